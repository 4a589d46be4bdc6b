#!/usr/bin/env bash
# prepare-data with Hugging Face tokenizers (issue 24). On a 10 MB mixed corpus (code, English,
# Chinese, digits, emoji, whitespace runs, special tokens), tokenizers trained here with the
# `tokenizers` package (DeepSeek-V3's, GPT-2's and Llama 3's configurations, and variants for the
# other components) give the same ids in dstrain's dataset as tokenizers' encode_batch. The output
# is the same for any --workers, for gzip and stdin input; JSON Lines keys, the sidecar, decoding,
# train's vocabulary check, refusals by name, and the export that transformers loads and generates
# with.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=true RAYON_NUM_THREADS=2
"$py" -c 'import tokenizers' 2>/dev/null || fail "the test venv lacks tokenizers (scripts/setup.sh --test installs transformers)"

"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 10
"$py" "$SRC/test/text/train_tokenizers.py" corpus.jsonl toks
size=$(stat -c %s corpus.jsonl)
[ "$size" -ge 10000000 ] || fail "the corpus is only $size bytes"

declare -A EOD=([deepseek_v3]="<｜end▁of▁sentence｜>" [gpt2]="<|endoftext|>" [llama3]="<|end_of_text|>" [nfkc_digits]="<|endoftext|>"
                [nfc_lower]="<|endoftext|>" [char_fallback]="</s>" [char_unk]="</s>")
token_id() { "$py" -c 'import sys; from tokenizers import Tokenizer; print(Tokenizer.from_file(sys.argv[1]).token_to_id(sys.argv[2]))' "$1" "$2"; }
for name in deepseek_v3 gpt2 llama3 nfkc_digits nfc_lower char_fallback char_unk; do
  expect_status 0 "$DSTRAIN" prepare-data corpus.jsonl --tokenizer "toks/$name" --output "out/$name" --workers 2
  expect_out "end-of-document $(token_id "toks/$name/tokenizer.json" "${EOD[$name]}")"
  "$py" "$SRC/test/text/check_parity.py" corpus.jsonl "toks/$name" "out/$name" "${EOD[$name]}" || fail "$name: ids differ from tokenizers"
done
ok "7 tokenizers (DeepSeek-V3, GPT-2, Llama 3 and 4 variants): ids identical to tokenizers' encode_batch on $((size / 1000000)) MB"

for n in 1 3; do
  expect_status 0 "$DSTRAIN" prepare-data corpus.jsonl --tokenizer toks/deepseek_v3 --output "w$n/ds" --workers $n
  cmp -s "w$n/ds.bin" out/deepseek_v3.bin && cmp -s "w$n/ds.idx" out/deepseek_v3.idx || fail "--workers $n wrote another dataset"
done
gzip -c corpus.jsonl > corpus.jsonl.gz
expect_status 0 "$DSTRAIN" prepare-data corpus.jsonl.gz --tokenizer toks/deepseek_v3 --output gz/ds
cmp -s gz/ds.bin out/deepseek_v3.bin || fail "gzip input gave another dataset"
set +e
OUT=$(gzip -c corpus.jsonl | "$DSTRAIN" prepare-data - --input-format jsonl --tokenizer toks/deepseek_v3 --output stdin/ds 2>&1)
rc=$?
set -e
[ $rc -eq 0 ] && cmp -s stdin/ds.bin out/deepseek_v3.bin || fail "gzip on stdin gave another dataset ($rc): $OUT"
ok "--workers 1, 2 and 3, a .gz file and gzip on stdin all write the same bytes"

"$py" - <<'PY' || fail "the sidecar is wrong"
import hashlib, json
j = json.load(open("out/deepseek_v3.json"))
want = hashlib.sha256(open("toks/deepseek_v3/tokenizer.json", "rb").read()).hexdigest()
assert j["tokenizer"] == "huggingface" and j["tokenizer_sha256"] == want and j["vocab_size"] == 6000, j
assert j["tokenizer_dir"] == "deepseek_v3.tokenizer" and j["json_key"] == "text", j
assert open("out/deepseek_v3.tokenizer/tokenizer.json", "rb").read() == open("toks/deepseek_v3/tokenizer.json", "rb").read()
PY
expect_status 0 "$DSTRAIN" inspect-data out/gpt2 --decode 3
"$py" - "$OUT" <<'PY' || fail "inspect-data --decode does not give the documents back"
import json, sys
docs = [t for t in (json.loads(l)["text"] for l in open("corpus.jsonl", encoding="utf-8")) if t][:3]
out = sys.argv[1]
for i, d in enumerate(docs):
    assert f"--- document {i} (" in out and d + "<|endoftext|>" in out, i
PY
ok "PREFIX.json records the vocabulary, the tokenizer's SHA-256 and its copy; inspect-data --decode gives the text back"

mkdir -p texts && printf 'def main():\n    print("héllo 世界 🚀")\n' > texts/a.py && printf '   \n\n12345 tabs\t\there\n' > texts/b.txt
expect_status 0 "$DSTRAIN" prepare-data texts --tokenizer toks/llama3 --output textdocs
printf '{"title": "Hello", "text": "World 123"}\n\n{"title": "标题", "text": "正文 text"}\n' > keys.jsonl
expect_status 0 "$DSTRAIN" prepare-data keys.jsonl --tokenizer toks/llama3 --json-key title --json-key text --output keyed
expect_out "(key 'title')"
"$py" - <<'PY' || fail "text files or JSON keys were not tokenized as tokenizers does"
import numpy as np
from tokenizers import Tokenizer
tok = Tokenizer.from_file("toks/llama3/tokenizer.json")
eod = tok.token_to_id("<|end_of_text|>")
def docs(prefix):
    idx = open(prefix + ".idx", "rb").read()
    n = int.from_bytes(idx[18:26], "little")
    lengths = np.frombuffer(idx[34:34 + 4 * n], dtype=np.int32)
    t = np.fromfile(prefix + ".bin", dtype=np.uint16).tolist()
    out, at = [], 0
    for l in lengths:
        out.append(t[at:at + l]); at += l
    return out
want = [tok.encode(open(f, encoding="utf-8").read()).ids + [eod] for f in ["texts/a.py", "texts/b.txt"]]
assert docs("textdocs") == want, (docs("textdocs"), want)
assert docs("keyed_title") == [tok.encode(s).ids + [eod] for s in ["Hello", "标题"]]
assert docs("keyed_text") == [tok.encode(s).ids + [eod] for s in ["World 123", "正文 text"]]
PY
ok "a folder of text files (one document each) and JSON Lines with two keys (one dataset per key, as Megatron does)"

printf '{"text": "fine"}\n{"text": "broken\n' > bad.jsonl
expect_status 3 "$DSTRAIN" prepare-data bad.jsonl --tokenizer toks/gpt2 --output bad
expect_out "bad.jsonl:2: not a JSON line"
[ ! -e bad.bin ] && [ ! -e bad.bin.tmp ] && [ ! -e bad.idx ] || fail "a failed prepare-data left files behind"
printf '{"body": "x"}\n' > nokey.jsonl
expect_status 3 "$DSTRAIN" prepare-data nokey.jsonl --tokenizer toks/gpt2 --output nokey
expect_out "nokey.jsonl:1: no key 'text' (the line has: body)"
expect_out "--json-key"
expect_status 2 "$DSTRAIN" prepare-data nokey.jsonl --tokenizer toks/gpt2 --json-key body --output nokey --eod-token '<nope>'
expect_out "--eod-token '<nope>' is not a token"
refusals=(
  'j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "x"}|the pre-tokenizer '"'"'Metaspace'"'"' is not supported'
  'j["model"]["type"] = "WordPiece"|the model '"'"'WordPiece'"'"' is not supported'
  'j["normalizer"] = {"type": "BertNormalizer"}|the normalizer '"'"'BertNormalizer'"'"' is not supported'
  'j["truncation"] = {"max_length": 512}|truncation: is set'
  'j["added_tokens"][0]["single_word"] = True|single_word: is true'
  'j["post_processor"] = {"type": "Bogus"}|the post-processor '"'"'Bogus'"'"' is not supported')
mkdir -p refused
for edit in "${refusals[@]}"; do
  "$py" -c "import json; j = json.load(open('toks/gpt2/tokenizer.json')); ${edit%%|*}; json.dump(j, open('refused/tokenizer.json', 'w'))"
  expect_status 3 "$DSTRAIN" prepare-data keys.jsonl --tokenizer refused --output refused/out
  expect_out "${edit#*|}"
  expect_out "refused/tokenizer.json"
done
ok "bad JSON lines, missing keys and unknown tokens are errors naming file, line and key; 6 unsupported components refused by name"

expect_status 2 "$DSTRAIN" train "$demo_recipe" --dry-run --set data.format=megatron --set data.path="$WORK/out/gpt2" --set model.vocab_size=257
expect_out "model.vocab_size: 257 is smaller than the vocabulary"
expect_out "set model.vocab_size to at least 6000"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --dry-run --set data.format=megatron --set data.path="$WORK/out/gpt2" --set model.vocab_size=6000 \
  --set data.eos_token=256
expect_out "data.eos_token: 256 is not the end-of-document token"
ok "train refuses a model.vocab_size below the dataset's vocabulary and a data.eos_token that is not its end-of-document token"

# The demo's path with a trained tokenizer: prepare, train, export; transformers loads and generates.
stdlib=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
expect_status 0 "$DSTRAIN" prepare-data "$stdlib" --ext .py --max-bytes 2000000 --tokenizer toks/gpt2 --output pycode
# The vocabulary (6000) and the end-of-document token (0) come from pycode.json, as in the demo.
expect_status 0 "$DSTRAIN" train "$SRC/recipes/demo-coder.yaml" --set data.path="$WORK/pycode" \
  --set train.steps=4 --set schedule.warmup_steps=1 --set checkpoint.interval_steps=4 --set run_dir=run \
  --set launch.nproc_per_node=1 --set train.global_batch_size=8
python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["config"]; assert (c["model"]["vocab_size"], c["data"]["eos_token"]) == (6000, 0), c' \
  run/config.resolved.json || fail "the vocabulary and end-of-document token were not taken from pycode.json"
expect_status 0 "$DSTRAIN" export-hf run hf
expect_out "the tokenizer the data was prepared with"
"$py" - <<'PY' || fail "transformers could not use the export's tokenizer"
import numpy as np, transformers
tok = transformers.AutoTokenizer.from_pretrained("hf")
idx = open("pycode.idx", "rb").read()
first = int.from_bytes(idx[34:38], "little")
doc = np.fromfile("pycode.bin", dtype=np.uint16)[:first].tolist()
text = tok.decode(doc[:-1])
assert tok(text)["input_ids"] == doc[:-1], "AutoTokenizer does not give the dataset's ids"
assert tok.eos_token_id == 0, tok.eos_token_id
gen = transformers.pipeline("text-generation", model="hf", tokenizer=tok)
out = gen("def main(", max_new_tokens=8, do_sample=False)[0]["generated_text"]
assert out.startswith("def main(") and len(out) > len("def main("), out
print("pipeline:", repr(out))
PY
ok "the demo prepares its data with a trained BPE tokenizer; export-hf's output loads with AutoTokenizer and pipeline('text-generation')"
finish
