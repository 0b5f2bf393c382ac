#!/usr/bin/env bash
# Multi-host tests over a real (virtual) network: two namespace hosts from
# netns_hosts.sh, each running `lockstep run --nnodes 2 --node-rank R
# --nproc-per-node 2`, against the same job on one host's loopback.
#
#   tests/multinode/multinode_test.sh SCENARIO BUILD_DIR
#
# SCENARIO
#   ddp       2 hosts x 2 processes of DDP end with the weights of 4 processes
#             on loopback, bitwise; ranks, local ranks, node groups and the
#             Gloo interface (automatic on host 0, --socket-ifname on host 1)
#             come out right
#   hybrid    the same with FSDP HYBRID_SHARD: shard groups are the hosts
#   linkdown  host 1's link is pulled mid-run: every rank on both hosts ends
#             with the timeout error, both launchers fail, nothing is left running
#   restart   the same under --max-restarts: once the link is back the job
#             resumes from its checkpoint and ends bitwise equal to a run that
#             never lost its link
#   peerfail  a worker on host 1 fails before it connects: host 1's launcher
#             announces the restart and host 0 stops its own (healthy, waiting)
#             workers at once instead of after the 120 s timeout; the job ends
#             bitwise equal to the loopback run
#   token     node 1 with another job token is refused by node 0 across the
#             network; both launchers end, nothing is left running
#   hier      the hierarchical all_reduce across the hosts (node split from the
#             launcher): equal to the flat one for every dtype and op, and DDP
#             with it (the default) ends within 1e-5 of DDP with it off
#   elastic   3 hosts x 1 process of Fashion-MNIST with --nnodes 2:3; host 2 is
#             killed for good mid-epoch: the other two go on in the next
#             rendezvous round within the last call + 30 s, every sample of the
#             interrupted epoch is trained on exactly once (index logs), and the
#             test accuracy is within 1 point of an uninterrupted run
#   grow      host 0 alone with --nnodes 1:2, FSDP with sharded checkpoints;
#             host 1 joins mid-epoch: the next round runs on both, resharding
#             the checkpoint of one rank over two, the rest of the epoch is
#             shared between them (each sample once), and the job finishes
#   mpirun    Open MPI's mpirun on host 0 starts 2 ranks on each host (host 1
#             through an rsh agent that enters its namespace), launcher: mpi
#             with MASTER_ADDR, and auto without it (lockstep built with MPI):
#             bitwise equal to the loopback run
#   etcd      3 hosts, each an etcd member (TLS, client certificates) and a
#             node of --rdzv-backend etcd --nnodes 2:3: an etcd member alone
#             killed goes unnoticed; host 0 (node 0, rank 0 and a member)
#             killed for good, then host 1: the survivors go on within 30 s,
#             each sample once; see etcd_scenarios.sh
#   slurm     a real SLURM cluster (slurmctld, two slurmd): srun, sbatch and
#   requeue   `srun ... lockstep run`, and a preempted job requeued by
#             auto_requeue; see slurm_scenarios.sh
#
# Exit 0: passed, 1: failed, 77: skipped (no root or no network namespaces).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns_hosts.sh
source "$here/netns_hosts.sh"

scenario=${1:?usage: multinode_test.sh SCENARIO BUILD_DIR}
build=$(cd "${2:?usage: multinode_test.sh SCENARIO BUILD_DIR}" && pwd)
lockstep="$build/bin/lockstep"
[ -x "$lockstep" ] || { echo "FAIL: no $lockstep (build first)"; exit 1; }

if ! why=$(netns_hosts_usable); then
  echo "SKIP: $why"
  exit 77
fi

work=$(mktemp -d /tmp/lockstep-multinode-"$scenario".XXXXXX)
cleanup() {
  declare -F slurm_cluster_down >/dev/null && slurm_cluster_down
  netns_hosts_down
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
HOSTS=2
[ "$scenario" = elastic ] || [ "$scenario" = etcd ] && HOSTS=3
netns_hosts_up "lsmn-$scenario" "$HOSTS" || { echo "FAIL: could not build the namespace hosts"; exit 1; }

fail() {
  echo "FAIL ($scenario): $*"
  for log in "$work"/*.log; do
    [ -f "$log" ] || continue
    echo "----- $(basename "$log") (last 40 lines)"
    tail -n 40 "$log"
  done
  declare -F slurm_cluster_logs >/dev/null && slurm_cluster_logs
  # Whatever is still alive on the hosts, and where it waits in the kernel.
  local host pids
  for ((host = 0; host < HOSTS; host++)); do
    pids=$(host_pids "$host" | tr '\n' ',')
    [ -n "$pids" ] && echo "----- still running on host $host" && ps -o pid,ppid,pgid,stat,wchan:24,etime,args -p "${pids%,}"
  done
  exit 1
}
expect_in() {  # file text
  grep -qF -- "$2" "$1" || fail "'$2' not in $(basename "$1")"
}

# The job every scenario trains; see the file.
cp "$here/job.yaml" "$work/job.yaml"
ddp='strategy={type: DDPStrategy, launcher: pytorch, backend: gloo}'
hybrid='strategy={type: FSDPStrategy, launcher: pytorch, backend: gloo, state_dict_type: full, model_wrapper: {sharding_strategy: HYBRID_SHARD, auto_wrap_policy: {type: size_based, min_num_params: 1000}}}'
export LOCKSTEP_JOB_TOKEN="multinode-test-$$-$RANDOM"
master=$(host_addr 0)

# train_argv WORK_DIR SETS... -> `lockstep train` argv
train_argv() {
  local dir=$1
  shift
  printf '%s\n' "$lockstep" train "$work/job.yaml" --work-dir "$dir"
  local set
  for set in "$@"; do printf '%s\n' --set "$set"; done
}

# node HOST NODE_RANK LOG MASTER [launcher args] -- command...: starts one
# node's launcher in the background on namespace host HOST.
node() {
  local host=$1 node_rank=$2 log=$3 master_addr=$4
  shift 4
  on_host "$host" timeout -k 5 240 "$lockstep" run --nnodes 2 --node-rank "$node_rank" --nproc-per-node 2 \
    --master-addr "$master_addr" --master-port 29500 "$@" >"$log" 2>&1 &
}

# two_hosts NAME [launcher args] -- command...: the job across both hosts.
# Leaves the launchers' pids in NODE_PIDS.
two_hosts() {
  local name=$1
  shift
  node 0 0 "$work/$name-host0.log" "$master" "$@"
  NODE_PIDS=($!)
  node 1 1 "$work/$name-host1.log" "$master" "$@"
  NODE_PIDS+=($!)
}

# loopback NAME [launcher args] -- command...: the same job, both "nodes" on
# host 0's loopback (its own port space, so nothing else on the machine interferes).
loopback() {
  local name=$1
  shift
  node 0 0 "$work/$name-node0.log" 127.0.0.1 "$@"
  local first=$!
  node 0 1 "$work/$name-node1.log" 127.0.0.1 "$@"
  local second=$!
  wait "$first" || fail "$name: node 0 on loopback exited with $?"
  wait "$second" || fail "$name: node 1 on loopback exited with $?"
}

wait_nodes() {  # NAME: both launchers must succeed
  wait "${NODE_PIDS[0]}" || fail "$1: host 0's launcher exited with $?"
  wait "${NODE_PIDS[1]}" || fail "$1: host 1's launcher exited with $?"
}

same_weights() {  # A B
  "$lockstep" ckpt diff "$1" "$2" >"$work/diff.log" 2>&1 || fail "weights differ: $(cat "$work/diff.log")"
  echo "$(basename "$(dirname "$1")") vs $(basename "$(dirname "$2")"): $(tail -n 1 "$work/diff.log")"
}

wait_until() {  # SECONDS WHAT COMMAND...: polls COMMAND every 0.1 s
  local seconds=$1 what=$2 i
  shift 2
  for ((i = 0; i < seconds * 10; i++)); do
    "$@" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$what did not happen within $seconds s"
}
wait_for_file() { wait_until "$2" "$1 to appear" test -e "$1"; }                        # FILE SECONDS
wait_for_text() { wait_until "$3" "'$2' in $(basename "$1")" grep -qF -- "$2" "$1"; }  # FILE TEXT SECONDS

nothing_left_running() {
  local host pids
  for ((host = 0; host < HOSTS; host++)); do
    pids=$(host_pids "$host")
    [ -z "$pids" ] || fail "left running on host $host: $(ps -o pid=,args= -p "$(echo "$pids" | paste -sd,)")"
  done
}

# Placement: what init_process_group reports on each host.
check_placement() {  # NAME
  local h0="$work/$1-host0.log" h1="$work/$1-host1.log"
  expect_in "$h0" "[rank0]: "
  expect_in "$h0" "rank 0 of 4: Gloo transport bound to $(host_addr 0)"
  expect_in "$h0" "rank 1 of 4: Gloo transport bound to $(host_addr 0)"
  expect_in "$h1" "rank 2 of 4: Gloo transport bound to GLOO_SOCKET_IFNAME=eth0"
  expect_in "$h1" "rank 3 of 4: Gloo transport bound to GLOO_SOCKET_IFNAME=eth0"
  expect_in "$h0" "rank 1 of 4: node group 'node0' = ranks [0, 1]"
  expect_in "$h1" "rank 2 of 4: node group 'node1' = ranks [2, 3]"
  expect_in "$h1" "[rank3]: "
}

# The elastic scenarios' job: Fashion-MNIST, an MLP, 2 epochs; checkpoints
# every 50 iterations. Each rank logs the sample indices of every batch it
# trains on.
fmnist_job() {
  local fmnist=/usr/share/datasets/fashion-mnist
  [ -f "$fmnist/train-images-idx3-ubyte.gz" ] || fail "no Fashion-MNIST in $fmnist (Debian package dataset-fashion-mnist)"
  cat >"$work/fmnist.yaml" <<YAML
randomness: {seed: 5}
model:
  type: MLP
  in_features: 784
  hidden: [128]
  num_classes: 10
  data_preprocessor: {type: ImgDataPreprocessor, mean: [72.94], std: [90.02]}
train_dataloader:
  batch_size: 50
  sampler: {type: DefaultSampler, shuffle: true}
  dataset: {type: FashionMNIST, root: $fmnist, split: train}
test_dataloader:
  batch_size: 1000
  sampler: {type: DefaultSampler, shuffle: false}
  dataset: {type: FashionMNIST, root: $fmnist, split: test}
test_evaluator: {type: Accuracy}
strategy: {type: DDPStrategy, launcher: pytorch, backend: gloo}
train_cfg: {max_epochs: 2}
optim_wrapper:
  optimizer: {type: SGD, lr: 0.05, momentum: 0.9}
# Decaying to a small lr makes the final accuracy a property of the run, not
# of its last few steps; at another world size it is replayed to where training resumes.
param_scheduler:
  - {type: CosineAnnealingLR, by_epoch: true, begin: 0, end: 2, T_max: 2, eta_min: 0.001}
default_hooks:
  logger: {interval: 100}
  checkpoint: {by_epoch: false, interval: 50, max_keep_ckpts: 3}
YAML
}

# elastic_node HOST NAME RANGE DIR [--set ...]: one launcher of the elastic job,
# meeting where RDZV says (node 0's store by default, etcd in the etcd scenario).
RDZV=(--master-addr "$master" --master-port 29500)
elastic_node() {
  local host=$1 name=$2 range=$3 dir=$4
  shift 4
  local sets=() set
  for set in "$@"; do sets+=(--set "$set"); done
  on_host "$host" timeout -k 5 400 "$lockstep" run --nnodes "$range" --nproc-per-node 1 \
    "${RDZV[@]}" --rdzv-conf last_call_timeout=5${RDZV_CONF:-} --max-restarts 2 -- \
    "$lockstep" train "$work/fmnist.yaml" --work-dir "$dir" "${sets[@]}" \
    --set "train_dataloader.index_log=$dir/index_rank{rank}.log" >"$work/$name-host$host.log" 2>&1 &
}
accuracy() {  # LOG...: the final test accuracy lockstep train printed (rank 0's host is any of them)
  cat "$@" | sed -n 's/.*Final test accuracy\/top1: \([0-9.]*\).*/\1/p' | tail -n 1
}

case "$scenario" in
  ddp | hybrid)
    strategy=$ddp
    [ "$scenario" = hybrid ] && strategy=$hybrid
    mapfile -t job < <(train_argv "$work/loopback" "$strategy")
    loopback loopback -- "${job[@]}"
    mapfile -t job < <(train_argv "$work/hosts" "$strategy")
    node 0 0 "$work/hosts-host0.log" "$master" -- "${job[@]}"
    NODE_PIDS=($!)
    node 1 1 "$work/hosts-host1.log" "$master" --socket-ifname eth0 -- "${job[@]}"
    NODE_PIDS+=($!)
    wait_nodes hosts
    check_placement hosts
    if [ "$scenario" = hybrid ]; then
      expect_in "$work/hosts-host0.log" "FSDP HYBRID_SHARD: rank 0 shards with ranks [0, 1] and replicates with ranks [0, 2]"
      expect_in "$work/hosts/log_rank3.txt" "FSDP HYBRID_SHARD: rank 3 shards with ranks [2, 3] and replicates with ranks [1, 3]"
    fi
    same_weights "$work/loopback/model_final.ckpt" "$work/hosts/model_final.ckpt"
    # The comparison can fail: the weights moved during training.
    if "$lockstep" ckpt diff "$work/hosts/model_final.ckpt" "$work/hosts/model_0000004.ckpt" >/dev/null 2>&1; then
      fail "the weights did not change between iterations 5 and 30"
    fi
    ;;
  linkdown)
    mapfile -t job < <(train_argv "$work/hosts" "$ddp" "train_cfg.max_iters=100000" \
      "custom_hooks=[{type: FaultInjection, step_delay_ms: 50}]")
    export LOCKSTEP_TIMEOUT_S=6
    two_hosts hosts -- "${job[@]}"
    wait_for_file "$work/hosts/model_0000009.ckpt" 120
    link_down 1
    pulled=$SECONDS
    wait "${NODE_PIDS[0]}" && fail "host 0's launcher succeeded without its peer host"
    code0=$?
    wait "${NODE_PIDS[1]}" && fail "host 1's launcher succeeded without its link"
    code1=$?
    [ "$code0" != 124 ] && [ "$code1" != 124 ] || fail "a launcher hung until the test's own timeout"
    echo "both launchers ended $((SECONDS - pulled)) s after the link went down (exit $code0, $code1)"
    # Each rank ends with its collective's error: its own timeout, or, when a
    # rank of its host timed out first and exited a moment earlier, the
    # connections that rank closed ("...which never entered it and closed
    # their connections"): a race of milliseconds, both a clear end.
    for rank in 0 1 2 3; do
      host=$((rank / 2))
      grep -Eq "^\[rank$rank\]: .*(timed out|closed their connections)" "$work/hosts-host$host.log" ||
        fail "rank $rank did not end with the timeout error (or its peer's closed connections)"
    done
    nothing_left_running
    ;;
  restart)
    mapfile -t job < <(train_argv "$work/loopback" "$ddp")
    loopback loopback -- "${job[@]}"
    mapfile -t job < <(train_argv "$work/hosts" "$ddp" "custom_hooks=[{type: FaultInjection, step_delay_ms: 150}]")
    export LOCKSTEP_TIMEOUT_S=6
    two_hosts hosts --max-restarts 3 -- "${job[@]}"
    wait_for_file "$work/hosts/model_0000009.ckpt" 120
    link_down 1
    # Host 0 notices first and waits for host 1 to join the restart; host 1
    # cannot reach node 0's store until its link is back.
    wait_for_text "$work/hosts-host0.log" "waiting for every node to join restart 1" 60
    wait_for_text "$work/hosts-host1.log" "waiting for every node to join restart 1" 60
    sleep 2
    link_up 1
    wait_nodes hosts
    for host in 0 1; do
      expect_in "$work/hosts-host$host.log" "timed out"
      expect_in "$work/hosts-host$host.log" "restarting all workers (restart 1 of 3)"
      grep -q "restart 2 of 3" "$work/hosts-host$host.log" && fail "host $host restarted twice for one lost link"
    done
    expect_in "$work/hosts-host0.log" "Restart 1 of this job: resuming"
    same_weights "$work/loopback/model_final.ckpt" "$work/hosts/model_final.ckpt"
    nothing_left_running
    ;;
  peerfail)
    mapfile -t job < <(train_argv "$work/loopback" "$ddp")
    loopback loopback -- "${job[@]}"
    mapfile -t job < <(train_argv "$work/hosts" "$ddp")
    # Rank 2 fails at start-up in the first attempt, before it ever connects:
    # the other ranks would wait in the rendezvous for the whole 120 s
    # timeout; host 0 must learn of the failure from host 1's launcher.
    export LOCKSTEP_TIMEOUT_S=120
    started=$SECONDS
    node 0 0 "$work/hosts-host0.log" "$master" --max-restarts 1 -- "${job[@]}"
    NODE_PIDS=($!)
    node 1 1 "$work/hosts-host1.log" "$master" --max-restarts 1 -- bash -c \
      'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 2 ]; then echo "rank 2 fails to start"; exit 3; fi; exec "$@"' \
      worker "${job[@]}"
    NODE_PIDS+=($!)
    wait_nodes hosts
    [ $((SECONDS - started)) -lt 60 ] || fail "the job took $((SECONDS - started)) s: host 0 waited for its timeout"
    expect_in "$work/hosts-host1.log" "worker rank 2 (pid"
    expect_in "$work/hosts-host0.log" "node 1 is restarting the job; stopping this node's workers"
    for host in 0 1; do expect_in "$work/hosts-host$host.log" "restarting all workers (restart 1 of 1)"; done
    same_weights "$work/loopback/model_final.ckpt" "$work/hosts/model_final.ckpt"
    nothing_left_running
    ;;
  token)
    mapfile -t job < <(train_argv "$work/hosts" "$ddp")
    export LOCKSTEP_TIMEOUT_S=8
    node 0 0 "$work/token-host0.log" "$master" -- "${job[@]}"
    NODE_PIDS=($!)
    LOCKSTEP_JOB_TOKEN=not-the-job-token node 1 1 "$work/token-host1.log" "$master" -- "${job[@]}"
    NODE_PIDS+=($!)
    wait "${NODE_PIDS[1]}" && fail "node 1 with a wrong token was let in"
    expect_in "$work/token-host1.log" "lockstep run: node 1 refused by the job at $master:29500: wrong job token"
    wait "${NODE_PIDS[0]}" && fail "node 0 finished a job without node 1"
    [ $? != 124 ] || fail "node 0 hung until the test's own timeout"
    nothing_left_running
    [ ! -e "$work/hosts/model_final.ckpt" ] || fail "a job with a refused node wrote a final checkpoint"
    ;;
  hier)
    # The collective itself: tests/parallel's worker, with the node split
    # each launcher reports (GROUP_RANK), not a simulated one.
    worker=(env LOCKSTEP_TEST_WORKER=1 "$build/tests/test_parallel"
      --gtest_filter=CommHookWorker.HierarchicalAllReduceMatchesFlat)
    [ -x "$build/tests/test_parallel" ] || fail "no $build/tests/test_parallel (build the parallel tests)"
    node 0 0 "$work/collective-host0.log" "$master" -- "${worker[@]}"
    NODE_PIDS=($!)
    node 1 1 "$work/collective-host1.log" "$master" --socket-ifname eth0 -- "${worker[@]}"
    NODE_PIDS+=($!)
    wait_nodes collective
    expect_in "$work/collective-host0.log" "hierarchy: 2 nodes of 2, 2 ranks"
    grep -q "FAILED" "$work"/collective-host*.log && fail "the hierarchical all_reduce differs from the flat one"
    # Training: hierarchical by default, flat when switched off.
    for mode in auto false; do
      mapfile -t job < <(train_argv "$work/$mode" \
        "strategy={type: DDPStrategy, launcher: pytorch, backend: gloo, model_wrapper: {hierarchical_all_reduce: $mode}}")
      node 0 0 "$work/$mode-host0.log" "$master" -- "${job[@]}"
      NODE_PIDS=($!)
      node 1 1 "$work/$mode-host1.log" "$master" --socket-ifname eth0 -- "${job[@]}"
      NODE_PIDS+=($!)
      wait_nodes "$mode"
    done
    expect_in "$work/auto/log.txt" "DDP reduces gradients hierarchically: 2 nodes of 2, 2 ranks"
    grep -q "reduces gradients hierarchically" "$work/false/log.txt" && fail "hierarchical_all_reduce: false still reduced hierarchically"
    "$lockstep" ckpt diff --atol 1e-5 "$work/auto/model_final.ckpt" "$work/false/model_final.ckpt" >"$work/diff.log" 2>&1 ||
      fail "hierarchical and flat DDP differ by more than 1e-5: $(cat "$work/diff.log")"
    echo "hierarchical vs flat: $(tail -n 1 "$work/diff.log")"
    nothing_left_running
    ;;
  elastic | grow)
    fmnist_job
    slow='custom_hooks=[{type: FaultInjection, step_delay_ms: 10}]'
    if [ "$scenario" = elastic ]; then
      # The uninterrupted run: 3 nodes from start to end.
      for host in 0 1 2; do
        elastic_node "$host" whole 2:3 "$work/whole"
        NODE_PIDS[$host]=$!
      done
      for host in 0 1 2; do wait "${NODE_PIDS[$host]}" || fail "whole: host $host's launcher exited with $?"; done
      # Nodes that start together are numbered in the order they reach the
      # store, as torchrun's rendezvous does: each host has one number, all differ.
      numbers=$(sed -n 's/.*rendezvous round 0: node \([0-9]\) of 3 .*/\1/p' "$work"/whole-host[012].log | sort | tr -d '\n')
      [ "$numbers" = 012 ] || fail "round 0 numbered the 3 nodes '$numbers', not 0, 1 and 2 once each"
      cat "$work"/whole-host*.log | grep -q "rendezvous round 1" && fail "the uninterrupted run had a second round"
      for host in 0 1 2; do
        elastic_node "$host" killed 2:3 "$work/killed" "$slow"
        NODE_PIDS[$host]=$!
      done
      wait_for_file "$work/killed/model_0000149.ckpt" 120
      # shellcheck disable=SC2046
      kill -9 $(host_pids 2)
      killed=$SECONDS
      # The survivors must be training again within the last call (5 s) + 30 s.
      wait_for_text "$work/killed-host0.log" "rendezvous round 1: node" 35
      echo "the job went on in rendezvous round 1 $((SECONDS - killed)) s after host 2 was killed"
      wait "${NODE_PIDS[0]}" || fail "killed: host 0's launcher exited with $?"
      wait "${NODE_PIDS[1]}" || fail "killed: host 1's launcher exited with $?"
      for host in 0 1; do expect_in "$work/killed-host$host.log" "of 2 (ranks"; done
      expect_in "$work/killed/log.txt" "saved by 3 rank(s) with batch_size 50, now 2 with batch_size 50"
      python3 "$here/check_index_log.py" 0 60000 "$work"/killed/index_rank*.log || fail "the interrupted epoch's samples"
      whole=$(accuracy "$work"/whole-host*.log)
      killed_acc=$(accuracy "$work"/killed-host[01].log)
      [ -n "$whole" ] && [ -n "$killed_acc" ] || fail "no final test accuracy (whole: '$whole', killed: '$killed_acc')"
      echo "test accuracy: uninterrupted $whole, with host 2 lost $killed_acc"
      python3 -c "import sys; sys.exit(abs($whole - $killed_acc) > 0.01)" ||
        fail "test accuracy $killed_acc is more than 1 point from the uninterrupted run's $whole"
    else
      # Under FSDP with sharded checkpoints: the one rank's checkpoint is
      # resharded over the two ranks of the next round.
      fsdp='strategy={type: FSDPStrategy, launcher: pytorch, backend: gloo, state_dict_type: sharded, model_wrapper: {sharding_strategy: FULL_SHARD}}'
      elastic_node 0 grow 1:2 "$work/grow" "$slow" "$fsdp"
      NODE_PIDS=($!)
      wait_for_file "$work/grow/model_0000149.ckpt" 120
      elastic_node 1 grow 1:2 "$work/grow" "$fsdp"
      NODE_PIDS+=($!)
      wait_nodes grow
      expect_in "$work/grow-host0.log" "rendezvous round 0: node 0 of 1"
      expect_in "$work/grow-host0.log" "a new rendezvous round is starting (1 node asked to join)"
      expect_in "$work/grow-host0.log" "rendezvous round 1: node 0 of 2"
      expect_in "$work/grow-host1.log" "rendezvous round 1: node 1 of 2"
      expect_in "$work/grow/log.txt" "saved by 1 rank(s) with batch_size 50, now 2 with batch_size 50"
      expect_in "$work/grow/log.txt" "(written by 1 rank(s), 1 per shard group) to 2 ranks"
      python3 "$here/check_index_log.py" 0 60000 "$work"/grow/index_rank*.log || fail "the interrupted epoch's samples"
      echo "test accuracy after growing: $(accuracy "$work/grow-host0.log")"
    fi
    nothing_left_running
    ;;
  mpirun)
    # Open MPI across the two hosts: mpirun runs on host 0 and starts host 1's
    # daemon through an rsh agent that enters host 1's namespace (what ssh
    # does between real machines). launcher: mpi with MASTER_ADDR, then auto
    # without it when lockstep has MPI (rank 0's address comes over MPI).
    command -v mpirun >/dev/null || { echo "SKIP: no mpirun (Debian package openmpi-bin)"; exit 77; }
    cat >"$work/netns-rsh" <<AGENT
#!/bin/bash
# Open MPI's rsh agent: HOST COMMAND... -> COMMAND run in HOST's namespace.
host=\$1
shift
case "\$host" in
  $(host_addr 0)) ns=$(host_ns 0) ;;
  $(host_addr 1)) ns=$(host_ns 1) ;;
  *) echo "netns-rsh: unknown host \$host" >&2; exit 1 ;;
esac
# Its own host name too, as a real machine has.
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$ns && \$*"
AGENT
    chmod +x "$work/netns-rsh"
    mapfile -t job < <(train_argv "$work/loopback" "$ddp")
    loopback loopback -- "${job[@]}"
    mpi_job() {  # NAME LAUNCHER [-x VAR...]
      local name=$1 launcher=$2
      shift 2
      mapfile -t job < <(train_argv "$work/$name" "strategy={type: DDPStrategy, backend: gloo, launcher: $launcher}")
      on_host 0 unshare --uts timeout -k 5 240 sh -c 'hostname "$0" && exec "$@"' "$(host_ns 0)" \
        mpirun --allow-run-as-root --oversubscribe -np 4 \
        -H "$(host_addr 0):2,$(host_addr 1):2" --mca plm_rsh_agent "$work/netns-rsh" \
        --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 --mca btl self,tcp \
        -x LOCKSTEP_JOB_TOKEN -x LOCKSTEP_TIMEOUT_S=60 -x OMP_NUM_THREADS=1 -x GLOO_SOCKET_IFNAME=eth0 "$@" \
        "${job[@]}" >"$work/$name.log" 2>&1 || fail "mpirun ($name) exited with $?"
    }
    MASTER_ADDR=$(host_addr 0) MASTER_PORT=29500 mpi_job mpi mpi -x MASTER_ADDR -x MASTER_PORT
    expect_in "$work/mpi.log" "strategy DDPStrategy (4 processes"
    expect_in "$work/mpi.log" "rank 3 of 4: Gloo transport bound to GLOO_SOCKET_IFNAME=eth0"
    expect_in "$work/mpi.log" "rank 2 of 4: node group '$(host_ns 1)' = ranks [2, 3]"
    same_weights "$work/loopback/model_final.ckpt" "$work/mpi/model_final.ckpt"
    if [ "$(cat "$build/tests/lockstep_with_mpi" 2>/dev/null)" = ON ]; then
      mpi_job auto auto
      expect_in "$work/auto.log" "rank 0 of 4: found the others over MPI_COMM_WORLD (no MASTER_ADDR): rank 0 listens at $(host_addr 0):"
      expect_in "$work/auto.log" "rank 2 of 4: node group 'node1' = ranks [2, 3]"
      same_weights "$work/loopback/model_final.ckpt" "$work/auto/model_final.ckpt"
    else
      echo "lockstep built without MPI: launcher auto without MASTER_ADDR not tried"
    fi
    nothing_left_running
    ;;
  etcd)
    # shellcheck source=etcd_scenarios.sh
    source "$here/etcd_scenarios.sh"
    etcd_scenario
    ;;
  slurm | requeue)
    # shellcheck source=slurm_scenarios.sh
    source "$here/slurm_scenarios.sh"
    slurm_scenario
    ;;
  *)
    echo "unknown scenario '$scenario'"
    exit 2
    ;;
esac
echo "PASS: $scenario"
