#!/usr/bin/env bash
# The paths added since the GPU was last measured (issue 41, item 5), each a short run on one GPU
# in bf16 against its fp32 twin on the CPU (same seed, batch and data order), held to the bf16
# tolerance of train_gpu_test.sh (5%):
#  - validation: eval.paths during and after training (val_loss at every evaluation);
#  - fine-tuning on conversations: prepare-data --chat (a byte-level tokenizer and template made
#    by make_chat_set.py from the standard library), rows packed best-fit, loss masks, per_sample
#    normalization;
#  - multi-token prediction at depth 2 with document masks: the loss and each depth's mtp_loss;
#  - generation (issue 61): the key/value cache on the GPU in fp32 (the first tokens of each prompt
#    as the CPU's) and bf16, and a generative task (the demo's Python idioms) scored during
#    training and by dstrain eval on the GPU as on the CPU (within 2 of its 20 questions).
# Skips without a GPU; DSTRAIN_GPU_TEST_DRY=1 runs it on the CPU.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/gpu_lib.sh"
# close A B WHAT: every evaluation's val_loss of run B within 5% of run A's, at the same steps.
close_evals() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY' || fail "$3: the validation losses differ by more than 5%"
import json, sys
a, b = ([(r["step"], r["eval"], r["val_loss"]) for r in map(json.loads, open(p)) if "eval" in r] for p in sys.argv[1:])
assert len(a) >= 2 and [x[:2] for x in a] == [x[:2] for x in b], (a, b)
worst = max(abs(x[2] - y[2]) / x[2] for x, y in zip(a, b))
print(f"{len(a)} evaluations, val_loss {a[0][2]:.4f} -> {a[-1][2]:.4f}: largest relative difference {worst:.2e}")
sys.exit(0 if worst <= 0.05 else 1)
PY
}

# Validation during training and at the end, on a held-out file.
tail -c 40000 "$SRC/recipes/data/demo_corpus.txt" > val.txt
ev=(--set train.steps=20 --set train.micro_batch_size=16 --set train.global_batch_size=16 --set "eval.paths=[$WORK/val.txt]"
    --set eval.interval_steps=10 --set eval.at_start=true --set checkpoint.interval_steps=0)
cpu_train evcpu "$demo_recipe" "${ev[@]}"
gpu_train evgpu "$demo_recipe" "${ev[@]}" --set precision.dtype=bf16
python3 "$cmp" evcpu/metrics.jsonl evgpu/metrics.jsonl --rtol 0.05 || fail "bf16 training with validation diverges from the CPU"
close_evals evcpu evgpu "validation on the GPU"
ok "validation on the GPU (bf16): the training and validation losses within 5% of the fp32 CPU run"

# Fine-tuning: conversations packed best-fit, trained on the assistant's tokens only.
python3 "$SRC/test/gpu/make_chat_set.py" chat 400
expect_status 0 "$DSTRAIN" prepare-data chat/chats.jsonl --tokenizer chat --output sft
expect_out "400 conversations kept"
cat > sft.yaml <<YAML
seed: 5
model: {family: dense, hidden_size: 128, num_layers: 2, num_heads: 4, intermediate_size: 256, max_seq_len: 256}
data: {path: $WORK/sft, format: megatron, seq_len: 256, packing: best_fit}
train: {steps: 25, micro_batch_size: 8, global_batch_size: 16, loss_normalization: per_sample}
optimizer: {lr: 3.0e-3}
schedule: {warmup_steps: 3}
eval: {split: 0.05, interval_steps: 12}
checkpoint: {interval_steps: 0}
YAML
cpu_train ftcpu sft.yaml
grep -q "packed (best_fit) into" ftcpu/logs/rank_00000.log || fail "the fine-tuning run did not pack its conversations"
gpu_train ftgpu sft.yaml --set precision.dtype=bf16
python3 "$cmp" ftcpu/metrics.jsonl ftgpu/metrics.jsonl --rtol 0.05 || fail "fine-tuning in bf16 on the GPU diverges from the CPU"
python3 "$cmp" ftgpu/metrics.jsonl --decreases 0.5 || fail "fine-tuning on the GPU did not learn"
close_evals ftcpu ftgpu "fine-tuning's held-out conversations"
ok "fine-tuning on packed conversations with loss masks (per_sample) on the GPU: within 5% of the CPU, validation too"

# Multi-token prediction (DeepSeek-V3's), depth 2, attention and MTP targets within documents.
mtp=(--set model.mtp_depth=2 --set data.document_mask=true --set data.eos_token=10 --set train.steps=20 --set train.micro_batch_size=8
     --set train.global_batch_size=8 --set checkpoint.interval_steps=0)
cpu_train mtpcpu "$SRC/recipes/tiny-mla-moe.yaml" "${mtp[@]}"
gpu_train mtpgpu "$SRC/recipes/tiny-mla-moe.yaml" "${mtp[@]}" --set precision.dtype=bf16
python3 "$cmp" mtpcpu/metrics.jsonl mtpgpu/metrics.jsonl --rtol 0.05 --mtp || fail "MTP in bf16 on the GPU diverges from the CPU"
ok "multi-token prediction (depth 2, document masks) on the GPU: the loss and each depth's mtp_loss within 5% of the CPU"

# Generation and generative tasks (issue 61). The dry run (CPU) takes "cpu" for "cuda".
cuda=cuda; [ "$dry" = 1 ] && cuda=cpu
gen=(--set train.steps=40 --set train.micro_batch_size=16 --set train.global_batch_size=16 --set eval.interval_steps=20
     --set "eval.tasks=[$SRC/recipes/data/python_idioms.jsonl]" --set checkpoint.interval_steps=40)
cpu_train gencpu "$demo_recipe" "${gen[@]}"
gpu_train gengpu "$demo_recipe" "${gen[@]}" --set precision.dtype=bf16
python3 - gencpu/metrics.jsonl gengpu/metrics.jsonl <<'PY' || fail "the generative task was not scored alike during training"
import json, sys
a, b = ([(r["step"], r["exact_match"]) for r in map(json.loads, open(p)) if r.get("task") == "python_idioms"] for p in sys.argv[1:])
assert [s for s, _ in a] == [s for s, _ in b] == [20, 40], (a, b)
assert all(abs(x[1] - y[1]) <= 0.1 + 1e-9 for x, y in zip(a, b)), (a, b)  # 2 of 20 questions
print(f"python_idioms exact_match: CPU fp32 {a}, GPU bf16 {b}")
PY
printf '%s\n' '{"prompt": "def main("}' '{"prompt": "import os\nimport "}' '{"prompt": "class Point:\n    def __init__("}' \
  '{"prompt": "    return "}' > prompts.jsonl
expect_status 0 "$DSTRAIN" generate gencpu --prompts prompts.jsonl --max-new-tokens 32 --device cpu --json
grep '^{' <<<"$OUT" > gen-cpu.jsonl
expect_status 0 "$DSTRAIN" generate gencpu --prompts prompts.jsonl --max-new-tokens 32 --device $cuda --dtype fp32 --json
grep '^{' <<<"$OUT" > gen-gpu32.jsonl
expect_status 0 "$DSTRAIN" generate gencpu --prompts prompts.jsonl --max-new-tokens 32 --device $cuda --dtype bf16 --json
grep '^{' <<<"$OUT" > gen-gpu16.jsonl
python3 - gen-cpu.jsonl gen-gpu32.jsonl gen-gpu16.jsonl <<'PY' || fail "generation on the GPU differs from the CPU's"
import json, sys
cpu, gpu32, gpu16 = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert len(cpu) == len(gpu32) == len(gpu16) == 4, (cpu, gpu32, gpu16)
for a, b, c in zip(cpu, gpu32, gpu16):
    assert a["token_ids"][:8] == b["token_ids"][:8], (a, b)  # later tokens may part at a near tie
    assert c["finish_reason"] in ("stop", "length") and len(c["token_ids"]) >= 1, c
same = sum(x == y for a, b in zip(cpu, gpu32) for x, y in zip(a["token_ids"], b["token_ids"]))
print(f"fp32 on the GPU: {same} of {sum(len(a['token_ids']) for a in cpu)} tokens as the CPU's; bf16: {[c['tokens_per_s'] for c in gpu16]} tokens/s")
PY
expect_status 0 "$DSTRAIN" eval gencpu --task "$SRC/recipes/data/python_idioms.jsonl" --json
grep '^{' <<<"$OUT" > task-gpu.json
CUDA_VISIBLE_DEVICES= expect_status 0 "$DSTRAIN" eval gencpu --task "$SRC/recipes/data/python_idioms.jsonl" --json
grep '^{' <<<"$OUT" > task-cpu.json
python3 -c 'import json, sys; a, b = (json.load(open(p))["tasks"][0]["exact_match"] for p in sys.argv[1:]); assert abs(a - b) <= 0.1 + 1e-9, (a, b)' \
  task-cpu.json task-gpu.json || fail "dstrain eval --task on the GPU scores other than on the CPU"
ok "generation on the GPU: fp32 begins every prompt as the CPU does, bf16 generates; the demo's generative task scores during training (bf16) and in dstrain eval within 2 of 20 questions of the CPU"
finish
