#!/usr/bin/env bash
# bench/stop_vote: what the per-iteration stop vote costs a distributed run.
#
# Since preemption (runner/preemption.h) is on by default, every distributed
# `lockstep train` agrees after each iteration whether any rank asked to stop:
# one 4-byte all-reduce (Trainer::agree_on_stop). This trains the same 2-rank
# DDP job with it (the default) and without it (preemption.signals: []),
# alternating in rounds, and prints the median ratio of seconds per iteration
# ("Overall training speed" of the IterationTimer). Two models: an MLP whose
# step takes about a millisecond (the worst case for a fixed cost per step)
# and the demo's ConvNet.
#
#   bench/stop_vote.sh [BUILD_DIR]          # BENCH_ROUNDS=5
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/rounds.sh"
bench_workspace stop-vote 5 "$root" "${1:-$PWD/build}"

job() {  # MODEL_LINE BATCH ITERS
  cat <<YAML
randomness: {seed: 3}
model: $1
train_dataloader:
  batch_size: $2
  sampler: {type: DefaultSampler, shuffle: true}
  dataset: {type: SyntheticImages, size: 4096, height: 28, width: 28, seed: 1}
train_cfg: {max_iters: $3, by_epoch: false}
optim_wrapper: {optimizer: {type: SGD, lr: 0.01, momentum: 0.9}}
strategy: {type: DDPStrategy, backend: gloo}
default_hooks:
  logger: {interval: 1000}
  checkpoint: null
YAML
}
job "{type: MLP, in_features: 784, hidden: [64], data_preprocessor: {type: ImgDataPreprocessor, mean: [100.0], std: [60.0]}}" 16 400 >"$work/mlp.yaml"
job "{type: ConvNet, data_preprocessor: {type: ImgDataPreprocessor, mean: [100.0], std: [60.0]}}" 64 40 >"$work/cnn.yaml"

with_vote() { train_seconds_per_iter "$lockstep" "$work/run" "$work/$model.yaml"; }
without_vote() { train_seconds_per_iter "$lockstep" "$work/run" "$work/$model.yaml" --set 'preemption={signals: []}'; }

echo "stop_vote: 2 ranks, Gloo, CPU, 1 thread each; with the vote (default) and without (preemption.signals: []); $rounds rounds"
for model in mlp cnn; do
  median_ratio_of_rounds "$rounds" "with the vote" with_vote "without" without_vote "$model"
  echo "RESULT stop_vote $model: seconds per iteration with / without the stop vote = $MEDIAN_RATIO (median of $rounds rounds)"
done
