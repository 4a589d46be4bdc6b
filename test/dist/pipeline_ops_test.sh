#!/usr/bin/env bash
# Pipeline parallelism in operation (issue 39): validation runs through the stages (forwards only)
# and gives the losses of the same run without a pipeline (interleaved v = 2; DP 2 x PP 2 at
# ZeRO-3); each pipeline rank's model states are what --dry-run planned; a middle stage's worker
# killed with SIGKILL restarts the job, which completes bit-identically; a stalled stage is named
# by the hang report, with the neighbours' receives (stage, micro-batch, direction) it holds up.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/pipeline_lib.sh"

# Each pipeline rank's model states as --dry-run plans them (DP 2 x PP 2, ZeRO-1: the shards differ by stage).
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 4 --set parallel.pipeline_parallel_size=2 --set zero.stage=1 --dry-run
plan="$OUT"
run mem 4 --set parallel.pipeline_parallel_size=2 --set zero.stage=1 --set train.steps=12
for r in 0 1; do
  planned=$(awk -v r=$r '$1 == r && $2 ~ /-/ && $7 == "MiB" {print $6}' <<<"$plan")
  measured=$(grep -o "pipeline rank $r of 2: .*model states [0-9.]* MiB" mem/logs/rank_0000$((2 * r)).log | grep -o "states [0-9.]*" | cut -d' ' -f2)
  [ -n "$planned" ] && [ "$planned" = "$measured" ] || fail "pipeline rank $r: model states $measured MiB, --dry-run planned $planned MiB"
done
ok "each pipeline rank's model states are what --dry-run planned"

# --- validation through the stages: the losses of the same run without a pipeline ------------
head -c 200000 "$SRC/recipes/data/demo_corpus.txt" > val.txt
ev=(--set train.steps=20 --set "eval.paths=[$WORK/val.txt]" --set eval.interval_steps=10 --set eval.max_batches=13)
run ev1 1 "${ev[@]}"
run evp2 2 "${ev[@]}" --set parallel.pipeline_parallel_size=2 --set pipeline.schedule=interleaved_1f1b --set pipeline.virtual_stages=2
run evdp2 2 "${ev[@]}" --set zero.stage=1
run evdp2pp2 4 "${ev[@]}" --set parallel.pipeline_parallel_size=2 --set zero.stage=3
python3 - ev1 evp2 evdp2 evdp2pp2 <<'PY' || fail "validation through the stages differs"
import json, sys
def evals(run):
    return [(r["step"], r["val_loss"], r["val_tokens"]) for r in map(json.loads, open(f"{run}/metrics.jsonl")) if "eval" in r]
for ref, pp in ((sys.argv[1], sys.argv[2]), (sys.argv[3], sys.argv[4])):
    a, b = evals(ref), evals(pp)
    assert len(a) == 2 and [x[0] for x in a] == [x[0] for x in b] and [x[2] for x in a] == [x[2] for x in b], (a, b)
    assert all(abs(x[1] - y[1]) <= 1e-9 * abs(x[1]) for x, y in zip(a, b)), (ref, a, pp, b)
PY
ok "validation through the stages (v = 2; DP 2 x PP 2 at ZeRO-3) gives the losses of the same run without a pipeline"

# --- faults: SIGKILL of a middle stage; a stalled stage named ---------------------------------
allow_worker_signals
faults=(--set train.steps=20 --set parallel.pipeline_parallel_size=4 --set zero.stage=1 --set checkpoint.interval_steps=5
        --set checkpoint.keep_last=2)
run whole4 4 "${faults[@]}"
"$DSTRAIN" train "$demo_recipe" "${common[@]}" "${faults[@]}" --nproc-per-node 4 --max-restarts 1 --set run_dir=killed > killed.log 2>&1 &
launcher=$!
for _ in $(seq 1 600); do [ "$(wc -l 2>/dev/null < killed/metrics.jsonl || echo 0)" -ge 8 ] && break; sleep 0.05; done
victim=$(pgrep -P $launcher -f worker | sed -n 3p)  # rank 2: stage 2 of 4
[ "$(tr '\0' '\n' < /proc/$victim/environ | grep '^RANK=')" = "RANK=2" ] || fail "could not find rank 2's process"
kill -9 "$victim"
set +e; wait $launcher; status=$?; set -e
[ $status -eq 0 ] || fail "the pipeline run did not complete after its middle stage was killed (exit $status): $(tail -5 killed.log)"
grep -q "restart 1 of 1" killed.log || fail "no restart was announced: $(tail -5 killed.log)"
python3 "$cmp" whole4/metrics.jsonl killed/metrics.jsonl --exact || fail "the restarted pipeline run's losses differ"
same_checkpoint_data whole4/ckpt/step_00000020 killed/ckpt/step_00000020 || fail "the restarted pipeline run's final weights differ"
ok "SIGKILL of stage 2 of 4 at step 8: restarted from the checkpoint, bit-identical losses and final weights"

DSTRAIN_TEST_FAULTS=stall=2:4:60 expect_status 6 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${faults[@]}" --nproc-per-node 4 \
  --set launch.collective_timeout_s=3 --set launch.heartbeat_timeout_s=6 --set run_dir=stalled  # 1 s beats: reported in seconds, not ~30
expect_out "hang: rank 2 ("
expect_out "while others wait in recv #"
expect_out "'s gradient from stage 2 to stage 1"
expect_out "'s activations from stage 2 to stage 3"
ok "a stalled middle stage is named; its neighbours' receives say which micro-batch, what and between which stages"
finish
