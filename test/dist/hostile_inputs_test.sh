#!/usr/bin/env bash
# Hostile and damaged inputs through the real binary (issue 20): each gets its documented exit
# code and a message naming the file, never a signal, never a hang (every command runs under a
# timeout), and a data error is not retried. The readers' own cases are in the unit tests
# (ckpt/hostile_checkpoint_test.cpp, data/token_file_test.cpp) and their fuzzers (test/fuzz/).
source "$(dirname "$0")/../lib.sh"
run=(timeout 120 "$DSTRAIN")
common=(--nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=10 --set schedule.warmup_steps=2)

# --- data ---------------------------------------------------------------------------------------
# A Megatron dataset of the demo corpus in 20 documents, each ending with token 256 (vocab 257).
python3 - "$SRC/recipes/data/demo_corpus.txt" <<'PY'
import struct, sys
text = open(sys.argv[1], "rb").read()
n = len(text) // 20
docs = [list(text[i * n:(i + 1) * n]) + [256] for i in range(20)]
bin_, lengths, pointers = b"", [], []
for d in docs:
    pointers.append(len(bin_)); lengths.append(len(d)); bin_ += struct.pack("<%dH" % len(d), *d)
def idx(doc_index):
    return (b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([8]) + struct.pack("<QQ", 20, 21) + struct.pack("<20i", *lengths)
            + struct.pack("<20q", *pointers) + struct.pack("<21q", *doc_index))
for name, doc_index in (("prose", list(range(21))), ("evil", [0, 1 << 40, (1 << 40) + 1] + list(range(3, 21)))):
    open(name + ".idx", "wb").write(idx(doc_index))  # evil: the audit's [0, 2^40, 2^40+1, ...]
    open(name + ".bin", "wb").write(bin_)
PY
megatron=(--set data.format=megatron --set model.vocab_size=257)
expect_status 3 "${run[@]}" train "$demo_recipe" "${common[@]}" "${megatron[@]}" --set data.path="$WORK/evil" --max-restarts 2 --set run_dir=evil
expect_out "evil.idx"
expect_out "document index entry 1 (1099511627776) is outside"
ok "a Megatron index pointing past its sequences: exit 3 naming the file (it segfaulted)"

expect_status 3 "${run[@]}" train "$demo_recipe" "${common[@]}" --set data.format=megatron --set data.path="$WORK/prose" --set model.vocab_size=256 \
  --max-restarts 2 --set run_dir=vocab
expect_out "outside the model's vocabulary [0, 256)"
! grep -q "restart 1 of" <<<"$OUT" || fail "a data error was retried"
ok "tokens outside the vocabulary: exit 3 naming the file and offset, not retried (it was 'internal error', retried)"

# --- checkpoints --------------------------------------------------------------------------------
expect_status 0 "${run[@]}" train "$demo_recipe" "${common[@]}" --set checkpoint.interval_steps=5 --set checkpoint.keep_last=0 --set run_dir=good
for attack in offset dot; do
  rm -rf "$attack" && cp -r good "$attack"
  python3 - "$attack/ckpt/step_00000010/manifest.json" "$attack" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
if sys.argv[2] == "offset":
    m["tensors"][0]["pieces"][0]["offset"] += 4      # loads shifted weights if trusted
else:
    m["files"][0]["name"] = "."                       # fs::file_size threw past the fallback
    for t in m["tensors"]:
        for p in t["pieces"]:
            if p["file"] == json.load(open(sys.argv[1]))["files"][0]["name"]:
                p["file"] = "."
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
  expect_status 4 "${run[@]}" inspect-ckpt "$attack/ckpt/step_00000010" --verify
  expect_status 0 "${run[@]}" resume "$attack"
  expect_out "step_00000010"
  expect_out "resumed from"
  grep -q "resumed from .*step_00000005" "$attack/logs/rank_00000.log" || fail "$attack: resume did not fall back to step 5"
  expect_status 0 "${run[@]}" inspect-ckpt "$attack/ckpt/step_00000010" --verify  # saved again, swapped in
done
ok "a manifest edited after the commit (a piece's offset; a file named '.'): inspect-ckpt exits 4, resume falls back to step 5 and re-saves step 10"

# A run stopped at a step boundary (SIGTERM after its first checkpoint), keep_last 1, to resume.
"$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=20 --set checkpoint.interval_steps=5 --set checkpoint.keep_last=1 \
  --set run_dir=stopped > stopped.log 2>&1 &
launcher=$!
wait_for stopped/ckpt/latest 120
kill -TERM $launcher
set +e; wait $launcher; status=$?; set -e
[ $status -eq 75 ] || fail "the stop exited $status: $(tail -5 stopped.log)"

# Stray and user-made names in ckpt/: never pruned, never a crash after the commit.
rm -rf stray && cp -r stopped stray
newest=$(ls -d stray/ckpt/step_* | sort | tail -1)
cp -r "$newest" "$newest.bak"
mkdir -p stray/ckpt/step_old && echo "step 0" > stray/ckpt/step_old/COMMITTED
expect_status 0 "${run[@]}" resume stray
[ -f "$newest.bak/manifest.json" ] || fail "a user's copy $(basename "$newest").bak was deleted"
[ -d stray/ckpt/step_old ] || fail "step_old was deleted"
[ "$(ls -d stray/ckpt/step_[0-9]* | grep -cv '\.bak$')" = 1 ] || fail "keep_last 1 did not prune: $(ls stray/ckpt)"
ok "a user's ckpt/step_N.bak and a stray ckpt/step_old survive pruning, and every save after them works (it was 'internal error: stoll')"

# --- metrics.jsonl torn by a crash mid-write ---------------------------------------------------------
rm -rf torn && cp -r stopped torn
printf '{"step":19,"time":1.2,"lo' >> torn/metrics.jsonl
expect_status 0 "${run[@]}" resume torn
expect_out "dropped 1 incomplete line(s)"
python3 - torn/metrics.jsonl <<'PY' || fail "metrics.jsonl is not whole after the resume"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1])]
assert steps == list(range(1, 21)), steps
PY
ok "a torn last metrics line is dropped with a warning on resume (it was 'internal error: stoll')"
finish
