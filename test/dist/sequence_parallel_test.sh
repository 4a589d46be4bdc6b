#!/usr/bin/env bash
# Ulysses sequence parallelism (parallel.sequence_parallel_size): each rank of a sequence group
# holds T / S tokens of every row, and attention exchanges heads for tokens. One process is the
# oracle: SP 2, SP 4 (GQA's 2 key/value heads repeated to 4) and SP 2 x DP 2 at ZeRO-3 train the
# same losses and gradient norms within 1e-5 in fp32, with documents masked and positions
# restarting at each, selective and full recompute, and the held-out loss evaluated; the MLA +
# MoE model with expert parallelism, ZeRO-3 and a pipeline, and with MTP across shard edges;
# packed conversations (loss masks, document masks, per_sample) the same; a checkpoint of SP 2
# starts SP 1 and SP 4 runs that follow the uninterrupted run, and SP 2 bit for bit; bad sizes are
# refused by key before any worker starts.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
cmp="$SRC/test/dist/compare_metrics.py"
py="$DSTRAIN_VENV/bin/python"

# The validation losses of two runs, step by step, within 1e-6 relative.
same_eval() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def evals(path):
    return [(r["step"], r["val_loss"]) for r in map(json.loads, open(path)) if "eval" in r]
a, b = evals(sys.argv[1]), evals(sys.argv[2])
assert a and [s for s, _ in a] == [s for s, _ in b], (a, b)
for (s, x), (_, y) in zip(a, b):
    assert abs(x - y) <= 1e-6 * abs(x), (s, x, y)
PY
}

common=(--set train.steps=20 --set train.micro_batch_size=4 --set train.global_batch_size=8 --set launch.threads_per_worker=1
        --set model.num_kv_heads=2 --set data.document_mask=true --set data.reset_positions=true --set data.eos_token=10
        --set eval.split=20 --set eval.interval_steps=10 --set checkpoint.interval_steps=10 --set checkpoint.keep_last=0)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 1 --set run_dir=one
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 2 --set parallel.sequence_parallel_size=2 \
  --set train.activation_checkpointing=selective --set run_dir=sp2
expect_out "1 data-parallel ranks x 4"
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 4 --set parallel.sequence_parallel_size=4 \
  --set train.activation_checkpointing=full --set run_dir=sp4
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 4 --set parallel.sequence_parallel_size=2 \
  --set zero.stage=3 --set train.micro_batch_size=2 --set run_dir=sp2dp2
python3 "$cmp" one/metrics.jsonl --decreases 1.0 || fail "the loss did not fall"
for run in sp2 sp4 sp2dp2; do
  python3 "$cmp" one/metrics.jsonl $run/metrics.jsonl --rtol 1e-5 --grad-norm || fail "$run's losses or gradient norms differ from one process"
  same_eval one/metrics.jsonl $run/metrics.jsonl || fail "$run's validation losses differ from one process"
done
ok "SP 2 (selective recompute), SP 4 (GQA, full recompute) and SP 2 x DP 2 at ZeRO-3 match one process: losses, gradient norms (1e-5), validation losses"

# dstrain eval of the SP 2 run's last checkpoint, at 1 and 3 ranks (no sequence groups there):
# the held-out loss that training logged at step 20.
logged=$(python3 -c "import json, sys; print([r for r in map(json.loads, open('sp2/metrics.jsonl')) if r.get('eval') == 'heldout'][-1]['val_loss'])")
for n in 1 3; do
  expect_status 0 "$DSTRAIN" eval sp2 --nproc-per-node $n --json
  got=$(grep '^{"datasets"' <<<"$OUT" | tail -n 1 | python3 -c "import json, sys; print(json.load(sys.stdin)['datasets'][0]['val_loss'])")
  python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 1e-6 * abs(a))" "$logged" "$got" \
    || fail "dstrain eval of the SP 2 run at $n ranks gives $got, training logged $logged"
done
ok "dstrain eval of an SP 2 run's checkpoint at 1 and 3 ranks gives the held-out loss training logged"

# LoRA on every projection, its dropout masks drawn for whole rows, at SP 2 x DP 2 against one process.
lora=(--set lora.rank=8 --set lora.alpha=16 --set lora.dropout=0.1 --set train.steps=10 --set eval.interval_steps=5)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${lora[@]}" --nproc-per-node 1 --set run_dir=lora1
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${lora[@]}" --nproc-per-node 4 --set parallel.sequence_parallel_size=2 \
  --set train.micro_batch_size=2 --set zero.stage=2 --set run_dir=lora_sp2dp2
python3 "$cmp" lora1/metrics.jsonl lora_sp2dp2/metrics.jsonl --rtol 1e-5 --grad-norm || fail "LoRA at SP 2 x DP 2 differs from one process"
ok "LoRA with dropout at SP 2 x DP 2 (ZeRO-2) matches one process"

# A checkpoint of SP 2 (step 10) starts runs at SP 1, 4 and 2 that follow the uninterrupted SP 2 run.
for s in 1 4 2; do
  expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node $s --set parallel.sequence_parallel_size=$s \
    --set run_dir=from2_$s --resume sp2/ckpt/step_00000010
done
for s in 1 4; do
  python3 "$cmp" sp2/metrics.jsonl from2_$s/metrics.jsonl --resumed --rtol 1e-5 --grad-norm || fail "SP 2's checkpoint at SP $s diverges"
done
python3 "$cmp" sp2/metrics.jsonl from2_2/metrics.jsonl --resumed --exact || fail "SP 2's checkpoint at SP 2 is not bit-identical"
ok "a checkpoint of SP 2 continues at SP 1 and SP 4 as the uninterrupted run (1e-5), and at SP 2 bit for bit"

# The MLA + MoE model (V3-shaped: sigmoid routing, the selection bias, a balance loss whose
# sequence statistics span the group) alone, with expert parallelism over the sequence group's
# ranks, over 4 ranks at ZeRO-3, and with a pipeline of 2 stages.
moe=(--set train.steps=20 --set train.micro_batch_size=4 --set train.global_batch_size=8 --set launch.threads_per_worker=1
     --set model.aux_loss_alpha=0.01 --set schedule.warmup_steps=2 --set data.eos_token=10 --set eval.split=20
     --set eval.interval_steps=10)
tiny="$SRC/recipes/tiny-mla-moe.yaml"
expect_status 0 "$DSTRAIN" train "$tiny" "${moe[@]}" --nproc-per-node 1 --set run_dir=moe1
expect_status 0 "$DSTRAIN" train "$tiny" "${moe[@]}" --nproc-per-node 2 --set parallel.sequence_parallel_size=2 \
  --set moe.expert_parallel_size=2 --set run_dir=moe_sp2ep2
expect_status 0 "$DSTRAIN" train "$tiny" "${moe[@]}" --nproc-per-node 4 --set parallel.sequence_parallel_size=2 \
  --set moe.expert_parallel_size=4 --set train.micro_batch_size=2 --set zero.stage=3 --set run_dir=moe_sp2dp2
expect_status 0 "$DSTRAIN" train "$tiny" "${moe[@]}" --nproc-per-node 4 --set parallel.sequence_parallel_size=2 \
  --set parallel.pipeline_parallel_size=2 --set train.micro_batch_size=2 --set run_dir=moe_sp2pp2
# V3's routing is discrete at near-ties (group sums, the bias's sign update): once fp32 rounding
# tips one (plain data parallelism does it at the same steps), the runs part by more than rounding.
# The losses are held to 1e-5 over all 20 steps; the gradient norms and the expert load over the
# first 10.
for run in moe_sp2ep2 moe_sp2dp2 moe_sp2pp2; do
  python3 "$cmp" moe1/metrics.jsonl $run/metrics.jsonl --rtol 1e-5 || fail "$run's losses differ from one process"
  python3 "$cmp" moe1/metrics.jsonl $run/metrics.jsonl --rtol 1e-5 --grad-norm --first 10 || fail "$run's gradient norms differ from one process"
  python3 "$cmp" moe1/metrics.jsonl $run/metrics.jsonl --rtol 1e-6 --key expert_imbalance --first 10 || fail "$run's expert load differs"
  same_eval moe1/metrics.jsonl $run/metrics.jsonl || fail "$run's validation losses differ from one process"
done
ok "MLA + MoE (balance loss over the whole rows): SP 2 x EP 2, SP 2 x DP 2 with EP 4 at ZeRO-3, SP 2 x PP 2 match one process"

# eval.tasks and eval.samples during an SP 2 run generate whole sequences on each rank: a task
# whose targets are one process's generations from the same training (scored 1.0 there) scores
# 1.0 at SP 2, and the samples are one process's.
gen=(--set train.steps=20 --set train.micro_batch_size=4 --set train.global_batch_size=8 --set launch.threads_per_worker=1
     --set checkpoint.interval_steps=0 --set eval.sample_tokens=16 --set eval.interval_steps=20)
printf '{"prompt": "def "}\n{"prompt": "The "}\n' > prompts.jsonl
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${gen[@]}" --set eval.samples=prompts.jsonl --nproc-per-node 1 --set run_dir=gen1
expect_status 0 "$DSTRAIN" eval gen1 --task "$SRC/recipes/data/python_idioms.jsonl" --log-samples idioms1.jsonl
python3 - idioms1.jsonl "$SRC/recipes/data/python_idioms.jsonl" own.jsonl <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
contexts = [r["context"] for r in map(json.loads, open(sys.argv[2])) if "context" in r]
with open(sys.argv[3], "w") as out:
    out.write(json.dumps({"settings": {"until": ["\n"], "max_gen_toks": 16, "strip": False}}) + "\n")
    for r in sorted(rows, key=lambda r: r["index"]):
        out.write(json.dumps({"context": contexts[r["index"]], "target": r["generation"]}) + "\n")
PY
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${gen[@]}" --set eval.samples=prompts.jsonl --set "eval.tasks=[$PWD/own.jsonl]" \
  --nproc-per-node 2 --set parallel.sequence_parallel_size=2 --set run_dir=gen_sp2
python3 - gen_sp2/metrics.jsonl gen1/samples.jsonl gen_sp2/samples.jsonl <<'PY' || fail "eval.tasks or eval.samples at SP 2 differ from one process"
import json, sys
tasks = [r for r in map(json.loads, open(sys.argv[1])) if r.get("task") == "own"]
assert [(r["step"], r["exact_match"], r["n"]) for r in tasks] == [(20, 1.0, 20)], tasks
texts = [[r["text"] for r in map(json.loads, open(p))] for p in sys.argv[2:]]
assert texts[0] == texts[1] and len(texts[0]) == 2, texts
PY
ok "eval.tasks and eval.samples during an SP 2 run generate what one process does (exact_match 1.0 on one process's own generations)"

# Multi-token prediction (depth 2) across shard edges, with documents masked: each rank reads the
# tokens and targets past its share, and the MoE statistics leave out the positions past T - k.
# V2's routing (softmax, greedy: no near-ties of group sums or bias signs here), so every metric is
# held to rounding over all 20 steps.
mtp=("${moe[@]}" --set model.mtp_depth=2 --set data.document_mask=true --set model.topk_method=greedy --set model.scoring_func=softmax
     --set model.n_group=1 --set model.topk_group=1)
expect_status 0 "$DSTRAIN" train "$tiny" "${mtp[@]}" --nproc-per-node 1 --set run_dir=mtp1
expect_status 0 "$DSTRAIN" train "$tiny" "${mtp[@]}" --nproc-per-node 2 --set parallel.sequence_parallel_size=2 --set run_dir=mtp_sp2
expect_status 0 "$DSTRAIN" train "$tiny" "${mtp[@]}" --nproc-per-node 4 --set parallel.sequence_parallel_size=4 \
  --set moe.expert_parallel_size=2 --set run_dir=mtp_sp4ep2
expect_status 0 "$DSTRAIN" train "$tiny" "${mtp[@]}" --nproc-per-node 4 --set parallel.sequence_parallel_size=2 \
  --set train.micro_batch_size=2 --set zero.stage=3 --set train.activation_checkpointing=full --set run_dir=mtp_sp2dp2
for run in mtp_sp2 mtp_sp4ep2 mtp_sp2dp2; do
  python3 "$cmp" mtp1/metrics.jsonl $run/metrics.jsonl --rtol 1e-5 --grad-norm --mtp || fail "$run's losses, MTP losses or gradient norms differ"
  python3 "$cmp" mtp1/metrics.jsonl $run/metrics.jsonl --rtol 1e-6 --key expert_imbalance || fail "$run's expert load differs"
  same_eval mtp1/metrics.jsonl $run/metrics.jsonl || fail "$run's validation losses differ from one process"
done
ok "MTP depth 2 with documents masked: SP 2, SP 4 x EP 2 and SP 2 x DP 2 (ZeRO-3, full recompute) match one process: losses, MTP losses, gradient norms, expert load"

# Packed conversations: loss masks, a document mask per conversation, per_sample normalization.
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks
: > none.jsonl
"$py" "$SRC/test/text/chat_data_reference.py" chats corpus.jsonl none.jsonl chats.jsonl --count 200
expect_status 0 "$DSTRAIN" prepare-data chats.jsonl --tokenizer toks/deepseek-llm-chat --output sft --max-length 64
cat > sft.yaml <<'EOF'
seed: 7
model: {family: dense, vocab_size: 3000, hidden_size: 64, num_layers: 2, num_heads: 4, num_kv_heads: 1, intermediate_size: 128, max_seq_len: 64}
data: {path: sft, format: megatron, seq_len: 64, packing: greedy}
train: {steps: 8, micro_batch_size: 4, global_batch_size: 8, loss_normalization: per_sample}
optimizer: {lr: 2.0e-3}
schedule: {warmup_steps: 2}
eval: {split: 16, interval_steps: 4}
launch: {threads_per_worker: 1}
EOF
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=c1
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=c4 --nproc-per-node 4 --set parallel.sequence_parallel_size=4
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=c22 --nproc-per-node 4 --set parallel.sequence_parallel_size=2 \
  --set train.micro_batch_size=2 --set zero.stage=1
for run in c4 c22; do
  python3 "$cmp" c1/metrics.jsonl $run/metrics.jsonl --rtol 1e-5 --grad-norm || fail "$run's packed conversations differ from one process"
  same_eval c1/metrics.jsonl $run/metrics.jsonl || fail "$run's held-out conversations differ from one process"
done
ok "packed conversations (per_sample, one key/value head) at SP 4 and SP 2 x DP 2 (ZeRO-1) match one process"

# Sizes that cannot work, refused by key before any worker starts.
expect_status 2 "$DSTRAIN" train "$demo_recipe" --nproc-per-node 3 --set parallel.sequence_parallel_size=3 --set run_dir=bad \
  --set train.global_batch_size=8 --set train.micro_batch_size=8
expect_out "data.seq_len 128 is not divisible by parallel.sequence_parallel_size 3"
expect_out "parallel.sequence_parallel_size 3 does not divide model.num_heads 4"
expect_status 2 "$DSTRAIN" check-env "$demo_recipe" --nproc-per-node 3 --set parallel.sequence_parallel_size=3 \
  --set train.global_batch_size=8 --set train.micro_batch_size=8
expect_out "data.seq_len 128 is not divisible by parallel.sequence_parallel_size 3"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --nproc-per-node 2 --set parallel.sequence_parallel_size=4 --set run_dir=bad
expect_out "parallel.sequence_parallel_size 4 does not divide the 2 data-parallel ranks"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --nproc-per-node 2 --set parallel.sequence_parallel_size=2 --set run_dir=bad \
  --set train.loss_normalization=micro_batch_mean
expect_out "train.loss_normalization micro_batch_mean"
expect_status 2 "$DSTRAIN" train "$tiny" --nproc-per-node 4 --set parallel.sequence_parallel_size=2 --set run_dir=bad \
  --set parallel.pipeline_parallel_size=2 --set model.mtp_depth=1 --set train.gradient_accumulation_steps=2
expect_out "model.mtp_depth > 0 and parallel.pipeline_parallel_size > 1 together"
[ ! -e bad ] || fail "a refused run left a run directory"
expect_status 0 "$DSTRAIN" train "$demo_recipe" --nproc-per-node 4 --set parallel.sequence_parallel_size=4 --dry-run
expect_out "sequence parallelism    4 ranks share each sample, 32 of its 128 tokens each (Ulysses); 1 rank reads distinct rows"
expect_out "without sequence parallelism"
ok "a sequence length or head count that the size does not divide, a size that does not divide the ranks, micro_batch_mean, MTP with a pipeline: refused by key (train and check-env); --dry-run shows the split"
finish
