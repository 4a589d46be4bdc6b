#!/usr/bin/env bash
# Training throughput at 2 ranks on CPU (Gloo): `dstrain train` on the demo recipe (ZeRO stages 0
# and 2) against the same model and step under PyTorch DDP launched by torchrun, in one script.
# The median tokens/s of each run after warm-up; the same micro batch, sequence and threads.
#   scripts/bench-train.sh [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps="${1:-40}"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); 2 ranks x 1 thread, batch 8x128 per rank, $steps steps"
median_tps() {  # median tokens/s of metrics.jsonl after the first 5 steps
  python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])][5:]; print(f'{statistics.median(x[\"tokens_per_s\"] for x in r):.0f}')" "$1"
}
declare -A tps
for stage in 0 2; do
  "$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" --nproc-per-node 2 --set launch.threads_per_worker=1 \
    --set train.steps="$steps" --set train.micro_batch_size=8 --set train.global_batch_size=16 --set zero.stage=$stage \
    --set checkpoint.interval_steps=0 --set run_dir="$work/s$stage" >/dev/null 2>&1
  tps[$stage]=$(median_tps "$work/s$stage/metrics.jsonl")
  echo "dstrain train  2 ranks  ZeRO stage $stage: ${tps[$stage]} tokens/s"
done
ddp=$(cd "$work" && "$DSTRAIN_VENV/bin/torchrun" --nproc-per-node 2 --master-port 29541 "$DSTRAIN_ROOT/bench/train_ddp.py" --steps "$steps" --threads 1 2>/dev/null | tail -1)
echo "$ddp"
python3 - "${tps[0]}" "${tps[2]}" "$ddp" <<'PY'
import re, sys
ddp = float(re.search(r"([\d.]+) tokens/s", sys.argv[3]).group(1))
print(f"ratio  dstrain stage 0 / DDP: {float(sys.argv[1]) / ddp:.2f}   stage 2 / DDP: {float(sys.argv[2]) / ddp:.2f}")
PY
