#!/usr/bin/env bash
# Fails when a model family stops being built from its parts (docs/ARCHITECTURE.md, "How a model
# is built"): a family file (one that derives from CausalLM) calls at::linear or SDPA itself
# instead of apply(Linear) and attend(); scaled_dot_product_attention appears outside
# model/attention.cpp; a regex decides what a parameter is (roles do); initial values are drawn
# outside the ParamBuilder.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
status=0
complain() { echo "check-model-parts: $*" >&2; status=1; }
mapfile -t families < <(grep -rlE 'public CausalLM\b' lib/dstrain/model --include='*.h' | sed 's/\.h$/.cpp/')
[ "${#families[@]}" -ge 2 ] || complain "found ${#families[@]} model families under lib/dstrain/model; expected the dense and MLA ones"
for f in "${families[@]}"; do
  [ -f "$f" ] || { complain "$f: a family header without its source"; continue; }
  while IFS= read -r hit; do complain "$f:$hit: a family applies projections through apply(Linear), not at::linear"; done \
    < <(grep -n 'at::linear' "$f" | cut -d: -f1 || true)
  while IFS= read -r hit; do complain "$f:$hit: a family attends through attend() (model/attention.h)"; done \
    < <(grep -n 'scaled_dot_product_attention' "$f" | cut -d: -f1 || true)
done
while IFS= read -r hit; do complain "$hit: scaled_dot_product_attention belongs in model/attention.cpp alone"; done \
  < <(grep -rn 'scaled_dot_product_attention' lib apps --include='*.cpp' --include='*.h' | grep -v '^lib/dstrain/model/attention.cpp:' || true)
while IFS= read -r hit; do complain "$hit: what a parameter is comes from its declared role, not a regex"; done \
  < <(grep -rnE 'std::regex|#include <regex>' lib/dstrain/model || true)
while IFS= read -r hit; do complain "$hit: initial values are drawn by the ParamBuilder (one stream for every rank and stage)"; done \
  < <(grep -rn 'at::normal(' lib/dstrain/model | grep -v '^lib/dstrain/model/param_builder.cpp:' || true)
[ "$status" = 0 ] && echo "check-model-parts: OK (${#families[@]} families built from Linear, attend and the ParamBuilder)"
exit "$status"
