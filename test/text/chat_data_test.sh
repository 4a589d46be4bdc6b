#!/usr/bin/env bash
# Conversations into fine-tuning data (issue 38): `prepare-data --chat` gives, for 7 chat templates
# (the DeepSeek family, Llama 3, ChatML, Mistral) x 225 conversations, the token ids of
# apply_chat_template(tokenize=True) and the incremental prefix masks of a transformers reference,
# identical; the built-in deepseek-coder-finetune equals DeepSeek-Coder's finetune script; every
# input layout (OpenAI, ShareGPT, Alpaca, renamed fields, a .json array, gzip, stdin, chosen without
# --chat) gives the same bytes; --train-on, "train": false, --max-length drop/truncate and their
# counts in PREFIX.json; inspect-data shows the trained spans and catches a changed mask; every bad
# input stops with its file, line, reason and exit status, leaving no files.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
ref="$SRC/test/text/chat_data_reference.py"
fx="$SRC/test/fixtures/chat_templates"
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" -c 'import transformers' 2>/dev/null || fail "transformers is not importable from $py (scripts/setup.sh --test installs it)"

"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1
"$py" "$ref" tokenizers corpus.jsonl "$fx" toks
"$py" "$ref" chats corpus.jsonl "$fx/conversations.jsonl" chats.jsonl --count 200
templates="deepseek-llm-chat deepseek-coder-instruct deepseek-v3-style deepseek-r1-style llama3-style chatml-qwen-style mistral-style"
for t in $templates; do
  expect_status 0 "$DSTRAIN" prepare-data chats.jsonl --chat --tokenizer "toks/$t" --output "out/$t" --on-error skip --workers 2
  expect_out "conversations kept"
  "$py" "$ref" reference "toks/$t" chats.jsonl "ref-$t.json"
  "$py" "$ref" compare "ref-$t.json" "out/$t" >> parity.txt || fail "$t: ids or masks differ from the transformers reference: $(tail -1 parity.txt)"
done
expect_status 0 "$DSTRAIN" prepare-data chats.jsonl --tokenizer toks/deepseek-v3-style --output w1/v3 --on-error skip --workers 1
cmp -s w1/v3.bin out/deepseek-v3-style.bin && cmp -s w1/v3.lossmask out/deepseek-v3-style.lossmask || fail "--workers 1 wrote another dataset"
ok "7 templates x $(wc -l < chats.jsonl) conversations: ids and loss masks identical to transformers' apply_chat_template with incremental prefix masking ($(awk '{n += $1} END {print n}' parity.txt) conversations compared; --chat chosen by itself; the same bytes with 1 and 2 workers)"

"$py" - <<'PY' > coder.jsonl
import json, random
rng = random.Random(3)
pool = [json.loads(l)["text"] for l in open("corpus.jsonl", encoding="utf-8")]
for _ in range(60):
    u, a = rng.choice(pool)[:rng.randint(1, 120)], rng.choice(pool)[:rng.randint(1, 300)]
    print(json.dumps({"instruction": rng.choice(["", "  ", "\n"]) + u + rng.choice(["", " \n"]), "output": a}, ensure_ascii=False))
PY
expect_status 0 "$DSTRAIN" prepare-data coder.jsonl --tokenizer toks/deepseek-coder-instruct --template deepseek-coder-finetune --output out/coder
expect_out "end of turn '<|EOT|>'"
"$py" "$ref" reference toks/deepseek-coder-instruct coder.jsonl ref-coder.json --builtin-coder
"$py" "$ref" compare ref-coder.json out/coder > coder.txt || fail "--template deepseek-coder-finetune differs from finetune_deepseekcoder.py: $(cat coder.txt)"
ok "--template deepseek-coder-finetune: ids and labels identical to DeepSeek-Coder's finetune_deepseekcoder.py preprocess ($(cat coder.txt))"

# The same conversations in every layout.
"$py" - <<'PY'
import gzip, json
openai, sharegpt, alpaca, renamed = [], [], [], []
for i in range(40):
    system = f"system {i}" if i % 3 == 0 else None
    turns = [(f"question {i} turn {k} ü", f"answer {i}.{k} 🙂") for k in range(1 + i % 3)]
    m = ([{"role": "system", "content": system}] if system else [])
    for q, a in turns:
        m += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    openai.append({"messages": m, "text": f"plain {i}"})
    sharegpt.append({"conversations": [{"from": {"system": "system", "user": "human", "assistant": "gpt"}[x["role"]], "value": x["content"]} for x in m]})
    a = {"instruction": turns[-1][0], "output": turns[-1][1], "history": [list(t) for t in turns[:-1]]}
    if system:
        a["system"] = system
    alpaca.append(a)
    renamed.append({"dialog": [{"speaker": x["role"], "text": x["content"]} for x in m]})
def lines(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
lines("openai.jsonl", openai); lines("sharegpt.jsonl", sharegpt); lines("alpaca.jsonl", alpaca); lines("renamed.jsonl", renamed)
json.dump(openai, open("array.json", "w", encoding="utf-8"), ensure_ascii=False, indent=1)
with gzip.open("openai.jsonl.gz", "wt", encoding="utf-8") as f:
    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in openai)
# Alpaca's instruction + input is one user turn: "instruction\ninput".
lines("split.jsonl", [{"instruction": "Sum these", "input": "1 2 3", "output": "6"}])
lines("joined.jsonl", [{"messages": [{"role": "user", "content": "Sum these\n1 2 3"}, {"role": "assistant", "content": "6"}]}])
PY
tok=toks/deepseek-llm-chat
expect_status 0 "$DSTRAIN" prepare-data openai.jsonl --tokenizer $tok --output fmt/openai
for f in sharegpt alpaca; do
  expect_status 0 "$DSTRAIN" prepare-data $f.jsonl --tokenizer $tok --output fmt/$f
done
expect_status 0 "$DSTRAIN" prepare-data renamed.jsonl --chat --tokenizer $tok --output fmt/renamed --chat-fields messages=dialog,role=speaker,content=text
expect_status 0 "$DSTRAIN" prepare-data array.json --chat --tokenizer $tok --output fmt/array
expect_status 0 "$DSTRAIN" prepare-data openai.jsonl.gz --tokenizer $tok --output fmt/gz
set +e
OUT=$(gzip -c openai.jsonl | "$DSTRAIN" prepare-data - --input-format jsonl --chat --tokenizer $tok --output fmt/stdin 2>&1)
rc=$?
set -e
[ $rc = 0 ] || fail "stdin: exit $rc: $OUT"
for f in sharegpt alpaca renamed array gz stdin; do
  cmp -s fmt/$f.bin fmt/openai.bin && cmp -s fmt/$f.idx fmt/openai.idx && cmp -s fmt/$f.lossmask fmt/openai.lossmask ||
    fail "the $f layout gave another dataset than the OpenAI one"
done
expect_status 0 "$DSTRAIN" prepare-data split.jsonl --tokenizer $tok --output fmt/split
expect_status 0 "$DSTRAIN" prepare-data joined.jsonl --tokenizer $tok --output fmt/joined
cmp -s fmt/split.bin fmt/joined.bin || fail "Alpaca's instruction and input are not joined by a newline"
expect_status 0 "$DSTRAIN" prepare-data openai.jsonl --no-chat --tokenizer $tok --output fmt/plain
[ ! -e fmt/plain.lossmask ] || fail "--no-chat wrote a loss mask"
ok "OpenAI messages, ShareGPT, Alpaca (system, history, input), --chat-fields, a .json array, gzip and stdin give the same bytes; --no-chat reads plain text"

# Parquet, as Hugging Face dataset repositories ship conversations: the same rows, the same bytes.
"$py" - <<'PY'
import json, pyarrow as pa, pyarrow.parquet as pq
rows = [json.loads(l) for l in open("openai.jsonl", encoding="utf-8")]
for r in rows:  # a column some rows leave null, as a struct column of a dataset does
    r["messages"][-1]["train"] = None
pq.write_table(pa.Table.from_pylist(rows), "openai.parquet", row_group_size=7)
open("broken.parquet", "wb").write(b"PAR1 not really")
PY
expect_status 0 "$DSTRAIN" prepare-data openai.parquet --tokenizer $tok --output fmt/parquet
expect_out "40 conversations kept"
cmp -s fmt/parquet.bin fmt/openai.bin && cmp -s fmt/parquet.lossmask fmt/openai.lossmask || fail "the Parquet file gave another dataset"
expect_status 0 "$DSTRAIN" prepare-data openai.parquet --no-chat --tokenizer $tok --output fmt/parquet-text
cmp -s fmt/parquet-text.bin fmt/plain.bin || fail "the Parquet file's text column gave another dataset than the JSON lines"
expect_status 3 "$DSTRAIN" prepare-data broken.parquet --tokenizer $tok --output fmt/broken
expect_out "cannot read 'broken.parquet' as Parquet"
DSTRAIN_PARQUET_PLUGIN=/nonexistent expect_status 5 "$DSTRAIN" prepare-data openai.parquet --tokenizer $tok --output fmt/none
expect_out "Parquet input needs libdstrain_parquet.so"
ok "Parquet (row groups, struct and list columns, nulls): the same bytes as the JSON lines, for conversations and for --json-key text; a broken file (exit 3) and a missing plugin (exit 5) named"

# What is trained, and the counts in PREFIX.json.
"$py" - <<'PY'
import json
rows = [{"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1", "train": False},
                      {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]},
        {"messages": [{"role": "user", "content": "only a question"}]},
        {"messages": [{"role": "user", "content": "q3"}, {"role": "assistant", "content": "a long answer " * 50}]}]
with open("train.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
PY
expect_status 0 "$DSTRAIN" prepare-data train.jsonl --tokenizer $tok --output tr/default
expect_out "2 conversations kept, 1 dropped with no trained token"
expect_status 0 "$DSTRAIN" prepare-data train.jsonl --tokenizer $tok --output tr/all --train-on all
expect_status 0 "$DSTRAIN" prepare-data train.jsonl --tokenizer $tok --output tr/last --train-on last
expect_status 0 "$DSTRAIN" prepare-data train.jsonl --tokenizer $tok --output tr/drop --max-length 100
expect_out "1 conversations kept, 1 dropped as longer than --max-length, 1 dropped with no trained token"
expect_status 0 "$DSTRAIN" prepare-data train.jsonl --tokenizer $tok --output tr/cut --max-length 100 --too-long truncate
expect_out "2 conversations kept, 1 truncated to --max-length"
"$py" - "$tok" "$SRC/test/text" <<'PY' || fail "what is trained is wrong"
import json, sys
from transformers import AutoTokenizer
sys.path.insert(0, sys.argv[2])
from chat_data_reference import read_dataset
tok = AutoTokenizer.from_pretrained(sys.argv[1])
eos = tok.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
text = lambda ids, mask: "".join(tok.decode([t]) if m else "" for t, m in zip(ids, mask))
d = read_dataset("tr/default")
assert len(d) == 2 and text(*d[0]) == " a2<｜end▁of▁sentence｜>", text(*d[0])  # "train": false kept a1 out
a = read_dataset("tr/all")
assert all(a[1][1]) and all(a[2][1]), "--train-on all left tokens out"
untrained = "".join(tok.decode([t]) for t, m in zip(*a[0]) if not m)
assert untrained == " a1<｜end▁of▁sentence｜>", untrained  # "train": false wins
last = read_dataset("tr/last")
assert text(*last[0]) == " a2<｜end▁of▁sentence｜>", text(*last[0])
drop, cut = read_dataset("tr/drop"), read_dataset("tr/cut")
assert len(drop) == 1 and len(cut) == 2 and len(cut[1][0]) == 100 and cut[1][0][-1] == eos and cut[1][1][-1] == 1, (len(cut[1][0]),)
j = json.load(open("tr/cut.json"))
c, m = j["chat"], j["loss_mask"]
assert c["conversations"] == 2 and c["truncated"] == 1 and c["dropped_untrained"] == 1 and c["overlength"] == "truncate", c
assert c["max_length"] == 100 and c["end_of_turn"] == "<｜end▁of▁sentence｜>" and c["train_on"] == "assistant", c
import zlib
raw = open("tr/cut.lossmask", "rb").read()
assert m["bytes"] == len(raw) and m["trained_tokens"] == sum(raw[16:]) and m["file"] == "cut.lossmask" and m["version"] == 1, m
assert json.load(open("tr/drop.json"))["chat"]["dropped_too_long"] == 1
PY
ok "default (assistant turns with their end-of-turn token), \"train\": false, --train-on all and last; --max-length drop and truncate (the cut answer ends with the end-of-turn token); the counts, size and trained tokens in PREFIX.json"

expect_status 0 "$DSTRAIN" inspect-data tr/default --decode 2
expect_out "loss mask  tr/default.lossmask: "
expect_out "<｜begin▁of▁sentence｜>User: q1"
expect_out "Assistant:[[ a2<｜end▁of▁sentence｜>]]"
cp tr/default.lossmask saved.lossmask
"$py" -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[-1] ^= 1; open(sys.argv[1], "wb").write(b)' tr/default.lossmask
expect_status 3 "$DSTRAIN" inspect-data tr/default
expect_out "the file changed"
ok "inspect-data verifies the loss mask against PREFIX.json and shows the trained spans between [[ and ]]"

# R1's template cuts the reasoning: warned, and --last-turn-verbatim keeps it.
printf '%s\n' '{"messages": [{"role": "user", "content": "Think"}, {"role": "assistant", "content": "<think>\nstep by step\n</think>\n\nSeven."}]}' > r1.jsonl
expect_status 0 "$DSTRAIN" prepare-data r1.jsonl --tokenizer toks/deepseek-r1-style --output r1/cut
expect_out "warning: in 1 conversations (the first: r1.jsonl:1) the chat template does not render a trained message as written"
expect_status 0 "$DSTRAIN" prepare-data r1.jsonl --tokenizer toks/deepseek-r1-style --output r1/kept --train-on last --last-turn-verbatim
expect_status 0 "$DSTRAIN" inspect-data r1/kept --decode 1
expect_out "<｜Assistant｜><think>
[[step by step
</think>

Seven.<｜end▁of▁sentence｜>]]"
ok "a template that rewrites an assistant turn (R1's </think> cut) is warned about with its file and line; --last-turn-verbatim trains the reasoning as written"

# Bad input: the file and line, the reason, the exit status, and no files left.
bad() {  # bad STATUS MESSAGE LINE [flags...]
  local want=$1 message=$2 line=$3
  shift 3
  printf '%s\n' '{"messages": [{"role": "user", "content": "fine"}, {"role": "assistant", "content": "ok"}]}' "$line" > bad.jsonl
  expect_status "$want" "$DSTRAIN" prepare-data bad.jsonl --tokenizer "${TOK:-$tok}" --output bad/set "$@"
  expect_out "$message"
  [ "$want" = 0 ] || [ -z "$(ls bad 2>/dev/null)" ] || fail "a failed run left files: $(ls bad)"
}
bad 3 'bad.jsonl:2: message 0 has no '"'"'role'"'"'' '{"messages": [{"content": "no role"}]}'
bad 3 "bad.jsonl:2: unknown role 'wizard'" '{"messages": [{"role": "wizard", "content": "x"}]}'
bad 3 "bad.jsonl:2: message 1 (assistant): 'content' is an array, not a string" \
  '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [1]}]}'
bad 3 "bad.jsonl:2: the conversation has no messages" '{"messages": []}'
bad 3 "bad.jsonl:2: not valid JSON" '{"messages": [' --chat
bad 3 "bad.jsonl:2: no conversation: the object has text" '{"text": "plain"}' --chat
TOK=toks/mistral-style bad 3 "bad.jsonl:2: the chat template refused it" \
  '{"messages": [{"role": "assistant", "content": "first"}, {"role": "user", "content": "x"}]}'
expect_out "conversation roles must alternate"
TOK=toks/mistral-style bad 0 "1 skipped as malformed or refused (--on-error skip; the first: bad.jsonl:2" \
  '{"messages": [{"role": "assistant", "content": "first"}, {"role": "user", "content": "x"}]}' --on-error skip
rm -rf bad
bad 2 "the end-of-turn string 'END' is not one token" '{"messages": []}' --end-of-turn END
expect_out "cannot learn to stop"
bad 2 "does not end assistant message 1 with the end-of-turn token '<|im_end|>'" '{"messages": []}' --end-of-turn '<|im_end|>'
bad 3 "no conversation is left to train on" '{"messages": [{"role": "user", "content": "x"}]}' --on-error skip --max-length 3
expect_status 2 "$DSTRAIN" prepare-data openai.jsonl --chat --output nothing
expect_out "--chat needs --tokenizer"
expect_status 2 "$DSTRAIN" prepare-data openai.jsonl --tokenizer $tok --template nope --output nothing
expect_out "--template 'nope' is not a built-in template"
expect_status 2 "$DSTRAIN" prepare-data openai.jsonl --tokenizer $tok --chat-fields speaker=x --output nothing
expect_out "--chat-fields 'speaker=x' is not NAME=KEY"
[ ! -e nothing.bin ] || fail "a refused run wrote files"
ok "malformed conversations (no role, unknown role, non-string content, empty, not JSON, no layout), a template's refusal, --on-error skip, an end-of-turn that is not one token or not in the turns, nothing left, bad flags: file:line, reason, exit status, no files"

finish
