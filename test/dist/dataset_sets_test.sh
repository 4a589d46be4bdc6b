#!/usr/bin/env bash
# A prepared dataset is one set of files (issue 55: D2, D3, D17): prepare-data stages PREFIX.bin,
# .idx, .lossmask, .tokenizer/ and .json under temporary names and publishes them together, so a
# full disk while a prefix is rewritten leaves the older set whole; train, eval and inspect-data
# check the set against PREFIX.json (CRC-32C of .bin and .idx, size and CRC of .lossmask) and
# refuse, naming the file, a set whose parts come from different runs, a missing loss mask, and a
# broken or missing PREFIX.json beside a loss mask, instead of training on them (exit 3).
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
ref="$SRC/test/text/chat_data_reference.py"
run=(timeout 120 "$DSTRAIN")
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1
"$py" "$ref" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks
: > none.jsonl
"$py" "$ref" chats corpus.jsonl none.jsonl chats.jsonl --count 400
head -n 60 chats.jsonl > few.jsonl
prepare=(prepare-data --tokenizer toks/deepseek-llm-chat --workers 1)

cat > sft.yaml <<'EOF'
seed: 7
model: {family: dense, vocab_size: 3000, hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64, max_seq_len: 64}
data: {format: megatron, seq_len: 64, packing: greedy}
train: {steps: 2, micro_batch_size: 4, global_batch_size: 4}
schedule: {warmup_steps: 0}
checkpoint: {interval_steps: 0}
launch: {threads_per_worker: 1}
EOF

# --- a full disk while a prefix is rewritten (a small tmpfs: needs root) ------------------------
# Sized so that the newer set's tokens and mask fit beside the older set and its index does not:
# the point where dstrain used to have renamed the newer .bin over the older one already.
for _ in $(seq 1 10); do cat chats.jsonl; done > many.jsonl
expect_status 0 "${run[@]}" "${prepare[@]}" few.jsonl --output measure/few --max-length 64
expect_status 0 "${run[@]}" "${prepare[@]}" many.jsonl --output measure/many
kb() { local total=0 f; for f in "$@"; do total=$((total + ($(stat -c %s "$f") + 4095) / 4096 * 4)); done; echo $total; }
older=$(kb measure/few.* measure/few.tokenizer/*)
tmpfs_kb=$((older + $(kb measure/many.bin measure/many.lossmask) + $(kb measure/many.idx) / 2))
if [ "$(id -u)" = 0 ] && mkdir small && mount -t tmpfs -o size=${tmpfs_kb}k tmpfs small 2>/dev/null; then
  trap 'rc=$?; umount "$WORK/small" 2>/dev/null; (exit $rc); cleanup' EXIT
  expect_status 0 "${run[@]}" "${prepare[@]}" few.jsonl --output small/sft --max-length 64
  mkdir before && cp -r small/sft.* before/
  expect_status 5 "${run[@]}" "${prepare[@]}" many.jsonl --output small/sft
  expect_out "No space left on device"
  for f in before/sft.* before/sft.tokenizer/*; do
    [ -f "$f" ] || continue
    cmp -s "$f" "small/${f#before/}" || fail "${f#before/} changed though prepare-data failed"
  done
  ! ls -d small/*.tmp > /dev/null 2>&1 || fail "temporary files left on the full disk: $(ls small)"
  expect_status 0 "${run[@]}" inspect-data small/sft
  expect_status 0 "${run[@]}" train sft.yaml --set data.path="$WORK/small/sft" --set run_dir=after_full
  ok "a full disk while rewriting a prefix (${tmpfs_kb} KiB: the newer tokens fit, the index not): exit 5 'No space left on device', the older set byte-identical, no temporaries, and it still trains"
  umount small
  trap cleanup EXIT
else
  echo "note: the full-disk case needs root and tmpfs; skipped"
fi

# --- parts from two runs, a missing part, a broken description ------------------------------------
expect_status 0 "${run[@]}" "${prepare[@]}" chats.jsonl --output sft --max-length 64
expect_status 0 "${run[@]}" "${prepare[@]}" few.jsonl --output other --max-length 64
expect_status 0 "${run[@]}" train sft.yaml --set data.path="$WORK/sft" --set run_dir=whole
ok "a whole set trains"

# D2: the newer tokens beside the older index, mask and description (what a failed rewrite left).
cp sft.bin sft.bin.good && cp other.bin sft.bin
expect_status 3 "${run[@]}" train sft.yaml --set data.path="$WORK/sft" --set run_dir=mixed
expect_out "sft.bin' has CRC-32C"
expect_out "sft.json recorded"
expect_status 3 "${run[@]}" inspect-data sft
expect_out "sft.bin' has CRC-32C"
mv sft.bin.good sft.bin
ok "a .bin from another run of prepare-data is refused by train and inspect-data (exit 3), naming the file and PREFIX.json"

cp sft.idx sft.idx.good && printf 'x' >> sft.idx
expect_status 3 "${run[@]}" train sft.yaml --set data.path="$WORK/sft" --set run_dir=idx
expect_out "sft.idx"
mv sft.idx.good sft.idx

# D3: the loss mask deleted: never a silent switch to pretraining on prompts.
mv sft.lossmask lossmask.saved
expect_status 3 "${run[@]}" train sft.yaml --set data.path="$WORK/sft" --set run_dir=nomask --set data.packing=none
expect_out "sft.lossmask' is missing"
expect_out "prompts included"
mv lossmask.saved sft.lossmask
ok "a deleted PREFIX.lossmask is an error naming it (it trained every token, prompts included, with exit 0)"

# D17: a broken or missing PREFIX.json beside a loss mask.
cp sft.json json.saved
head -c 40 json.saved > sft.json
expect_status 3 "${run[@]}" train sft.yaml --set data.path="$WORK/sft" --set run_dir=badjson
expect_out "sft.json' is not valid JSON"
rm sft.json
expect_status 3 "${run[@]}" train sft.yaml --set data.path="$WORK/sft" --set run_dir=nojson
expect_out "has no '$WORK/sft.json' beside it"
cp json.saved sft.json
ok "a broken or missing PREFIX.json beside a loss mask is an error naming it (mask verification was skipped silently)"

# A pretraining set written over a fine-tuning prefix leaves no stale loss mask behind.
"$py" -c 'import json
for l in open("chats.jsonl"): print(json.dumps({"text": " ".join(m["content"] for m in json.loads(l)["messages"])}))' > text.jsonl
expect_status 0 "${run[@]}" prepare-data text.jsonl --tokenizer toks/deepseek-llm-chat --output sft --workers 1
[ ! -e sft.lossmask ] || fail "the older set's loss mask was left beside the new pretraining set"
expect_status 0 "${run[@]}" train sft.yaml --set data.path="$WORK/sft" --set data.packing=none --set run_dir=text
ok "a pretraining set over a fine-tuning prefix removes the older loss mask and trains"

# Ctrl-C while a prefix is rewritten: exit 130, the older set as it was, no temporaries.
cp sft.bin before_sigint.bin
for _ in $(seq 1 4); do cat many.jsonl; done > more.jsonl
"$DSTRAIN" "${prepare[@]}" more.jsonl --output sft > sigint.log 2>&1 &
writer=$!
for _ in $(seq 1 200); do [ -e sft.bin.tmp ] && break; sleep 0.05; done
[ -e sft.bin.tmp ] || fail "prepare-data never began writing: $(cat sigint.log)"
kill -INT $writer
set +e; wait $writer; status=$?; set -e
[ $status -eq 130 ] || fail "prepare-data exited $status after SIGINT: $(cat sigint.log)"
grep -q "stopped by a signal; nothing was written" sigint.log || fail "no word of the stop: $(cat sigint.log)"
cmp -s sft.bin before_sigint.bin || fail "SIGINT changed the older set"
! ls -d sft.*.tmp > /dev/null 2>&1 || fail "SIGINT left temporaries: $(ls -d sft.*)"
ok "SIGINT while rewriting a prefix: exit 130, the older set unchanged, no temporaries"

# Temporaries an interrupted run (kill -9) left behind are cleared by the next run.
: > sft.bin.tmp && mkdir sft.tokenizer.tmp
expect_status 0 "${run[@]}" "${prepare[@]}" few.jsonl --output sft --max-length 64
! ls -d sft.*.tmp > /dev/null 2>&1 || fail "stale temporaries survived: $(ls -d sft.*)"
ok "stale temporaries of an interrupted prepare-data are removed by the next one"

finish
