#!/usr/bin/env bash
# Pipeline parallelism measured in training (issue 39): `dstrain train` on the demo model with 4
# layers at P = 2 (one process per stage, 1 thread each), for each schedule and several
# micro-batch counts m. The bubble is what the run's metrics.jsonl reports (pipeline_bubble:
# every rank's time in the schedule not computing over its compute time, from the step's own
# timeline), the median over the steps after warm-up, beside the papers' formula and the replay
# of the same schedule by `dstrain bench pipeline` with equal costs (F = I = W). Throughput is
# against one process training the same global batch (m micro-batches of 4 rows) in the same
# script: with 2 stages on 2 cores the ideal is 2 / (1 + bubble).
#   scripts/bench-pipeline.sh [STEPS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps="${1:-25}"
"$DSTRAIN_ROOT/scripts/build.sh" dstrain >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--set model.num_layers=4 --set train.micro_batch_size=4 --set launch.threads_per_worker=1 --set checkpoint.interval_steps=0
        --set checkpoint.keep_last=0 --set train.steps="$steps" --set schedule.warmup_steps=0)
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); demo model with 4 layers, micro batch 4 x 128, P = 2 x 1 thread, $steps steps (median of steps > 5)"
printf '%-17s %2s %3s %9s %9s %9s %12s %11s\n' schedule v m measured formula replay "tokens/s" "vs 1 proc"
median() {  # median FILE KEY
  python3 -c "import json, statistics, sys; print(statistics.median(json.loads(l)[sys.argv[2]] for l in open(sys.argv[1]) if json.loads(l)['step'] > 5))" "$@"
}
for spec in gpipe:1:8 1f1b:1:2 1f1b:1:4 1f1b:1:8 1f1b:1:16 interleaved_1f1b:2:4 interleaved_1f1b:2:8 zb_h1:1:8; do
  IFS=: read -r schedule v m <<<"$spec"
  batch=$((4 * m))
  one="$work/one_$m"
  if [ ! -d "$one" ]; then
    "$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" "${common[@]}" --nproc-per-node 1 --set launch.threads_per_worker=2 \
      --set train.global_batch_size=$batch --set run_dir="$one" >/dev/null 2>&1
  fi
  run="$work/${schedule}_${v}_$m"
  "$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" "${common[@]}" --nproc-per-node 2 --set parallel.pipeline_parallel_size=2 \
    --set pipeline.schedule="$schedule" --set pipeline.virtual_stages="$v" --set train.global_batch_size=$batch --set run_dir="$run" >/dev/null 2>&1
  vflag=()
  [ "$v" -gt 1 ] && vflag=(--virtual-stages "$v")
  replay=$("$DSTRAIN_BUILD_DIR/dstrain" bench pipeline --ranks 2 --micro-batches "$m" "${vflag[@]}" --schedule "$schedule" | awk -v s="$schedule" '$1 == s {print $4, $5}')
  read -r replayed formula <<<"$replay"
  measured=$(median "$run/metrics.jsonl" pipeline_bubble)
  tokens=$(median "$run/metrics.jsonl" tokens_per_s)
  base=$(median "$one/metrics.jsonl" tokens_per_s)
  python3 -c "import sys; s, v, m, me, fo, re, t, b = sys.argv[1:]; print(f'{s:<17} {v:>2} {m:>3} {float(me):9.3f} {float(fo):9.3f} {float(re):9.3f} {float(t):12.0f} {float(t) / float(b):10.2f}x')" \
    "$schedule" "$v" "$m" "$measured" "$formula" "$replayed" "$tokens" "$base"
done
echo "measured: pipeline_bubble of the run (idle over compute, all ranks); formula: (p-1)/m, (p-1)/(v m) interleaved, ZB-H1's with F = I = W; replay: dstrain bench pipeline, F = I = W, no transfer time; vs 1 proc: tokens/s over one process with 2 threads on the same global batch"
