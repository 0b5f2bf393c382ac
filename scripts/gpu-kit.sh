#!/usr/bin/env bash
# Builds the offline GPU kit: one folder that holds everything a GPU host with
# no network lacks to build and test lockstep against the libtorch inside its
# pip PyTorch. Run it on a machine with Debian bookworm's package archive (this
# one), carry the folder to the GPU host, and give it to scripts/gpu-check.sh:
#
#   scripts/gpu-kit.sh                     # writes gpu-kit/ (about 40 MiB)
#   scripts/gpu-kit.sh /tmp/kit            # ... or there
#   # on the GPU host, in a copy of this checkout:
#   scripts/gpu-check.sh --kit gpu-kit --logs /tmp/gpu-logs
#
# What it holds:
#   debs/           Debian bookworm .deb files: the -dev packages lockstep
#                   builds with (yaml-cpp, spdlog, fmt, CLI11, nlohmann-json,
#                   GoogleTest with GMock, libjpeg-turbo, libpng, zlib, libcurl,
#                   Gloo's headers for a torch that ships none) and the runtime
#                   libraries they link to, libcurl's own dependencies among
#                   them. Bookworm, because its C library (2.36) is older than
#                   most hosts' and so runs on them; trixie's would not run on
#                   a host older than 2.41.
#   fashion-mnist/  the four gzipped IDX files of Fashion-MNIST (the demo, the
#                   differential tests).
#   fortunes/       the text of Debian's `fortunes` (examples/gpt's corpus).
#   MANIFEST        each file with its package version and sha256.
#
# The C library, libstdc++ and libgcc are the host's own and are not in the
# kit. gpu-check unpacks the .debs into a prefix with `dpkg -x` (no root, no
# package database) and keeps a runtime library from the kit only where the
# host has none of that soname (see Note [The kit fills gaps] there).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/gpu-kit}

# shellcheck source=scripts/kit-lib.sh
source "$here/scripts/kit-lib.sh"  # kit_dev_packages, kit_runtime_packages
fashion_mnist=${FASHION_MNIST_ROOT:-/usr/share/datasets/fashion-mnist}
fortunes=${FORTUNES_ROOT:-/usr/share/games/fortunes}
fashion_files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
if [[ "$codename" != bookworm ]]; then
  echo "gpu-kit: this machine is '$codename', not Debian bookworm: the kit's .debs must come from bookworm's archive" >&2
  exit 1
fi
for file in "${fashion_files[@]}"; do
  if [[ ! -f "$fashion_mnist/$file" ]]; then
    echo "gpu-kit: $fashion_mnist/$file not found (apt install dataset-fashion-mnist, or set FASHION_MNIST_ROOT)" >&2
    exit 1
  fi
done

if [[ ! -d "$fortunes" ]]; then
  echo "gpu-kit: $fortunes not found (apt install fortunes, or set FORTUNES_ROOT)" >&2
  exit 1
fi

rm -rf "$out"
mkdir -p "$out/debs" "$out/fashion-mnist"
# apt-get download writes into the current folder, as the user running it.
(cd "$out/debs" && apt-get download -q "${kit_dev_packages[@]}" "${kit_runtime_packages[@]}") || {
  echo "gpu-kit: apt-get download failed (run apt-get update, check the archive in /etc/apt/sources.list)" >&2
  exit 1
}
cp "${fashion_files[@]/#/$fashion_mnist/}" "$out/fashion-mnist/"
cp -rL "$fortunes" "$out/fortunes"

{
  echo "# lockstep GPU kit, built $(date -u '+%Y-%m-%d %H:%M UTC') from Debian $codename by scripts/gpu-kit.sh"
  echo "# file  package=version  sha256"
  for deb in "$out"/debs/*.deb; do
    echo "debs/$(basename "$deb")  $(dpkg-deb -f "$deb" Package)=$(dpkg-deb -f "$deb" Version)  $(sha256sum "$deb" | cut -d' ' -f1)"
  done
  for file in "${fashion_files[@]}"; do
    echo "fashion-mnist/$file  dataset-fashion-mnist  $(sha256sum "$out/fashion-mnist/$file" | cut -d' ' -f1)"
  done
} >"$out/MANIFEST"

size=$(du -sm "$out" | cut -f1)
echo "gpu-kit: $out holds $(find "$out/debs" -name '*.deb' | wc -l) packages and Fashion-MNIST, ${size} MiB"
if ((size >= 60)); then
  echo "gpu-kit: the kit is ${size} MiB, over its 60 MiB budget" >&2
  exit 1
fi
