#!/usr/bin/env bash
# Step time of two dstrain builds on the same run, interleaved (old, new, old, new, ...) so that
# the machine's drift hits both alike: demo-coder (the demo's dense model) at 2 ranks, or any
# recipe. The median ms/step of each run after warm-up, each build's runs, their spread and the
# ratio new/old of the medians. For refactors that must not cost time (scripts/compare-builds.sh
# checks that they do not change the numbers).
#   scripts/bench-builds.sh OLD_DSTRAIN NEW_DSTRAIN [RUNS] [STEPS] [RECIPE] [--set ...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ $# -ge 2 ] || die "usage: scripts/bench-builds.sh OLD_DSTRAIN NEW_DSTRAIN [RUNS] [STEPS] [RECIPE] [--set ...]"
old=$(realpath "$1") new=$(realpath "$2") runs=${3:-3} steps=${4:-60} recipe=${5:-$DSTRAIN_ROOT/recipes/demo-coder.yaml}
shift $(($# < 5 ? $# : 5))
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(basename "$recipe"), 2 ranks x 1 thread, $steps steps, $runs interleaved runs per build"
median_ms() {  # median ms/step after the first 10 steps
  python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1]) if '\"step_ms\"' in l][10:]; print(f'{statistics.median(x[\"step_ms\"] for x in r):.2f}')" "$1"
}
declare -A all=([old]="" [new]="")
for ((i = 1; i <= runs; i++)); do
  for side in old new; do
    bin=$old; [ "$side" = new ] && bin=$new
    "$bin" train "$recipe" --nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps="$steps" \
      --set checkpoint.interval_steps=0 --set checkpoint.keep_last=1 --set run_dir="$work/$side$i" "$@" >/dev/null 2>&1 \
      || die "the $side build failed; run it by hand to see why"
    all[$side]+=" $(median_ms "$work/$side$i/metrics.jsonl")"
  done
done
python3 - "${all[old]}" "${all[new]}" <<'PY'
import statistics, sys
old, new = ([float(x) for x in s.split()] for s in sys.argv[1:3])
for name, v in (("old", old), ("new", new)):
    print(f"{name}: median {statistics.median(v):.2f} ms/step; runs {', '.join(f'{x:.2f}' for x in v)}; spread {max(v) - min(v):.2f} ms ({100 * (max(v) - min(v)) / statistics.median(v):.1f}%)")
print(f"new / old: {statistics.median(new) / statistics.median(old):.3f}")
PY
