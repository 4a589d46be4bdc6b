#!/usr/bin/env bash
# Generative exact-match tasks (issue 61): `dstrain eval --task` generates each row's answer as
# lm-evaluation-harness 0.4's HFLM.generate_until does (greedy, batch size 1, until strings, the
# end of sequence, max_gen_toks) and scores it with its RegexFilter and exact_match: on 12 dstrain
# rows (a settings line: two stop strings, a regex with two groups taken from the end, ignore_case,
# ignore_punctuation, a regex to ignore) and 8 GSM8K rows as downloaded (lm-eval's own gsm8k.yaml:
# its prompt, stop strings, strict and flexible filters), every text, answer and score equals
# lm-eval's on a DeepSeek-V2-Lite-shaped model (MLA, MoE), at 1 and 3 ranks and with the experts
# over 2 ranks. eval.tasks scores them during training as dstrain eval does each step's checkpoint,
# at 1 rank and at 2 ranks with ZeRO-3 (ranks generating texts of different lengths pair their
# gathers); the demo's byte-level run scores its Python idioms; bad files are refused by file:line.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
source "$SRC/test/dist/tasks_lib.sh"
py="$DSTRAIN_VENV/bin/python"
trl="$DSTRAIN_TRL_VENV/bin/python"
ref="$SRC/test/dist/generative_task_reference.py"
[ -x "$trl" ] && "$trl" -c 'import lm_eval.models.huggingface' 2>/dev/null ||
  { echo "SKIP: no lm-evaluation-harness in the TRL overlay ($DSTRAIN_TRL_VENV; scripts/setup.sh --test)"; exit 77; }
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks >/dev/null
tok=toks/deepseek-llm-chat
eos=$("$py" -c 'import json, sys; print(next(t["id"] for t in json.load(open(sys.argv[1]))["added_tokens"] if t["content"] == "<｜end▁of▁sentence｜>"))' $tok/tokenizer.json)
"$py" "$SRC/test/dist/generate_reference.py" model hf --family deepseek_v2 --vocab 3000 --max-positions 384 --eos "$eos" >/dev/null 2>&1 ||
  fail "transformers could not make the model"
"$py" "$ref" rows corpus.jsonl rows.jsonl --count 12 --seed 1
"$py" "$ref" rows corpus.jsonl gsm.raw.jsonl --count 8 --seed 2 --gsm8k
# lm-eval generates once; then every other target becomes its answer, so exact_match is neither 0 nor 1.
for t in rows gsm; do
  flag=(); [ $t = gsm ] && flag=(--gsm8k)
  in=$t.jsonl; [ $t = gsm ] && in=gsm.raw.jsonl
  "$trl" "$ref" score hf "$tok" $in $t.first.json "${flag[@]}" > lmeval.log 2>&1 || fail "lm-eval could not generate: $(tail -3 lmeval.log)"
  "$trl" "$ref" retarget $in $t.first.json $t.task.jsonl $t.ref.json "${flag[@]}" || fail "retarget"
done
mv rows.task.jsonl idioms.jsonl && mv rows.ref.json idioms.ref.json && mv gsm.task.jsonl gsm8k.jsonl && mv gsm.ref.json gsm8k.ref.json
"$py" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert 0 < r["exact_match"] < 1, r["exact_match"]' idioms.ref.json ||
  fail "the reference scores are all or nothing: the test would not see a wrong score"

for run in "1" "3" "2 --expert-parallel-size 2"; do
  n=${run%% *}
  expect_status 0 "$DSTRAIN" eval hf --task idioms.jsonl --tokenizer "$tok" --log-samples s-idioms$n.jsonl --json --nproc-per-node $run
  grep '^{' <<<"$OUT" > idioms$n.json
  "$py" "$ref" compare idioms.ref.json idioms$n.json s-idioms$n.jsonl --name idioms || fail "dstrain eval --nproc-per-node $run differs from lm-eval"
  expect_status 0 "$DSTRAIN" eval hf --task gsm8k.jsonl --task-format gsm8k --tokenizer "$tok" --log-samples s-gsm8k$n.jsonl --json \
    --nproc-per-node $run
  grep '^{' <<<"$OUT" > gsm8k$n.json
  "$py" "$ref" compare gsm8k.ref.json gsm8k$n.json s-gsm8k$n.jsonl --name gsm8k || fail "gsm8k at --nproc-per-node $run differs from lm-eval"
done
cmp -s s-idioms1.jsonl s-idioms3.jsonl && cmp -s s-idioms1.jsonl s-idioms2.jsonl || fail "other ranks gave other generations"
# Batches (lm-eval's --batch_size): sorted longest first, left-padded; batch k on rank k % world.
"$trl" "$ref" score hf "$tok" idioms.jsonl idioms.b5.json --batch-size 5 >> lmeval.log 2>&1 || fail "lm-eval could not generate in batches"
for n in 1 2; do
  expect_status 0 "$DSTRAIN" eval hf --task idioms.jsonl --tokenizer "$tok" --task-batch-size 5 --log-samples s-b5-$n.jsonl --json \
    --nproc-per-node $n
  grep '^{' <<<"$OUT" > b5-$n.json
  "$py" "$ref" compare idioms.b5.json b5-$n.json s-b5-$n.jsonl --name idioms || fail "batches of 5 at $n ranks differ from lm-eval's"
done
expect_status 0 "$DSTRAIN" eval hf --task idioms.jsonl --tokenizer "$tok"
expect_out "exact_match"
expect_out "idioms "
ok "generative tasks equal lm-evaluation-harness's generate_until + RegexFilter + exact_match on 20 rows (a settings line; GSM8K rows through its gsm8k.yaml, strict and flexible): every text, answer and score, at 1 and 3 ranks and with the experts over 2 ranks; in batches of 5 (lm-eval's --batch_size 5) at 1 and 2 ranks"

# eval.tasks during training: each step's score is dstrain eval's of that step's checkpoint.
sft_recipe "$tok" "{tasks: [idioms.jsonl], interval_steps: 1}"
expect_status 0 "$DSTRAIN" train sft.yaml --set logging.csv_dir="$WORK/csv" --set 'logging.sinks=[console, jsonl, csv]'
expect_out "eval step 2/2 | task idioms | exact_match "
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=sft-zero3 --set zero.stage=3 --nproc-per-node 2
for step in 1 2; do
  expect_status 0 "$DSTRAIN" eval sft --step $step --task idioms.jsonl --json
  "$py" - sft/metrics.jsonl sft-zero3/metrics.jsonl "$(grep '^{' <<<"$OUT")" $step <<'PY' || fail "eval.tasks at step $step differs from dstrain eval --task of that checkpoint"
import json, sys
step = int(sys.argv[4])
want = json.loads(sys.argv[3])["tasks"][0]
for path in sys.argv[1:3]:
    got = [json.loads(l) for l in open(path)]
    got = [r for r in got if r.get("task") == "idioms" and r["step"] == step]
    assert len(got) == 1 and "acc" not in got[0], (path, got)
    assert got[0]["n"] == want["n"] and abs(got[0]["exact_match"] - want["exact_match"]) < 1e-12, (path, got, want)
PY
done
[ "$(tail -n +2 csv/task_idioms_exact_match.csv | wc -l)" = 2 ] || fail "csv/task_idioms_exact_match.csv lacks the two evaluations"
expect_status 0 "$DSTRAIN" report sft
[ -f sft/report/tasks.png ] || fail "the report has no task chart"
ok "eval.tasks scores a generative task at every evaluation: metrics.jsonl's exact_match equals dstrain eval --task of each step's checkpoint, at 1 rank and at 2 ranks with ZeRO-3; CSV and the report have it"

# The demo's task: a byte-level run (no tokenizer) scores its Python idioms as bytes.
expect_status 0 "$DSTRAIN" prepare-data "$SRC/scripts" --ext .py --output code
expect_status 0 "$DSTRAIN" train "$SRC/recipes/demo-coder.yaml" --set run_dir=coder --set data.path="$WORK/code" --set train.steps=4 \
  --set schedule.warmup_steps=0 --set eval.interval_steps=2 --set launch.nproc_per_node=2 --set checkpoint.interval_steps=4
expect_out "eval step 4/4 | task python_idioms | exact_match "
expect_status 0 "$DSTRAIN" eval coder --task "$SRC/recipes/data/python_idioms.jsonl" --log-samples idioms-bytes.jsonl --json
"$py" - idioms-bytes.jsonl coder/metrics.jsonl "$(grep '^{' <<<"$OUT")" <<'PY' || fail "the byte-level run's task scores differ"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 20 and all(r["new_tokens"] <= 16 for r in rows), rows
assert all("\n" not in r["generation"] for r in rows), rows  # cut at the stop string
last = [json.loads(l) for l in open(sys.argv[2]) if '"task"' in l][-1]
assert last["step"] == 4 and last["exact_match"] == json.loads(sys.argv[3])["tasks"][0]["exact_match"], (last, sys.argv[3])
PY
printf '{"context": "a", "choices": ["b", "c"], "gold": 0}\n' > choice.jsonl
expect_status 2 "$DSTRAIN" eval coder --task choice.jsonl
expect_out "choice.jsonl: a multiple-choice task needs the model's tokenizer, and this model has none (it was trained on bytes)"
ok "the demo's byte-level run scores recipes/data/python_idioms.jsonl during training and with dstrain eval alike (texts cut at the stop string); a multiple-choice task without a tokenizer is refused (exit 2)"

# Bad files.
printf '{"settings": {"until": ["\\n"], "regex_pattern": "(unclosed"}}\n{"context": "a", "target": "b"}\n' > badregex.jsonl
expect_status 3 "$DSTRAIN" eval hf --task badregex.jsonl --tokenizer "$tok"
expect_out "badregex.jsonl:1: the regular expression '(unclosed' does not compile"
printf '{"settings": {"max_gen_toks": 370}}\n{"context": "a b c d e f g h i j k l m n o p q r s t u v w x y z", "target": "b"}\n' > long.jsonl
expect_status 3 "$DSTRAIN" eval hf --task long.jsonl --tokenizer "$tok"
expect_out "long.jsonl:2: the context's"
expect_out "more than the model's 384 positions"
printf '{"question": "q"}\n' > badgsm.jsonl
expect_status 3 "$DSTRAIN" eval hf --task badgsm.jsonl --task-format gsm8k --tokenizer "$tok"
expect_out "badgsm.jsonl:1: \"answer\" is missing or not a string"
expect_status 3 "$DSTRAIN" train sft.yaml --set run_dir=bad-tasks --set 'eval.tasks=[badregex.jsonl]'
expect_out "badregex.jsonl:1: the regular expression"
[ ! -e bad-tasks/metrics.jsonl ] || fail "a run with a bad task file started"
ok "a regex that does not compile, a context with no room for max_gen_toks and a GSM8K row without an answer are refused by file:line (exit 3), in dstrain eval and before a run starts"
finish
