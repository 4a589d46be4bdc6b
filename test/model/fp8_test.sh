#!/usr/bin/env bash
# DeepSeek's FP8 checkpoints in and out (issue 40), against test/model/fp8_reference.py: a tiny
# DeepSeek-V3 made by transformers and quantized to the release format by the reference (128x128
# blocks over two shards with the scales in the other shard; 16x32 blocks with ue8m0 scales).
# dstrain reads each one's weights as the reference's weight_dequant, bit for bit; gives
# transformers' logits on those weights (1e-6) and its loss through `dstrain eval` (1e-5); writes
# the format (--dtype fp8, --scale-fmt ue8m0) within half a float8 step of every block, and
# reads its own export back as the reference does; refuses broken folders by name.
source "$(dirname "$0")/../lib.sh"
UNIT="$3"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
ref="$SRC/test/model/fp8_reference.py"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
if ! "$py" -c 'import transformers' 2>/dev/null; then echo "SKIPPED: transformers is not importable from $py (run scripts/setup.sh --test)"; exit 77; fi
"$py" "$ref" make "$WORK" || fail "the reference could not make its FP8 folders"

for v in fp8 fp8_ue8m0; do
  expect_status 0 "$DSTRAIN" export-hf $v $v.f32 --dtype fp32
  "$py" "$ref" same ${v}_dequant $v.f32 || fail "$v: dstrain's dequantized weights differ from weight_dequant's"
  DSTRAIN_HF_MODEL="$WORK/$v" "$UNIT" "[model-hf-logits]" >/dev/null || fail "$v: dstrain could not compute its logits"
  "$py" "$ref" logits $v ${v}_dequant || fail "$v: dstrain's logits differ from transformers'"
  "$DSTRAIN" eval $v --data val.bin --format bytes --seq-len 32 --micro-batch-size 4 --json > $v.json 2> $v.log ||
    fail "dstrain eval $v failed: $(cat $v.log)"
  got=$(python3 -c "import json; print(repr(json.load(open('$v.json'))['datasets'][0]['val_loss']))")
  want=$(python3 -c "import json; print(repr(json.load(open('${v}_dequant/loss.json'))['loss']))")
  python3 -c "import sys; a,b=$got,$want; print(f'$v: dstrain eval {a:.9f}, transformers {b:.9f}: relative {abs(a-b)/b:.1e}'); sys.exit(0 if abs(a-b)<=1e-5*b else 1)" ||
    fail "$v: dstrain eval's loss differs from transformers' on the dequantized weights"
done
# Training from the FP8 folder (model.init_from, 2 ranks, ZeRO-3): with lr 0 its weights stay the dequantized ones.
cat > init.yaml <<YAML
run_dir: $WORK/init
model: {init_from: $WORK/fp8, bias_update_speed: 0, mtp_depth: 0}
data: {path: $WORK/val.bin, format: bytes, seq_len: 32}
train: {steps: 2, micro_batch_size: 2, global_batch_size: 4}
optimizer: {lr: 0}
schedule: {type: constant, warmup_steps: 0}
zero: {stage: 3}
checkpoint: {interval_steps: 0}
launch: {threads_per_worker: 1}
YAML
expect_status 0 "$DSTRAIN" train init.yaml --nproc-per-node 2
expect_out "initialised from $WORK/fp8"
expect_status 0 "$DSTRAIN" export-hf init init.f32
"$py" "$ref" same fp8_dequant init.f32 || fail "a run started from the FP8 folder did not hold its dequantized weights"
ok "FP8 in: the release format's weights dequantized bit-identically to weight_dequant (scales across shards, partial blocks, ue8m0); transformers' logits within 1e-6 and loss within 1e-5"

# LoRA on the FP8 base as released (lora.base: fp8): every frozen projection, the routed experts'
# included, keeps the folder's FP8 bytes and scales; 10 steps (2 ranks, ZeRO-3) give the losses of
# LoRA on the same weights dequantized (fp32: within 1e-5; bf16: the same bf16 weights, 1e-3).
# init.yaml's run with a learning rate and adapters (the routed experts' too).
lora8=(init.yaml --set train.steps=10 --set optimizer.lr=0.002 --set lora.rank=4 --set lora.alpha=8 --set lora.experts=true)
for dtype in fp32 bf16; do
  expect_status 0 "$DSTRAIN" train "${lora8[@]}" --set run_dir="$WORK/l8$dtype" --set lora.base=fp8 --set precision.dtype=$dtype --nproc-per-node 2
  n=$(grep -oE "lora: base in FP8: [0-9]+ frozen projections" <<<"$OUT" | grep -oE "[0-9]+ frozen" | cut -d' ' -f1)
  [ -n "$n" ] && [ "$n" -gt 0 ] || fail "no line says the FP8 base's storage: $OUT"
  expect_out "; $n of them as the folder stores them, 0 quantized by amax / 448"
  expect_status 0 "$DSTRAIN" train "${lora8[@]}" --set run_dir="$WORK/l8m$dtype" --set precision.dtype=$dtype --nproc-per-node 2
  rtol=$([ $dtype = fp32 ] && echo 1e-5 || echo 1e-3)
  python3 "$SRC/test/dist/compare_metrics.py" l8m$dtype/metrics.jsonl l8$dtype/metrics.jsonl --rtol $rtol ||
    fail "LoRA on the FP8 base ($dtype) differs from LoRA on its dequantized weights"
done
for layout in "moe.expert_parallel_size=2" "parallel.pipeline_parallel_size=2"; do
  expect_status 0 "$DSTRAIN" train "${lora8[@]}" --set run_dir="$WORK/l8${layout%%.*}" --set lora.base=fp8 --set $layout --nproc-per-node 2
  python3 "$SRC/test/dist/compare_metrics.py" l8mfp32/metrics.jsonl l8${layout%%.*}/metrics.jsonl --rtol 1e-5 ||
    fail "LoRA on the FP8 base with $layout differs from LoRA on its dequantized weights"
done
ok "LoRA on the FP8 base: all $n frozen projections (routed experts too) kept as the folder stores them; 10 steps at ZeRO-3 on 2 ranks, with 2-way expert parallelism and with a 2-stage pipeline, give LoRA's losses on the dequantized weights (fp32 1e-5, bf16 1e-3)"

for scale in "" ue8m0; do
  out=out${scale:+_$scale}
  expect_status 0 "$DSTRAIN" export-hf hf $out --dtype fp8 ${scale:+--scale-fmt $scale}
  expect_out "fp8${scale:+ $scale}"
  "$py" "$ref" check-export hf $out || fail "dstrain's FP8 export is not the release format"
  "$py" "$ref" dequant $out $out.ref || fail "the reference cannot read dstrain's FP8 export"
  expect_status 0 "$DSTRAIN" export-hf $out $out.f32 --dtype fp32
  "$py" "$ref" same $out.ref $out.f32 || fail "dstrain reads its own FP8 export unlike the reference"
done
ok "FP8 out: DeepSeek's format (float8_e4m3fn, a float32 scale per 128x128 block, the rest bf16, the router bias float32), within half a float8 step; dstrain and the reference read it identically"

# Broken folders: refused by name, nothing written.
cp -r fp8_ue8m0 broken
python3 - broken/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["quantization_config"]["weight_block_size"] = [32, 32]; json.dump(c, open(sys.argv[1], "w"))
PY
expect_status 4 "$DSTRAIN" export-hf broken broken.out --dtype bf16
expect_out "_scale_inv' has shape ["
expect_out "32×32 blocks of the"
[ ! -e broken.out/model.safetensors ] || fail "a refused conversion wrote weights"
python3 - broken/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["quantization_config"]["quant_method"] = "gptq"; json.dump(c, open(sys.argv[1], "w"))
PY
expect_status 4 "$DSTRAIN" eval broken --data val.bin --format bytes --seq-len 32
expect_out "quantization_config.quant_method: 'gptq' is not fp8"
expect_status 2 "$DSTRAIN" export-hf hf hf --dtype fp8
expect_out "is both the model to read and the directory to write"
expect_status 2 "$DSTRAIN" export-hf hf x --dtype bf16 --scale-fmt ue8m0
expect_out "--scale-fmt ue8m0 (power-of-two block scales) goes with --dtype fp8"
ok "a mis-shaped scale grid and an unknown quant_method are checkpoint errors (4) naming the tensor or key; converting a folder onto itself and --scale-fmt without fp8 are usage errors (2)"
finish
