#!/usr/bin/env bash
# lockstep on a machine with NVIDIA GPUs, in one command: builds lockstep
# against a CUDA libtorch in build-gpu/ (LOCKSTEP_REQUIRE_CUDA=ON), checks that
# GPUs are visible, runs the unit tests (the CUDA ones run instead of skipping),
# trains the Fashion-MNIST demo (cnn_ddp.yaml, DDP over NCCL) on 1 GPU and on
# every GPU, and runs bench/ddp, bench/fsdp and bench/amp. It ends with a table
# (step, result, seconds) and exits 1 if any step failed; a failed step does
# not stop the others.
#
#   scripts/gpu-check.sh                              # Debian's libtorch-cuda-dev
#   TORCH_DIR=/opt/libtorch scripts/gpu-check.sh      # pytorch.org's libtorch (CUDA, cxx11 ABI) unzipped in /opt/libtorch
#   TORCH_DIR=/opt/libtorch \
#     CMAKE_FLAGS='-DLOCKSTEP_GLOO_INCLUDE_DIR=/src/pytorch/third_party/gloo;/src/pytorch/gloo-build' \
#     scripts/gpu-check.sh                            # ... with Gloo's headers from a PyTorch checkout (see README)
#
# Environment (all optional):
#   TORCH_DIR           libtorch folder (holding share/cmake/Torch), passed as CMAKE_PREFIX_PATH;
#                       without it cmake finds Torch as usual (the CMAKE_PREFIX_PATH environment variable, /usr)
#   BUILD_DIR           build folder (build-gpu)            JOBS       parallel jobs (nproc)
#   CMAKE_FLAGS         more cmake options, split at spaces
#   WORK_DIR            demo work folders (work_dirs/gpu-check)
#   FASHION_MNIST_ROOT  Fashion-MNIST's folder, if not Debian's /usr/share/datasets/fashion-mnist
#   BENCH_*             passed on to the benches (BENCH_ROUNDS, BENCH_ITERS, BENCH_WORLDS, ...)
# Every step's output is also in $BUILD_DIR/gpu-check/<step>.log.

# The step functions run through `step "$name" fn`, which shellcheck 0.9 takes
# for unreachable code (SC2317).
# shellcheck disable=SC2317
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
BUILD_DIR=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
WORK_DIR=${WORK_DIR:-work_dirs/gpu-check}
LOG_DIR=$BUILD_DIR/gpu-check
DEMO_CONFIG=examples/fashion_mnist/cnn_ddp.yaml
read -ra extra_cmake_flags <<<"${CMAKE_FLAGS:-}"
mkdir -p "$LOG_DIR" && LOG_DIR=$(cd "$LOG_DIR" && pwd) || exit 1

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
    for dir in "$TORCH_DIR/share/cmake/Torch" "$TORCH_DIR"; do
      [[ -f "$dir/TorchConfig.cmake" ]] && { config_dir=$dir; break; }
    done
    if [[ -z "$config_dir" ]]; then
      result="TORCH_DIR=$TORCH_DIR holds no share/cmake/Torch/TorchConfig.cmake (give the folder the libtorch zip unpacks to)"
      return 1
    fi
    # Torch_DIR too, so that a build folder configured before with another libtorch follows TORCH_DIR.
    torch_flags=("-DCMAKE_PREFIX_PATH=$TORCH_DIR" "-DTorch_DIR=$config_dir")
  fi
  if ! logged configure cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_REQUIRE_CUDA=ON \
      "${torch_flags[@]}" "${extra_cmake_flags[@]}"; then
    result="configure failed (a libtorch without CUDA fails LOCKSTEP_REQUIRE_CUDA); see $LOG_DIR/configure.log"
    return 1
  fi
  if ! logged build cmake --build "$BUILD_DIR" -j "$JOBS"; then
    result="build failed; see $LOG_DIR/build.log"
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

# ---- 4. the demo on the GPUs --------------------------------------------------
# cnn_ddp.yaml is DDPStrategy with backend gloo on the CPU; --set moves it to
# the GPUs: strategy.device (auto|cpu|cuda: cuda is cuda:LOCAL_RANK) and
# strategy.backend (auto|gloo|nccl). --nproc 1 runs it as one process.
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
      --set strategy.device=cuda --set strategy.backend=nccl "${data_flags[@]}"; then
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
echo "gpu-check: $(pwd), build folder $BUILD_DIR, logs in $LOG_DIR"
step "configure + build" build
step "GPUs visible" check_gpus
step "unit tests (ctest -L unit)" unit_tests
step "demo, 1 GPU, NCCL" demo_one
step "demo, every GPU, NCCL" demo_all
step "bench/ddp (BENCH_DEVICE=cuda)" bench_ddp
step "bench/fsdp (BENCH_DEVICE=cuda)" bench_fsdp
step "bench/amp" bench_amp

failed=0
echo
echo "## gpu-check results ($(date -u '+%Y-%m-%d %H:%M UTC'), ${HOSTNAME:-})"
echo
echo "| step | result | seconds |"
echo "|---|---|---|"
for i in "${!names[@]}"; do
  echo "| ${names[$i]} | ${statuses[$i]}${results[$i]:+: ${results[$i]}} | ${durations[$i]} |"
  [[ ${statuses[$i]} == FAIL ]] && failed=1
done
echo
if ((failed)); then
  echo "gpu-check: FAILED (logs in $LOG_DIR)"
  exit 1
fi
echo "gpu-check: all steps passed or were skipped for want of GPUs"
exit 0
