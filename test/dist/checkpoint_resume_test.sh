#!/usr/bin/env bash
# Checkpoints in use: bit-exact resume at ZeRO 0-3 on 2 ranks with accumulation stages and fp16
# loss scaling active (real overflows, a skipped step right at the checkpoint); asynchronous
# saves write the same bytes as synchronous ones; saves on demand (run_dir/SAVE_NOW, SIGUSR1).
source "$(dirname "$0")/../lib.sh"
cmp="$SRC/test/dist/compare_metrics.py"
grep -v global_batch_size "$demo_recipe" > staged.yaml
common=(--set data.path="$SRC/recipes/data/demo_corpus.txt" --nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=20
        --set train.micro_batch_size=2 --set data.seq_len=32 --set 'train.accumulation=[{until_step: 6, steps: 1}, {steps: 2}]'
        --set precision.dtype=fp16 --set precision.initial_scale_power=20 --set precision.loss_scale_window=4
        --set checkpoint.interval_steps=10 --set checkpoint.keep_last=0 --set zero.stage3_param_persistence_threshold=0)

for stage in 0 1 2 3; do
  expect_status 0 "$DSTRAIN" train staged.yaml "${common[@]}" --set zero.stage=$stage --set run_dir=whole$stage
  python3 - whole$stage/metrics.jsonl <<'PY' || fail "stage $stage: the fp16 scaler was not exercised"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
scales = [r["loss_scale"] for r in rows]
assert any(r["skipped"] for r in rows) and len(set(scales)) > 2, scales
PY
  cp -r whole$stage cut$stage
  rm -r cut$stage/ckpt/step_00000020 && printf 'step_00000010\n' > cut$stage/ckpt/latest
  expect_status 0 "$DSTRAIN" resume cut$stage
  expect_out "resumed from $PWD/cut$stage/ckpt/step_00000010 at step 10"
  python3 "$cmp" whole$stage/metrics.jsonl cut$stage/metrics.jsonl --exact || fail "stage $stage: the resumed losses differ"
  same_checkpoint_data whole$stage/ckpt/step_00000020 cut$stage/ckpt/step_00000020 || fail "stage $stage: the final state differs"
done
ok "ZeRO 0-3 on 2 ranks, fp16 with overflows and accumulation stages: 10 steps + resume + 10 equal 20 straight, losses and final state bit for bit"

plain=(--nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=30 --set checkpoint.interval_steps=10 --set checkpoint.keep_last=0 --set zero.stage=2)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${plain[@]}" --set run_dir=sync
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${plain[@]}" --set run_dir=async --set checkpoint.async=true
expect_out "checkpoint being written in the background"
grep -q "checkpoint saved in the background" async/logs/rank_00000.log || fail "no background save was reported"
for s in 10 20 30; do same_checkpoint_data sync/ckpt/step_000000$s async/ckpt/step_000000$s || fail "async step $s differs from sync"; done
expect_status 0 "$DSTRAIN" inspect-ckpt async/ckpt --verify
ok "asynchronous saves commit the same bytes as synchronous ones, and verify"

expect_status 0 "$DSTRAIN" inspect-ckpt sync/ckpt --diff async/ckpt
expect_out "0 of 64 tensors differ"
expect_status 0 "$DSTRAIN" inspect-ckpt sync/ckpt/step_00000010 --diff sync/ckpt/step_00000030
expect_out "relative L2"
expect_status 0 "$DSTRAIN" inspect-ckpt sync/ckpt --json --tensors
python3 -c "import json, sys; d = json.loads(sys.stdin.read()); assert d['step'] == 30 and d['zero_stage'] == 2 and d['ok'] and len(d['tensors']) == 64 and d['tensors'][0]['norm'] > 0, d" <<<"$OUT" \
  || fail "inspect-ckpt --json is not the expected document"
expect_status 0 "$DSTRAIN" inspect-ckpt sync/ckpt --export exported
[ -s exported/config.json ] && [ -s exported/model.safetensors ] || fail "--export wrote no Hugging Face layout: $(ls exported)"
ok "inspect-ckpt --diff names what differs, --json is one document with every tensor's statistics, --export writes config.json + safetensors"

# On demand: a long run with no interval; SAVE_NOW, then SIGUSR1 to the launcher, each give a checkpoint.
"$DSTRAIN" train "$demo_recipe" --nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=100000 --set checkpoint.keep_last=0 --set run_dir=od > od.log 2>&1 &
launcher=$!
wait_for od/metrics.jsonl 60
touch od/SAVE_NOW
wait_for od/ckpt/latest 60
first=$(cat od/ckpt/latest)
kill -USR1 $launcher
for _ in $(seq 1 600); do [ "$(cat od/ckpt/latest)" != "$first" ] && break; sleep 0.1; done
second=$(cat od/ckpt/latest)
kill -TERM $launcher
set +e; wait $launcher; status=$?; set -e
[ $status -eq 75 ] || fail "the on-demand run ended with $status, expected 75 (stopped with a checkpoint) after SIGTERM: $(tail -3 od.log)"
[ "$second" != "$first" ] || fail "SIGUSR1 gave no new checkpoint (latest stays $first): $(tail -5 od.log)"
[ ! -e od/SAVE_NOW ] || fail "SAVE_NOW was not consumed"
grep -q "received SIGUSR1" od.log || fail "the launcher did not report SIGUSR1"
expect_status 0 "$DSTRAIN" inspect-ckpt od/ckpt/$first --verify
expect_status 0 "$DSTRAIN" inspect-ckpt od/ckpt/$second --verify
ok "run_dir/SAVE_NOW and SIGUSR1 each save a checkpoint at the end of the current step ($first, $second)"
auto=(--set launch.threads_per_worker=1 --set train.steps=12 --set checkpoint.interval_steps=5 --set run_dir=ra --resume auto)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${auto[@]}"
expect_out "dstrain starting run"
rm -r ra/ckpt/step_00000012 && printf 'step_00000010\n' > ra/ckpt/latest   # as if killed after step 10's save
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${auto[@]}"
expect_out "resumed from $PWD/ra/ckpt/step_00000010 at step 10"
expect_out "step 12/12"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${auto[@]}" --set train.steps=13
expect_out "holds a run with another configuration"
ok "train --resume auto starts a new run_dir, continues the same run from its checkpoint, and refuses another run's directory"
# checkpoint.at_end false (benchmarks): the interval's checkpoints only, not the end's.
expect_status 0 "$DSTRAIN" train "$demo_recipe" --set launch.threads_per_worker=1 --set train.steps=5 --set schedule.warmup_steps=0 --set checkpoint.interval_steps=2 \
  --set checkpoint.at_end=false --set checkpoint.keep_last=0 --set run_dir=noend
[ "$(cd noend/ckpt && ls -d step_* | xargs)" = "step_00000002 step_00000004" ] || fail "checkpoint.at_end false: $(ls noend/ckpt)"
ok "checkpoint.at_end false saves the interval's checkpoints and not the end's"
finish
