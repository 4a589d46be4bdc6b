# Shared helpers for scripts/*.sh. Sourced, never run.
DSTRAIN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=versions.sh
source "$DSTRAIN_ROOT/scripts/versions.sh"

# The virtualenv that holds torch (LibTorch) and the reference packages. It lives in a per-user
# cache keyed by the torch version, so every clone and every CI run on this machine shares it.
# Override with DSTRAIN_VENV=/path.
DSTRAIN_VENV="${DSTRAIN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/dstrain/venv-torch-$DSTRAIN_TORCH_VERSION}"
DSTRAIN_TRL_VENV="${DSTRAIN_VENV}-trl"  # scripts/setup.sh --test: TRL over the torch venv (scripts/versions.sh)
DSTRAIN_BUILD_DIR="${DSTRAIN_BUILD_DIR:-$DSTRAIN_ROOT/build}"

say() { printf '\033[1m[dstrain]\033[0m %s\n' "$*" >&2; }
die() { printf '[dstrain] error: %s\n' "$*" >&2; exit 1; }

# fuzz_build TARGET...: configures (once) and builds the libFuzzer project test/fuzz with clang in
# $DSTRAIN_FUZZ_BUILD_DIR (default build-fuzz/), and prints that directory.
fuzz_build() {
  local build="${DSTRAIN_FUZZ_BUILD_DIR:-$DSTRAIN_ROOT/build-fuzz}"
  command -v clang++ >/dev/null || die "clang++ is missing: run scripts/setup.sh --test"
  if [ ! -f "$build/build.ninja" ]; then
    CXX=clang++ cmake -S "$DSTRAIN_ROOT/test/fuzz" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  cmake --build "$build" --target "$@" | grep -vE "^\[[0-9]+/[0-9]+\]" >&2 || true
  mkdir -p "$build/crashes"
  echo "$build"
}
