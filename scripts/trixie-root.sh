#!/usr/bin/env bash
# Builds (once) a Debian trixie root with libtorch 2.x and runs a command inside
# it with the lockstep checkout bind-mounted at /src. This is the libtorch 2.x
# leg of CI: the same sources, configured and tested against Debian trixie's
# libtorch-dev (2.6) instead of bookworm's 1.13.
#
#   scripts/trixie-root.sh make test          # run the test suite under libtorch 2.x
#   TRIXIE_ROOT=/var/tmp/t scripts/trixie-root.sh bash
set -euo pipefail
# debootstrap, chroot and mount need root.
if [[ $(id -u) -ne 0 ]]; then exec sudo --preserve-env=TRIXIE_ROOT,DEBIAN_MIRROR "$0" "$@"; fi
here=$(cd "$(dirname "$0")/.." && pwd)
root=${TRIXIE_ROOT:-/var/tmp/lockstep-trixie}
mirror=${DEBIAN_MIRROR:-}
if [[ -z "$mirror" ]]; then
  mirror=$(grep -hoE '^(deb|URIs:) *(\[[^]]*\] *)?https?://[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
           | grep -oE 'https?://[^ ]+' | grep -v security | head -n1 || true)
  if [[ -z "$mirror" ]]; then
    echo "trixie-root: no Debian mirror in /etc/apt/sources.list{,.d/*}; set DEBIAN_MIRROR to the archive's URL" >&2
    exit 1
  fi
fi

need=(g++ cmake make ccache libtorch-dev libgloo-dev libopenblas0-openmp libyaml-cpp-dev
      nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev zlib1g-dev libgtest-dev libgmock-dev
      dataset-fashion-mnist python3-numpy protobuf-compiler fortunes procps iproute2 psmisc)

if [[ ! -f "$root/.lockstep-ready" ]]; then
  command -v debootstrap >/dev/null || "$here/scripts/install-deps.sh" --chroot
  echo "trixie-root: debootstrap into $root from $mirror"
  rm -rf "$root"
  debootstrap --variant=minbase trixie "$root" "$mirror" >/dev/null
  mount --bind /proc "$root/proc"
  trap 'umount "$root/proc" 2>/dev/null || true' EXIT
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  umount "$root/proc"; trap - EXIT
  touch "$root/.lockstep-ready"
fi

mkdir -p "$root/src" "$root/dev" "$root/proc"
((${#@})) || set -- bash
# The bind mounts live in a private mount namespace: they vanish with this
# command and never disturb another invocation running at the same time.
exec unshare --mount --propagation private bash -c '
  root=$1; here=$2; shift 2
  mount --bind /proc "$root/proc"
  mount --bind /dev "$root/dev"
  mount --bind "$here" "$root/src"
  exec chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    LOCKSTEP_SKIP_INSTALL=1 TERM=dumb bash -c "cd /src && \"\$@\"" bash "$@"
' bash "$root" "$here" "$@"
