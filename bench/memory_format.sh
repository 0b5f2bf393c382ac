#!/usr/bin/env bash
# bench/memory_format: what `model.memory_format: channels_last` saves the
# demo's step (Note [Which layout a tensor is in], lockstep/model/memory_format.cpp).
#
# Trains `make demo`'s job (examples/fashion_mnist/cnn_ddp.yaml: the ConvNet,
# 2 ranks of DDP over Gloo, one thread each) for one epoch with the weights
# and inputs channels-last (the example's setting) and contiguous
# (`--set model.memory_format=contiguous_format`), alternating which goes
# first, and prints the median ratio of seconds per iteration ("Overall
# training speed" of the IterationTimer).
#
#   bench/memory_format.sh [BUILD_DIR]          # BENCH_ROUNDS=3
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/bench/rounds.sh"
bench_workspace memory-format 3 "$root" "${1:-}"
config="$root/examples/fashion_mnist/cnn_ddp.yaml"
epoch() { train_seconds_per_iter "$lockstep" "$work/run" "$config" --set train_cfg.max_epochs=1 "$@"; }
channels_last() { epoch --set model.memory_format=channels_last; }
contiguous() { epoch --set model.memory_format=contiguous_format; }

echo "memory_format: make demo's ConvNet, 2 ranks, DDP over Gloo, 1 thread each, one epoch; $rounds rounds"
median_ratio_of_rounds "$rounds" channels_last channels_last contiguous_format contiguous
echo "RESULT memory_format: seconds per iteration, channels_last / contiguous_format = $MEDIAN_RATIO" \
  "(median of $rounds rounds)"
