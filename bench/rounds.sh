# bench/rounds.sh: sourced by the shell benches that time one job in two
# settings (stop_vote.sh, memory_format.sh). Machines here are noisy, so the
# settings alternate which goes first in each round and the median ratio is
# the result.
#
#   source "$(dirname "$0")/rounds.sh"
#   bench_workspace my-bench 3 "$root" "${1:-}"      # build, lockstep, rounds, work
#   a() { train_seconds_per_iter "$lockstep" "$work/run" job.yaml; }
#   b() { train_seconds_per_iter "$lockstep" "$work/run" job.yaml --set key=value; }
#   median_ratio_of_rounds 5 "as configured" a "with key=value" b "mlp"   # sets MEDIAN_RATIO

# The variables every such bench starts from: build (BUILD_DIR, default
# ROOT/build), lockstep, rounds (BENCH_ROUNDS, else DEFAULT_ROUNDS) and work,
# a scratch directory removed when the script exits.
bench_workspace() {  # NAME DEFAULT_ROUNDS ROOT [BUILD_DIR]
  build=$(cd "${4:-$3/build}" && pwd)
  lockstep="$build/bin/lockstep"
  rounds=${BENCH_ROUNDS:-$2}
  work=$(mktemp -d "/tmp/lockstep-bench-$1.XXXXXX")
  trap 'rm -rf "$work"' EXIT
}

# Seconds per iteration of `lockstep train CONFIG --nproc 2` (the
# IterationTimer's "Overall training speed"), one thread per rank; the work
# dir is removed afterwards.
train_seconds_per_iter() {  # LOCKSTEP WORK_DIR CONFIG [ARGS...]
  local lockstep=$1 work_dir=$2 config=$3
  shift 3
  OMP_NUM_THREADS=1 "$lockstep" train "$config" --nproc 2 --work-dir "$work_dir" "$@" 2>&1 |
    sed -n 's/.*Overall training speed: .*(\([0-9.]*\) s \/ it).*/\1/p' | head -n 1
  rm -rf "$work_dir"
}

# Runs A and B (functions that print seconds per iteration) ROUNDS times,
# alternating which goes first; prints each round and sets MEDIAN_RATIO to the
# median of A / B.
median_ratio_of_rounds() {  # ROUNDS LABEL_A A LABEL_B B [WHAT]
  local rounds=$1 label_a=$2 run_a=$3 label_b=$4 run_b=$5 what=${6:-}
  local round a b ratio ratios=()
  for ((round = 0; round < rounds; round++)); do
    if ((round % 2 == 0)); then
      a=$($run_a)
      b=$($run_b)
    else
      b=$($run_b)
      a=$($run_a)
    fi
    ratio=$(python3 -c "print(f'{$a / $b:.3f}')")
    ratios+=("$ratio")
    echo "  round $round${what:+ $what}: $label_a $a s/it, $label_b $b s/it ($ratio)"
  done
  MEDIAN_RATIO=$(printf '%s\n' "${ratios[@]}" | sort -n | sed -n "$(((rounds + 1) / 2))p")
}
