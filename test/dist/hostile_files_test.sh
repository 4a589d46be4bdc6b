#!/usr/bin/env bash
# Hostile inputs, round 2 (issue 55), through the real binary: every case exits with its documented
# status and a message that names the file, line or key, never a signal, an "internal error", a
# hang or unbounded memory (each command runs under a timeout and, where it matters, a memory cap).
# The templates' own cases are in unit/text/jinja_sandbox_test.cpp, the sets' in dist.dataset_sets,
# the store's secret in dist.store_security.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
run=(timeout 120 "$DSTRAIN")
no_crash() { ! grep -qE "internal error|Segmentation|core dumped|Floating point" <<<"$OUT" || fail "a crash or an internal error: $OUT"; }

"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks
tok=toks/deepseek-v3-style

# D4: one message with an unused key nested 40,000 levels deep, among good conversations.
python3 - <<'PY'
import json
good = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]
with open("deep.jsonl", "w") as f:
    f.write(json.dumps({"messages": good}) + "\n")
    f.write('{"messages": [{"role": "user", "content": "x", "meta": ' + "[" * 40000 + "]" * 40000 + "}]}\n")
    f.write(json.dumps({"messages": good}) + "\n")
PY
expect_status 3 "${run[@]}" prepare-data deep.jsonl --chat --tokenizer $tok --output out/deep
no_crash
expect_out "deep.jsonl:2"
expect_out "nested more than 128 levels deep"
expect_status 0 "${run[@]}" prepare-data deep.jsonl --chat --tokenizer $tok --output out/deep --on-error skip
expect_out "1 skipped as malformed"
expect_status 3 "${run[@]}" chat-template $tok --messages <(sed -n 2p deep.jsonl)
no_crash
expect_out "nested more than 128 levels deep"
ok "a message nested 40,000 levels deep: exit 3 naming file and line (skipped with --on-error skip), not SIGSEGV"

# D5 and D13 end to end: the template arrives inside a tokenizer_config.json.
chat() {  # chat TEMPLATE: renders one conversation with it as the tokenizer's template
  mkdir -p evil && cp $tok/tokenizer.json evil/
  python3 -c 'import json, sys
c = json.load(open(sys.argv[2] + "/tokenizer_config.json"))
c["chat_template"] = sys.argv[1]
json.dump(c, open("evil/tokenizer_config.json", "w"))' "$1" $tok
  echo '[{"role": "user", "content": "hi"}]' > one.jsonl
}
for t in '{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}' '{{ (-9223372036854775807-1) // -1 }}' '{{ tools|dictsort }}' \
         "{{ 'a'.startswith(none) }}" '{{ range(10**9)|length }}' "{{ ('x'*10**10)|length }}" '{{ "a"|indent(10**10) }}' \
         '{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}' '{% set x = [] %}{{ x.append(1) }}'; do
  chat "$t"
  expect_status 3 timeout 60 prlimit --as=4000000000 "$DSTRAIN" chat-template evil --messages one.jsonl
  no_crash
  expect_out "evil/tokenizer_config.json:1:"
  expect_status 3 timeout 60 prlimit --as=4000000000 "$DSTRAIN" prepare-data one.jsonl --chat --tokenizer evil --output out/evil
  no_crash
done
chat "{{ $(printf '(%.0s' $(seq 1 10000))1$(printf ')%.0s' $(seq 1 10000)) }}"
expect_status 2 "${run[@]}" chat-template evil --messages one.jsonl
expect_out "nested more than 200 levels deep"
chat '{{ 99999999999999999999999 }}'
expect_status 2 "${run[@]}" chat-template evil --messages one.jsonl
expect_out "is out of range"
python3 -c 'import json; json.dump({"chat_template": [{"name": 5, "template": "x"}]}, open("evil/tokenizer_config.json", "w"))'
expect_status 2 "${run[@]}" chat-template evil --messages one.jsonl
expect_out "chat_template[0] is not"
no_crash
ok "hostile templates in a tokenizer_config.json (endless recursion, SIGFPE arithmetic, None where a dict goes, 10^10-byte strings, 10^10 iterations, list mutation, 10,000 brackets, huge literals, a numeric template name): exit 2 or 3 naming the line, within 4 GB and 60 s"

# D6: a pipeline that does not divide the world, in --dry-run.
expect_status 2 "${run[@]}" train "$demo_recipe" --nproc-per-node 2 --set parallel.pipeline_parallel_size=3 --dry-run
expect_out "parallel.pipeline_parallel_size 3 does not divide the world size 2"
no_crash
ok "pipeline_parallel_size 3 on 2 ranks: a config error naming the key (it was SIGFPE)"

# D8: a gzip bomb with no newline is read no further than --max-line-bytes.
python3 - <<'PY'
import zlib
c = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
chunk = b"x" * (1 << 20)
with open("bomb.jsonl.gz", "wb") as f:
    for _ in range(600):
        f.write(c.compress(chunk))
    f.write(c.flush())
PY
expect_status 3 timeout 120 prlimit --as=4000000000 "$DSTRAIN" prepare-data bomb.jsonl.gz --output out/bomb --max-bytes 1000000
expect_out "bomb.jsonl.gz:1: the record is longer than 256 MiB"
expect_status 3 "${run[@]}" prepare-data bomb.jsonl.gz --output out/bomb --max-line-bytes 1000000
expect_out "longer than 0 MiB"
ok "a $(($(stat -c %s bomb.jsonl.gz) / 1024)) KB gzip bomb of 600 MiB without a newline: exit 3 at the line bound (256 MiB, or --max-line-bytes), within a 4 GB address space (dstrain itself maps 2.5 GB)"

# D9: the chat path's memory is linear in a message with a small constant (at most 5 times it). A
# 20 MB answer, whose prefix strip alone took 32 bytes a character (a string per code point), and
# which was held in 7 copies and cut into 16-byte pieces for the whole text: peak RSS above the
# same command's on a small conversation, against the message's size.
python3 - <<'PY'
import json, random
rng = random.Random(1)
words = ["alpha", "beta", "gamma", "ünï", "世界", "1234", "  ", "\n"]
text = " ".join(rng.choice(words) for _ in range(3_000_000))
with open("long.jsonl", "w") as f:
    f.write(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": text}]}) + "\n")
with open("short.jsonl", "w") as f:
    f.write(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}) + "\n")
PY
peak_kb() { /usr/bin/time -f "%M" -o rss.txt "$@" > /dev/null 2>&1 || true; tail -n 1 rss.txt; }
small=$(peak_kb "$DSTRAIN" prepare-data short.jsonl --chat --tokenizer $tok --output out/short --workers 1)
large=$(peak_kb "$DSTRAIN" prepare-data long.jsonl --chat --tokenizer $tok --output out/long --workers 1 --max-length 4096)
message_kb=$(($(stat -c %s long.jsonl) / 1024))
ratio=$(python3 -c "print(f'{($large - $small) / $message_kb:.1f}')")
python3 -c "import sys; sys.exit(0 if $ratio <= 5 else 1)" || fail "a ${message_kb} KB message took $ratio times its size ($small -> $large KB)"
ok "a ${message_kb} KB message: $ratio times its size in peak memory (at most 5; it was 36 times at 3464396)"

# D11: a small tokenizer.json with a huge id.
mkdir -p hugeid && python3 -c '
import json; json.dump({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2147483647}, "merges": []}}, open("hugeid/tokenizer.json", "w"))'
echo '{"text": "ab"}' > ab.jsonl
expect_status 3 timeout 60 prlimit --as=4000000000 "$DSTRAIN" prepare-data ab.jsonl --tokenizer hugeid --output out/hugeid
expect_out "model.vocab.b: is not a token id"
ok "a tokenizer.json id of 2^31-1: exit 3 naming the entry, not memory exhaustion"

# D15: a Parquet binary column that is not UTF-8 is named.
if "$py" -c 'import pyarrow' 2>/dev/null; then
  "$py" - <<'PY'
import pyarrow as pa, pyarrow.parquet as pq
pq.write_table(pa.table({"text": ["a", "b"], "image": pa.array([b"\x89PNG\xff\xfe", b"\x00\x01"], pa.binary())}), "img.parquet")
PY
  expect_status 3 "${run[@]}" prepare-data img.parquet --output out/img
  expect_out "column 'image' holds binary data that is not UTF-8 text (row 1)"
  expect_out "drop_columns"
  ok "a non-UTF-8 Parquet binary column: exit 3 naming the column and row (every row read as 'not valid JSON')"
fi

# D16: inspect-ckpt RUN finds the checkpoint that resume would take when `latest` is missing.
expect_status 0 "${run[@]}" train "$demo_recipe" --set train.steps=4 --set schedule.warmup_steps=1 --set checkpoint.interval_steps=2 \
  --set run_dir=ck --set launch.threads_per_worker=1
rm ck/ckpt/latest
expect_status 0 "${run[@]}" inspect-ckpt ck
expect_out "step_00000004"
expect_out "has no 'latest' file"
ok "inspect-ckpt RUN without a 'latest' file shows the newest committed checkpoint (it said 'no committed checkpoint')"

# FP8 block sizes far beyond DeepSeek's 128 are a checkpoint error naming the key.
mkdir -p fp8 && python3 -c '
import json, struct
json.dump({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128,
           "vocab_size": 300, "max_position_embeddings": 128,
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [4611686018427387904, 128]}},
          open("fp8/config.json", "w"))
header = b"{}      "
open("fp8/model.safetensors", "wb").write(struct.pack("<Q", len(header)) + header)'
expect_status 4 "${run[@]}" eval fp8 --data "$SRC/recipes/data/demo_corpus.txt" --seq-len 64
no_crash
expect_out "weight_block_size: [4611686018427387904,128] is not two integers [rows, cols] from 1 to 65536"
ok "an FP8 block size of 2^62: a checkpoint error naming weight_block_size"
finish
