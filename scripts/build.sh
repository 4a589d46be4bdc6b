#!/usr/bin/env bash
# Configures and builds dstrain with CMake + Ninja (+ ccache when present).
#   scripts/build.sh             Release build in build/: dstrain, and the tests when Catch2 is installed
#   scripts/build.sh dstrain     only the dstrain binary (what scripts/demo.sh builds)
#   scripts/build.sh --debug     Debug build in build-debug/
#   scripts/build.sh --asan      Debug + AddressSanitizer/UBSan in build-asan/
#   scripts/build.sh --werror    warnings are errors (CI sets this through CI=true)
#   scripts/build.sh --no-cuda   skip cuda/ even when nvcc and a CUDA LibTorch are found
# Run scripts/setup.sh first (scripts/test.sh and scripts/demo.sh do it for you).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

build_type=Release; build_dir="$DSTRAIN_BUILD_DIR"; sanitize=OFF; werror=OFF; cuda=AUTO; targets=()
[ "${CI:-}" = "true" ] && werror=ON
for arg in "$@"; do
  case "$arg" in
    --debug) build_type=Debug; build_dir="$DSTRAIN_ROOT/build-debug" ;;
    --asan) build_type=Debug; sanitize=ON; build_dir="$DSTRAIN_ROOT/build-asan" ;;
    --werror) werror=ON ;;
    --no-cuda) cuda=OFF ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$arg' (see scripts/build.sh --help)" ;;
    *) targets+=("$arg") ;;
  esac
done

[ -x "$DSTRAIN_VENV/bin/python" ] || die "no torch virtualenv at $DSTRAIN_VENV: run scripts/setup.sh first"
torch_prefix="$("$DSTRAIN_VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"

# Configure when there is no build yet, when asked, when -Werror changes, and when Catch2 has
# been installed since a configure that found none (a demo build turning into a test build).
tests_missing() { [ -f /usr/include/catch2/catch.hpp ] && ! grep -q "dstrain_unit_tests" "$build_dir/build.ninja" 2>/dev/null; }
if [ ! -f "$build_dir/build.ninja" ] || [ "${DSTRAIN_RECONFIGURE:-0}" = 1 ] || tests_missing \
   || ! grep -q "DSTRAIN_WERROR:BOOL=$werror" "$build_dir/CMakeCache.txt" 2>/dev/null; then
  say "configuring $build_type build in $build_dir"
  cmake -S "$DSTRAIN_ROOT" -B "$build_dir" -G Ninja \
    -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_PREFIX_PATH="$torch_prefix" \
    -DDSTRAIN_SANITIZE="$sanitize" -DDSTRAIN_WERROR="$werror" -DDSTRAIN_CUDA="$cuda" \
    >/dev/null
fi
say "building ${targets[*]:-everything} ($build_type, $(nproc) jobs)"
cmake --build "$build_dir" -j "$(nproc)" ${targets[@]:+--target "${targets[@]}"}
say "built $build_dir/dstrain"
