#!/usr/bin/env bash
# export-hf as Hugging Face users need it: bf16 or fp32 weights, sharded past --max-shard-size with
# model.safetensors.index.json, generation_config.json with the dataset's end-of-document id, and a
# tokenizer; transformers (from the test venv) loads every variant as it is, the shards give the
# same logits as one file, and AutoTokenizer maps text to the dataset's byte ids. Bad arguments are
# usage errors (exit 2).
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error  # local files only, quiet

mkdir -p corpus
for i in 1 2 3 4 5 6; do python3 -c "print('def f$i(x):\n    return x * $i  # héllo\n' * 200)" > corpus/f$i.py; done
expect_status 0 "$DSTRAIN" prepare-data corpus --output text
expect_status 0 "$DSTRAIN" train "$demo_recipe" --set data.format=megatron --set data.path="$WORK/text" --set model.vocab_size=257 \
  --set data.eos_token=256 --set train.steps=6 --set schedule.warmup_steps=2 --set checkpoint.interval_steps=0 --set run_dir=run

expect_status 0 "$DSTRAIN" export-hf run one
expect_out "1 weight file"
expect_out "tokenizer: byte-level"
[ -f one/model.safetensors ] && [ ! -f one/model.safetensors.index.json ] || fail "one file expected"
expect_status 0 "$DSTRAIN" export-hf run sharded --max-shard-size 300KB
shards=$(ls sharded/model-*-of-*.safetensors | wc -l)
[ "$shards" -ge 2 ] && [ -f sharded/model.safetensors.index.json ] && [ ! -f sharded/model.safetensors ] || fail "no shards ($shards)"
python3 - sharded "$shards" <<'EOF' || fail "the index does not list every tensor of the shards once"
import json, struct, sys, os
d, n = sys.argv[1], int(sys.argv[2])
index = json.load(open(f"{d}/model.safetensors.index.json"))
seen = {}
for f in sorted(os.listdir(d)):
    if f.startswith("model-"):
        raw = open(f"{d}/{f}", "rb").read()
        header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
        seen.update({k: f for k in header if k != "__metadata__"})
        assert os.path.getsize(f"{d}/{f}") <= 300_000 + 20_000 or len(header) == 2, f
assert seen == index["weight_map"], (len(seen), len(index["weight_map"]))
assert index["metadata"]["total_size"] > 0
assert f"model-00001-of-{n:05d}.safetensors" in seen.values()
EOF
ok "past --max-shard-size the weights are HF-named shards with an index that lists each tensor once"

expect_status 0 "$DSTRAIN" export-hf run one --max-shard-size 300KB
[ ! -f one/model.safetensors ] && [ -f one/model.safetensors.index.json ] || fail "a re-export left the old weight file behind"
expect_status 0 "$DSTRAIN" export-hf run one
[ -f one/model.safetensors ] && [ ! -f one/model.safetensors.index.json ] && ! ls one/model-0* 2>/dev/null || fail "stale shards remain"
ok "exporting again into the same directory removes the weight files it no longer writes"

expect_status 0 "$DSTRAIN" export-hf run half --dtype bf16
python3 - <<'EOF' || fail "bf16 export: config or generation config wrong"
import json
c = json.load(open("half/config.json")); g = json.load(open("half/generation_config.json"))
assert c["torch_dtype"] == "bfloat16" and c["eos_token_id"] == 256 and g["eos_token_id"] == 256, (c, g)
assert json.load(open("one/config.json"))["torch_dtype"] == "float32"
EOF
ok "--dtype bf16 writes bfloat16 weights; config.json and generation_config.json carry the end-of-document id"

if "$py" -c 'import transformers' 2>/dev/null; then
  "$py" - <<'EOF' || fail "transformers could not use the exports"
import torch, transformers
ids = torch.tensor([list(b"def f1(x):\n    return x")])
def logits(d, dtype=torch.float32):
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype)
    with torch.no_grad():
        return m(ids).logits.float()
a, b, h = logits("one"), logits("sharded"), logits("half", torch.bfloat16)
assert torch.equal(a, b), "the shards' logits differ from one file's"
rel = ((h - a).abs().max() / a.abs().max()).item()
assert rel < 0.05, rel
tok = transformers.AutoTokenizer.from_pretrained("one")
text = "def f(x):\n    return x  # héllo"
got = tok(text, add_special_tokens=False)["input_ids"]
assert got == list(text.encode()), got
assert tok.decode(got) == text and tok.eos_token_id == 256 and tok.eos_token == "<|endoftext|>"
print(f"transformers {transformers.__version__}: shards == one file; bf16 within {rel:.3f}; tokenizer ids are the bytes, eos 256")
EOF
  ok "transformers loads fp32, sharded and bf16 exports and the byte-level tokenizer as they are"
else
  echo "note: transformers is not importable from $py; the loading check was not run"
fi

expect_status 2 "$DSTRAIN" export-hf nowhere out
expect_out "'nowhere' is neither a dstrain run directory (no config.resolved.json) nor a Hugging Face folder"
touch afile
expect_status 2 "$DSTRAIN" export-hf run afile
expect_out "'afile' exists and is not a directory"
expect_status 2 "$DSTRAIN" export-hf run out --max-shard-size lots
expect_out "'lots' is not a size"
ok "a missing run, an output that is a file, or a bad size are usage errors (exit 2)"
finish
