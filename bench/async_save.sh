#!/usr/bin/env bash
# bench/async_save: what FSDPStrategy's `async_save: true` saves a training
# step that checkpoints (Note [Saving in the background],
# lockstep/strategy/fsdp_strategy.cpp).
#
# Trains a ConvNet with a wide hidden layer (6.4 M parameters: 77 MiB of
# weights and AdamW state per DCP checkpoint) under FullyShard on 2 ranks
# over Gloo, one thread each, saving a DCP checkpoint every 5 iterations,
# with the save in the foreground and in the background, alternating which
# goes first, and once more saving only at the end; prints the median ratios
# of seconds per iteration ("Overall training speed").
#
#   bench/async_save.sh [BUILD_DIR]          # BENCH_ROUNDS=3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/rounds.sh"
bench_workspace async-save 3 "$root" "${1:-}"
config="$work/job.yaml"
cat > "$config" <<YAML
randomness: {seed: 0}
env: {num_threads: 1}
model:
  type: ConvNet
  channels: [8, 16]
  hidden: 8192
  batch_norm: false
  data_preprocessor: {type: ImgDataPreprocessor, mean: [72.94], std: [90.02]}
train_dataloader:
  batch_size: 32
  num_workers: 0
  sampler: {type: DefaultSampler, shuffle: true}
  dataset: {type: FashionMNIST, root: /usr/share/datasets/fashion-mnist, split: train}
train_cfg: {max_iters: 60}
optim_wrapper:
  optimizer: {type: AdamW, lr: 0.001, weight_decay: 0.01}
default_hooks:
  logger: {interval: 20}
  checkpoint: {interval: 5, by_epoch: false, max_keep_ckpts: 1}
strategy:
  type: FSDPStrategy
  device: cpu
  state_dict_type: dcp
  model_wrapper: {type: FullyShard, auto_wrap_policy: {type: module_type, module_types: [Conv2d, Linear]}}
YAML

run() { train_seconds_per_iter "$lockstep" "$work/run" "$config" "$@"; }
background() { run --set strategy.async_save=true; }
foreground() { run --set strategy.async_save=false; }
at_the_end() { run --set default_hooks.checkpoint.interval=1000; }

echo "async_save: ConvNet (hidden 8192), FullyShard on 2 ranks over Gloo, 60 iterations, a DCP checkpoint every 5; $rounds rounds"
median_ratio_of_rounds "$rounds" background background foreground foreground
background_ratio=$MEDIAN_RATIO
median_ratio_of_rounds "$rounds" foreground foreground "saving at the end" at_the_end
foreground_cost=$MEDIAN_RATIO
median_ratio_of_rounds "$rounds" background background "saving at the end" at_the_end
background_cost=$MEDIAN_RATIO
echo "RESULT async_save: seconds per iteration, background / foreground = $background_ratio;" \
  "against saving only at the end: foreground $foreground_cost, background $background_cost (median of $rounds rounds)"
