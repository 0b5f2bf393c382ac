#!/usr/bin/env bash
# Builds (once) a Debian trixie root with libtorch 2.x and runs a command inside
# it with the lockstep checkout bind-mounted at /src. Two flavours:
#
#   default  libtorch-dev 2.6 (CPU, Gloo) and python3-torch 2.6: the libtorch
#            2.x leg of CI.
#   --cuda   libtorch-cuda-dev 2.6, nvidia-cuda-dev 12.4, libnccl-dev 2.22,
#            libgloo-cuda-dev and nvidia-cuda-toolkit (nvcc: libtorch's CMake
#            config enables the CUDA language): a CUDA build of libtorch to
#            compile, link and test lockstep's CUDA/NCCL path against on a
#            machine without a GPU (about 7.8 GB, 3 minutes from a near mirror);
#            and python3-torch-cuda 2.6, against which CI runs the
#            differential suite on this build's CPU code.
#
#   --forky  not trixie: Debian forky (testing) with libtorch-dev 2.14 and
#            python3-torch 2.14 (CPU, Gloo; Python 3.14, GCC 16): the
#            libtorch users install today, which needs C++20 (Note [One C++
#            standard per libtorch]). The archive's forky Release file may be
#            past its Valid-Until date; apt is told not to check it there.
#
#   --fresh  not trixie: a bare Debian bookworm root (debootstrap's minbase,
#            nothing installed after it), made anew each time, where a
#            command installs what it needs itself, as on a new machine
#            (scripts/fresh-demo.sh times `make demo` there).
#
#   --kit-proof  not trixie: a Debian bookworm root with libtorch-dev 1.13 and
#            a compiler but none of the -dev packages lockstep builds with
#            (those libtorch-dev pulls in are removed): where the offline GPU
#            kit proves it holds everything else (scripts/kit-proof.sh).
#
#   scripts/trixie-root.sh make test                 # the test suite under libtorch 2.x
#   scripts/trixie-root.sh --cuda make cuda-check    # compile every CUDA-dependent file
#   TRIXIE_ROOT=/var/tmp/t scripts/trixie-root.sh bash
#
# The CUDA packages depend on two things the archive cannot give a GPU-less
# machine: `nvidia-cudnn`, an installer that downloads cuDNN from the internet,
# and the driver's `libcuda1`. A local stand-in package (lockstep-cuda-standins)
# provides both names. At run time the stand-ins are libraries that answer
# "no device": libcuda.so.1 is the toolkit's own stub (every call returns
# CUDA_ERROR_STUB_LIBRARY) and libcudnn.so.9 is generated from the cudnn*
# symbols libtorch_cuda imports, each returning an error status. So programs
# link and run, and torch::cuda::is_available() is false.
set -euo pipefail
# debootstrap, chroot and mount need root.
if [[ $(id -u) -ne 0 ]]; then exec sudo --preserve-env=TRIXIE_ROOT,DEBIAN_MIRROR "$0" "$@"; fi
cuda=0 kit_proof=0 fresh=0 forky=0 suite=trixie
if [[ "${1:-}" == "--cuda" ]]; then cuda=1; shift; fi
if [[ "${1:-}" == "--forky" ]]; then forky=1; suite=forky; shift; fi
if [[ "${1:-}" == "--kit-proof" ]]; then kit_proof=1; suite=bookworm; shift; fi
if [[ "${1:-}" == "--fresh" ]]; then fresh=1; suite=bookworm; shift; fi
here=$(cd "$(dirname "$0")/.." && pwd)
if [[ $cuda == 1 ]]; then root=${TRIXIE_ROOT:-/var/tmp/lockstep-trixie-cuda}; else root=${TRIXIE_ROOT:-/var/tmp/lockstep-trixie}; fi
[[ $kit_proof == 1 ]] && root=${TRIXIE_ROOT:-/var/tmp/lockstep-kit-proof}
[[ $forky == 1 ]] && root=${TRIXIE_ROOT:-/var/tmp/lockstep-forky}
# apt in a testing root: its Release file's Valid-Until may have passed on a
# mirror that is not refreshed daily.
apt_options=()
[[ $forky == 1 ]] && apt_options=(-o Acquire::Check-Valid-Until=false)
if [[ $fresh == 1 ]]; then
  root=${TRIXIE_ROOT:-/var/tmp/lockstep-fresh}
  rm -rf "$root"  # anew each time: nothing left from an earlier run
fi
mirror=${DEBIAN_MIRROR:-}
if [[ -z "$mirror" ]]; then
  mirror=$(grep -hoE '^(deb|URIs:) *(\[[^]]*\] *)?https?://[^ ]+' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
           | grep -oE 'https?://[^ ]+' | grep -v security | head -n1 || true)
  if [[ -z "$mirror" ]]; then
    echo "trixie-root: no Debian mirror in /etc/apt/sources.list{,.d/*}; set DEBIAN_MIRROR to the archive's URL" >&2
    exit 1
  fi
fi

# ninja-build: the Makefile configures new folders with Ninja where it is
# installed (Note [The demo's quick build]): no core idles between targets,
# and .ninja_log says what each compile took.
common=(g++ cmake make ninja-build ccache libopenblas0-openmp libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
        libspdlog-dev libfmt-dev zlib1g-dev libjpeg62-turbo-dev libpng-dev libgtest-dev libgmock-dev dataset-fashion-mnist
        python3-numpy protobuf-compiler fortunes procps iproute2 psmisc libcurl4-openssl-dev)
if [[ $fresh == 1 ]]; then
  need=()
  components=main
elif [[ $kit_proof == 1 ]]; then
  # binutils: objdump, which the kit's unpacking reads sonames with.
  need=(g++ cmake make python3 binutils libtorch-dev procps)
  components=main
elif [[ $cuda == 1 ]]; then
  # python3-torch-cuda (contrib): PyTorch 2.6 itself, the reference of CI's
  # 2.6 leg, which runs the differential suite on the CPU of this CUDA build
  # (Note [libtorch 2.6 on the CUDA root's CPU]); clang compiles that leg
  # (Note [clang for the test build]); `make cuda-check` compiles with GCC 14.
  need=("${common[@]}" libtorch-cuda-dev nvidia-cuda-dev nvidia-cuda-toolkit libnccl-dev libgloo-cuda-dev
        python3-torch-cuda clang)
  components=main,contrib,non-free
else
  # python3-torch: PyTorch 2.6 itself, for the tests that check lockstep
  # against it (torch.load of lockstep's files, torchrun) and bench/fsdp's
  # comparison with its FSDP.
  need=("${common[@]}" libtorch-dev libgloo-dev python3-torch)
  components=main
fi

# The stand-in package: only names and versions, so that apt accepts the
# CUDA packages without the cuDNN downloader and the driver.
install_cuda_standins() {
  local pkg=$root/tmp/lockstep-cuda-standins
  mkdir -p "$pkg/DEBIAN"
  cat >"$pkg/DEBIAN/control" <<'EOF'
Package: lockstep-cuda-standins
Version: 1.0
Architecture: amd64
Maintainer: lockstep <lockstep@localhost>
Provides: nvidia-cudnn (= 9.0.0.312~cuda12), libcudnn.so.9, libcuda.so.1 (= 550.163.01), libcuda1-any
Conflicts: nvidia-cudnn, libcuda1
Description: stand-ins for cuDNN's downloader and the NVIDIA driver library
 Lets libtorch-cuda-dev install on a machine without a GPU or internet access.
 See lockstep's scripts/trixie-root.sh.
EOF
  chroot "$root" dpkg-deb --build /tmp/lockstep-cuda-standins /tmp/lockstep-cuda-standins.deb >/dev/null
  chroot "$root" dpkg -i /tmp/lockstep-cuda-standins.deb >/dev/null
}

# The run-time stand-ins: the toolkit's libcuda stub as libcuda.so.1, and a
# generated libcudnn.so.9 whose every function returns an error status.
install_cuda_stub_libraries() {
  local stubs=/usr/local/lib/lockstep-cuda-stubs
  chroot "$root" bash -euo pipefail -c "
    mkdir -p $stubs
    ln -sf /usr/lib/x86_64-linux-gnu/stubs/libcuda.so $stubs/libcuda.so.1
    nm -D --undefined-only /usr/lib/x86_64-linux-gnu/libtorch*.so.*.* | awk '\$2 ~ /^cudnn/ {sub(/@.*/, \"\", \$2); print \$2}' \
      | sort -u | awk '{print \"long \" \$1 \"(void) { return 1; }\"}' > $stubs/cudnn_stub.c
    # libtorch asks for the symbols at version libcudnn.so.9, as cuDNN defines them.
    echo 'libcudnn.so.9 { global: *; };' > $stubs/cudnn_stub.map
    gcc -shared -fPIC -Wl,-soname,libcudnn.so.9 -Wl,--version-script=$stubs/cudnn_stub.map \
      -o $stubs/libcudnn.so.9 $stubs/cudnn_stub.c
    ln -sf libcudnn.so.9 $stubs/libcudnn.so
    echo $stubs > /etc/ld.so.conf.d/lockstep-cuda-stubs.conf
    ldconfig
  "
}

# The kit proof's root: the -dev packages that libtorch-dev's own
# dependencies pulled in (zlib1g-dev, through libprotobuf-dev) go, by force,
# so that nothing but the kit can supply them.
remove_kit_dev_packages() {
  # shellcheck source=scripts/kit-lib.sh
  source "$here/scripts/kit-lib.sh"
  local present=() p
  for p in "${kit_dev_packages[@]}"; do
    chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && present+=("$p")
  done
  if ((${#present[@]})); then
    echo "trixie-root: removing from $root (the kit must supply them): ${present[*]}"
    chroot "$root" dpkg --purge --force-depends "${present[@]}" >/dev/null
  fi
}

if [[ ! -f "$root/.lockstep-ready" ]]; then
  command -v debootstrap >/dev/null || "$here/scripts/install-deps.sh" --chroot
  echo "trixie-root: debootstrap $suite into $root from $mirror ($components)"
  rm -rf "$root"
  # bookworm's debootstrap has no script named forky; sid's makes any suite
  # after trixie.
  script=()
  [[ -f /usr/share/debootstrap/scripts/$suite ]] || script=(/usr/share/debootstrap/scripts/sid)
  debootstrap --variant=minbase --components="$components" "$suite" "$root" "$mirror" "${script[@]}" >/dev/null
  mount --bind /proc "$root/proc"
  trap 'umount "$root/proc" 2>/dev/null || true' EXIT
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_options[@]}" update -qq
  [[ $cuda == 1 ]] && install_cuda_standins
  if ((${#need[@]})); then
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  [[ $cuda == 1 ]] && install_cuda_stub_libraries
  [[ $kit_proof == 1 ]] && remove_kit_dev_packages
  chroot "$root" apt-get clean
  umount "$root/proc"; trap - EXIT
  touch "$root/.lockstep-ready"
fi

# A root made before a package joined the list gets it now.
missing=()
for p in "${need[@]}"; do
  chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "trixie-root: installing into $root: ${missing[*]}"
  mount --bind /proc "$root/proc"
  trap 'umount "$root/proc" 2>/dev/null || true' EXIT
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_options[@]}" update -qq
  chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  chroot "$root" apt-get clean
  umount "$root/proc"; trap - EXIT
fi

mkdir -p "$root/src" "$root/dev" "$root/proc"
((${#@})) || set -- bash
# The bind mounts live in a private mount namespace: they vanish with this
# command and never disturb another invocation running at the same time.
# A fresh root installs for itself (LOCKSTEP_SKIP_INSTALL unset), and needs
# the host's name servers to reach the archive.
skip_install=1
if [[ $fresh == 1 ]]; then
  skip_install=
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
fi
exec unshare --mount --propagation private bash -c '
  root=$1; here=$2; skip=$3; shift 3
  mount --bind /proc "$root/proc"
  mount --bind /dev "$root/dev"
  # Pseudo-terminals too (a bind of /dev leaves its devpts behind): the
  # progress bar is tested in one.
  mount --bind /dev/pts "$root/dev/pts"
  mount --bind "$here" "$root/src"
  exec chroot "$root" env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    ${skip:+LOCKSTEP_SKIP_INSTALL=1} TERM=dumb bash -c "cd /src && \"\$@\"" bash "$@"
' bash "$root" "$here" "$skip_install" "$@"
