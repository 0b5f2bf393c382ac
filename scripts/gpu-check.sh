#!/usr/bin/env bash
# lockstep on a machine with NVIDIA GPUs, in one command: builds lockstep
# against a CUDA libtorch (LOCKSTEP_REQUIRE_CUDA=ON), checks that GPUs are
# visible, runs the unit tests (the CUDA ones run instead of skipping), trains
# through `lockstep train` on every CUDA path (cuda-paths: one GPU, NCCL, fp16
# and bf16 autocast, two ranks sharing a GPU over Gloo and refused over NCCL,
# FSDP with CPU offload and activation checkpointing, MemoryStatsHook), trains
# the Fashion-MNIST demo on the GPUs, runs the benches, and times and checks
# the whole step as one CUDA graph (cuda-graph). Each step fits in
# 10 minutes on one H100 (the build: about 2 with 16 jobs). It ends with a table
# (step, result, seconds), also written to <logs>/summary.md, and exits 1 if
# any step failed; a failed step does not stop the others.
#
#   scripts/gpu-check.sh                              # the libtorch inside python3's pip PyTorch, else Debian's
#   scripts/gpu-check.sh --kit gpu-kit --logs /tmp/l  # a host with no network: the kit of scripts/gpu-kit.sh
#   scripts/gpu-check.sh --kit gpu-kit build unit     # only these steps (names below)
#   TORCH_DIR=/opt/libtorch scripts/gpu-check.sh      # pytorch.org's libtorch (CUDA, cxx11 ABI) unzipped in /opt/libtorch
#
# Options:
#   --kit DIR    the offline kit (scripts/gpu-kit.sh): its .debs are unpacked
#                into <build>/kit-root and searched after libtorch; its
#                Fashion-MNIST is used where the host has none.
#   --logs DIR   where every step's log and summary.md go (<build>/gpu-check)
#   STEP...      run only these, in the order given: build gpus unit multiprocess differential cuda-paths demo-1
#                demo-all make-demo bench-ddp bench-fsdp bench-amp bench-overhead bench-eager cuda-graph. The build (which
#                only redoes what is out of date) and the GPU count always run first. A lease of a few minutes
#                puts what matters most first, so that a call cut short still measured it.
#
# libtorch: TORCH_DIR when set; else the one inside python3's PyTorch
# (torch.utils.cmake_prefix_path), when python3 has a CUDA build of torch;
# else cmake's own search (Debian's libtorch-cuda-dev in /usr).
#
# Environment (all optional):
#   TORCH_DIR           libtorch folder (holding share/cmake/Torch or Torch/), passed as CMAKE_PREFIX_PATH
#   BUILD_DIR           build folder (build-gpu)            JOBS       parallel jobs (nproc)
#   CMAKE_FLAGS         more cmake options, split at spaces
#   WORK_DIR            demo work folders (work_dirs/gpu-check)
#   FASHION_MNIST_ROOT  Fashion-MNIST's folder, if not Debian's /usr/share/datasets/fashion-mnist
#   RUN_TIMEOUT         seconds each cuda-paths run may take (150)
#   MULTIPROCESS_TIMEOUT  seconds the multi-process tests may take together (540)
#   BENCH_*             passed on to the benches (BENCH_ROUNDS, BENCH_ITERS, BENCH_WORLDS, ...)

# The step functions run through `step "$name" fn`, which shellcheck 0.9 takes
# for unreachable code (SC2317).
# shellcheck disable=SC2317
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
WORK_DIR=${WORK_DIR:-work_dirs/gpu-check}
LOG_DIR=$BUILD_DIR/gpu-check
KIT=""
DEMO_CONFIG=examples/fashion_mnist/cnn_ddp.yaml
ALL_STEPS=(build gpus unit multiprocess differential cuda-paths demo-1 demo-all make-demo bench-ddp bench-fsdp bench-amp bench-overhead bench-eager cuda-graph)
read -ra extra_cmake_flags <<<"${CMAKE_FLAGS:-}"
wanted=()
while (($#)); do
  case $1 in
    --kit) KIT=${2:?--kit needs a folder}; shift 2 ;;
    --logs) LOG_DIR=${2:?--logs needs a folder}; shift 2 ;;
    -h|--help) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 2 ;;
    *)
      if [[ " ${ALL_STEPS[*]} " != *" $1 "* ]]; then
        echo "gpu-check: no step '$1'; the steps are: ${ALL_STEPS[*]}" >&2
        exit 2
      fi
      wanted+=("$1"); shift ;;
  esac
done
((${#wanted[@]})) || wanted=("${ALL_STEPS[@]}")
mkdir -p "$LOG_DIR" "$BUILD_DIR" && LOG_DIR=$(cd "$LOG_DIR" && pwd) && BUILD_DIR=$(cd "$BUILD_DIR" && pwd) || exit 1
if [[ -n "$KIT" ]]; then
  KIT=$(cd "$KIT" 2>/dev/null && pwd) || { echo "gpu-check: --kit $KIT: no such folder" >&2; exit 2; }
  [[ -d "$KIT/debs" ]] || { echo "gpu-check: --kit $KIT holds no debs/ (make it with scripts/gpu-kit.sh)" >&2; exit 2; }
fi

# ---- the offline kit (scripts/kit-lib.sh: unpack_kit) ---------------------------
# shellcheck source=scripts/kit-lib.sh
source scripts/kit-lib.sh  # the working folder is the checkout (cd above)

# libtorch inside python3's PyTorch, when it is a CUDA build.
pip_torch_dir() {
  command -v python3 >/dev/null || return 1
  python3 -c 'import torch, torch.utils, sys; sys.exit(0) if torch.version.cuda else sys.exit(1)' 2>/dev/null || return 1
  python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)'
}

# ---- bookkeeping --------------------------------------------------------------
# A step is a function that sets `result` (one line for the table) and returns
# 0 (pass), 1 (fail) or 2 (skipped).
names=() statuses=() results=() durations=()
built=0   # the build succeeded
gpus=0    # GPUs this process sees

step() {
  local name=$1 fn=$2 start status
  echo
  echo "==== gpu-check: $name"
  start=$(date +%s)
  result=""
  "$fn"
  status=$?
  names+=("$name")
  case $status in
    0) statuses+=(PASS) ;;
    2) statuses+=(SKIP) ;;
    *) statuses+=(FAIL) ;;
  esac
  results+=("$result")
  durations+=("$(($(date +%s) - start))")
  echo "==== gpu-check: $name: ${statuses[-1]}${result:+: $result}"
}

# Runs a command with its output on the terminal and in $LOG_DIR/<log>.log; returns its status.
logged() {
  local log=$LOG_DIR/$1.log
  shift
  echo "+ $*" | tee "$log"
  "$@" 2>&1 | tee -a "$log"
}

# ---- 1. configure and build ---------------------------------------------------
build() {
  local -a torch_flags=()
  if [[ -n "${TORCH_DIR:-}" ]]; then
    local config_dir="" dir
    for dir in "$TORCH_DIR/share/cmake/Torch" "$TORCH_DIR/Torch" "$TORCH_DIR"; do
      [[ -f "$dir/TorchConfig.cmake" ]] && { config_dir=$dir; break; }
    done
    if [[ -z "$config_dir" ]]; then
      result="TORCH_DIR=$TORCH_DIR holds no share/cmake/Torch/TorchConfig.cmake (give the folder the libtorch zip unpacks to)"
      return 1
    fi
    # Torch_DIR too, so that a build folder configured before with another libtorch follows TORCH_DIR.
    torch_flags=("-DTorch_DIR=$config_dir")
  fi
  local prefix_path=${TORCH_DIR:-}
  [[ -n "$KIT" ]] && prefix_path+="${prefix_path:+;}$BUILD_DIR/kit-root/usr"
  [[ -n "$prefix_path" ]] && torch_flags+=("-DCMAKE_PREFIX_PATH=$prefix_path")
  # Ninja where there is one (a pip host has it), unless the folder was configured with another generator.
  local -a generator=() keep_going=(-k)
  if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
  if ! logged configure cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_REQUIRE_CUDA=ON \
      "${torch_flags[@]}" "${extra_cmake_flags[@]}"; then
    result="configure failed (a libtorch without CUDA fails LOCKSTEP_REQUIRE_CUDA); see $LOG_DIR/configure.log"
    return 1
  fi
  # Keep going past a failed file, so that one build shows every error.
  [[ -f "$BUILD_DIR/build.ninja" ]] && keep_going=(-k 0)
  if ! logged build cmake --build "$BUILD_DIR" -j "$JOBS" -- "${keep_going[@]}"; then
    result="build failed: $(grep -cE 'error:' "$LOG_DIR/build.log") error lines; see $LOG_DIR/build.log"
    # Past a failed file the build went on: where the CLI was linked, the
    # steps that need only what was built still run (a step whose binary is
    # missing fails by itself), so that one short lease learns the most.
    # Only a CLI that is up to date: a warm machine's second call keeps the
    # first call's binary, which a failed rebuild would leave behind.
    if [[ -x "$BUILD_DIR/bin/lockstep" && -f "$BUILD_DIR/build.ninja" ]] &&
      ninja -C "$BUILD_DIR" -n bin/lockstep 2>/dev/null | grep -q 'no work to do'; then
      built=1
      result+="; bin/lockstep is up to date, so the steps run"
    fi
    return 1
  fi
  built=1
  # "lockstep: libtorch 2.6.0 from /usr/lib/..., CUDA ON" and "lockstep: Gloo headers from /usr/include (beside torch)"
  result=$(grep -hoE 'lockstep: (libtorch .*|Gloo headers from .*)' "$LOG_DIR/configure.log" | sed 's/^lockstep: //' | paste -sd ';' -)
  result=${result//;/; }
  return 0
}

# ---- 2. GPUs ------------------------------------------------------------------
check_gpus() {
  if ! command -v nvidia-smi >/dev/null; then
    result="nvidia-smi not found: no NVIDIA driver on this machine (install the driver; nvidia-smi comes with it)"
    return 1
  fi
  local list count cvd=""
  [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]] && cvd=" (CUDA_VISIBLE_DEVICES=\"$CUDA_VISIBLE_DEVICES\")"
  if ! list=$(nvidia-smi -L 2>&1); then
    echo "$list" | tee "$LOG_DIR/gpus.log"
    result="nvidia-smi -L failed: $(head -n1 <<<"$list")"
    return 1
  fi
  echo "$list" | tee "$LOG_DIR/gpus.log"
  count=$(grep -cE '^GPU [0-9]+:' <<<"$list")
  gpus=$count
  # CUDA_VISIBLE_DEVICES narrows what CUDA programs see; nvidia-smi ignores it.
  if [[ -n "$cvd" ]]; then
    local visible
    visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
    ((visible < gpus)) && gpus=$visible
  fi
  if ((gpus == 0)); then
    result="no GPU visible: nvidia-smi lists $count$cvd"
    return 1
  fi
  result="$gpus visible; nvidia-smi: $(grep -E '^GPU [0-9]+:' <<<"$list" | sed -E 's/^GPU [0-9]+: (.*) \(UUID.*/\1/' | sort | uniq -c \
    | awk '{n=$1; $1=""; printf "%s%dx%s", sep, n, $0; sep=", "}')"
  result+=$cvd
  return 0
}

# ---- 3. unit tests ------------------------------------------------------------
# One ctest entry per library folder; each writes gtest's XML report, which
# says how many tests ran and which skipped, and why.
unit_tests() {
  ((built)) || { result="not run: no build"; return 2; }
  local xml_dir ctest_status
  xml_dir=$LOG_DIR/unit-xml
  rm -rf "$xml_dir" && mkdir -p "$xml_dir"
  (cd "$BUILD_DIR" && GTEST_OUTPUT="xml:$xml_dir/" logged unit-tests ctest -L unit --output-on-failure -j "$JOBS" --timeout 900)
  ctest_status=$?
  local ran skipped failed skipped_list
  ran=$(cat "$xml_dir"/*.xml 2>/dev/null | grep -o 'result="completed"' | wc -l)
  skipped=$(cat "$xml_dir"/*.xml 2>/dev/null | grep -o 'result="skipped"' | wc -l)
  failed=$(cat "$xml_dir"/*.xml 2>/dev/null | grep -oE '<testsuites [^>]*failures="[0-9]+"' \
    | grep -oE 'failures="[0-9]+"' | tr -dc '0-9\n' | awk '{n += $1} END {print n + 0}')
  # "Suite.Name: message" for each skipped test.
  skipped_list=$(cat "$xml_dir"/*.xml 2>/dev/null | awk '
    /<testcase / {
      skipped = ($0 ~ /result="skipped"/)
      match($0, / name="[^"]*"/); name = substr($0, RSTART + 7, RLENGTH - 8)
      match($0, /classname="[^"]*"/); suite = substr($0, RSTART + 11, RLENGTH - 12)
    }
    /<skipped message="/ && skipped {
      match($0, /message="[^"]*"/); message = substr($0, RSTART + 9, RLENGTH - 10)
      n = split(message, parts, "&#x0A;"); print suite "." name ": " parts[n]
    }')
  echo
  echo "unit tests: $ran ran ($failed failed), $skipped skipped"
  if [[ -n "$skipped_list" ]]; then
    local line
    while IFS= read -r line; do echo "  skipped: $line"; done <<<"$skipped_list"
  fi
  result="$ran ran, $failed failed, $skipped skipped"
  if ((ran == 0)); then
    result+="; no unit test ran, see $LOG_DIR/unit-tests.log"
    return 1
  fi
  if ((ctest_status != 0)); then
    result+="; ctest failed, see $LOG_DIR/unit-tests.log"
    return 1
  fi
  # With a GPU present, a test that skips for want of one means libtorch does not see it.
  local no_cuda
  no_cuda=$(grep -i 'no CUDA device' <<<"$skipped_list" | cut -d: -f1 | paste -sd, -)
  if ((gpus > 0)) && [[ -n "$no_cuda" ]]; then
    result+="; skipped for want of a GPU with $gpus visible: $no_cuda"
    return 1
  fi
  return 0
}

# ---- 3b. multi-process tests and the comparison with PyTorch ------------------------
# Runs the tests of ctest label pattern $2 into $LOG_DIR/$1.log, bounded by
# MULTIPROCESS_TIMEOUT seconds (540) so the step fits a 10-minute call; sets
# `result` to ctest's summary and the failed tests' names.
labelled_tests() {
  local log=$1 labels=$2 status summary failed_list
  ((built)) || { result="not run: no build"; return 2; }
  (cd "$BUILD_DIR" && logged "$log" timeout "${MULTIPROCESS_TIMEOUT:-540}" \
    ctest -L "$labels" --output-on-failure -j "$JOBS" --timeout 480)
  status=$?
  if ((status == 124)); then
    result="stopped after ${MULTIPROCESS_TIMEOUT:-540} s; see $LOG_DIR/$log.log"
    return 1
  fi
  summary=$(grep -oE '[0-9]+% tests passed, [0-9]+ tests failed out of [0-9]+' "$LOG_DIR/$log.log" | tail -n1)
  failed_list=$(grep -E '^\s+[0-9]+ - .* \(' "$LOG_DIR/$log.log" | awk '{print $3}' | paste -sd, -)
  result="${summary:-no ctest summary}${failed_list:+; failed: $failed_list}"
  ((status == 0))
}

# The areas whose tests start several ranks (collectives, DDP, FSDP, AMP under
# DDP, GANs), on this build: their CUDA cases run where a GPU is visible.
multiprocess_tests() { labelled_tests multiprocess 'dist|parallel|fsdp|amp_dist|gan'; }

# tests/differential against the host's PyTorch (LOCKSTEP_TEST_PYTHON), its
# DDP_BatchNorm_OneGpu case on GPU 0 with deterministic algorithms on both sides.
differential_tests() {
  labelled_tests differential differential
  local status=$? gpu_case
  gpu_case=$(grep -A40 'DDP_BatchNorm_OneGpu' "$LOG_DIR/differential.log" 2>/dev/null | grep -m1 -oE 'largest: [-0-9.e+]+')
  result+="${gpu_case:+; on the GPU $gpu_case}"
  return "$status"
}

# ---- 4. the demo on the GPUs --------------------------------------------------
# cnn_ddp.yaml is DDPStrategy with backend gloo on the CPU; --set moves it to
# the GPUs: strategy.device (auto|cpu|cuda: cuda is cuda:LOCAL_RANK) and
# strategy.backend (auto|gloo|nccl). --nproc 1 runs it as one process.
# strategy.sync_bn=torch: the GPU runs take SyncBatchNorm's fused CUDA path,
# which the CPU demo (no sync_bn) does not.
demo() {
  local nproc=$1 root=${FASHION_MNIST_ROOT:-/usr/share/datasets/fashion-mnist}
  ((built)) || { result="not run: no build"; return 2; }
  ((gpus > 0)) || { result="not run: no GPU"; return 2; }
  if ((nproc > gpus)); then
    result="not run: $nproc processes need $nproc GPUs, $gpus visible"
    return 2
  fi
  if [[ ! -d "$root" ]]; then
    result="no Fashion-MNIST in $root: apt install dataset-fashion-mnist, or set FASHION_MNIST_ROOT"
    return 1
  fi
  local -a data_flags=()
  if [[ -n "${FASHION_MNIST_ROOT:-}" ]]; then
    local loader
    for loader in train_dataloader val_dataloader test_dataloader; do
      data_flags+=(--set "$loader.dataset.root=$root")
    done
  fi
  local work=$WORK_DIR/demo-${nproc}gpu log=demo-${nproc}gpu
  rm -rf "$work"
  if ! logged "$log" "$BUILD_DIR/bin/lockstep" train "$DEMO_CONFIG" --nproc "$nproc" --work-dir "$work" \
      --set strategy.device=cuda --set strategy.backend=nccl --set strategy.sync_bn=torch "${data_flags[@]}"; then
    result="training failed; see $LOG_DIR/$log.log"
    return 1
  fi
  # The runner ends with "Final test accuracy/top1: 0.9208" (and top5).
  local top1 top5
  top1=$(grep -oE 'Final test accuracy/top1: [0-9.]+' "$LOG_DIR/$log.log" | tail -n1 | awk '{print $NF}')
  top5=$(grep -oE 'Final test accuracy/top5: [0-9.]+' "$LOG_DIR/$log.log" | tail -n1 | awk '{print $NF}')
  if [[ -z "$top1" ]]; then
    result="no 'Final test accuracy/top1' line; see $LOG_DIR/$log.log"
    return 1
  fi
  result="test top-1 $top1${top5:+, top-5 $top5} ($nproc GPU$( ((nproc > 1)) && echo s), NCCL)"
  return 0
}
demo_one() { demo 1; }
demo_all() {
  ((built)) || { result="not run: no build"; return 2; }
  if ((gpus == 1)); then
    result="not run: 1 GPU, the run above"
    return 2
  fi
  demo "$gpus"
}

# `make demo` itself, as README's first command: its quick build of the CLI
# (build-demo-gpu, against this host's libtorch and the kit), then the 2-rank
# DDP demo under `device: auto`, which says where its ranks run (on a host
# with fewer GPUs than ranks: all on the CPU, Note [auto never fails for want
# of GPUs]). LOCKSTEP_SKIP_INSTALL: a host without network installs nothing.
make_demo() {
  ((built)) || { result="not run: no build"; return 2; }
  # CMake reads CMAKE_PREFIX_PATH from the environment too (':' between folders).
  local prefix_path=${TORCH_DIR:-}
  [[ -n "$KIT" ]] && prefix_path+="${prefix_path:+:}$BUILD_DIR/kit-root/usr"
  rm -rf work_dirs/demo
  if ! CMAKE_PREFIX_PATH=$prefix_path LOCKSTEP_SKIP_INSTALL=1 logged make-demo make demo DEMO_BUILD_DIR="$BUILD_DIR-demo" JOBS="$JOBS"; then
    result="make demo failed; see $LOG_DIR/make-demo.log"
    return 1
  fi
  local top1 where
  top1=$(grep -oE 'Final test accuracy/top1: [0-9.]+' "$LOG_DIR/make-demo.log" | tail -n1 | awk '{print $NF}')
  where=$(grep -m1 -oE 'device auto: [^;]*|rank 0[^;]* on (cuda|cpu)[^;,]*' "$LOG_DIR/make-demo.log")
  [[ -n "$top1" ]] || { result="no 'Final test accuracy/top1' line; see $LOG_DIR/make-demo.log"; return 1; }
  result="test top-1 $top1${where:+; ${where:0:160}}"
}

# ---- 5. every CUDA path, through `lockstep train` --------------------------------
# Each run is one line of the table: a name, the processes, what it must show
# (a log line's pattern, "metric:<name>" for a scalar of its metrics.jsonl,
# or "error:<pattern>" for a run that must fail with that message, quickly), then the command's arguments after `lockstep train`
# (or `gpt:` and the arguments of examples/gpt). One epoch (300 iterations for
# the GPT) each; a run that takes over RUN_TIMEOUT seconds (150) fails.
one_epoch=(--set train_cfg.max_epochs=1)
on_gpu=(--set strategy.device=cuda --set strategy.backend=nccl)
memory_hook=(--set 'custom_hooks=[{type: MemoryStatsHook, interval: 100}]')
cuda_runs=(
  "single-gpu|1|metric:memory/cuda_peak_allocated_mib|examples/fashion_mnist/cnn.yaml ${one_epoch[*]} --set strategy={type: SingleDeviceStrategy, device: cuda} --set train_dataloader.pin_memory=true ${memory_hook[*]}"
  "ddp-nccl-fp16|1|loss_scale|examples/fashion_mnist/cnn_ddp.yaml ${one_epoch[*]} ${on_gpu[*]} --set optim_wrapper.amp={dtype: fp16}"
  "bf16|1|Final test accuracy/top1|examples/fashion_mnist/cnn_bf16.yaml ${one_epoch[*]} --set strategy={type: SingleDeviceStrategy, device: cuda}"
  "ddp-gloo-2-ranks-1-gpu|2|Final test accuracy/top1|examples/fashion_mnist/cnn_ddp.yaml ${one_epoch[*]} --set strategy.device=cuda:0 --set strategy.backend=gloo --set strategy.sync_bn=torch"
  "ddp-nccl-2-ranks-1-gpu|2|error:share|examples/fashion_mnist/cnn_ddp.yaml ${one_epoch[*]} --set strategy.device=cuda:0 --set strategy.backend=nccl"
  "cuda-graph|1|Final test accuracy/top1|examples/fashion_mnist/cnn.yaml ${one_epoch[*]} --set strategy={type: SingleDeviceStrategy, device: cuda} --set cuda_graph={warmup_iters: 3}"
  "cuda-graph-ddp-refused|1|error:cannot capture this run|examples/fashion_mnist/cnn_ddp.yaml ${one_epoch[*]} ${on_gpu[*]} --set cuda_graph={warmup_iters: 3}"
  "gpt-fsdp-offload-ckpt-bf16|1|metric:memory/cuda_peak_allocated_mib|gpt: examples/gpt/gpt_fsdp.yaml ${on_gpu[*]} --set strategy.model_wrapper.cpu_offload=true --set strategy.model_wrapper.mixed_precision={param_dtype: bf16, reduce_dtype: fp32} --set activation_checkpointing={module_types: [Block]} ${memory_hook[*]}"
)
cuda_paths() {
  ((built)) || { result="not run: no build"; return 2; }
  ((gpus > 0)) || { result="not run: no GPU"; return 2; }
  local line name nproc expect args log status failed=0 summary="" found
  for line in "${cuda_runs[@]}"; do
    IFS='|' read -r name nproc expect args <<<"$line"
    log=run-$name
    local -a argv=()
    # The arguments split at spaces, except inside {...} and [...] (YAML flow values).
    mapfile -t argv < <(awk '{
        depth = 0; word = ""
        for (i = 1; i <= length($0); i++) {
          c = substr($0, i, 1)
          if (c == "{" || c == "[") depth++
          if (c == "}" || c == "]") depth--
          if (c == " " && depth == 0) { if (word != "") print word; word = "" } else word = word c
        }
        if (word != "") print word }' <<<"$args")
    local -a command
    if [[ "${argv[0]}" == gpt: ]]; then
      command=("$BUILD_DIR/bin/lockstep" run --standalone --nproc-per-node "$nproc" -- "$BUILD_DIR/examples/gpt_fortunes" "${argv[@]:1}" --work-dir "$WORK_DIR/$name")
    else
      command=("$BUILD_DIR/bin/lockstep" train "${argv[@]}" --nproc "$nproc" --work-dir "$WORK_DIR/$name")
    fi
    rm -rf "${WORK_DIR:?}/$name"
    timeout "${RUN_TIMEOUT:-150}" "${command[@]}" >"$LOG_DIR/$log.log" 2>&1
    status=$?
    if [[ "$expect" == error:* ]]; then
      found=$(grep -m1 -iE "${expect#error:}" "$LOG_DIR/$log.log")
      if ((status != 0 && status != 124)) && [[ -n "$found" ]]; then
        summary+="$name PASS (failed as it must: ${found:0:160}); "
      else
        summary+="$name FAIL (status $status, no '${expect#error:}' line); "; failed=1
      fi
      continue
    fi
    if [[ "$expect" == metric:* ]]; then
      # A scalar of the run's metrics.jsonl (MemoryStatsHook's do not go to the console).
      found=$(find "$WORK_DIR/$name" -name metrics.jsonl -exec cat {} + 2>/dev/null \
        | grep -oE "\"${expect#metric:}\":[-0-9.e+]+" | tail -n1)
    else
      found=$(grep -E "$expect" "$LOG_DIR/$log.log" | tail -n1 | grep -oE "${expect}[^,|]*" | head -n1)
    fi
    if ((status == 0)) && [[ -n "$found" ]]; then
      summary+="$name PASS (${found:0:80}); "
    else
      summary+="$name FAIL (status $status$( ((status == 124)) && echo ", timed out"), see $log.log); "; failed=1
    fi
  done
  result=${summary%; }
  return "$failed"
}

# ---- 5. benchmarks ------------------------------------------------------------
bench_binary() {
  local name=$1
  ((built)) || { result="not run: no build"; return 2; }
  if [[ ! -x "$BUILD_DIR/bench/bench_$name" ]]; then
    result="$BUILD_DIR/bench/bench_$name was not built (LOCKSTEP_BUILD_BENCH=OFF?)"
    return 1
  fi
}

# bench/ddp: BENCH_DEVICE=cuda trains each of its 2 ranks on its own GPU
# (cuda:LOCAL_RANK) over NCCL, so it needs 2 GPUs.
bench_ddp() {
  bench_binary ddp || return
  ((gpus >= 2)) || { result="not run: 2 ranks need 2 GPUs, $gpus visible"; return 2; }
  if ! BENCH_DEVICE=cuda logged bench-ddp "$BUILD_DIR/bench/bench_ddp"; then
    result="failed; see $LOG_DIR/bench-ddp.log"
    return 1
  fi
  # | model | lockstep DDP | no communication | after backward | PyTorch DDP | lockstep / PyTorch | lockstep / no-comm |
  result=$(awk -F'|' '$2 ~ /^ (cnn|mlp) $/ {
      gsub(/ /, "", $2); gsub(/^ +| +$/, "", $3); gsub(/ /, "", $7); gsub(/ /, "", $8)
      printf "%s%s %s/step, lockstep/no-comm %s, lockstep/PyTorch %s", sep, $2, $3, $8, $7; sep = "; " }' \
    "$LOG_DIR/bench-ddp.log")
  [[ -n "$result" ]] || { result="no result table; see $LOG_DIR/bench-ddp.log"; return 1; }
  return 0
}

# bench/fsdp: BENCH_DEVICE=cuda trains its ~100M parameter GPT with each rank
# on its own GPU over NCCL (BENCH_WORLDS 2, and 4 when there are 4 GPUs) and
# compares FSDP's memory (the CUDA caching allocator's peak) and step time
# with DDP's.
bench_fsdp() {
  bench_binary fsdp || return
  ((gpus >= 2)) || { result="not run: 2 ranks need 2 GPUs, $gpus visible"; return 2; }
  local worlds=2
  ((gpus >= 4)) && worlds=2,4
  if ! BENCH_DEVICE=cuda BENCH_WORLDS=$worlds logged bench-fsdp "$BUILD_DIR/bench/bench_fsdp"; then
    result="failed; see $LOG_DIR/bench-fsdp.log"
    return 1
  fi
  # "world 2, ..." then "FULL_SHARD total peak ... ratio 0.545 (target <= 1); step / DDP step = 0.85 ..."
  result=$(awk '/^world [0-9]+,/ { world = $2; sub(/,/, "", world) }
    /^FULL_SHARD total peak/ {
      match($0, /ratio [0-9.]+/); ratio = substr($0, RSTART + 6, RLENGTH - 6)
      match($0, /step \/ DDP step = [0-9.]+/); step = substr($0, RSTART + 18, RLENGTH - 18)
      printf "%sworld %s: FULL_SHARD memory bound ratio %s, step x%s of DDP", sep, world, ratio, step; sep = "; " }' \
    "$LOG_DIR/bench-fsdp.log")
  [[ -n "$result" ]] || { result="no FULL_SHARD line; see $LOG_DIR/bench-fsdp.log"; return 1; }
  return 0
}

# bench/trainer_overhead on GPU 0: lockstep's Trainer against a hand-written
# libtorch loop of the same ConvNet steps (target: at most 1.02x), and each
# side's host synchronisations per step (goal: at most one).
bench_overhead() {
  bench_binary trainer_overhead || return
  ((gpus > 0)) || { result="not run: no GPU"; return 2; }
  if ! BENCH_DEVICE=cuda logged bench-overhead "$BUILD_DIR/bench/bench_trainer_overhead"; then
    result="failed; see $LOG_DIR/bench-overhead.log"
    return 1
  fi
  # "median: hand-written 1.23 ms/step, lockstep Trainer 1.25 ms/step" and "RESULT trainer_overhead ratio (...) = 1.016  (target <= 1.03)"
  local medians ratio
  medians=$(grep -E '^median: ' "$LOG_DIR/bench-overhead.log" | tail -n1 | sed 's/^median: //')
  ratio=$(grep -oE 'RESULT trainer_overhead ratio .* = [0-9.]+' "$LOG_DIR/bench-overhead.log" | awk '{print $NF}')
  [[ -n "$ratio" ]] || { result="no RESULT line; see $LOG_DIR/bench-overhead.log"; return 1; }
  # "RESULT trainer_overhead host synchronisations per step (...): lockstep Trainer 1.00, hand-written 1.00 (goal <= 1)"
  local syncs
  syncs=$(grep -oE 'lockstep Trainer [0-9.]+, hand-written [0-9.]+ \(goal' "$LOG_DIR/bench-overhead.log" | sed 's/ (goal//')
  # "RESULT trainer_overhead ATen operators per step (outermost calls): lockstep Trainer 61.0, hand-written 52.0"
  local ops
  ops=$(grep -oE 'outermost calls\): lockstep Trainer [0-9.]+, hand-written [0-9.]+' "$LOG_DIR/bench-overhead.log" \
    | sed 's/^outermost calls): //')
  result="Trainer / hand-written $ratio ($medians); host synchronisations per step: ${syncs:-not counted}"
  result+="; ATen operators per step: ${ops:-not counted}"
  return 0
}

# lockstep's step against PyTorch eager's on GPU 0, for two small models: the
# demo's ConvNet through `lockstep train` (in-memory SyntheticImages,
# SingleDeviceStrategy) and examples/gpt's GPT in bf16 through its own program
# (SingleDeviceStrategy, AdamW, clipping), each with the loss logged every 10
# steps, against a plain PyTorch loop of the same model, batch, optimizer and
# logging (bench/eager_step.py --model convnet|gpt), in alternating rounds; the
# median window of each, and their ratio (target: at most 0.9, no Python on
# lockstep's hot path).
eager_iters=${BENCH_EAGER_ITERS:-600}
eager_models=(${BENCH_EAGER_MODELS:-convnet gpt})
eager_common=(
  --set "train_cfg={_delete_: true, max_iters: $eager_iters}" --set default_hooks.logger.interval=10
  --set val_dataloader=null --set val_evaluator=null --set default_hooks.checkpoint=null --set param_scheduler=null
)
# The median of a run's logged windows' "time" (metrics.jsonl), past the
# first 5 (warm-up).
median_logged_time() {
  python3 -c 'import json, statistics, sys
times = [json.loads(line)["time"] for line in open(sys.argv[1]) if "\"time\"" in line][5:]
print("%.6f" % statistics.median(times))' "$1"
}
# The lockstep side of `model`, into the array `command`.
eager_command() {
  case $1 in
    convnet)
      command=("$BUILD_DIR/bin/lockstep" train examples/fashion_mnist/cnn.yaml
        --set 'strategy={type: SingleDeviceStrategy, device: cuda}'
        --set 'train_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 4096}'
        --set test_dataloader=null --set test_evaluator=null "${eager_common[@]}") ;;
    gpt)
      command=("$BUILD_DIR/examples/gpt_fortunes" examples/gpt/gpt_fsdp.yaml
        --set 'strategy={_delete_: true, type: SingleDeviceStrategy, device: cuda}'
        --set 'optim_wrapper.amp={dtype: bf16}' "${eager_common[@]}" --sample-chars 1) ;;
  esac
}
# One lockstep run of $model (${command[@]}, then the arguments after the
# first two) into $WORK_DIR/$1; its median step time in $value. $2 names the
# run in an error. For bench_eager and bench_graph (their $log, $model).
lockstep_step_time() {
  local dir=$WORK_DIR/$1 what=$2
  shift 2
  rm -rf "$dir"
  "${command[@]}" "$@" --work-dir "$dir" >>"$log" 2>&1 || { result="$model: $what failed; see $log"; return 1; }
  value=$(median_logged_time "$dir/metrics.jsonl") || { result="$model: no metrics.jsonl times; see $log"; return 1; }
}
# PyTorch eager's step time for $model (bench/eager_step.py) in $value.
pytorch_eager_step_time() {
  python3 bench/eager_step.py --device cuda --model "$model" --iters "$eager_iters" >>"$log" 2>&1 \
    || { result="$model: bench/eager_step.py failed; see $log"; return 1; }
  value=$(grep -oE 'RESULT eager seconds per step .* = [0-9.]+' "$log" | tail -n1 | awk '{print $NF}')
}
bench_eager() {
  ((built)) || { result="not run: no build"; return 2; }
  ((gpus > 0)) || { result="not run: no GPU"; return 2; }
  local model round rounds=${BENCH_ROUNDS:-3} log=$LOG_DIR/bench-eager.log value summary command=() parts=()
  : >"$log"
  for model in "${eager_models[@]}"; do
    local ours=() theirs=()
    eager_command "$model"
    for ((round = 0; round < rounds; ++round)); do
      lockstep_step_time eager lockstep || return 1
      ours+=("$value")
      pytorch_eager_step_time || return 1
      theirs+=("$value")
      echo "$model round $round: lockstep ${ours[-1]} s/step, PyTorch eager $value s/step" | tee -a "$log"
    done
    summary=$(python3 -c 'import statistics, sys
n = len(sys.argv[2:]) // 2
ours, theirs = [float(v) for v in sys.argv[2:n + 2]], [float(v) for v in sys.argv[n + 2:]]
a, b = statistics.median(ours), statistics.median(theirs)
print("%s: lockstep %.3f ms/step, PyTorch eager %.3f ms/step, ratio %.3f" % (sys.argv[1], a * 1e3, b * 1e3, a / b))' \
      "$model" "${ours[@]}" "${theirs[@]}")
    echo "$summary" | tee -a "$log"
    parts+=("$summary")
  done
  result="$(IFS=';'; echo "${parts[*]}" | sed 's/;/; /g') (target <= 0.9)"
  return 0
}

# cuda-graph: the whole step as one CUDA graph (cuda_graph: {warmup_iters: 3}).
# Speed: bench-eager's two lockstep runs with cuda_graph on, against PyTorch
# eager (bench/eager_step.py) and PyTorch with the whole step captured
# (bench/graph_step.py), in alternating rounds (targets: at most 0.25 and
# 1.15). Exactness: 200 steps with cuda_graph against the same job run eagerly
# with `capturable: true`, deterministic algorithms on both, compared with
# `lockstep ckpt diff` (bitwise): the ConvNet with SGD, and with fp16 loss
# scaling from a scale of 2^40, whose first steps the scaler skips.
graph_set=(--set 'cuda_graph={warmup_iters: 3}')
bench_graph() {
  ((built)) || { result="not run: no build"; return 2; }
  ((gpus > 0)) || { result="not run: no GPU"; return 2; }
  local model round rounds=${BENCH_ROUNDS:-3} log=$LOG_DIR/cuda-graph.log value summary command=() parts=() failed=0
  : >"$log"
  for model in "${eager_models[@]}"; do
    local ours=() eager=() graphed=()
    eager_command "$model"
    for ((round = 0; round < rounds; ++round)); do
      lockstep_step_time graph "lockstep with cuda_graph" "${graph_set[@]}" || return 1
      ours+=("$value")
      pytorch_eager_step_time || return 1
      eager+=("$value")
      python3 bench/graph_step.py --model "$model" --iters "$eager_iters" >>"$log" 2>&1 \
        || { result="$model: bench/graph_step.py failed; see $log"; return 1; }
      graphed+=("$(grep -oE 'RESULT graph seconds per step .* = [0-9.]+' "$log" | tail -n1 | awk '{print $NF}')")
      echo "$model round $round: lockstep graph ${ours[-1]}, PyTorch eager ${eager[-1]}, PyTorch graph ${graphed[-1]} s/step" \
        | tee -a "$log"
    done
    summary=$(python3 -c 'import statistics, sys
n = len(sys.argv[2:]) // 3
ours, eager, graphed = ([float(v) for v in sys.argv[2 + k * n:2 + (k + 1) * n]] for k in range(3))
a, b, c = statistics.median(ours), statistics.median(eager), statistics.median(graphed)
print("%s: lockstep graph %.3f ms/step, PyTorch eager %.3f (ratio %.3f), PyTorch graph %.3f (ratio %.3f)"
      % (sys.argv[1], a * 1e3, b * 1e3, a / b, c * 1e3, a / c))' "$model" "${ours[@]}" "${eager[@]}" "${graphed[@]}")
    echo "$summary" | tee -a "$log"
    parts+=("$summary")
  done
  # Bitwise: the graph against the eager run of the same capturable job.
  local exact=(examples/fashion_mnist/cnn.yaml --set 'strategy={type: SingleDeviceStrategy, device: cuda}'
    --set 'train_dataloader.dataset={_delete_: true, type: SyntheticImages, size: 4096}'
    --set 'train_cfg={_delete_: true, max_iters: 200}' --set val_dataloader=null --set val_evaluator=null
    --set test_dataloader=null --set test_evaluator=null --set 'randomness={seed: 5, deterministic: true}'
    --set default_hooks.checkpoint=null --set 'param_scheduler=[{type: LinearLR, start_factor: 0.1, by_epoch: false, begin: 0, end: 100}]'
    --set optim_wrapper.optimizer.capturable=true)
  local variant extra name
  for variant in "sgd|" "sgd-fp16-skips|--set optim_wrapper.amp={dtype: fp16, loss_scale: {init_scale: 1099511627776}}"; do
    IFS='|' read -r name extra <<<"$variant"
    local -a more=()
    [[ -n "$extra" ]] && more=(--set "${extra#--set }")
    rm -rf "$WORK_DIR/exact-eager" "$WORK_DIR/exact-graph"
    if ! { CUBLAS_WORKSPACE_CONFIG=:4096:8 "$BUILD_DIR/bin/lockstep" train "${exact[@]}" "${more[@]}" \
             --work-dir "$WORK_DIR/exact-eager" >>"$log" 2>&1 &&
           CUBLAS_WORKSPACE_CONFIG=:4096:8 "$BUILD_DIR/bin/lockstep" train "${exact[@]}" "${more[@]}" "${graph_set[@]}" \
             --work-dir "$WORK_DIR/exact-graph" >>"$log" 2>&1; }; then
      parts+=("$name: a run failed, see $log"); failed=1; continue
    fi
    if "$BUILD_DIR/bin/lockstep" ckpt diff "$WORK_DIR/exact-eager/model_final.ckpt" "$WORK_DIR/exact-graph/model_final.ckpt" \
      >>"$log" 2>&1; then
      parts+=("$name 200 steps: graph bitwise equal to eager")
    else
      parts+=("$name 200 steps: graph DIFFERS from eager (see $log)"); failed=1
    fi
  done
  result="$(IFS=';'; echo "${parts[*]}" | sed 's/;/; /g') (targets: <= 0.25 eager, <= 1.15 PyTorch graph)"
  return "$failed"
}

# bench/amp adds its "cuda fp32/bf16/fp16" modes by itself when libtorch sees
# a GPU (on GPU 0), after the CPU modes.
bench_amp() {
  bench_binary amp || return
  ((gpus > 0)) || { result="not run: no GPU"; return 2; }
  if ! logged bench-amp "$BUILD_DIR/bench/bench_amp"; then
    result="failed; see $LOG_DIR/bench-amp.log"
    return 1
  fi
  # "RESULT amp speedup (cuda fp16 over cuda fp32 step time) [convnet] = 1.234"
  result=$(grep -E '^RESULT amp speedup \(cuda ' "$LOG_DIR/bench-amp.log" \
    | sed -E 's/^RESULT amp speedup \(cuda ([a-z0-9]+) over .*\[([a-z_]+)\] = ([0-9.]+)$/\2 \1 x\3/' | paste -sd, - | sed 's/,/, /g')
  if [[ -z "$result" ]]; then
    result="no CUDA rows: libtorch saw no GPU (bench_amp found torch::cuda::is_available() false)"
    return 1
  fi
  result="speedup over cuda fp32: $result"
  return 0
}

# ---- run ----------------------------------------------------------------------
echo "gpu-check: $(pwd), build folder $BUILD_DIR, logs in $LOG_DIR, steps: ${wanted[*]}"
if [[ -z "${TORCH_DIR:-}" ]] && TORCH_DIR=$(pip_torch_dir); then
  echo "gpu-check: libtorch from python3's PyTorch $(python3 -c 'import torch; print(torch.__version__)'): TORCH_DIR=$TORCH_DIR"
  # The tests that compare with PyTorch use that Python, not Debian's /usr/bin/python3.
  LOCKSTEP_TEST_PYTHON=${LOCKSTEP_TEST_PYTHON:-$(command -v python3)}
  export LOCKSTEP_TEST_PYTHON
else
  [[ -n "${TORCH_DIR:-}" ]] || unset TORCH_DIR
fi
if [[ -n "$KIT" ]]; then
  # Not through `logged`: its pipe would run unpack_kit in a subshell, and the
  # LD_LIBRARY_PATH it exports would not reach the steps.
  unpack_kit "$KIT" "$BUILD_DIR/kit-root" >"$LOG_DIR/kit.log" 2>&1
  kit_status=$?
  cat "$LOG_DIR/kit.log"
  ((kit_status == 0)) || { echo "gpu-check: the kit $KIT could not be unpacked; see $LOG_DIR/kit.log" >&2; exit 1; }
fi
declare -A step_title=(
  [build]="configure + build" [gpus]="GPUs visible" [unit]="unit tests (ctest -L unit)"
  [multiprocess]="multi-process tests (dist, parallel, fsdp, amp_dist, gan)"
  [differential]="against the host's PyTorch (tests/differential)"
  [demo-1]="demo, 1 GPU, NCCL" [demo-all]="demo, every GPU, NCCL" [make-demo]="make demo, as a newcomer types it" [cuda-paths]="CUDA paths (lockstep train)" [bench-ddp]="bench/ddp (BENCH_DEVICE=cuda)"
  [bench-fsdp]="bench/fsdp (BENCH_DEVICE=cuda)" [bench-amp]="bench/amp" [bench-overhead]="bench/trainer_overhead (BENCH_DEVICE=cuda)"
  [bench-eager]="ConvNet and GPT (bf16) steps: lockstep / PyTorch eager"
  [cuda-graph]="the whole step as one CUDA graph: speed and bitwise"
)
declare -A step_function=(
  [build]=build [gpus]=check_gpus [unit]=unit_tests [multiprocess]=multiprocess_tests [differential]=differential_tests [demo-1]=demo_one [demo-all]=demo_all [make-demo]=make_demo [cuda-paths]=cuda_paths
  [bench-ddp]=bench_ddp [bench-fsdp]=bench_fsdp [bench-amp]=bench_amp [bench-overhead]=bench_overhead [bench-eager]=bench_eager [cuda-graph]=bench_graph
)
# The build and the GPU count come first whatever was asked: later steps need both.
wanted=(build gpus $(printf '%s\n' "${wanted[@]}" | grep -vxE 'build|gpus' | awk '!seen[$0]++'))
for name in "${wanted[@]}"; do
  step "${step_title[$name]}" "${step_function[$name]}"
done

failed=0
for status in "${statuses[@]}"; do [[ $status == FAIL ]] && failed=1; done
{
  echo "## gpu-check results ($(date -u '+%Y-%m-%d %H:%M UTC'), ${HOSTNAME:-})"
  echo
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  for i in "${!names[@]}"; do
    echo "| ${names[$i]} | ${statuses[$i]}${results[$i]:+: ${results[$i]}} | ${durations[$i]} |"
  done
} >"$LOG_DIR/summary.md"
echo
cat "$LOG_DIR/summary.md"
echo
if ((failed)); then
  echo "gpu-check: FAILED (logs in $LOG_DIR)"
  exit 1
fi
echo "gpu-check: all steps passed or were skipped for want of GPUs"
exit 0
