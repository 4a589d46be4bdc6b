#!/usr/bin/env bash
# dstrain generate (issue 61): greedy tokens identical to transformers' generate(do_sample=False,
# use_cache=True) for 64 new tokens on tiny Llama (GQA), DeepSeek-V2-Lite-shaped (MLA without
# q_lora, MoE) and DeepSeek-V3-shaped (q_lora, YaRN) models transformers made, 8 prompts of 1 to
# 50 tokens (text and conversations through the chat template) in one left-padded batch, with and
# without the cache, and one prompt at a time; texts are the tokenizer's decode; stop strings, stop
# ids and seeded sampling; a run's checkpoint generates as its export, a LoRA run (MLA, adapters on
# kv_b) as PEFT on transformers does; bad input is refused by flag or file:line.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
ref="$SRC/test/dist/generate_reference.py"
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks >/dev/null
tok=toks/deepseek-llm-chat
eos=$("$py" -c 'import json, sys; print(next(t["id"] for t in json.load(open(sys.argv[1]))["added_tokens"] if t["content"] == "<｜end▁of▁sentence｜>"))' $tok/tokenizer.json)
"$py" - corpus.jsonl prompts.jsonl <<'PY'
import json, sys
rows = [json.loads(l)["text"] for l in open(sys.argv[1])][:40]
with open(sys.argv[2], "w") as f:
    for i, n in enumerate([3, 40, 11, 120, 1, 25]):
        f.write(json.dumps({"prompt": rows[i][:n]}) + "\n")
    f.write(json.dumps({"messages": [{"role": "user", "content": rows[10][:60]}]}) + "\n")
    f.write(json.dumps({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": rows[11][:30]},
                                     {"role": "assistant", "content": rows[12][:20]}, {"role": "user", "content": "ok?"}]}) + "\n")
PY

for fam in llama deepseek_v2 deepseek_v3; do
  "$py" "$ref" model $fam --family $fam --vocab 3000 --max-positions 256 --eos "$eos" >/dev/null 2>&1 || fail "transformers could not make $fam"
  "$py" "$ref" generate $fam $tok prompts.jsonl $fam.ref.jsonl --max-new-tokens 64 > ref.log 2>&1 || fail "transformers could not generate: $(tail -3 ref.log)"
  expect_status 0 "$DSTRAIN" generate $fam --prompts prompts.jsonl --tokenizer $tok --json
  grep '^{' <<<"$OUT" > $fam.ours.jsonl
  "$py" "$ref" compare $fam.ref.jsonl $fam.ours.jsonl --tokdir $tok || fail "$fam: other tokens than transformers' generate"
  expect_status 0 "$DSTRAIN" generate $fam --prompts prompts.jsonl --tokenizer $tok --json --no-cache
  grep '^{' <<<"$OUT" > $fam.nocache.jsonl
  "$py" "$ref" compare $fam.ref.jsonl $fam.nocache.jsonl || fail "$fam: without the cache, other tokens"
  expect_status 0 "$DSTRAIN" generate $fam --prompts prompts.jsonl --tokenizer $tok --json --batch-size 1
  grep '^{' <<<"$OUT" > $fam.alone.jsonl
  "$py" "$ref" compare $fam.ref.jsonl $fam.alone.jsonl || fail "$fam: one prompt at a time, other tokens"
done
ok "greedy generation equals transformers' generate for 64 new tokens of 8 prompts (text and chat-template conversations, left-padded in one batch) on Llama with GQA, V2-Lite-shaped MLA + MoE and V3-shaped MLA (q_lora, YaRN); the same without the cache and one prompt at a time; texts decode as the tokenizer does"

# Text output, stop strings and ids, seeded sampling.
expect_status 0 "$DSTRAIN" generate llama --prompt "The first" --tokenizer $tok --max-new-tokens 12 --json
line=$(grep '^{' <<<"$OUT")
stop_id=$("$py" -c 'import json, sys; print(json.loads(sys.argv[1])["token_ids"][3])' "$line")
stop_text=$("$py" -c 'import json, sys; t = json.loads(sys.argv[1])["text"]; print(t[len(t)//2:len(t)//2 + 3])' "$line")
expect_status 0 "$DSTRAIN" generate llama --prompt "The first" --tokenizer $tok --max-new-tokens 12 --json --stop-id "$stop_id"
"$py" - "$line" "$(grep '^{' <<<"$OUT")" "$stop_id" <<'PY' || fail "--stop-id did not end the row at that token"
import json, sys
free, stopped, sid = json.loads(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
first = free["token_ids"].index(sid)
assert stopped["token_ids"] == free["token_ids"][:first + 1] and stopped["finish_reason"] == "stop", (free, stopped)
PY
expect_status 0 "$DSTRAIN" generate llama --prompt "The first" --tokenizer $tok --max-new-tokens 12 --json --stop "$stop_text"
"$py" - "$line" "$(grep '^{' <<<"$OUT")" "$stop_text" <<'PY' || fail "--stop did not cut the text before the stop string"
import json, sys
free, stopped, stop = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
assert stopped["finish_reason"] == "stop" and stop not in stopped["text"] and free["text"].startswith(stopped["text"] + stop), (free, stopped)
PY
expect_status 0 "$DSTRAIN" generate llama --prompt "The first" --tokenizer $tok --max-new-tokens 12
text_out=$(grep -v '^20..-..-.. ' <<<"$OUT")
want=$("$py" -c 'import json, sys; print(json.loads(sys.argv[1])["text"])' "$line")
[ "$text_out" = "$want" ] || fail "the plain output is not the text: $text_out"
if command -v script >/dev/null; then  # on a terminal the text is streamed as it comes: the same text in the end
  streamed=$(script -qec "'$DSTRAIN' generate llama --prompt 'The first' --tokenizer $tok --max-new-tokens 12" /dev/null | tr -d '\r' |
    grep -v '^20..-..-.. ')
  [ "$streamed" = "$want" ] || fail "the streamed text is not the text: $streamed"
fi
for seed in 3 3 4; do
  expect_status 0 "$DSTRAIN" generate llama --prompts prompts.jsonl --tokenizer $tok --max-new-tokens 16 --json --temperature 0.9 \
    --top-k 50 --top-p 0.9 --repetition-penalty 1.2 --seed $seed
  grep '^{' <<<"$OUT" > sampled.$seed.$(ls sampled.$seed.* 2>/dev/null | wc -l).jsonl
done
ids() { "$py" -c 'import json, sys; print([json.loads(l)["token_ids"] for l in open(sys.argv[1])])' "$1"; }
[ "$(ids sampled.3.0.jsonl)" = "$(ids sampled.3.1.jsonl)" ] || fail "the same seed sampled other tokens"
[ "$(ids sampled.3.0.jsonl)" != "$(ids sampled.4.0.jsonl)" ] || fail "another seed sampled the same tokens"
[ "$(ids sampled.3.0.jsonl)" != "$(ids llama.ours.jsonl)" ] || fail "sampling gave the greedy tokens"
ok "--stop-id ends a row at that token, --stop cuts the text before the string (finish_reason stop); the plain output is the text, streamed on a terminal; sampling (temperature, top-k, top-p, repetition penalty) repeats with its seed and changes with another"

# A run's checkpoint generates as its export; a LoRA run (MLA: adapters on kv_b) as PEFT does.
"$py" - corpus.jsonl chat.jsonl <<'PY'
import json, sys
rows = [json.loads(l)["text"] for l in open(sys.argv[1])][:64]
with open(sys.argv[2], "w") as out:
    for i in range(0, len(rows) - 1, 2):
        out.write(json.dumps({"messages": [{"role": "user", "content": rows[i][:200]}, {"role": "assistant", "content": rows[i + 1][:200]}]}) + "\n")
PY
expect_status 0 "$DSTRAIN" prepare-data chat.jsonl --chat --tokenizer $tok --output chat --max-length 96 --too-long truncate
cat > sft.yaml <<'YAML'
run_dir: sft
seed: 3
model: {init_from: llama}
data: {path: chat, format: megatron, seq_len: 96}
train: {steps: 3, micro_batch_size: 4, global_batch_size: 8}
optimizer: {lr: 3.0e-3}
schedule: {warmup_steps: 0}
launch: {threads_per_worker: 1}
YAML
expect_status 0 "$DSTRAIN" train sft.yaml
expect_status 0 "$DSTRAIN" generate sft --prompts prompts.jsonl --json
grep '^{' <<<"$OUT" > run.jsonl
expect_status 0 "$DSTRAIN" export-hf sft sft-hf
expect_status 0 "$DSTRAIN" generate sft-hf --prompts prompts.jsonl --tokenizer $tok --json
grep '^{' <<<"$OUT" > export.jsonl
"$py" "$ref" compare run.jsonl export.jsonl || fail "the run's checkpoint and its export generate differently"
"$py" "$ref" compare llama.ref.jsonl run.jsonl >/dev/null 2>&1 && fail "training changed no generated token"
sed -e 's/init_from: llama/init_from: deepseek_v2/' -e 's/run_dir: sft/run_dir: lora/' sft.yaml > lora.yaml
# Attention adapters: PEFT 0.21 on transformers 5 turns MLP targets of a DeepSeek MoE model into the fused experts'.
echo 'lora: {rank: 4, alpha: 8, targets: [q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj]}' >> lora.yaml
expect_status 0 "$DSTRAIN" train lora.yaml
expect_status 0 "$DSTRAIN" generate lora --prompts prompts.jsonl --json
grep '^{' <<<"$OUT" > lora.jsonl
expect_status 0 "$DSTRAIN" export-hf lora lora-adapter
"$py" "$ref" generate deepseek_v2 $tok prompts.jsonl peft.ref.jsonl --max-new-tokens 64 --adapter lora-adapter > ref.log 2>&1 ||
  fail "PEFT could not generate: $(tail -3 ref.log)"
"$py" "$ref" compare peft.ref.jsonl lora.jsonl || fail "the LoRA run generates other tokens than PEFT with its exported adapter"
"$py" "$ref" compare deepseek_v2.ref.jsonl lora.jsonl >/dev/null 2>&1 && fail "the LoRA run generates as the base does: the adapters did nothing"
expect_status 0 "$DSTRAIN" export-hf lora lora-merged --merge
expect_status 0 "$DSTRAIN" generate lora-merged --prompts prompts.jsonl --tokenizer $tok --json
grep '^{' <<<"$OUT" > merged.jsonl
"$py" "$ref" compare peft.ref.jsonl merged.jsonl || fail "the merged export generates otherwise"
"$py" "$ref" generate lora-merged $tok prompts.jsonl merged.ref.jsonl --max-new-tokens 64 > ref.log 2>&1 || fail "transformers could not generate: $(tail -3 ref.log)"
"$py" "$ref" compare merged.ref.jsonl lora.jsonl || fail "transformers on the merged export generates otherwise than the LoRA run"
ok "a run's checkpoint generates the tokens its export does; a LoRA run on the MLA model (adapters on kv_b: per-head keys from the cached latents) generates with its adapters as PEFT does on transformers (and otherwise than the base), as its merged export does in dstrain and in transformers"

# eval.samples: text at every evaluation during training (the MLA + MoE model, its cache under
# ZeRO-3's layer-by-layer gathers at 2 ranks), each step's equal to dstrain generate of that checkpoint.
sed -e 's/init_from: llama/init_from: deepseek_v2/' -e 's/run_dir: sft/run_dir: samples/' sft.yaml > samples.yaml
cat >> samples.yaml <<'YAML'
eval: {samples: prompts.jsonl, sample_tokens: 16, interval_steps: 1, at_start: true}
checkpoint: {interval_steps: 1}
logging: {sinks: [console, jsonl, tensorboard]}
YAML
expect_status 0 "$DSTRAIN" train samples.yaml
expect_out "eval step 3/3 | samples | 8 written to"
expect_status 0 "$DSTRAIN" train samples.yaml --set run_dir=samples-zero3 --set zero.stage=3 --nproc-per-node 2
for step in 2 3; do
  expect_status 0 "$DSTRAIN" generate samples --step $step --prompts prompts.jsonl --max-new-tokens 16 --json
  grep '^{' <<<"$OUT" > gen.$step.jsonl
  "$py" - gen.$step.jsonl samples/samples.jsonl samples-zero3/samples.jsonl $step <<'PY' || fail "eval.samples at step $step differ from dstrain generate of that checkpoint"
import json, sys
want = [json.loads(l)["text"] for l in open(sys.argv[1])]
step = int(sys.argv[4])
for path in sys.argv[2:4]:
    rows = [json.loads(l) for l in open(path)]
    got = [r["text"] for r in sorted((r for r in rows if r["step"] == step), key=lambda r: r["index"])]
    assert got == want, (path, got, want)
    assert sorted({r["step"] for r in rows}) == [0, 1, 2, 3], path
PY
done
"$py" - samples <<'PY' || fail "TensorBoard has no samples"
import glob, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(glob.glob(sys.argv[1] + "/tensorboard/events.out.tfevents.*")[0], size_guidance={"tensors": 0})
acc.Reload()
events = acc.Tensors("samples/0")
assert [e.step for e in events] == [0, 1, 2, 3], events
text = events[-1].tensor_proto.string_val[0].decode()
assert text.startswith("> ") and "```" in text, text
PY
ok "eval.samples writes each prompt's text at every evaluation (samples.jsonl, TensorBoard's text tab), equal to dstrain generate of that step's checkpoint, at 1 rank and at 2 ranks with ZeRO-3 on the MLA + MoE model"

# dstrain chat on a terminal: each answer is what generate gives for the conversation so far.
expect_status 2 "$DSTRAIN" chat llama --tokenizer $tok </dev/null
expect_out "dstrain chat talks with a person at a terminal, and its input is not one"
if command -v script >/dev/null; then
  printf 'hello there\n/system Be brief.\nwhat now?\nsecond turn\n/reset\nagain\n' |
    timeout 120 script -qec "'$DSTRAIN' chat llama --tokenizer $tok --max-new-tokens 10 --save conversations.jsonl" /dev/null > chat.log ||
    fail "dstrain chat failed: $(tail -5 chat.log)"
  "$py" - conversations.jsonl turns.jsonl <<'PY'
import json, sys
conversations = [json.loads(l)["messages"] for l in open(sys.argv[1])]
roles = [[m["role"] for m in c] for c in conversations]
assert roles == [["user", "assistant"], ["system", "user", "assistant", "user", "assistant"], ["system", "user", "assistant"]], roles
assert conversations[1][0]["content"] == "Be brief." and conversations[2][1]["content"] == "again", conversations
with open(sys.argv[2], "w") as out:
    for c in conversations:
        for k, m in enumerate(c):
            if m["role"] == "assistant":
                out.write(json.dumps({"messages": c[:k], "answer": m["content"]}) + "\n")
PY
  [ $? = 0 ] || fail "the saved conversations are not the session's"
  expect_status 0 "$DSTRAIN" generate llama --prompts turns.jsonl --tokenizer $tok --max-new-tokens 10 --json
  "$py" - turns.jsonl "$OUT" <<'PY' || fail "chat answered otherwise than generate does for the same conversation"
import json, sys
turns = [json.loads(l) for l in open(sys.argv[1])]
answers = [json.loads(l)["text"] for l in sys.argv[2].splitlines() if l.startswith("{")]
assert [t["answer"] for t in turns] == answers, (turns, answers)
PY
  grep -qF "(system message set; a new conversation)" chat.log || fail "chat did not confirm /system: $(cat chat.log)"
  ok "dstrain chat keeps the history, /system and /reset start new conversations, Ctrl-D leaves; every answer is what generate gives for that conversation (through the chat template); --save writes them as JSON Lines; without a terminal it is refused (exit 2)"
fi

# A run trained on bytes (the demo's prepare-data without a tokenizer): text is its UTF-8 bytes.
expect_status 0 "$DSTRAIN" prepare-data "$SRC/scripts" --ext .py --output code
expect_status 0 "$DSTRAIN" train "$SRC/recipes/demo-coder.yaml" --set run_dir=coder --set data.path="$WORK/code" --set train.steps=4 \
  --set schedule.warmup_steps=0 --set eval.interval_steps=0 --set launch.nproc_per_node=1 --set model.max_seq_len=128 \
  --set data.seq_len=128
expect_status 0 "$DSTRAIN" generate coder --prompt "def main(" --max-new-tokens 20 --json
"$py" - "$(grep '^{' <<<"$OUT")" <<'PY' || fail "the byte-level run did not generate bytes"
import json, sys
row = json.loads(sys.argv[1])
assert row["prompt_tokens"] == len("def main(") and all(0 <= t <= 256 for t in row["token_ids"]), row
text = bytes(t for t in row["token_ids"] if t < 256).decode("utf-8", errors="replace")
assert row["text"] == (text if row["finish_reason"] == "length" else text), row
PY
printf '{"messages": [{"role": "user", "content": "hi"}]}\n' > chat-prompt.jsonl
expect_status 2 "$DSTRAIN" generate coder --prompts chat-prompt.jsonl
expect_out "chat-prompt.jsonl:1: this model was trained on bytes"
ok "a byte-level run (prepare-data without a tokenizer, as the demo's) generates from its prompt's UTF-8 bytes and stops at its end-of-document token; a conversation is refused for it by file:line"

# Bad input.
n=$("$py" -c 'import json, sys; print(json.loads(sys.argv[1])["prompt_tokens"])' "$line")
expect_status 2 "$DSTRAIN" generate llama --prompt "The first" --tokenizer $tok --max-new-tokens 256
expect_out "--prompt 1: $n prompt tokens and --max-new-tokens 256 make $((n + 256)), more than the model's 256 positions"
expect_out "pass --max-new-tokens $((256 - n)) or less"
printf '{"prompt": "fine"}\n{"text": "not a prompt"}\n' > bad.jsonl
expect_status 3 "$DSTRAIN" generate llama --prompts bad.jsonl --tokenizer $tok
expect_out "bad.jsonl:2: a prompt is a JSON object with \"prompt\" (text) or \"messages\" (a list)"
python3 -c 'import json; print(json.dumps({"prompt": "word " * 400}))' > long.jsonl
expect_status 3 "$DSTRAIN" generate llama --prompts long.jsonl --tokenizer $tok
expect_out "long.jsonl:1: "
expect_out "shorten the prompt"
expect_status 2 "$DSTRAIN" generate llama --prompt "x" --tokenizer $tok --stop-id 3000
expect_out "--stop-id 3000 is not a token of this model (its vocabulary is 0..2999)"
expect_status 2 "$DSTRAIN" generate llama --prompt "x"
expect_out "dstrain generate needs the model's tokenizer"
expect_status 2 "$DSTRAIN" generate llama --tokenizer $tok
expect_out "nothing to generate from"
expect_status 2 "$DSTRAIN" generate nowhere --prompt x
ok "a prompt too long for the model's positions (by flag, or by file:line), a line that is no prompt, an unknown stop id, no tokenizer and no prompt are refused with what to do (exit 2, or 3 for the prompts file)"
finish
