# The SLURM scenarios of multinode_test.sh, sourced by it (they use its
# helpers: train_argv, loopback, same_weights, expect_in, fail, ...). A real
# slurmctld and two slurmd (slurm_cluster.sh) on the two namespace hosts.
#
#   slurm     the job through srun with launcher: slurm, through sbatch with
#             launcher: auto, and as `srun ... lockstep run` (one launcher per
#             node, as users start torchrun under SLURM): each bitwise equal
#             to the same 2 x 2 job on loopback under `lockstep run`
#   requeue   an sbatch job with preemption.auto_requeue gets SIGUSR1 from
#             `scancel --signal=USR1 --full` mid-run: every rank stops after
#             the same iteration and saves, rank 0 requeues the job, SLURM
#             runs the batch script again and the job resumes, ending bitwise
#             equal to an uninterrupted run

# shellcheck source=slurm_cluster.sh
source "$here/slurm_cluster.sh"

slurm_scenario() {
  local why
  if ! why=$(slurm_cluster_usable); then
    echo "SKIP: $why"
    exit 77
  fi
  slurm_cluster_up "$work/slurm" 2 || fail "could not start the SLURM cluster: $(slurm_cluster_logs)"
  echo "SLURM cluster up: slurmctld on $(host_ns 0), slurmd on $(host_ns 0) and $(host_ns 1)"
  case "$scenario" in
    slurm) slurm_launches ;;
    requeue) slurm_requeue ;;
  esac
  nothing_left_running_but_slurm
}

# job_state JOB_ID -> "COMPLETED 1" (the state and the number of restarts).
job_state() {
  on_slurm_host 0 scontrol -o show job "$1" 2>/dev/null |
    sed -n 's/.*JobState=\([A-Z_]*\).*Restarts=\([0-9]*\).*/\1 \2/p'
}

# batch_script FILE COMMAND...: a batch script that becomes `srun COMMAND`.
# Note [exec srun in a batch script]: a signal for the whole job (scancel
# --full, `--signal=B:USR1@90`) reaches the batch shell too, and bash dies of
# SIGUSR1 while srun runs in the foreground: the job ends as FAILED and SLURM
# kills the step before any rank can save. `exec srun` leaves no shell to die.
batch_script() {
  local file=$1
  shift
  {
    echo '#!/bin/bash'
    echo 'echo "batch script on $(hostname), SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}"'
    printf 'exec srun'
    printf ' %q' "$@"
    echo
  } >"$file"
}

slurm_launches() {
  mapfile -t job < <(train_argv "$work/loopback" "$ddp")
  loopback loopback -- "${job[@]}"

  # srun, launcher: slurm (master: the first host of SLURM_NODELIST).
  mapfile -t job < <(train_argv "$work/srun" "strategy={type: DDPStrategy, backend: gloo, launcher: slurm}")
  on_slurm_host 0 timeout -k 5 240 srun --nodes 2 --ntasks-per-node 2 "${job[@]}" >"$work/srun.log" 2>&1 ||
    fail "srun exited with $?"
  expect_in "$work/srun.log" "rank 0 of 4: Gloo transport bound to $(host_addr 0)"
  expect_in "$work/srun.log" "rank 3 of 4: Gloo transport bound to $(host_addr 1)"
  expect_in "$work/srun.log" "rank 2 of 4: node group 'node1' = ranks [2, 3]"
  same_weights "$work/loopback/model_final.ckpt" "$work/srun/model_final.ckpt"

  # sbatch, launcher: auto.
  mapfile -t job < <(train_argv "$work/sbatch" "strategy={type: DDPStrategy, backend: gloo, launcher: auto}")
  batch_script "$work/sbatch.sh" "${job[@]}"
  on_slurm_host 0 timeout -k 5 240 sbatch --wait --nodes 2 --ntasks-per-node 2 -o "$work/sbatch.log" \
    "$work/sbatch.sh" >"$work/sbatch-submit.log" 2>&1 || fail "sbatch --wait exited with $?: $(cat "$work/sbatch-submit.log")"
  expect_in "$work/sbatch.log" "batch script on $(host_ns 0)"
  same_weights "$work/loopback/model_final.ckpt" "$work/sbatch/model_final.ckpt"

  # srun starting one `lockstep run` per node, as users start torchrun.
  mapfile -t job < <(train_argv "$work/srun-run" "strategy={type: DDPStrategy, backend: gloo, launcher: auto}")
  # shellcheck disable=SC2016
  on_slurm_host 0 timeout -k 5 240 srun --nodes 2 --ntasks-per-node 1 bash -c \
    'exec "$0" run --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --nproc-per-node 2 \
       --master-addr "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)" --master-port 29400 -- "$@"' \
    "$lockstep" "${job[@]}" >"$work/srun-run.log" 2>&1 || fail "srun ... lockstep run exited with $?"
  expect_in "$work/srun-run.log" "rank 2 of 4: node group 'node1' = ranks [2, 3]"
  same_weights "$work/loopback/model_final.ckpt" "$work/srun-run/model_final.ckpt"
}

slurm_requeue() {
  # 300 iterations of 20 ms or more: the signal comes while the job trains.
  local long=("train_cfg.max_iters=300" "custom_hooks=[{type: FaultInjection, step_delay_ms: 20}]")
  mapfile -t job < <(train_argv "$work/loopback" "$ddp" "${long[@]}")
  loopback loopback -- "${job[@]}"

  mapfile -t job < <(train_argv "$work/requeued" "strategy={type: DDPStrategy, backend: gloo, launcher: slurm}" \
    "${long[@]}" "preemption={auto_requeue: true}")
  batch_script "$work/requeue.sh" "${job[@]}"
  local id
  id=$(on_slurm_host 0 sbatch --parsable --requeue --open-mode=append --nodes 2 --ntasks-per-node 2 \
    -o "$work/requeue.log" "$work/requeue.sh") || fail "sbatch failed: $id"
  wait_for_file "$work/requeued/model_0000019.ckpt" 120
  # Now what `#SBATCH --signal=USR1@90` does ninety seconds before a time
  # limit; --full signals the batch shell as well (Note [exec srun in a batch
  # script]).
  on_slurm_host 0 scancel --signal=USR1 --full "$id" || fail "scancel --signal=USR1 --full failed"
  echo "job $id: SIGUSR1 sent by scancel"
  requeued_and_completed() { [ "$(job_state "$id")" = "COMPLETED 1" ]; }
  wait_until 180 "job $id to be requeued once and complete" requeued_and_completed
  local log="$work/requeue.log" stop
  expect_in "$log" "SIGUSR1 received: stopping at the iteration every rank agrees on"
  expect_in "$log" "requeued SLURM job $id (scontrol requeue)"
  expect_in "$log" "SLURM_RESTART_COUNT=1"
  expect_in "$log" "SLURM requeued this job (1 time(s)): resuming from the last good checkpoint"
  stop=$(sed -n 's/.*Stopping training after iteration \([0-9]*\): stop signal received.*/\1/p' "$log" | head -n 1)
  [ -n "$stop" ] && [ "$stop" -lt 299 ] || fail "the job did not stop early (stopped after iteration '${stop}')"
  expect_in "$log" "Starting training from iteration $((stop + 1))"
  echo "job $id stopped after iteration $stop of 300, was requeued and resumed from $((stop + 1))"
  same_weights "$work/loopback/model_final.ckpt" "$work/requeued/model_final.ckpt"
}

nothing_left_running_but_slurm() {
  local host pids pid others=""
  for ((host = 0; host < HOSTS; host++)); do
    pids=$(host_pids "$host")
    for pid in $pids; do
      case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
        slurmctld | slurmd | slurmstepd | slurmscriptd) ;;
        *) others+="$pid " ;;
      esac
    done
  done
  [ -z "$others" ] || fail "left running: $(ps -o pid=,args= -p "$(echo "$others" | xargs | tr ' ' ,)")"
}
