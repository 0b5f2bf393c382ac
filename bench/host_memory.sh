#!/usr/bin/env bash
# bench/host_memory: what keeping freed memory in the process buys a CPU run
# (Note [Freed activations stay in the process], core/host_memory_policy.cpp).
#
# Trains the demo's ConvNet (BatchNorm, batch 64, SyncBatchNorm too) on 2
# ranks with one thread each, with the policy (the default) and without it
# (env.keep_freed_host_memory: false), alternating in rounds, and prints the
# median ratios of seconds per iteration ("Overall training speed") and of
# the minor page faults of the whole job (GNU time's %R counts the ranks,
# which the command waits for).
#
#   bench/host_memory.sh [BUILD_DIR]          # BENCH_ROUNDS=5 BENCH_ITERS=150
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
lockstep="$build/bin/lockstep"
rounds=${BENCH_ROUNDS:-5}
iters=${BENCH_ITERS:-150}
work=$(mktemp -d /tmp/lockstep-bench-host-memory.XXXXXX)
trap 'rm -rf "$work"' EXIT
[[ -x /usr/bin/time ]] || { echo "host_memory: needs GNU time (/usr/bin/time, Debian's package time)" >&2; exit 1; }

cat >"$work/cnn.yaml" <<YAML
randomness: {seed: 3}
model: {type: ConvNet, channels: [32, 64], hidden: 128, batch_norm: true,
        data_preprocessor: {type: ImgDataPreprocessor, mean: [100.0], std: [60.0]}}
train_dataloader:
  batch_size: 64
  sampler: {type: DefaultSampler, shuffle: true}
  dataset: {type: SyntheticImages, size: 20000, height: 28, width: 28, seed: 1}
train_cfg: {max_iters: $iters, by_epoch: false}
optim_wrapper: {optimizer: {type: SGD, lr: 0.01, momentum: 0.9}}
strategy: {type: DDPStrategy, backend: gloo, sync_bn: torch}
default_hooks:
  logger: {interval: 1000}
  checkpoint: null
YAML

run() {  # KEEP(true|false) -> "seconds_per_iter faults"
  local out
  out=$(OMP_NUM_THREADS=1 /usr/bin/time -f "minor faults %R" "$lockstep" train "$work/cnn.yaml" --nproc 2 \
          --work-dir "$work/run" --set "env.keep_freed_host_memory=$1" 2>&1)
  rm -rf "$work/run"
  echo "$(sed -n 's/.*Overall training speed: .*(\([0-9.]*\) s \/ it).*/\1/p' <<<"$out" | head -n 1)" \
       "$(sed -n 's/^minor faults \([0-9]*\)$/\1/p' <<<"$out" | tail -n 1)"
}

echo "host_memory: ConvNet [32, 64] + BatchNorm (SyncBatchNorm), batch 64, 2 ranks, Gloo, 1 thread each," \
     "$iters iterations; freed memory kept (default) and given back (env.keep_freed_host_memory: false); $rounds rounds"
time_ratios=() fault_ratios=()
for ((round = 0; round < rounds; round++)); do
  if ((round % 2 == 0)); then read -r kept_s kept_f < <(run true); read -r back_s back_f < <(run false)
  else read -r back_s back_f < <(run false); read -r kept_s kept_f < <(run true); fi
  time_ratios+=("$(python3 -c "print(f'{$kept_s / $back_s:.3f}')")")
  fault_ratios+=("$(python3 -c "print(f'{$kept_f / $back_f:.4f}')")")
  echo "  round $round: kept $kept_s s/it, $kept_f faults; given back $back_s s/it, $back_f faults" \
       "(${time_ratios[-1]}, ${fault_ratios[-1]})"
done
median() { printf '%s\n' "$@" | sort -n | sed -n "$((($# + 1) / 2))p"; }
echo "RESULT host_memory: seconds per iteration kept / given back = $(median "${time_ratios[@]}")," \
     "minor page faults kept / given back = $(median "${fault_ratios[@]}") (medians of $rounds rounds)"
