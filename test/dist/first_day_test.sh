#!/usr/bin/env bash
# A fine-tuner's first day (issue 56): the README's "Fine-tune a Hugging Face model on your
# conversations" block run as written (fewer steps), the four silent traps closed (data from
# another tokenizer, pretraining's optimizer defaults, MTP modules the weights lack, a size beside
# init_from), each misleading message now true and with what to do, and HF's stock ZeRO-3 config
# taken as the HF Trainer takes it.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
ref="$SRC/test/text/chat_data_reference.py"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error

# A tokenizer, conversations, and a tiny DeepSeek-V3-shaped Hugging Face folder that stands for a
# released model (pretrained 2 steps here, exported with its tokenizer and chat template).
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1 > /dev/null
"$py" "$ref" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks > /dev/null
: > none.jsonl
"$py" "$ref" chats corpus.jsonl none.jsonl chats.jsonl --count 200 > /dev/null
expect_status 0 "$DSTRAIN" prepare-data chats.jsonl --tokenizer toks/deepseek-v3-style --output pre --max-length 64
sed -e 's/vocab_size: 256/vocab_size: 3000/' -e "s#path: data/demo_corpus.txt, seq_len: 64#path: $WORK/pre, seq_len: 64, packing: greedy#" \
  -e 's/nproc_per_node: 2/nproc_per_node: 1/' -e "s#runs/tiny-mla-moe#$WORK/runs/base#" "$SRC/recipes/tiny-mla-moe.yaml" > base.yaml
expect_status 0 "$DSTRAIN" train base.yaml --set train.steps=2 --set schedule.warmup_steps=0 --set launch.threads_per_worker=1
mkdir -p models
expect_status 0 "$DSTRAIN" export-hf runs/base models/base

# --- The README's block, command by command as written there (sizes and steps cut) -------------
python3 - "$SRC/README.md" <<'PY' > readme.cmds || fail "README.md has no fine-tune block"
import re, sys
text = open(sys.argv[1]).read()
block = text.split("<!-- fine-tune:begin -->")[1].split("<!-- fine-tune:end -->")[0]
yaml = block.split("<<'YAML'\n")[1].split("\nYAML")[0]
for a, b in [("seq_len: 2048", "seq_len: 64"), ("epochs: 3", "epochs: 2"), ("micro_batch_size: 4", "micro_batch_size: 2"),
             ("global_batch_size: 32", "global_batch_size: 4"), ("interval_steps: 50", "interval_steps: 10")]:
    assert a in yaml, a
    yaml = yaml.replace(a, b)
open("sft.yaml", "w").write(yaml + "\nlaunch: {nproc_per_node: 1, threads_per_worker: 1}\n")
for line in block.splitlines():
    if line.startswith("build/dstrain "):
        print("D " + re.sub(r"\s+#.*$", "", line[len("build/dstrain "):]).replace("--max-length 2048", "--max-length 64"))
    elif line.startswith("python "):
        print("P " + line[len("python "):])
PY
[ "$(grep -c '^D ' readme.cmds)" -eq 5 ] && grep -q '^P ' readme.cmds || fail "the fine-tune block changed shape: $(cat readme.cmds)"
while IFS= read -r cmd; do
  case $cmd in
    "D "*) eval "expect_status 0 \"\$DSTRAIN\" ${cmd#D }" ;;
    "P "*) eval "expect_status 0 \"\$py\" ${cmd#P }" ;;
  esac
  case $cmd in
    *"--dry-run"*) expect_out "fine-tuning default with model.init_from (HF TrainingArguments' learning_rate)" ;;
    *"--step best"*) expect_out "heldout" ;;
    *"export-hf"*) expect_out "runs/sft/ckpt/step_" ;;
    "P "*) grep -q "'role': 'assistant'" <<<"$OUT" || fail "transformers did not answer: $OUT" ;;
  esac
done < readme.cmds
[ -f models/sft/tokenizer.json ] && grep -q chat_template models/sft/tokenizer_config.json || fail "the export lacks the tokenizer or template"
ok "README's fine-tune block as written: prepare-data, --dry-run, train, eval --step best, export-hf --checkpoint best, chat in transformers"

# One story in the docs: the limits up front; pipeline parallelism and the optimizer's device told alike.
grep -q "^## What dstrain does not do yet" "$SRC/README.md" || fail "README.md lists no limits up front"
grep -q "NCCL across 2+ GPUs has not run on real GPUs yet" <(sed -n '/^## What dstrain does not do yet/,/^## /p' "$SRC/README.md") ||
  fail "the multi-GPU status is not in the README's limits"
! grep -q "not yet run\|always runs today\|planned but not built" "$SRC/recipes/README.md" "$SRC/docs/ARCHITECTURE.md" ||
  fail "recipes/README.md or docs/ARCHITECTURE.md still says pipeline parallelism does not run, or where the optimizer always runs"
ok "the docs list what dstrain does not do yet, and tell pipeline parallelism and the optimizer's device as the README does"

ft=(--set run_dir=runs/x --set train.epochs=0 --set train.steps=2 --set schedule.warmup_steps=0 --set launch.threads_per_worker=1)

# --- (a) data prepared with another tokenizer of the same vocabulary size ----------------------
cp -r toks/deepseek-v3-style other-tok
python3 - other-tok/tokenizer.json <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
v = t["model"]["vocab"]
items = sorted(v.items(), key=lambda kv: kv[1])
(a, i), (b, j) = items[500], items[600]
v[a], v[b] = j, i  # the same size, two tokens swapped
json.dump(t, open(sys.argv[1], "w"), ensure_ascii=False)
PY
expect_status 0 "$DSTRAIN" prepare-data chats.jsonl --tokenizer other-tok --output other --max-length 64
expect_status 2 "$DSTRAIN" train sft.yaml --dry-run "${ft[@]}" --set data.path=other
expect_out "model.init_from: '$WORK/other' was prepared with another tokenizer (sha256 "
expect_out "than the weights' own $WORK/models/base/tokenizer.json (sha256 $(sha256sum models/base/tokenizer.json | cut -c1-12))"
expect_out "set data.other_tokenizer: true if the two tokenizers give the same ids"
expect_status 3 "$DSTRAIN" eval models/base --data other --seq-len 64
expect_out "--data: '$WORK/other' was prepared with another tokenizer"
expect_out "its token ids would mean other words to the model"
expect_status 0 "$DSTRAIN" train sft.yaml --dry-run "${ft[@]}" --set data.path=other --set data.other_tokenizer=true
ok "(a) data from another tokenizer of the same size is refused by train and eval, naming both hashes; data.other_tokenizer accepts it"

# --- (b) the optimizer of a fine-tuning run ----------------------------------------------------
expect_status 0 "$DSTRAIN" train sft.yaml --dry-run "${ft[@]}"
grep -E "^  optimizer.lr +5e-05 +fine-tuning default" <<<"$OUT" > /dev/null || fail "lr is not 5e-05 by the fine-tuning default: $OUT"
grep -E "^  optimizer.weight_decay +0 +fine-tuning default" <<<"$OUT" > /dev/null || fail "weight decay is not 0: $OUT"
grep -E "^  optimizer.beta2 +0.999 +fine-tuning default" <<<"$OUT" > /dev/null || fail "beta2 is not 0.999: $OUT"
expect_status 0 "$DSTRAIN" train sft.yaml --dry-run "${ft[@]}" --set optimizer.lr=1e-4
grep -E "^  optimizer.lr +0.0001 +--set" <<<"$OUT" > /dev/null || fail "--set optimizer.lr lost to the default: $OUT"
ok "(b) with init_from: lr 5e-5, weight decay 0, beta2 0.999 (HF TrainingArguments'), each with that source; what is set wins"

# --- (c) config.json names an MTP module the weights do not hold --------------------------------
cp -r models/base models/mtp
sed -i 's/"num_nextn_predict_layers": 0/"num_nextn_predict_layers": 1/' models/mtp/config.json
grep -q '"num_nextn_predict_layers": 1' models/mtp/config.json || fail "the fixture's config.json has no num_nextn_predict_layers"
expect_status 0 "$DSTRAIN" train sft.yaml "${ft[@]}" --set model.init_from=models/mtp --set run_dir=runs/nomtp
expect_out "models/mtp/config.json names 1 multi-token prediction module (num_nextn_predict_layers) but its weights hold none: training without MTP; set model.mtp_depth: 1"
! grep -q mtp_loss runs/nomtp/metrics.jsonl || fail "an MTP module trained"
expect_status 0 "$DSTRAIN" export-hf runs/nomtp models/nomtp
! grep -q "eh_proj" models/nomtp/model.safetensors || fail "the export holds an MTP module"
expect_status 0 "$DSTRAIN" train sft.yaml --dry-run "${ft[@]}" --set model.init_from=models/mtp --set model.mtp_depth=1
grep -E "^  model.mtp_depth +1 +--set" <<<"$OUT" > /dev/null || fail "model.mtp_depth: 1 does not ask for MTP: $OUT"
ok "(c) MTP named by config.json but absent from the weights stays off (one line says how to turn it on) and is never exported"

# --- (d) a size beside init_from, in a recipe and in --set alike --------------------------------
expect_status 0 "$DSTRAIN" train sft.yaml --dry-run "${ft[@]}" --set model.max_seq_len=128
grep -E "^  model.max_seq_len +128 +--set" <<<"$OUT" > /dev/null || fail "--set model.max_seq_len did not override config.json: $OUT"
grep -E "^  model.hidden_size +64 +.*models/base/config.json" <<<"$OUT" > /dev/null || fail "the other sizes left config.json: $OUT"
sed 's#model: {init_from: models/base}#model: {init_from: models/base, max_seq_len: 128}#' sft.yaml > longer.yaml
grep -q "max_seq_len: 128" longer.yaml || fail "the recipe's model line changed"
expect_status 0 "$DSTRAIN" train longer.yaml --dry-run "${ft[@]}"
grep -E "^  model.max_seq_len +128 +longer.yaml" <<<"$OUT" > /dev/null || fail "the recipe's model.max_seq_len did not override: $OUT"
expect_status 4 "$DSTRAIN" train sft.yaml --dry-run "${ft[@]}" --set model.hidden_size=128
expect_out "hint: model.hidden_size 128 (--set) overrides $WORK/models/base/config.json: drop it"
ok "(d) model.max_seq_len beside init_from overrides config.json's in a recipe and in --set alike; a shape-changing size names the override"

# --- Messages that said what was not true --------------------------------------------------------
expect_status 0 "$DSTRAIN" train sft.yaml "${ft[@]}" --set run_dir=runs/nobest --set checkpoint.keep_best=false
expect_status 4 "$DSTRAIN" export-hf runs/nobest nobest-hf --checkpoint best
expect_out "run 'runs/nobest' has no best checkpoint (runs/nobest/ckpt/best)"
expect_out "pass --checkpoint N (its committed checkpoints are of steps 2)"
expect_status 0 "$DSTRAIN" export-hf runs/nobest step2-hf --checkpoint 2
ok "export-hf --checkpoint takes best or a step number as eval's --step does, and a run without a best one says so"

cp -r models/base bad-hf
sed -i 's/"intermediate_size": 128/"intermediate_size": 96/' bad-hf/config.json
expect_status 4 "$DSTRAIN" eval bad-hf --data pre --seq-len 64
expect_out "hint: $WORK/bad-hf/config.json does not describe the weights beside it: export the folder again, or fix its config.json"
expect_status 4 "$DSTRAIN" export-hf bad-hf bad-out
expect_out "bad-hf/config.json does not describe the weights beside it"
ok "an HF folder whose config.json disagrees with its weights says so (no recipe to drop sizes from) in eval and export-hf"

expect_status 2 "$DSTRAIN" eval models/base --data chats.jsonl
expect_out "--data 'chats.jsonl' is a file of records, not a dataset"
expect_out "dstrain prepare-data chats.jsonl --tokenizer $WORK/models/base --output PREFIX"
expect_status 2 "$DSTRAIN" eval runs/nobest --data chats.jsonl
expect_out "--tokenizer $WORK/data/chats.tokenizer"
ok "eval --data given unprepared conversations says to prepare them, with the model's tokenizer"

expect_status 0 "$DSTRAIN" prepare-data chats.jsonl --tokenizer models/base --output nochat --max-length 64
expect_out "conversations kept"
ok "prepare-data finds conversations by their messages key without --chat"

mkdir -p sub
cat > sub/r.yaml <<'YAML'
run_dir: runs/rel
model: {init_from: models/base}
data: {path: pre, seq_len: 64, packing: greedy}
train: {steps: 2, micro_batch_size: 2, global_batch_size: 4}
schedule: {warmup_steps: 0}
YAML
expect_status 2 "$DSTRAIN" train sub/r.yaml --dry-run
expect_out "model.init_from: '$WORK/sub/models/base' is not a directory (a recipe's paths are relative to its own directory, $WORK/sub; '$WORK/models/base' from the current directory exists: write ../models/base)"
sed -i 's#models/base#../models/base#' sub/r.yaml
expect_status 3 "$DSTRAIN" train sub/r.yaml --dry-run
expect_out "data.path: '$WORK/sub/pre' does not exist or is not a file (a recipe's paths are relative to its own directory, $WORK/sub;"
expect_out "write ../pre)"
ok "a wrong recipe-relative path says paths are relative to the recipe, and what to write"

expect_status 0 "$DSTRAIN" prepare-data chats.jsonl --tokenizer models/base --output long
cat > long.yaml <<'YAML'
run_dir: runs/long
model: {family: mla_moe, init_from: models/base, max_seq_len: 512}
data: {path: long, packing: greedy}
train: {epochs: 1, micro_batch_size: 2, global_batch_size: 4}
eval: {split: 0.05}
YAML
expect_status 2 "$DSTRAIN" train long.yaml --dry-run
expect_out "1 problem in the configuration"
expect_out "data.seq_len: 64 (default) is shorter than the longest conversation of '$WORK/long'"
expect_out "set data.seq_len: $(python3 -c "import json; print(json.load(open('long.json'))['chat']['longest_conversation'])"), or prepare the data again with --max-length 64"
ok "a data.seq_len left out is one problem (not one per check), with the value that fits"

"$DSTRAIN" train sft.yaml "${ft[@]}" --set run_dir=runs/k9 --set train.steps=100000 --set checkpoint.interval_steps=0 --set checkpoint.keep_best=false \
  --nproc-per-node 2 > k9.log 2>&1 &
launcher=$!
for _ in $(seq 1 600); do [ "$(wc -l 2>/dev/null < runs/k9/metrics.jsonl || echo 0)" -ge 5 ] && break; sleep 0.1; done
victim=$(pgrep -P $launcher -f "dstrain worker" | tail -n1)  # rank 1 starts last; its log file says so for certain
for p in $(pgrep -P $launcher -f "dstrain worker"); do ls -l /proc/"$p"/fd 2>/dev/null | grep -q rank_00001.log && victim=$p; done
kill -9 "$victim"
set +e; wait $launcher; status=$?; set -e
allow_worker_signals
[ $status -eq 7 ] || fail "a killed worker's launcher exited $status: $(tail -5 k9.log)"
grep -qF "its log $WORK/runs/k9/logs/rank_00001.log is empty: it wrote nothing before it stopped" k9.log || fail "the empty log is not said: $(cat k9.log)"
grep -qF "the run stopped before its first checkpoint: \`dstrain resume $WORK/runs/k9\` starts it again" k9.log || fail "no resume hint: $(tail -5 k9.log)"
ok "kill -9 of a worker: its empty log is said as such, and the launcher says how to go on"

# --- HF's stock ZeRO-3 config, as the HF Trainer fills it --------------------------------------
cat > hf_zero3.json <<'JSON'
{
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true}, "offload_param": {"device": "cpu", "pin_memory": true},
    "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": true},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false
}
JSON
expect_status 0 "$DSTRAIN" train sft.yaml --set ds_config=hf_zero3.json --set run_dir=runs/z3 --set launch.threads_per_worker=1 \
  --set train.epochs=1 --nproc-per-node 2
expect_status 0 "$DSTRAIN" train sft.yaml --dry-run --set ds_config=hf_zero3.json --set train.epochs=1
grep -E "^  precision.dtype +fp32 +.*fp16.enabled and bf16.enabled are \"auto\" and the recipe sets no precision.dtype: fp32, as HF TrainingArguments'" \
  <<<"$OUT" > /dev/null || fail "precision is not fp32 by HF's default: $OUT"
grep -E "^  train.steps +[0-9]+ +derived: ceil\(train.epochs 1 x" <<<"$OUT" > /dev/null || fail "total_num_steps auto is not the epochs' steps: $OUT"
grep -E "^  schedule.warmup_steps +0 +.*the default of HF TrainingArguments' warmup_steps" <<<"$OUT" > /dev/null || fail "warmup auto is not 0: $OUT"
expect_status 0 "$DSTRAIN" train sft.yaml --dry-run --set ds_config=hf_zero3.json --set train.epochs=1 --set precision.dtype=bf16
grep -E "^  precision.dtype +bf16 +--set" <<<"$OUT" > /dev/null || fail "precision.dtype bf16 did not fill the auto: $OUT"
sed 's/"gradient_clipping"/"gradient_clip"/' hf_zero3.json > typo.json
expect_status 2 "$DSTRAIN" train sft.yaml --dry-run --set ds_config=typo.json --set train.epochs=1
expect_out "gradient_clip: unknown top-level key (did you mean 'gradient_clipping'?)"
ok "HF's stock ZeRO-3 config trains at 2 ranks with train.epochs: fp32 as HF's default, total_num_steps from the epochs; a misspelled key is an error"

finish
