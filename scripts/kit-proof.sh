#!/usr/bin/env bash
# The offline GPU kit's proof: inside a root that has libtorch and a compiler
# but none of the -dev packages lockstep builds with (scripts/trixie-root.sh
# --kit-proof), builds lockstep from the kit alone and runs its unit tests.
# It first checks that the root really lacks them: no package of the kit's
# -dev list installed, none of their headers under /usr/include.
#
#   make kit-proof          # = scripts/gpu-kit.sh && scripts/trixie-root.sh --kit-proof scripts/kit-proof.sh
#
# Environment: KIT (gpu-kit), BUILD_DIR (build-kit-proof), JOBS (nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/kit-lib.sh
source scripts/kit-lib.sh
KIT=${KIT:-gpu-kit}
BUILD_DIR=${BUILD_DIR:-build-kit-proof}
JOBS=${JOBS:-$(nproc)}
fail() { echo "kit-proof: $*" >&2; exit 1; }

[[ -d "$KIT/debs" ]] || fail "no kit in $KIT (run scripts/gpu-kit.sh first)"
for package in "${kit_dev_packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    fail "$package is installed in this root: the build would not prove the kit (use scripts/trixie-root.sh --kit-proof)"
  fi
done
for header in yaml-cpp/yaml.h spdlog/spdlog.h fmt/core.h CLI/CLI.hpp nlohmann/json.hpp gtest/gtest.h gmock/gmock.h \
              jpeglib.h png.h zlib.h curl/curl.h gloo/config.h; do
  [[ ! -e "/usr/include/$header" ]] || fail "/usr/include/$header exists in this root: the build would not prove the kit"
done
echo "kit-proof: this root has libtorch ($(dpkg-query -W -f='${Version}' libtorch-dev)) and none of the kit's ${#kit_dev_packages[@]} -dev packages"

mkdir -p "$BUILD_DIR"
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
unpack_kit "$KIT" "$BUILD_DIR/kit-root"
# Only the unit tests (lockstep/*/*_test.cpp): no benches, no multi-process areas.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$BUILD_DIR/kit-root/usr" \
  -DLOCKSTEP_BUILD_BENCH=OFF -DLOCKSTEP_BUILD_EXAMPLES=OFF -DLOCKSTEP_TEST_AREAS=none
cmake --build "$BUILD_DIR" -j "$JOBS"
cd "$BUILD_DIR"
ctest -L unit --output-on-failure -j "$JOBS"
echo "kit-proof: lockstep built from the kit alone and its unit tests passed"
