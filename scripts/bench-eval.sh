#!/usr/bin/env bash
# Evaluation against training throughput on the same model and ranks (issue 37): `dstrain train`
# on the demo recipe at 2 ranks x 1 thread, evaluating a held-out file every 10 steps. Training:
# the median tokens/s of the steps after warm-up; evaluation: each evaluation's tokens / eval_ms
# (forward only, no autograd), the median over the run's evaluations. The same micro batch,
# sequence, threads and process; a training step is about three forwards, so expect >= 2.5x.
#   scripts/bench-eval.sh [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps="${1:-40}"
"$DSTRAIN_ROOT/scripts/build.sh" dstrain >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
head -c 300000 "$DSTRAIN_ROOT/recipes/data/demo_corpus.txt" > "$work/val.txt"
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); 2 ranks x 1 thread, batch 8x128 per rank, $steps steps"
for stage in 0 3; do
  "$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" --nproc-per-node 2 --set launch.threads_per_worker=1 \
    --set train.steps="$steps" --set train.micro_batch_size=8 --set train.global_batch_size=16 --set zero.stage=$stage \
    --set checkpoint.interval_steps=0 --set eval.paths="[$work/val.txt]" --set eval.interval_steps=10 --set run_dir="$work/s$stage" \
    >/dev/null 2>&1
  python3 - "$work/s$stage/metrics.jsonl" "$stage" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
train = statistics.median(r["tokens_per_s"] for r in rows if "eval" not in r and r["step"] > 5)
evals = [r for r in rows if "eval" in r]
ev = statistics.median(r["val_tokens"] / (r["eval_ms"] / 1000) for r in evals)
print(f"ZeRO stage {sys.argv[2]}: training {train:8.0f} tokens/s | evaluation {ev:8.0f} tokens/s "
      f"({len(evals)} evaluations of {evals[0]['val_tokens']} tokens) | ratio {ev / train:.2f}")
PY
done
