#!/usr/bin/env bash
# The fused CPU Adam against torch::optim::AdamW on 50M parameters, next to a memory-bandwidth
# reference kernel with the same traffic, in one process, at 1 thread and at every core.
#   scripts/bench-optimizer.sh [PARAMS] [ITERS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
params="${1:-50000000}"
iters="${2:-10}"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); median of $iters steps after a warm-up"
for threads in 1 "$(nproc)"; do
  "$DSTRAIN_BUILD_DIR/dstrain" bench optimizer --params "$params" --threads "$threads" --iters "$iters"
done
