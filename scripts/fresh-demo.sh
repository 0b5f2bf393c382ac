#!/usr/bin/env bash
# `make demo` as on a new machine: inside a bare Debian bookworm root
# (scripts/trixie-root.sh --fresh: debootstrap's minbase and nothing more),
# with an empty compiler cache and a build folder of its own. It prints the
# time from the command to the demo's accuracy and checks that the demo
# installed none of what only `make test` needs (Note [What make demo
# installs]). Then, in the same root, the rest: `scripts/install-deps.sh`
# installs every other part and the demo's build folder, configured again,
# must find what CMake treats as optional (MPI, gfortran, libcurl, GoogleTest).
#
#   make fresh-demo        # = scripts/trixie-root.sh --fresh scripts/fresh-demo.sh
#
# A new machine of this project's kind comes with make, g++ and CMake
# (its description lists them among what every new machine has); minbase has none,
# so they are installed before the clock starts, as they would be there. The
# rest (clang, libtorch, the dataset, ...) the demo installs, on the clock.
# Each line of the log carries the seconds since the start, so the install,
# the build and the training can be read apart.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${DEMO_BUILD_DIR:-build-fresh-demo}
export CCACHE_DIR=/tmp/fresh-demo-ccache DEBIAN_FRONTEND=noninteractive
rm -rf "$BUILD_DIR" "$CCACHE_DIR" work_dirs/demo
fail() { echo "fresh-demo: $*" >&2; exit 1; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

apt-get update -qq
apt-get install -y -qq --no-install-recommends make g++ cmake >/dev/null

start=$SECONDS
make demo DEMO_BUILD_DIR="$BUILD_DIR" 2>&1 | while IFS= read -r line; do
  printf '[%4d s] %s\n' $((SECONDS - start)) "$line"
done | tee /tmp/fresh-demo.log
demo_seconds=$((SECONDS - start))
grep -q "Final test accuracy/top1: " /tmp/fresh-demo.log || fail "the demo printed no accuracy"
accuracy=$(grep -o "Final test accuracy/top1: [0-9.]*" /tmp/fresh-demo.log | grep -o "[0-9.]*$")
[[ -f work_dirs/demo/curves.svg ]] || fail "the demo drew no curves"
for package in slurm-wlm slurmd etcd-server openmpi-bin libopenmpi-dev gfortran libcurl4-openssl-dev libgtest-dev \
               python3-torch; do
  installed "$package" && fail "make demo installed $package, which only make test needs"
done
echo "fresh-demo: make demo took ${demo_seconds} s in a bare bookworm root (test accuracy ${accuracy});" \
     "it installed none of SLURM, etcd, MPI, gfortran, libcurl, GoogleTest or the PyTorch reference"

# The rest, as `make test` installs it: the demo's build folder now finds it.
scripts/install-deps.sh >/dev/null
cmake -S . -B "$BUILD_DIR" 2>&1 | tee /tmp/fresh-configure.log | grep "lockstep:" || true
grep -q "lockstep: MPI ON" /tmp/fresh-configure.log || fail "the demo's build folder did not find MPI after make test's install"
grep -q "lockstep: libcurl (the etcd rendezvous) TRUE" /tmp/fresh-configure.log \
  || fail "the demo's build folder did not find libcurl after make test's install"
grep -q "lockstep: Fortran module ON" /tmp/fresh-configure.log || fail "the demo's build folder did not find gfortran"
grep -q "lockstep: no tests" /tmp/fresh-configure.log && fail "the demo's build folder did not find GoogleTest"
echo "fresh-demo: after scripts/install-deps.sh the demo's build folder finds MPI, gfortran, libcurl and GoogleTest"
