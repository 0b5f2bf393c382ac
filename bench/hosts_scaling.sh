#!/usr/bin/env bash
# bench/hosts_scaling: one whole DDP job across namespace hosts, each with its
# own port space (tests/multinode/netns_hosts.sh), as a cluster of HOSTS
# machines with NPROC ranks each would run it: `lockstep run --nnodes HOSTS`
# on every host, `lockstep train` of a small MLP (batch 1 per rank, 2
# iterations, a log line per iteration, a checkpoint). Prints the wall time,
# when rank 0 logged its first iteration, and the store operations each rank
# logged for its world group (Note [One table of Gloo addresses]). Root only.
#
#   bench/hosts_scaling.sh [BUILD_DIR]       # HOSTS=8 NPROC=16
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
hosts=${HOSTS:-8}
nproc=${NPROC:-16}
# shellcheck source-path=SCRIPTDIR source=../tests/multinode/netns_hosts.sh
source "$here/../tests/multinode/netns_hosts.sh"
why=$(netns_hosts_usable) || { echo "hosts_scaling: $why"; exit 1; }
work=$(mktemp -d /tmp/lockstep-bench-hosts.XXXXXX)
netns_hosts_up lshs "$hosts"
trap 'netns_hosts_down; rm -rf "$work"' EXIT
cat >"$work/job.yaml" <<YAML
randomness: {seed: 5}
strategy: {type: DDPStrategy, launcher: pytorch, backend: gloo}
model:
  type: MLP
  in_features: 64
  hidden: [32]
  data_preprocessor: {type: ImgDataPreprocessor, mean: [100.0], std: [60.0]}
train_dataloader:
  batch_size: 1
  sampler: {type: DefaultSampler, shuffle: true}
  dataset: {type: SyntheticImages, size: $((hosts * nproc * 2)), height: 8, width: 8, seed: 1}
train_cfg: {max_iters: 2, by_epoch: false}
optim_wrapper:
  optimizer: {type: SGD, lr: 0.05, momentum: 0.9}
default_hooks:
  logger: {interval: 1}
  checkpoint: {by_epoch: false, interval: 2}
YAML
start=$(date +%s.%N)
pids=()
for ((h = 0; h < hosts; ++h)); do
  on_host "$h" env LOCKSTEP_JOB_TOKEN="hosts-scaling-$$" OMP_NUM_THREADS=1 timeout -k 5 600 \
    "$build/bin/lockstep" run --nnodes "$hosts" --node-rank "$h" --nproc-per-node "$nproc" \
    --master-addr "$(host_addr 0)" --master-port 29500 -- \
    "$build/bin/lockstep" train "$work/job.yaml" --work-dir "$work/run" >"$work/host$h.log" 2>&1 &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
wall=$(echo "$(date +%s.%N) - $start" | bc)
if [ "$rc" != 0 ] || [ ! -f "$work/run/model_final.ckpt" ]; then
  echo "hosts_scaling: the job failed (exit $rc); host 0's log:"
  tail -30 "$work/host0.log"
  exit 1
fi
first=$(grep -m1 "iter: 0/" "$work/host0.log" | grep -o '[0-9][0-9]:[0-9][0-9]:[0-9][0-9]')
echo "hosts_scaling: $hosts hosts x $nproc ranks trained (2 iterations, a checkpoint) in ${wall} s; rank 0's first" \
  "iteration logged at $first (started at $(date -d "@${start%.*}" +%T))"
ops=$(grep -h "world group ready after" "$work"/host*.log | grep -o 'rank [0-9]* of [0-9]*: world group ready after [0-9]*' |
  awk '{print $2, $NF}')
echo "hosts_scaling: store operations for the world group: rank 0 $(echo "$ops" | awk '$1 == 0 {print $2}');" \
  "the other ranks $(echo "$ops" | awk '$1 != 0 {print $2}' | sort -n | awk '{a[NR] = $1} END {print "min", a[1], "median", a[int((NR + 1) / 2)], "max", a[NR]}')"
