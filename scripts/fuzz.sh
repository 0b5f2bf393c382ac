#!/bin/sh
# Builds lockstep's libFuzzer targets with clang (ASan + UBSan) and runs each
# for a set time on its seed corpus. Findings (crash-*, oom-*, timeout-*)
# land in $FUZZ_DIR/findings/<target>/; new interesting inputs grow a working
# copy of the corpus there, never the seed corpus in the repo.
#
#   scripts/fuzz.sh                      # every target, FUZZ_SECONDS (600) each
#   FUZZ_SECONDS=60 scripts/fuzz.sh idx  # one target, one minute
#
# Needs clang and libFuzzer: scripts/install-deps.sh --extra.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$here/build-fuzz}
out=${FUZZ_DIR:-$build/runs}
seconds=${FUZZ_SECONDS:-600}
jobs=${JOBS:-2}
targets=${*:-config idx checkpoint pt jpeg png}

command -v clang++ >/dev/null || { echo "fuzz: clang++ not found; run scripts/install-deps.sh --extra" >&2; exit 2; }
cmake -S "$here/lockstep/fuzz" -B "$build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
for t in $targets; do cmake --build "$build" -j "$jobs" --target "fuzz_$t"; done

status=0
for t in $targets; do
  corpus=$out/corpus/$t
  findings=$out/findings/$t
  mkdir -p "$corpus" "$findings"
  echo "== fuzz_$t: ${seconds}s (corpus $corpus, findings $findings)"
  # -rss_limit_mb / -malloc_limit_mb: a parser that believes a header's
  # sizes and allocates gigabytes is a finding too.
  if ! (cd "$findings" && "$build/fuzz_$t" "$corpus" "$here/lockstep/fuzz/corpus/$t" \
          -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10 \
          -print_final_stats=1 2>&1 | tail -n 25); then
    status=1
  fi
  if ls "$findings" | grep -q .; then echo "fuzz_$t: findings in $findings:"; ls "$findings"; status=1; fi
done
exit $status
