#!/usr/bin/env bash
# Fails when a module under lib/dstrain/ includes a module above it. The order, lowest first, is
# docs/ARCHITECTURE.md's; a module may include only itself and the modules before it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
order=(core pipeline config sched text data io ckpt run comm model device envcheck optim zero pipeline_run metrics report train launch tasks)
status=0
for ((i = 0; i < ${#order[@]}; i++)); do
  module=${order[$i]}
  [ -d "lib/dstrain/$module" ] || { echo "check-modules: lib/dstrain/$module is in the order but does not exist" >&2; status=1; continue; }
  allowed=" ${order[*]:0:$((i + 1))} "
  while IFS= read -r hit; do
    used=$(sed -E 's/.*#include "dstrain\/([a-z_]+)\/.*/\1/' <<<"$hit")
    if [[ "$allowed" != *" $used "* ]]; then
      echo "check-modules: $module includes $used, which is above it: $hit" >&2
      status=1
    fi
  done < <(grep -rnE '#include "dstrain/[a-z_]+/' "lib/dstrain/$module" || true)
done
for dir in lib/dstrain/*/; do
  name=$(basename "$dir")
  [[ " ${order[*]} " == *" $name "* ]] || { echo "check-modules: lib/dstrain/$name is not in the module order" >&2; status=1; }
done
# Tests include Catch through test/catch_torch.h, so that LibTorch's glog-style CHECK (which
# aborts the binary) never replaces Catch's.
while IFS= read -r hit; do
  echo "check-modules: include \"catch_torch.h\" instead of <catch2/catch.hpp>: $hit" >&2
  status=1
done < <(grep -rn '#include <catch2/catch.hpp>' test --include='*.cpp' --include='*.h' | grep -v '^test/catch_torch.h:' || true)
[ "$status" = 0 ] && echo "check-modules: OK (${#order[@]} modules, no upward includes)"
exit "$status"
