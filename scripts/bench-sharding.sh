#!/usr/bin/env bash
# Heterogeneous ranks: 2 CPU workers, rank 1 made 3x slower (DSTRAIN_TEST_FAULTS=slow_rank=1:3, a
# benchmarking knob that sleeps after each micro-batch), trained with equal shares, explicit
# weights [3, 1] and auto balancing. Prints the median step time of each and the gain.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--set train.steps=40 --set checkpoint.interval_steps=0 --set launch.threads_per_worker=1 --set logging.steps_per_print=100)
run() {
  local name=$1; shift
  DSTRAIN_TEST_FAULTS=slow_rank=1:3 "$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" "${common[@]}" --set run_dir="$work/$name" "$@" >/dev/null 2>&1
  python3 - "$work/$name/metrics.jsonl" "$name" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][10:]  # after warm-up and auto's measuring steps
print(f"{sys.argv[2]:<10} median step {statistics.median(r['step_ms'] for r in rows):7.1f} ms")
PY
}
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); demo model, 2 ranks, rank 1 3x slower; steps 11-40"
run equal
run weighted "--set" "data.shard_weights=[3, 1]"
run auto "--set" "data.shard_weights=auto" "--set" "data.balance_steps=5"
