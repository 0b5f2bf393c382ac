#!/usr/bin/env bash
# Installs lockstep's dependencies from Debian's archive, by part. Quick when
# everything is already there: it asks dpkg first and only calls apt-get for
# what is missing.
#
#   scripts/install-deps.sh demo      # what `make demo` needs: build the library and the CLI, train on Fashion-MNIST
#   scripts/install-deps.sh           # every part: what `make test` needs
#   scripts/install-deps.sh --chroot  # every part, plus debootstrap (the libtorch 2.x CI leg)
#   scripts/install-deps.sh --extra   # every part, plus debootstrap and clang's runtime (sanitizer builds, fuzzing)
#   scripts/install-deps.sh --list demo   # print a part's packages, install nothing
#
# Note [What make demo installs]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# A newcomer's first command should install what it uses and no more: the
# compilers (clang and Ninja for its quick build, Note [The demo's quick build]
# in the Makefile; g++, which a new machine has, for the rest), CMake,
# libtorch, Gloo's headers, the config, log and image libraries and
# Fashion-MNIST. The cluster's tools (SLURM, etcd, MPI, gfortran, libcurl) and the tests' (GoogleTest, the PyTorch reference) come
# with `make test`. CMake treats the later parts as optional (MPI, Fortran,
# libcurl for the etcd rendezvous, GoogleTest for the tests) and looks for them
# again at every configure, so a build folder made by `make demo` gains them
# when `make test` has installed them. One list, in named parts, so that the
# two commands cannot drift apart.
set -euo pipefail

# The demo: build the library and bin/lockstep, train the Fashion-MNIST CNN.
# clang and ninja: the demo's quick build (Note [The demo's quick build], Makefile).
demo=(
  g++ clang ninja-build cmake make ccache pkg-config
  libtorch-dev libgloo-dev libopenblas0-openmp
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev zlib1g-dev
  libjpeg62-turbo-dev libpng-dev
  dataset-fashion-mnist
)
# The tests: GoogleTest, the PyTorch reference, TensorBoard's schema, the
# fortunes text, rsvg-convert (lockstep plot --png), network namespaces and
# process tools.
tests=(
  libgtest-dev libgmock-dev
  python3-torch python3-numpy python3-torchvision python3-pil
  protobuf-compiler
  fortunes
  librsvg2-bin
  iproute2 procps psmisc
)
# The cluster: MPI and Fortran (the C API's in-situ programs), SLURM, etcd and
# libcurl (the etcd rendezvous).
cluster=(
  gfortran openmpi-bin libopenmpi-dev
  slurm-wlm slurmctld slurmd slurm-client munge util-linux
  etcd-server etcd-client libcurl4-openssl-dev openssl
)

list_only=0
if [[ "${1:-}" == "--list" ]]; then
  list_only=1
  shift
fi
case "${1:-}" in
  demo) packages=("${demo[@]}") ;;
  "") packages=("${demo[@]}" "${tests[@]}" "${cluster[@]}") ;;
  --chroot) packages=("${demo[@]}" "${tests[@]}" "${cluster[@]}" debootstrap) ;;
  --extra) packages=("${demo[@]}" "${tests[@]}" "${cluster[@]}" debootstrap libclang-rt-14-dev) ;;
  *) echo "install-deps: unknown part '$1' (use demo, --chroot or --extra, or nothing for every part)" >&2; exit 2 ;;
esac
if ((list_only)); then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
# slurmctld, slurmd, munge and etcd would start their services on installation,
# where an init system runs: the tests start daemons of their own, under
# their own configuration, and the packaged ones would only fail (no
# /etc/slurm/slurm.conf) and fail the installation with them. So, where the
# machine has no policy-rc.d, one that refuses every start is in place for
# the installation only.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee "$policy" >/dev/null
  "${sudo_cmd[@]}" chmod +x "$policy"
  trap '"${sudo_cmd[@]}" rm -f "$policy"' EXIT
fi
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
