# Sourced by the task tests (dist.choice_tasks, dist.generative_tasks): a fine-tuning run of a
# Hugging Face folder that scores tasks during training.
# sft_recipe TOKDIR EVAL: conversations from corpus.jsonl prepared with TOKDIR as chat.{idx,bin},
# and sft.yaml: 2 steps from the folder `hf`, a checkpoint at each, with the `eval:` mapping EVAL.
sft_recipe() {
  local tok=$1 eval=$2
  "$DSTRAIN_VENV/bin/python" - corpus.jsonl chat.jsonl <<'PY'
import json, sys
rows = [json.loads(l)["text"] for l in open(sys.argv[1])][:64]
with open(sys.argv[2], "w") as out:
    for i in range(0, len(rows) - 1, 2):
        out.write(json.dumps({"messages": [{"role": "user", "content": rows[i][:200]}, {"role": "assistant", "content": rows[i + 1][:200]}]}) + "\n")
PY
  expect_status 0 "$DSTRAIN" prepare-data chat.jsonl --chat --tokenizer "$tok" --output chat --max-length 96 --too-long truncate
  cat > sft.yaml <<YAML
run_dir: sft
seed: 3
model: {init_from: hf}
data: {path: chat, format: megatron, seq_len: 96}
train: {steps: 2, micro_batch_size: 4, global_batch_size: 8}
optimizer: {lr: 2.0e-2}
schedule: {warmup_steps: 0}
eval: $eval
checkpoint: {interval_steps: 1}
launch: {threads_per_worker: 1}
YAML
}
