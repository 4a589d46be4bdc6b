#!/usr/bin/env bash
# Fails when a dstrain binary leaves a C++ runtime symbol (std::, operator new/delete, __cxa_*,
# typeinfo/vtables of std types) to be found in whichever shared library exports it first.
# With a shared libstdc++ every such import is versioned (GLIBCXX_*, CXXABI_*) and binds to
# libstdc++; an unversioned one was satisfied at link time by another library: the torch
# wheel's libtorch.so exports its own std::filesystem, whose remove_all segfaults (issue 17).
#   scripts/check-link.sh [BINARY]   (default build/dstrain)
set -euo pipefail
bin="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/dstrain}"
[ -x "$bin" ] || { echo "check-link: no binary at $bin" >&2; exit 2; }
# __cxa_pure_virtual only ever aborts; whichever copy does it is the same.
bad=$(nm -D --undefined-only "$bin" | awk '{print $2}' | grep -v '@' |
  grep -E '^(_ZN?K?St|_ZNK?S[sa]|_ZT[ISV]N?St|_ZT[IV]N10__cxxabiv|__cxa_|__gxx_|_Zn[wa]|_Zd[la])' | grep -vx '__cxa_pure_virtual' || true)
if [ -n "$bad" ]; then
  echo "check-link: $bin imports $(wc -l <<<"$bad") C++ runtime symbol(s) without a libstdc++ version, so another library" >&2
  echo "  (libtorch.so exports std::filesystem) may provide them; link libstdc++ before torch (cmake/DstrainDependencies.cmake):" >&2
  c++filt <<<"$bad" | head -20 | sed 's/^/    /' >&2
  exit 1
fi
echo "check-link: OK ($(basename "$bin"): every C++ runtime import is libstdc++'s)"
