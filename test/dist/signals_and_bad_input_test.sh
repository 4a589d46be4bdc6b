#!/usr/bin/env bash
# The launcher killed with SIGTERM leaves no process behind. Bad input gets a clear error and a
# documented exit status, and never damages what was already written.
source "$(dirname "$0")/../lib.sh"

# A coordinated stop: SIGTERM to the launcher; every rank stops at the same step boundary after a
# checkpoint, exit 75; resume continues bit-exactly. No process is left behind.
stop=(--set train.steps=60 --set checkpoint.interval_steps=0 --set launch.threads_per_worker=1)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${stop[@]}" --set run_dir=whole
"$DSTRAIN" train "$demo_recipe" "${stop[@]}" --set run_dir=long > long.log 2>&1 &
launcher=$!
for _ in $(seq 1 600); do [ "$(wc -l < long/metrics.jsonl 2>/dev/null || echo 0)" -ge 5 ] && break; sleep 0.05; done
workers=$(pgrep -P $launcher || true)
[ "$(wc -w <<<"$workers")" -eq 2 ] || fail "expected 2 workers, found: $workers"
kill -TERM $launcher
set +e; wait $launcher; status=$?; set -e
[ $status -eq 75 ] || fail "launcher exited $status on SIGTERM, expected 75 (stopped with a checkpoint): $(tail -5 long.log)"
grep -q "stopped as asked (signal) at step" long.log || fail "no stop report: $(tail -5 long.log)"
at=$(cat long/ckpt/latest)
[ "$at" != "step_00000060" ] || fail "the run finished before the signal; make it longer"
sleep 0.5
left=$(alive $workers)
[ -z "$left" ] || fail "workers left after SIGTERM: $left"
expect_status 0 "$DSTRAIN" resume long
python3 "$SRC/test/dist/compare_metrics.py" whole/metrics.jsonl long/metrics.jsonl --exact || fail "the run resumed after a stop differs"
ok "SIGTERM stops every rank at one step boundary ($at) with a checkpoint, exit 75, no process left, and resume continues bit-exactly"

expect_status 75 "$DSTRAIN" train "$demo_recipe" --set train.steps=100000 --max-time 0.05 --set run_dir=budget
expect_out "stopped as asked (wall-time budget of 0.05 min)"
[ -e budget/ckpt/latest ] || fail "the wall-time stop left no checkpoint"
expect_status 0 "$DSTRAIN" inspect-ckpt budget/ckpt --verify
ok "--max-time stops every rank at one step boundary with a checkpoint (exit 75)"

expect_status 0 "$DSTRAIN" train "$demo_recipe" --set train.steps=20 --set checkpoint.interval_steps=10 --set checkpoint.keep_last=0 --set run_dir=r
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set run_dir=r
expect_out "already holds a run"
expect_out "dstrain resume"
[ -f r/ckpt/step_00000020/COMMITTED ] || fail "the refused run touched the existing checkpoints"
ok "training into an existing run directory is refused and changes nothing"

printf '\x01' | dd of=r/ckpt/step_00000020/rank_00000.bin bs=1 seek=1000 conv=notrunc status=none
expect_status 4 "$DSTRAIN" inspect-ckpt r/ckpt
expect_out "CORRUPT: crc32c mismatch (corrupt); holds"
expect_status 0 "$DSTRAIN" inspect-ckpt r/ckpt/step_00000010 --verify
expect_out "verified: all 1 files OK (crc32c)"
ok "inspect-ckpt verifies checksums: exit 4 for a flipped byte (naming the file and its tensors), 0 for a good checkpoint"

expect_status 0 "$DSTRAIN" resume r
expect_out "skipping a checkpoint that does not verify"
expect_out "step_00000020/rank_00000.bin: checksum mismatch"
expect_out "resumed from $PWD/r/ckpt/step_00000010"
expect_out "step 20/20"
expect_status 0 "$DSTRAIN" inspect-ckpt r/ckpt
ok "resume falls back past a corrupt checkpoint to the previous one, says why, and finishes the run"

rm r/ckpt/step_00000020/COMMITTED
printf '\x01' | dd of=r/ckpt/step_00000010/rank_00000.bin bs=1 seek=1000 conv=notrunc status=none
expect_status 4 "$DSTRAIN" resume r
expect_out "not a committed checkpoint"
expect_out "no committed checkpoint in $PWD/r/ckpt verifies"
ok "with no checkpoint that verifies, resume refuses with exit 4 and says why for each"

printf 'short' > tiny.txt
expect_status 3 "$DSTRAIN" train "$demo_recipe" --set data.path="$WORK/tiny.txt" --set run_dir=tiny
expect_out "has 5 tokens, fewer than one sample"
ok "a data file too short for one sample is a data error (exit 3)"

# Out of memory (the host's here: a 4.5 GiB address-space limit, ~1.5 GiB above a worker's start,
# against ~15 GiB of activations): exit 5, not retried, with where, the estimate and what to change.
expect_status 5 prlimit --as=4831838208 "$DSTRAIN" train "$demo_recipe" --nproc-per-node 1 --max-restarts 2 --set train.steps=20 \
  --set train.micro_batch_size=4096 --set train.global_batch_size=4096 --set run_dir=oom
expect_out "rank 0: out of memory on cpu in forward of step 1: DefaultCPUAllocator: can't allocate memory"
expect_out "GiB of activations for a micro-batch of 4096 x 128 tokens"
expect_out "hint: lower train.micro_batch_size (now 4096; more gradient accumulation keeps the global batch)"
[ "$(wc -l 2>/dev/null < oom/failures.jsonl)" -eq 1 ] || fail "an out-of-memory failure was retried"
ok "out of memory exits 5 with the per-rank estimate and what to change, and is not retried"

# A run directory in use (issue 20): resume or train of a running run is refused at once, naming it.
"$DSTRAIN" train "$demo_recipe" --set train.steps=400 --set launch.threads_per_worker=1 --set checkpoint.interval_steps=5 --set run_dir=busy > busy.log 2>&1 &
busy=$!
wait_for busy/ckpt/latest 120
expect_status 2 "$DSTRAIN" resume busy
expect_out "is in use by pid $busy on"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set run_dir=busy
expect_out "is in use by pid $busy"
kill -TERM $busy
set +e; wait $busy; status=$?; set -e
[ $status -eq 75 ] || fail "the running run was disturbed: exit $status: $(tail -5 busy.log)"
expect_status 0 "$DSTRAIN" inspect-ckpt busy/ckpt --verify
ok "a run directory in use: resume and train are refused (exit 2) naming the holder's pid; the running run is untouched"

# A store port in use (issue 25, defect 2): exit 6 with one line saying so, not c10d's backtrace.
python3 -c 'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)' > held_port &
holder=$!
for _ in $(seq 1 50); do [ -s held_port ] && break; sleep 0.1; done
expect_status 6 "$DSTRAIN" train "$demo_recipe" --set run_dir=port_in_use --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 \
  --master-port "$(cat held_port)" --set launch.timeout_s=5 --set train.global_batch_size=32
kill $holder 2>/dev/null || true
expect_out "cannot host the rendezvous store on 127.0.0.1:$(cat held_port)"
! grep -qE "frame #|Exception raised from" <<<"$OUT" || fail "the port-in-use error carries a C++ backtrace: $OUT"
ok "a store port in use: exit 6 and one line naming the address, no C++ backtrace"

# Node 1 with no node 0 (issue 55's nit): c10d's own error and retry warnings carried a C++
# backtrace of 17 frames to the console before dstrain's one line. TORCH_CPP_LOG_LEVEL brings them back.
expect_status 6 "$DSTRAIN" train "$demo_recipe" --set run_dir=lonely --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 \
  --master-port "$(cat held_port)" --set launch.timeout_s=3 --set train.global_batch_size=32
expect_out "cannot reach node 0's launcher at 127.0.0.1:$(cat held_port) within 3 s"
! grep -qE "frame #|Exception raised from|\[c10d\]" <<<"$OUT" || fail "c10d's log lines reach the console: $OUT"
TORCH_CPP_LOG_LEVEL=WARNING expect_status 6 "$DSTRAIN" train "$demo_recipe" --set run_dir=lonely --nnodes 2 --node-rank 1 \
  --master-addr 127.0.0.1 --master-port "$(cat held_port)" --set launch.timeout_s=3 --set train.global_batch_size=32
grep -qF "[c10d]" <<<"$OUT" || fail "TORCH_CPP_LOG_LEVEL=WARNING did not bring c10d's log lines back: $OUT"
ok "node 1 without node 0: exit 6 and dstrain's one line, no c10d backtrace (TORCH_CPP_LOG_LEVEL=WARNING shows c10d's lines)"
finish
