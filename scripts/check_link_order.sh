#!/usr/bin/env bash
# Checks Note [libstdc++ before libtorch] (cmake/LockstepTorch.cmake) on built
# programs: each must list libstdc++.so.6 among its needed libraries before any
# libtorch library, so that C++ library calls bind to libstdc++ even where
# libtorch exports copies of its own (pip's libtorch 2.11 does, and its
# std::filesystem::remove_all crashed every test program that bound to it).
#
#   scripts/check_link_order.sh build/bin/lockstep build/liblockstep.so
set -euo pipefail
status=0
for program in "$@"; do
  needed=$(readelf -d "$program" | awk '/\(NEEDED\)/ {gsub(/[\[\]]/, "", $NF); print $NF}')
  listed=$(tr '\n' ' ' <<<"$needed")
  stdcxx=$(grep -n '^libstdc++\.so' <<<"$needed" | head -n1 | cut -d: -f1 || true)
  torch=$(grep -n '^libtorch' <<<"$needed" | head -n1 | cut -d: -f1 || true)
  if [[ -z "$stdcxx" ]]; then
    echo "check_link_order: $program does not list libstdc++.so.6 among its needed libraries: $listed" >&2
    status=1
  elif [[ -n "$torch" ]] && ((torch < stdcxx)); then
    echo "check_link_order: $program lists $(sed -n "${torch}p" <<<"$needed") before libstdc++.so.6: $listed" >&2
    status=1
  else
    echo "check_link_order: $program: libstdc++.so.6 is needed library $stdcxx, before libtorch"
  fi
done
exit "$status"
