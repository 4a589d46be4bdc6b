#!/usr/bin/env bash
# QLoRA (issue 59, lora.base: nf4) against bitsandbytes itself (test/dist/qlora_reference.py):
# dstrain's NF4 codes, quantized block maxima and dequantized weights equal bitsandbytes' bit for
# bit on random tensors (float32 and bfloat16, partial blocks, a block of zeros, maxima over six
# powers of ten); a QLoRA run on a Hugging Face base says what its base takes, as --dry-run planned
# it, trains alike at ZeRO 1 (optimizer offloaded) and 3 (full recompute) on 2 ranks (1e-5),
# resumes on another world size exactly, `dstrain eval` gives its validation loss, and PEFT on
# transformers' 4-bit load of the same base (BitsAndBytesConfig nf4 with double quantization) gives
# that loss with dstrain's exported adapter (1e-5); what cannot go with a quantized base is refused
# by key.
source "$(dirname "$0")/../lib.sh"
UNIT="$3"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
ref="$SRC/test/dist/qlora_reference.py"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error PYTHONWARNINGS=ignore
if ! "$py" -c 'import bitsandbytes, peft' 2>/dev/null; then echo "SKIPPED: bitsandbytes or peft is not importable from $py (run scripts/setup.sh --test)"; exit 77; fi

"$py" "$ref" codes nf4.safetensors || fail "bitsandbytes could not make the reference codes"
DSTRAIN_NF4_REFERENCE="$WORK/nf4.safetensors" "$UNIT" "[nf4-bnb]" >unit.log 2>&1 || fail "dstrain's NF4 differs from bitsandbytes': $(tail -30 unit.log)"
ok "NF4 codes, the double-quantized block maxima (codes, scales, offset) and the dequantized weights equal bitsandbytes' bit for bit (6 weights)"

# --- refused by key ----------------------------------------------------------------------------
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.rank=4 --set lora.base=nf4 --set run_dir=refused
expect_out "lora.base nf4 (--set): there is no base to quantize: model.init_from is not set"
[ ! -e refused ] || fail "a refused QLoRA run wrote its run directory"
expect_status 0 "$DSTRAIN" train "$demo_recipe" --set lora.rank=4 --set lora.base=nf4 --dry-run
expect_out "note: lora.base nf4 quantizes model.init_from's weights: training needs it set (this plan does not)"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.base=fp8 --dry-run
expect_out "lora.base is set (--set) but lora.rank is 0"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.rank=4 --set lora.base=nf3 --dry-run
expect_out "lora.base"
ok "a quantized base without model.init_from (planned by --dry-run, refused by train before anything is written), lora.base without adapters and an unknown storage are refused by key (exit 2)"

# --- a QLoRA run on a Hugging Face base ----------------------------------------------------------
tail -c 40000 "$SRC/recipes/data/demo_corpus.txt" > val.txt
common=(--set launch.threads_per_worker=1 --set checkpoint.interval_steps=0 --set checkpoint.keep_last=0
        --set zero.stage3_param_persistence_threshold=0)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=12 --set run_dir=base
expect_status 0 "$DSTRAIN" export-hf base hf-base
qlora=(--set model.init_from="$WORK/hf-base" --set lora.rank=8 --set lora.alpha=16 --set lora.base=nf4 --set train.steps=20
       --set eval.paths="[$WORK/val.txt]" --set eval.micro_batch_size=4 --set eval.interval_steps=0)
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${qlora[@]}" --set lora.use_dora=true --dry-run
expect_out "lora.use_dora with lora.base nf4"
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${qlora[@]}" --set run_dir=one
expect_out "lora: base in NF4: 14 frozen projections"
expect_out "(bitsandbytes' NF4, blocks of 64, double quantization)"
# The plan: --dry-run's model states are the engine's plus the NF4 base the log reports.
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${qlora[@]}" --dry-run
expect_out "lora base               395.3k of the frozen projections' weights in NF4 (double quantization): 199.1 KiB (1.5 MiB in fp32)"
planned=$(grep -o "model states per rank   [0-9.]* MiB" <<<"$OUT" | grep -o "[0-9.]*")
engine=$(grep -o "; model states [0-9.]* MiB" one/logs/rank_00000.log | grep -o "[0-9.]*")
base=$(grep -o "frozen projections ([0-9.]*M weights), [0-9.]* MiB on this rank" one/logs/rank_00000.log | grep -o "[0-9.]* MiB" | grep -o "[0-9.]*")
python3 -c "import sys; sys.exit(0 if abs($planned - ($engine + $base)) <= 0.1 else 1)" ||
  fail "--dry-run planned $planned MiB of model states; the engine holds $engine MiB and the NF4 base $base MiB"
ok "--dry-run plans the QLoRA run's model states as held: $planned MiB = the engine's $engine + the NF4 base's $base"
# ZeRO-1 with the adapters' optimizer offloaded; ZeRO-3 with every layer recomputed in backward.
declare -A mode=([1]="zero.offload_optimizer=cpu" [3]="train.activation_checkpointing=full")
for stage in 1 3; do
  expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${qlora[@]}" --set run_dir=z$stage --set zero.stage=$stage \
    --set "${mode[$stage]}" --nproc-per-node 2
  python3 "$SRC/test/dist/compare_metrics.py" one/metrics.jsonl z$stage/metrics.jsonl --rtol 1e-5 --grad-norm ||
    fail "QLoRA at ZeRO $stage on 2 ranks differs from one process"
done
losses=$(python3 -c "import json; r=[json.loads(l) for l in open('one/metrics.jsonl')]; t=[x['loss'] for x in r if 'loss' in x and 'eval' not in x]; print(t[0], t[-1])")
read -r first last <<<"$losses"
python3 -c "import sys; sys.exit(0 if $last < $first else 1)" || fail "QLoRA did not lower the loss in 20 steps ($first -> $last)"
ok "QLoRA (rank 8 on the 14 projections of an NF4 base): ZeRO 1 with the optimizer offloaded and ZeRO 3 with full recompute, on 2 ranks, give one process's losses (1e-5); the loss falls ($first -> $last)"

# A resume (2 ranks -> 1) reads and quantizes the base again and continues the run exactly.
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${qlora[@]}" --set run_dir=half --set zero.stage=2 --nproc-per-node 2 \
  --set checkpoint.interval_steps=10
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${qlora[@]}" --set run_dir=alone --resume half/ckpt/step_00000010
expect_out "lora: base in NF4: 14 frozen projections"
python3 "$SRC/test/dist/compare_metrics.py" half/metrics.jsonl alone/metrics.jsonl --resumed --rtol 1e-5 ||
  fail "a QLoRA run resumed on one rank does not continue the run"
ok "a QLoRA run resumed on 1 rank from a 2-rank ZeRO-2 checkpoint quantizes its base again and continues exactly"

trained=$(python3 -c "import json; r=[json.loads(l) for l in open('one/metrics.jsonl')]; print(repr(next(x['val_loss'] for x in r if x.get('eval')=='val' and x['step']==20)))")
expect_status 0 "$DSTRAIN" eval one --json
python3 -c "import json,sys; v=json.loads(sys.argv[1])['datasets'][0]['val_loss']; sys.exit(0 if abs(v-$trained)<=1e-6*$trained else f'{v} vs $trained')" \
  "$(tail -1 <<<"$OUT")" || fail "dstrain eval of the QLoRA run gives another loss than its training-time evaluation"
expect_status 0 "$DSTRAIN" export-hf one adapter
"$py" "$ref" loss hf-base adapter val.txt 128 "$trained" || fail "PEFT on bitsandbytes' 4-bit base does not give the QLoRA run's loss"
ok "dstrain eval of the QLoRA run, and PEFT with its exported adapter on transformers' 4-bit load of the base, give its validation loss (1e-6, 1e-5)"
finish
