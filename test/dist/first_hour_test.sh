#!/usr/bin/env bash
# The dead ends a new user met in their first hour, each now with a way out: a run that failed
# before its first checkpoint, a run directory given to inspect-ckpt, a resume of a typo,
# TensorBoard, the peak memory column, OMP_NUM_THREADS, and a model started from HF weights.
source "$(dirname "$0")/../lib.sh"

short=(--nproc-per-node 1 --set train.steps=12 --set schedule.warmup_steps=2 --set checkpoint.interval_steps=0
       --set launch.threads_per_worker=1)

# A run that diverges at step 3, before its first checkpoint: resume has nothing to resume, and
# its hint is the command that starts the run again in the same directory.
DSTRAIN_TEST_FAULTS="nan_loss=0:3" expect_status 8 "$DSTRAIN" train "$demo_recipe" "${short[@]}" --set run_dir=early
[ -f early/config.resolved.json ] && [ ! -e early/ckpt/latest ] || fail "the diverged run should leave a run directory without a checkpoint"
expect_status 4 "$DSTRAIN" resume early
expect_out "has no committed checkpoint to resume from: it stopped before its first save"
hint=$(grep -o 'start it again with `[^`]*`' <<<"$OUT" | sed 's/^start it again with `dstrain //; s/`$//')
[ -n "$hint" ] || fail "resume's hint gives no command: $OUT"
grep -qF -- "--set train.steps=12" <<<"$hint" && grep -qF -- "--nproc-per-node 1" <<<"$hint" || fail "the hint lost the run's flags: $hint"
# shellcheck disable=SC2086
expect_status 0 "$DSTRAIN" $hint
expect_out "held a run that stopped before its first checkpoint: starting anew in its place"
[ -f early/previous-attempts/1/logs/rank_00000.log ] || fail "the failed attempt's logs were not kept"
grep -q "diverged\|NaN\|non-finite" early/previous-attempts/1/logs/rank_00000.log || fail "the kept log is not the failed attempt's"
[ "$(wc -l < early/metrics.jsonl)" -eq 12 ] || fail "the new run's metrics.jsonl should hold its 12 steps only"
[ -f early/ckpt/latest ] || fail "the new run left no checkpoint"
ok "a run that failed before its first checkpoint: resume's hint starts it again, keeping the failed attempt's logs"

DSTRAIN_TEST_FAULTS="nan_loss=0:3" expect_status 8 "$DSTRAIN" train "$demo_recipe" "${short[@]}" --set run_dir=requeued
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${short[@]}" --set run_dir=requeued --resume auto
expect_out "holds this run without a committed checkpoint: starting it again"
[ -d requeued/previous-attempts/1 ] || fail "--resume auto did not keep the first attempt"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${short[@]}" --set run_dir=requeued
expect_out "already holds a run"
ok "--resume auto (a requeued job) starts a run that never saved again; a run with a checkpoint is still never overwritten"

expect_status 2 "$DSTRAIN" resume no-such-run
expect_out "run directory 'no-such-run' does not exist"
expect_status 0 "$DSTRAIN" inspect-ckpt early
expect_out "checkpoint   early/ckpt/step_00000012"
expect_out "world size   1"
expect_status 2 "$DSTRAIN" inspect-ckpt no-such-run
expect_out "'no-such-run' does not exist"
mkdir -p never && cp early/previous-attempts/1/config.resolved.json never/
expect_status 4 "$DSTRAIN" inspect-ckpt never
expect_out "has no committed checkpoint yet"
ok "inspect-ckpt takes a run directory (its newest checkpoint), like resume; a path that does not exist is said to"

python3 - early/metrics.jsonl <<'PY' || fail "host_peak_rss_mb is not the peak"
import json, sys
peak = 0
for line in open(sys.argv[1]):
    m = json.loads(line)
    assert m["host_peak_rss_mb"] >= m["host_rss_mb"], m
    assert m["host_peak_rss_mb"] >= peak, m
    peak = m["host_peak_rss_mb"]
PY
ok "host_peak_rss_mb is at least host_rss_mb on every line, and never falls"

OMP_NUM_THREADS=1 expect_status 0 "$DSTRAIN" train "$demo_recipe" --nproc-per-node 1 --set train.steps=2 --set schedule.warmup_steps=1 \
  --set checkpoint.interval_steps=0 --set run_dir=omp
expect_out "1 worker x 1 thread (OMP_NUM_THREADS=1 from the environment)"
OMP_NUM_THREADS=1 expect_status 0 "$DSTRAIN" train "$demo_recipe" "${short[@]}" --set train.steps=2 --set launch.threads_per_worker=2 \
  --set run_dir=omp2
expect_out "OMP_NUM_THREADS=1 in the environment is overridden by launch.threads_per_worker=2"
ok "OMP_NUM_THREADS is honoured as torchrun does, and said; launch.threads_per_worker overrides it, also said"

# TensorBoard through dstrain: the program from PATH (here a stand-in that records its arguments).
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${short[@]}" --set train.steps=3 --set "logging.sinks=[console, jsonl, tensorboard]" \
  --set run_dir=tb
mkdir -p bin && printf '#!/bin/sh\necho "$@" > %s/tensorboard.args\n' "$WORK" > bin/tensorboard && chmod +x bin/tensorboard
PATH="$WORK/bin:$PATH" expect_status 0 "$DSTRAIN" tensorboard tb --port 6123
grep -qF -- "--logdir $WORK/tb/tensorboard --host 127.0.0.1 --port 6123" tensorboard.args || fail "tensorboard got: $(cat tensorboard.args)"
expect_status 2 "$DSTRAIN" tensorboard early
expect_out "wrote no TensorBoard events"
expect_out "add tensorboard to the recipe's logging.sinks"
ok "dstrain tensorboard RUN_DIR serves the run's event files; a run without them says how to get them"

# A model from HF weights: model.init_from alone takes the weights' config.json, and a model
# whose sizes differ from the weights' is refused by --dry-run, naming the tensors.
expect_status 0 "$DSTRAIN" export-hf early hf
cat > own.yaml <<YAML
run_dir: runs/own
data: {path: $SRC/recipes/data/demo_corpus.txt, format: bytes, seq_len: 64}
model: {init_from: hf}
train: {steps: 4, micro_batch_size: 2, global_batch_size: 2}
schedule: {warmup_steps: 1}
launch: {nproc_per_node: 1}
YAML
expect_status 0 "$DSTRAIN" train own.yaml --dry-run
expect_out "implied by model.init_from"
expect_status 4 "$DSTRAIN" train own.yaml --dry-run --set model.hidden_size=64 --set model.max_seq_len=128
expect_out "tensors do not match the weights in $WORK/hf"
expect_out "'model.embed_tokens.weight' has shape [256, 128], the model needs [256, 64]"
expect_status 0 "$DSTRAIN" train own.yaml
expect_out "initialised from $WORK/hf"
ok "model.init_from alone trains with the weights' own config; --dry-run checks every tensor's shape from the headers"
# The README's "Train on your own text", command by command as written there (only the step
# count is cut): prepare-data, the recipe, --dry-run, train stopped by Ctrl-C, resume, report,
# tensorboard.
mkdir -p my-texts && split -n 4 -d --additional-suffix=.txt "$SRC/recipes/data/demo_corpus.txt" my-texts/part
python3 - "$SRC/README.md" <<'PY' > readme.cmds || fail "README.md has no own-text block"
import re, sys
text = open(sys.argv[1]).read()
block = text.split("<!-- own-text:begin -->")[1].split("<!-- own-text:end -->")[0]
yaml = block.split("<<'YAML'\n")[1].split("\nYAML")[0]
open("mine.yaml", "w").write(yaml.replace("steps: 500", "steps: 15") + "\n")
for line in block.splitlines():
    if line.startswith("build/dstrain "):
        print(re.sub(r"\s+#.*$", "", line[len("build/dstrain "):]).replace("~/my-texts", "my-texts"))
PY
[ "$(wc -l < readme.cmds)" -eq 6 ] || fail "the README's own-text block should have 6 dstrain commands: $(cat readme.cmds)"
while read -r cmd; do
  # shellcheck disable=SC2086
  case "$cmd" in
    "train mine.yaml")  # Ctrl-C once a few steps are done
      "$DSTRAIN" $cmd > own.log 2>&1 &
      launcher=$!
      for _ in $(seq 1 600); do [ "$(wc -l < runs/mine/metrics.jsonl 2>/dev/null || echo 0)" -ge 5 ] && break; sleep 0.05; done
      kill -INT $launcher
      set +e; wait $launcher; status=$?; set -e
      [ $status -eq 75 ] || fail "Ctrl-C: train exited $status, not 75: $(tail -5 own.log)" ;;
    tensorboard*) PATH="$WORK/bin:$PATH" expect_status 0 "$DSTRAIN" $cmd ;;
    *) expect_status 0 "$DSTRAIN" $cmd ;;
  esac
done < readme.cmds
[ "$(wc -l < runs/mine/metrics.jsonl)" -eq 15 ] && [ -f runs/mine/report/index.html ] || fail "the own-text run did not finish or report"
grep -qF -- "--logdir $WORK/runs/mine/tensorboard" tensorboard.args || fail "tensorboard got: $(cat tensorboard.args)"
grep -q '"vocab_size": 257' runs/mine/config.resolved.json || fail "the vocabulary did not come from data/mine.json"
ok "the README's own-text path works as written: prepare-data, train, Ctrl-C (exit 75), resume, report, tensorboard"
finish
