#!/usr/bin/env bash
# Fails when a C++ file under apps/ lib/ cuda/ test/ differs from what clang-format makes of it
# (.clang-format at the root). Formatting differs between clang-format versions, so the check
# needs the one the project is formatted with, Debian 12's clang-format 14 (scripts/setup.sh
# --test installs it); with another version it skips (exit 77) and says so.
#   scripts/check-format.sh          check
#   scripts/check-format.sh --fix    reformat the files in place
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
want=14
tool=""
for candidate in "clang-format-$want" clang-format; do
  if command -v "$candidate" >/dev/null && "$candidate" --version | grep -qE "version $want\."; then tool=$candidate; break; fi
done
if [ -z "$tool" ]; then
  echo "check-format: skipped: clang-format $want not found (found: $(clang-format --version 2>/dev/null || echo none))"
  exit 77
fi
mapfile -t files < <(git ls-files -co --exclude-standard -- 'apps/*' 'lib/*' 'cuda/*' 'test/*' | grep -E '\.(h|cpp|cu|cuh)$' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
if [ "${1:-}" = "--fix" ]; then
  "$tool" -i "${files[@]}"
  echo "check-format: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$tool" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check-format: ${#bad[@]} file(s) differ from clang-format's output; run scripts/check-format.sh --fix:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check-format: OK (${#files[@]} files)"
