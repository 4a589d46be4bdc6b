#!/usr/bin/env bash
# Multiple-choice tasks (issue 61): `dstrain eval --task` scores {"context", "choices", "gold"} rows
# as lm-evaluation-harness 0.4 scores multiple_choice tasks: on 40 rows (2 to 5 choices, trailing
# spaces and newlines, an empty context, non-ASCII choices) acc and acc_norm equal its HFLM's on
# the same model, and every request's log-likelihood within 1e-5, at 1 and 3 ranks; a run's
# checkpoint scores as its Hugging Face export; HellaSwag, ARC and MMLU rows as downloaded become
# lm-eval's prompts for them; bad rows and flags are refused by file:line or flag.
# eval.tasks scores them during training: each step's row in metrics.jsonl (and CSV, the report)
# is what `dstrain eval --task` gives for that step's checkpoint, at 1 rank and at 2 ranks with
# ZeRO-3; bad task files and a run without a tokenizer are refused before any worker starts.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
source "$SRC/test/dist/tasks_lib.sh"
py="$DSTRAIN_VENV/bin/python"
trl="$DSTRAIN_TRL_VENV/bin/python"
ref="$SRC/test/dist/choice_task_reference.py"
[ -x "$trl" ] && "$trl" -c 'import lm_eval.models.huggingface' 2>/dev/null ||
  { echo "SKIP: no lm-evaluation-harness in the TRL overlay ($DSTRAIN_TRL_VENV; scripts/setup.sh --test)"; exit 77; }
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks >/dev/null
tok=toks/deepseek-llm-chat
"$py" "$SRC/test/dist/finetune_reference.py" model hf --vocab 3000 --max-positions 128 >/dev/null || fail "the model could not be made"
"$py" "$ref" rows corpus.jsonl arc.jsonl --count 40 --seed 1
"$py" "$ref" rows corpus.jsonl mmlu.jsonl --count 12 --seed 2
"$trl" "$ref" score hf "$tok" arc.jsonl arc.ref.json > lmeval.log 2>&1 || fail "lm-eval could not score the rows: $(tail -3 lmeval.log)"
"$trl" "$ref" score hf "$tok" mmlu.jsonl mmlu.ref.json >> lmeval.log 2>&1 || fail "lm-eval could not score the rows: $(tail -3 lmeval.log)"

for world in 1 3; do
  expect_status 0 "$DSTRAIN" eval hf --task arc.jsonl --task mmlu.jsonl --tokenizer "$tok" --log-samples samples$world.jsonl \
    --nproc-per-node $world --json
  grep '^{' <<<"$OUT" > result$world.json
  for name in arc mmlu; do
    "$py" "$ref" compare $name.ref.json result$world.json samples$world.jsonl --name $name || fail "$name at $world ranks differs from lm-eval"
  done
done
cmp -s samples1.jsonl samples3.jsonl || fail "3 ranks gave other log-likelihoods than 1"
expect_status 0 "$DSTRAIN" eval hf --task arc.jsonl --tokenizer "$tok"
expect_out "task"
expect_out "acc_norm"
expect_out "arc "
ok "dstrain eval --task equals lm-evaluation-harness's HFLM on 52 rows in two tasks (acc, acc_norm exactly; every request's log-likelihood within 1e-5), at 1 and 3 ranks alike; the table names each task"

# Downloaded rows (--task-format hellaswag, arc, mmlu) become the prompts lm-eval's task definitions make.
for kind in hellaswag arc mmlu; do
  "$py" "$ref" raw $kind corpus.jsonl $kind.raw.jsonl --count 20 --seed 4
  "$trl" "$ref" convert $kind $kind.raw.jsonl $kind.lmeval.jsonl >> lmeval.log 2>&1 || fail "lm-eval could not convert $kind: $(tail -3 lmeval.log)"
  expect_status 0 "$DSTRAIN" eval hf --task $kind.raw.jsonl --task-format $kind --tokenizer "$tok" --log-samples $kind.ours.jsonl
  expect_status 0 "$DSTRAIN" eval hf --task $kind.lmeval.jsonl --tokenizer "$tok" --log-samples $kind.theirs.jsonl
  "$py" - $kind.ours.jsonl $kind.theirs.jsonl <<'PY' || fail "--task-format $kind makes other prompts than lm-eval's task"
import json, sys
ours, theirs = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(ours) == len(theirs) == 20
for a, b in zip(ours, theirs):
    assert a["loglikelihoods"] == b["loglikelihoods"] and a["gold"] == b["gold"], (a, b)
PY
done
python3 -c 'import json; print(json.dumps({"question": "q?", "choices": {"text": ["a", "b"], "label": ["A", "B"]}, "answerKey": "C"}))' > badarc.jsonl
expect_status 3 "$DSTRAIN" eval hf --task badarc.jsonl --task-format arc --tokenizer "$tok"
expect_out "badarc.jsonl:1: \"answerKey\" \"C\" is none of the labels [\"A\",\"B\"]"
ok "HellaSwag, ARC and MMLU rows as downloaded (--task-format) score exactly as the prompts lm-eval's task definitions make of them (its hellaswag process_docs, its arc_easy and mmlu templates); an ARC answer key that is no label is refused by file:line"

# A run scores as its export: a few SFT steps from the folder, then both.
sft_recipe "$tok" "{tasks: [arc.jsonl, mmlu.jsonl], interval_steps: 1, at_start: true}"
expect_status 0 "$DSTRAIN" train sft.yaml --set logging.csv_dir="$WORK/csv" --set 'logging.sinks=[console, jsonl, csv]'
expect_out "eval step 2/2 | task arc | acc "
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=sft-zero3 --set zero.stage=3 --nproc-per-node 2
for step in 1 2; do
  expect_status 0 "$DSTRAIN" eval sft --step $step --task arc.jsonl --task mmlu.jsonl --json
  "$py" - sft/metrics.jsonl sft-zero3/metrics.jsonl "$(grep '^{' <<<"$OUT")" $step <<'PY' || fail "eval.tasks at step $step differs from dstrain eval --task of that checkpoint"
import json, sys
step = int(sys.argv[4])
want = {t["name"]: t for t in json.loads(sys.argv[3])["tasks"]}
for path in sys.argv[1:3]:
    rows = [json.loads(l) for l in open(path)]
    got = {r["task"]: r for r in rows if "task" in r and r["step"] == step}
    assert sorted(got) == ["arc", "mmlu"], (path, got)
    for name, r in got.items():
        assert r["n"] == want[name]["n"], (path, r, want[name])
        assert abs(r["acc"] - want[name]["acc"]) < 1e-8 and abs(r["acc_norm"] - want[name]["acc_norm"]) < 1e-8, (path, r, want[name])
    assert any("task" in r and r["step"] == 0 for r in rows), "eval.at_start scored no task"
    arc = [(r["acc"], r["acc_norm"]) for r in rows if r.get("task") == "arc"]
    assert len(set(arc)) > 1, f"training changed no score: {arc}"  # so a score of stale weights would show
PY
done
[ "$(tail -n +2 csv/task_arc_acc.csv | wc -l)" = 3 ] || fail "csv/task_arc_acc.csv lacks the three evaluations: $(cat csv/task_arc_acc.csv)"
expect_status 0 "$DSTRAIN" report sft
[ -f sft/report/tasks.png ] || fail "the report has no task chart"
ok "eval.tasks scores the tasks at every evaluation (at_start, every step): metrics.jsonl's task rows equal dstrain eval --task of each step's checkpoint, at 1 rank and at 2 ranks with ZeRO-3; CSV and the report's chart have them"
expect_status 0 "$DSTRAIN" eval sft --task arc.jsonl --log-samples run.jsonl --json
expect_status 0 "$DSTRAIN" export-hf sft sft-hf
expect_status 0 "$DSTRAIN" eval sft-hf --task arc.jsonl --log-samples export.jsonl --json
"$py" - run.jsonl export.jsonl samples1.jsonl <<'PY' || fail "the run and its export score the task differently"
import json, sys
run, export, before = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(run) == len(export) == 40
for a, b in zip(run, export):
    for x, y in zip(a["loglikelihoods"], b["loglikelihoods"]):
        assert abs(x - y) <= 1e-5 * abs(x) + 1e-6, (a, b)
assert any(a["loglikelihoods"] != b["loglikelihoods"] for a, b in zip(run, before[:40])), "training changed nothing"
PY
ok "a run's checkpoint (its tokenizer found through its data) scores the task as its Hugging Face export does (1e-5)"

# Bad rows and flags.
printf '{"context": "a", "choices": [], "gold": 0}\n' > empty.jsonl
expect_status 3 "$DSTRAIN" eval hf --task empty.jsonl --tokenizer "$tok"
expect_out "empty.jsonl:1: \"choices\" is missing or not a non-empty list of strings"
printf '{"context": "a", "choices": ["b", "c"], "gold": 0}\n{"context": "a", "choices": ["b", "c"], "gold": 2}\n' > gold.jsonl
expect_status 3 "$DSTRAIN" eval hf --task gold.jsonl --tokenizer "$tok"
expect_out "gold.jsonl:2: \"gold\" is 2, outside the 2 choices (0 to 1)"
python3 -c 'print(__import__("json").dumps({"context": "a", "choices": ["word " * 300], "gold": 0}))' > long.jsonl
expect_status 3 "$DSTRAIN" eval hf --task long.jsonl --tokenizer "$tok"
expect_out "long.jsonl:1: choice 0 is"
expect_out "more than the model's context of 128"
expect_status 2 "$DSTRAIN" eval hf --task arc.jsonl --data chat --tokenizer "$tok"
expect_out "--task and --data score different things"
expect_status 2 "$DSTRAIN" eval hf --task arc.jsonl
expect_out "--task needs the model's tokenizer"
ok "a row without choices, a gold index out of range and a choice longer than the model's context are refused by file:line (exit 3); --task with --data, and without a tokenizer, by flag (exit 2)"
expect_status 3 "$DSTRAIN" train sft.yaml --set run_dir=bad-tasks --set 'eval.tasks=[gold.jsonl]'
expect_out "gold.jsonl:2: \"gold\" is 2, outside the 2 choices (0 to 1)"
[ ! -e bad-tasks/metrics.jsonl ] || fail "a run with a bad task file started"
expect_status 2 "$DSTRAIN" train "$SRC/recipes/demo.yaml" --set run_dir=no-tok --set "eval.tasks=[$WORK/arc.jsonl]" --set train.steps=20
expect_out "arc.jsonl: a multiple-choice task needs the model's tokenizer, and this model has none (it was trained on bytes)"
expect_status 2 "$DSTRAIN" train sft.yaml --set run_dir=pp --set parallel.pipeline_parallel_size=2 --nproc-per-node 2 --dry-run
expect_out "eval.tasks with parallel.pipeline_parallel_size > 1 is not supported yet"
ok "eval.tasks: a bad row is refused by file:line before any worker starts (exit 3), a run without a tokenizer (exit 2) and a pipeline by key"
finish
