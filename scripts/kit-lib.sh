# shellcheck shell=bash
# The offline kit's unpacking, shared by scripts/gpu-check.sh and
# scripts/kit-proof.sh (source it; bash).
#
#   source scripts/kit-lib.sh
#   unpack_kit gpu-kit build-gpu/kit-root    # sets kit_libdir, exports LD_LIBRARY_PATH
#   cmake -S . -B build-gpu -DCMAKE_PREFIX_PATH="$TORCH_DIR;build-gpu/kit-root/usr"

# The -dev packages (headers, static GoogleTest, CMake configs, .so links).
# shellcheck disable=SC2034  # used by the scripts that source this file
kit_dev_packages=(
  libyaml-cpp-dev libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libjpeg62-turbo-dev libpng-dev zlib1g-dev
  libcurl4-openssl-dev libgloo-dev
)
# The shared libraries those link to, and libcurl's runtime closure (bookworm's
# libcurl4 Depends, recursively), but not libc6, libstdc++6 or libgcc-s1.
# shellcheck disable=SC2034
kit_runtime_packages=(
  libyaml-cpp0.7 libspdlog1.10 libfmt9 libjpeg62-turbo libpng16-16 zlib1g
  libcurl4 libbrotli1 libgssapi-krb5-2 libidn2-0 libldap-2.5-0 libnghttp2-14
  libpsl5 librtmp1 libssh2-1 libssl3 libzstd1 libkrb5-3 libk5crypto3
  libkrb5support0 libkeyutils1 libcom-err2 libsasl2-2 libsasl2-modules-db
  libdb5.3 libgnutls30 libhogweed6 libnettle8 libgmp10 libp11-kit0 libtasn1-6
  libffi8 libunistring2
)

# Note [The kit fills gaps]
# The kit's .debs come from Debian bookworm; the host may be any x86-64 Linux
# with a C library at least as new. Its .debs are unpacked (dpkg-deb -x, no root,
# no package database) into a folder (gpu-check: <build>/kit-root), whose usr/ goes on
# CMAKE_PREFIX_PATH (the CMake configs there are relocatable). A runtime
# library is kept from the kit only where the host has no library of that
# soname: a host's own libssl or libz is what its other programs (python3,
# libtorch) already load, and two copies of one soname in a process is how
# symbol clashes start. Where the host has the soname, the kit's file becomes
# a link to the host's library, so the CMake configs and development links
# (libcurl.so) that name the file still resolve, to the host's. LD_LIBRARY_PATH
# then finds the libraries kept.
kit_libdir=""
# Unpacks a .deb's files into a folder: dpkg-deb where there is one, else ar and tar.
extract_deb() {
  local deb=$1 into=$2 tmp status
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$deb" "$into"
    return
  fi
  tmp=$(mktemp -d) || return 1
  (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$into")
  status=$?
  rm -rf "$tmp"
  return "$status"
}
# unpack_kit KIT ROOT: the kit's .debs into ROOT (emptied first), as the Note says.
unpack_kit() {
  local kit root=$2 deb arch
  kit=$(cd "$1" && pwd) || return 1  # absolute: the data links below point into it
  arch=$(gcc -print-multiarch 2>/dev/null || true)
  arch=${arch:-x86_64-linux-gnu}
  rm -rf "$root" && mkdir -p "$root" || return 1
  for deb in "$kit"/debs/*.deb; do
    extract_deb "$deb" "$root" || { echo "kit: cannot unpack $deb" >&2; return 1; }
  done
  kit_libdir=$root/usr/lib/$arch
  mkdir -p "$kit_libdir"
  # Debian bookworm splits /lib and /usr/lib; put everything in one folder.
  if [[ -d "$root/lib/$arch" ]]; then
    cp -a "$root/lib/$arch"/. "$kit_libdir"/ && rm -rf "${root:?}/lib/$arch"
  fi
  local file soname host kept=() dropped=()
  for file in "$kit_libdir"/*.so.*; do
    [[ -f "$file" && ! -L "$file" ]] || continue
    soname=$(objdump -p "$file" 2>/dev/null | awk '$1 == "SONAME" {print $2}')
    [[ -n "$soname" ]] || continue
    host=$(ldconfig -p 2>/dev/null | awk -v s="$soname" '$1 == s && /x86-64/ {print $NF; exit}')
    if [[ -n "$host" && "$host" != "$kit_libdir"/* ]]; then
      ln -sfn "$host" "$file" && ln -sfn "$host" "$kit_libdir/$soname"
      dropped+=("$soname")
    else
      kept+=("$soname")
    fi
  done
  # A development link may name its library by an absolute bookworm path
  # (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13); point it at the copy here.
  local link name
  for link in "$kit_libdir"/*.so; do
    [[ -L "$link" ]] || continue
    name=$(basename "$(readlink "$link")")
    [[ -e "$kit_libdir/$name" ]] && ln -sfn "$name" "$link"
  done
  export LD_LIBRARY_PATH=$kit_libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  echo "kit: $(find "$kit/debs" -name '*.deb' | wc -l) packages unpacked in $root"
  echo "kit: libraries kept from the kit (the host has no such soname): ${kept[*]:-none}"
  echo "kit: libraries the host's own copy replaces: ${dropped[*]:-none}"
  # Fashion-MNIST and the fortunes: the tests and example configs read Debian's paths.
  kit_data "$kit" fashion-mnist /usr/share/datasets/fashion-mnist FASHION_MNIST_ROOT
  kit_data "$kit" fortunes /usr/share/games/fortunes FORTUNES_ROOT
  return 0
}
# Links Debian's path for a data set to the kit's copy where the host has none.
kit_data() {
  local kit=$1 name=$2 debian_path=$3 variable=$4
  [[ -z "${!variable:-}" && ! -e "$debian_path" && -d "$kit/$name" ]] || return 0
  if mkdir -p "$(dirname "$debian_path")" 2>/dev/null && ln -sfn "$kit/$name" "$debian_path" 2>/dev/null; then
    echo "kit: $debian_path -> $kit/$name (the path lockstep's tests and example configs read)"
  else
    export "$variable=$kit/$name"
    echo "kit: cannot write $debian_path (not root?): $variable=$kit/$name; tests that read Debian's path fail"
  fi
}

