#!/usr/bin/env bash
# Installs every build, test and demo dependency of lockstep from Debian's
# archive. Quick when everything is already there: it asks dpkg first and only
# calls apt-get for what is missing.
#
#   scripts/install-deps.sh          # what `make demo` and `make test` need
#   scripts/install-deps.sh --chroot # plus debootstrap (the libtorch 2.x CI leg)
#   scripts/install-deps.sh --extra  # plus debootstrap and clang (sanitizer builds)
set -euo pipefail

packages=(
  g++ cmake make ccache pkg-config
  libtorch-dev libgloo-dev libopenblas0-openmp
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev zlib1g-dev
  libjpeg62-turbo-dev libpng-dev
  libgtest-dev libgmock-dev
  dataset-fashion-mnist
  python3-torch python3-numpy python3-torchvision python3-pil
  protobuf-compiler
  fortunes
  iproute2 procps psmisc
  gfortran openmpi-bin libopenmpi-dev
  slurm-wlm slurmctld slurmd slurm-client munge util-linux
  etcd-server etcd-client libcurl4-openssl-dev openssl
)
case "${1:-}" in
  --chroot) packages+=(debootstrap) ;;
  --extra) packages+=(debootstrap clang libclang-rt-14-dev) ;;
  "") ;;
  *) echo "install-deps: unknown option '$1' (use --chroot or --extra)" >&2; exit 2 ;;
esac

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
