#!/usr/bin/env bash
# Forward+backward throughput of the demo's tiny dense model: dstrain (LibTorch C++) next to the
# same model written in PyTorch (Python), same sizes, same thread count, same process shape.
#   scripts/bench-model.sh [ITERS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
iters="${1:-30}"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); median of $iters steps after 3 warm-ups"
for threads in 1 2; do
  for seq in 128; do
    a=$("$DSTRAIN_BUILD_DIR/dstrain" bench model "$DSTRAIN_ROOT/recipes/demo.yaml" --threads $threads --iters "$iters" --seq-len $seq)
    b=$("$DSTRAIN_VENV/bin/python" "$DSTRAIN_ROOT/bench/model_pytorch.py" --threads $threads --iters "$iters" --seq-len $seq)
    echo "$a"
    echo "$b"
    python3 - "$a" "$b" <<'PY'
import re, sys
ms = [float(re.search(r"([\d.]+) ms/step", s).group(1)) for s in sys.argv[1:]]
print(f"ratio    dstrain / pytorch time: {ms[0] / ms[1]:.2f}")
PY
  done
done
