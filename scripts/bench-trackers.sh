#!/usr/bin/env bash
# What the wandb and mlflow sinks cost a run (issue 56): the demo recipe at 2 ranks on CPU, with
# and without both sinks (W&B offline, an MLflow file store: no network), alternated twice.
# Per run: the median tokens/s after warm-up (the training loop) and the launch's wall time (the
# side process's start, its SDKs' runs, the report and the upload at the end).
#   scripts/bench-trackers.sh [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps="${1:-60}"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
"$DSTRAIN_VENV/bin/python" -c 'import wandb, mlflow' || die "wandb and mlflow are not in $DSTRAIN_VENV (scripts/setup.sh --test)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export WANDB_MODE=offline WANDB_SILENT=true WANDB_DISABLE_GIT=true MLFLOW_TRACKING_URI="file://$work/mlruns" MLFLOW_ALLOW_FILE_STORE=true
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); demo recipe, 2 ranks x 1 thread, $steps steps"
median_tps() {  # median tokens/s of metrics.jsonl after the first 5 steps
  python3 -c "import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1]) if '\"loss\"' in l][5:]; print(f'{statistics.median(x[\"tokens_per_s\"] for x in r):.0f}')" "$1"
}
declare -A tps wall
printf '%-22s %12s %10s\n' "sinks" "tokens/s" "wall s"
for round in 1 2; do
  for kind in plain trackers; do
    sinks="[console, jsonl]"
    [ $kind = trackers ] && sinks="[console, jsonl, wandb, mlflow]"
    start=$EPOCHREALTIME
    "$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" --nproc-per-node 2 --set launch.threads_per_worker=1 \
      --set train.steps="$steps" --set checkpoint.interval_steps=0 --set logging.python="$DSTRAIN_VENV/bin/python" \
      --set "logging.sinks=$sinks" --set run_dir="$work/$kind$round" >/dev/null 2>&1
    w=$(python3 -c "print(f'{$EPOCHREALTIME - $start:.1f}')")
    t=$(median_tps "$work/$kind$round/metrics.jsonl")
    tps[$kind]="${tps[$kind]:-} $t" wall[$kind]="${wall[$kind]:-} $w"
    printf '%-22s %12s %10s\n' "$kind ($round)" "$t" "$w"
  done
done
python3 - "${tps[plain]}" "${tps[trackers]}" "${wall[plain]}" "${wall[trackers]}" <<'PY'
import statistics, sys
p, t, wp, wt = ([float(x) for x in a.split()] for a in sys.argv[1:])
print(f"ratio  tokens/s with wandb+mlflow / without: {statistics.mean(t) / statistics.mean(p):.3f}   "
      f"launch wall time: +{statistics.mean(wt) - statistics.mean(wp):.1f} s")
PY
