#!/usr/bin/env bash
# The ZeRO engine against the single-process oracle: stages 0-3 at 2 and 4 ranks, with gradient
# accumulation, overlap_comm on and off, optimizer offload (bit-identical in chunks, parameters
# too), small buckets, stage 3 with every parameter sharded; the dense and the MoE model.
# dist.zero_memory_resume has the rest: memory, bf16, resume, fp16, the delayed update.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/zero_lib.sh"

run single 1 16
python3 "$cmp" single/metrics.jsonl --decreases 1.5 || fail "the single-process loss did not fall"
for stage in 0 1 2 3; do
  run s${stage}n2 2 4 --set zero.stage=$stage --set zero.overlap_comm=false   # 2 accumulation steps
  run s${stage}n4 4 2 --set zero.stage=$stage --set zero.overlap_comm=true    # 2 accumulation steps
  grep -q "ZeRO stage $stage on 4 rank(s)" s${stage}n4/logs/rank_00000.log || fail "stage $stage: no engine line in the log"
  for n in 2 4; do
    python3 "$cmp" single/metrics.jsonl s${stage}n$n/metrics.jsonl --rtol 1e-5 || fail "stage $stage on $n ranks diverges from the single process"
  done
done
ok "ZeRO stages 0-3 on 2 and 4 ranks match the single-process losses (rtol 1e-5, accumulation, overlap on/off)"

run s3overlap2 2 8 --set zero.stage=3 --set zero.overlap_comm=true
run s2offload 2 8 --set zero.stage=2 --set zero.offload_optimizer=cpu
for r in s3overlap2 s2offload; do python3 "$cmp" single/metrics.jsonl $r/metrics.jsonl --rtol 1e-5 || fail "$r diverges"; done
grep -q "offloaded to the CPU" s2offload/logs/rank_00000.log || fail "offload not reported"
ok "stage 3 with prefetch and stage 2 with offload_optimizer: cpu match too"

# Offload updates in chunks of whole parameters (copies overlapped on a GPU): the same kernel calls
# as without offload, so the losses and the saved optimizer state are bit-identical. Small chunks
# (test hook) make many of them; bf16 checks the model-dtype upload, stage 3 its own shard (10
# steps: bf16 is slow on a CPU, and bit-identity shows from the first step).
for cfg in "2 zero.stage=2 fp32 30" "3 zero.stage=3 bf16 10"; do
  set -- $cfg
  run off$1plain 2 8 --set $2 --set precision.dtype=$3 --set train.steps=$4
  DSTRAIN_TEST_FAULTS=offload_chunk=5000 run off$1chunked 2 8 --set $2 --set precision.dtype=$3 --set zero.offload_optimizer=cpu --set train.steps=$4
  python3 "$cmp" off$1plain/metrics.jsonl off$1chunked/metrics.jsonl --exact || fail "offload at stage $1 ($3) is not bit-identical"
  chunks=$(grep -o "[0-9]* chunks" off$1chunked/logs/rank_00000.log | head -1 | cut -d' ' -f1)
  [ "${chunks:-0}" -ge 5 ] || fail "offload at stage $1 used ${chunks:-no} chunks; the test hook asked for many"
  for r in 0 1; do
    cmp -s off$1plain/ckpt/step_000000$4/rank_0000$r.bin off$1chunked/ckpt/step_000000$4/rank_0000$r.bin ||
      fail "stage $1: rank $r's saved master weights and Adam states differ with offload"
  done
done
ok "offload_optimizer: cpu in many chunks is bit-identical to no offload (stage 2 fp32, stage 3 bf16: losses and saved states)"

# offload_param at stage 3 (ZeRO-Infinity's CPU tier): the bf16 parameter shard lives in host
# memory and goes up per layer group; the same numbers again, bit for bit, and memory.json says where.
DSTRAIN_TEST_FAULTS=offload_chunk=5000 run off3param 2 8 --set zero.stage=3 --set precision.dtype=bf16 --set zero.offload_optimizer=cpu \
  --set zero.offload_param=cpu --set train.steps=10
python3 "$cmp" off3plain/metrics.jsonl off3param/metrics.jsonl --exact || fail "offload_param is not bit-identical"
grep -q "parameter shards in host memory" off3param/logs/rank_00000.log || fail "offload_param not reported in the log"
for r in 0 1; do
  cmp -s off3plain/ckpt/step_00000010/rank_0000$r.bin off3param/ckpt/step_00000010/rank_0000$r.bin ||
    fail "rank $r's saved state differs with offload_param"
done
python3 - off3plain/memory.json off3param/memory.json <<'PY' || fail "memory.json does not move the parameter shard to host memory"
import json, sys
plain, off = (json.load(open(p)) for p in sys.argv[1:])
assert plain["host_params_bytes"] == 0 and off["host_params_bytes"] > 0, (plain, off)
assert off["params_bytes"] + off["host_params_bytes"] == plain["params_bytes"], (plain, off)
PY
ok "offload_param: cpu at stage 3 is bit-identical too, with the parameter shard counted in host memory"

moe=(--set train.steps=20 --set train.global_batch_size=8 --set launch.threads_per_worker=1 --set zero.stage3_param_persistence_threshold=0)
expect_status 0 "$DSTRAIN" train "$SRC/recipes/tiny-mla-moe.yaml" "${moe[@]}" --nproc-per-node 1 --set train.micro_batch_size=8 --set run_dir=moe1
for stage in 2 3; do
  expect_status 0 "$DSTRAIN" train "$SRC/recipes/tiny-mla-moe.yaml" "${moe[@]}" --nproc-per-node 2 --set train.micro_batch_size=2 \
    --set zero.stage=$stage --set zero.overlap_comm=true --set run_dir=moe$stage
  python3 "$cmp" moe1/metrics.jsonl moe$stage/metrics.jsonl --rtol 1e-5 || fail "MoE stage $stage diverges"
done
ok "the MLA + MoE model at stages 2 and 3 matches its single-process run"

finish
