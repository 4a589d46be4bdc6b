#!/usr/bin/env bash
# Fails when a module under lib/dstrain/ includes a module above it (the order, lowest first, is
# docs/ARCHITECTURE.md's; a module may include only itself and the modules before it), or when
# files include each other in a cycle (a file and its header count as one) beyond the few known
# below: a class and its private implementation header, and the model factory.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
order=(core pipeline config cost sched text data io ckpt run comm model device envcheck optim zero pipeline_exec metrics report train launch bench tasks)
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
known_cycles="pipeline/schedule pipeline/transfers pipeline/zero_bubble
model/causal_lm model/dense_model model/mla_moe_model model/mlp model/param_builder
text/tokenizer text/tokenizer_impl
comm/store_client comm/store_client_impl
zero/engine zero/engine_impl"
python3 - "$known_cycles" <<'PY' || status=1
import os, re, sys
known = {tuple(sorted(line.split())) for line in sys.argv[1].splitlines() if line.strip()}
root, edges = "lib/dstrain", {}
for d, _, files in os.walk(root):
    for f in files:
        if f.endswith((".h", ".cpp")):
            unit = os.path.relpath(os.path.join(d, f), root).rsplit(".", 1)[0]
            for m in re.finditer(r'#include "dstrain/([^"]+)\.h"', open(os.path.join(d, f)).read()):
                if m.group(1) != unit:
                    edges.setdefault(unit, set()).add(m.group(1))
index, low, stack, on, bad = {}, {}, [], set(), []
def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index); stack.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        c = []
        while not c or c[-1] != v:
            c.append(stack.pop()); on.discard(c[-1])
        if len(c) > 1 and tuple(sorted(c)) not in known:
            bad.append(" <-> ".join(sorted(c)))
sys.setrecursionlimit(10000)
for v in list(edges):
    if v not in index:
        visit(v)
for c in bad:
    print(f"check-modules: files include each other in a cycle: {c}", file=sys.stderr)
sys.exit(1 if bad else 0)
PY
# Tests include Catch through test/catch_torch.h, so that LibTorch's glog-style CHECK (which
# aborts the binary) never replaces Catch's.
while IFS= read -r hit; do
  echo "check-modules: include \"catch_torch.h\" instead of <catch2/catch.hpp>: $hit" >&2
  status=1
done < <(grep -rn '#include <catch2/catch.hpp>' test --include='*.cpp' --include='*.h' | grep -v '^test/catch_torch.h:' || true)
[ "$status" = 0 ] && echo "check-modules: OK (${#order[@]} modules, no upward includes, no new include cycle)"
exit "$status"
