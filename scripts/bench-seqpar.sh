#!/usr/bin/env bash
# Ulysses sequence parallelism (parallel.sequence_parallel_size, issue 62): peak memory per rank
# and tokens/s at long sequences for SP 1, 2 and 4 on this machine's CPU, one sample of LENGTH
# tokens per step (micro batch 1, no data parallelism: SP ranks = world). A dense model of 2
# layers x 256 (8 heads, 2 key/value heads) on the bundled byte corpus, fp32, no recompute.
# The activation part of rank 0's peak memory is its peak RSS less that of the same run at
# sequence 256 (model states, buffers and the runtime), so the ratio SP S / SP 1 isolates what
# the sequence costs: Ulysses should bring it to about 1/S (each rank holds T / S tokens; during
# attention, heads / S of all T).
#   scripts/bench-seqpar.sh [LENGTH ...]        (default: 8192 16384 32768)
# DSTRAIN_BENCH_DEVICE=cuda runs it on a GPU (device peak memory instead of host RSS), with
# DSTRAIN_BENCH_DTYPE (default fp32).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
lengths=("$@")
[ ${#lengths[@]} -gt 0 ] || lengths=(8192 16384 32768)
steps=3
# Large blocks always mmapped and returned when freed (no dynamic threshold): peak RSS then follows
# the live tensors, not what glibc kept of earlier steps.
export MALLOC_MMAP_THRESHOLD_="${MALLOC_MMAP_THRESHOLD_:-131072}"
device="${DSTRAIN_BENCH_DEVICE:-cpu}"
dtype="${DSTRAIN_BENCH_DTYPE:-fp32}"
"$DSTRAIN_ROOT/scripts/build.sh" dstrain >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(--set model.hidden_size=256 --set model.num_layers=2 --set model.num_heads=8 --set model.num_kv_heads=2
       --set model.intermediate_size=688 --set train.micro_batch_size=1 --set train.global_batch_size=1
       --set schedule.warmup_steps=0 --set train.steps=$steps --set checkpoint.interval_steps=0 --set checkpoint.at_end=false
       --set precision.dtype="$dtype" --set launch.env_check=false)
[ "$device" = cuda ] || model+=(--set launch.threads_per_worker=1)
peak_key=host_peak_rss_mb
[ "$device" = cuda ] && peak_key=device_alloc_peak_mb

# run LENGTH SP: one run; prints "median step ms, tokens/s, rank 0's peak MiB".
run() {
  local length=$1 sp=$2 dir="$work/t$1_sp$2"
  local threads=(); [ "$device" = cuda ] || threads=(--set launch.threads_per_worker=$(( $(nproc) / sp > 0 ? $(nproc) / sp : 1 )))
  "$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" "${model[@]}" "${threads[@]}" --nproc-per-node "$sp" \
    --set parallel.sequence_parallel_size="$sp" --set data.seq_len="$length" --set model.max_seq_len="$length" \
    --set run_dir="$dir" >"$dir.log" 2>&1 || { tail -5 "$dir.log" >&2; die "the run at $length tokens, SP $sp failed"; }
  python3 - "$dir/metrics.jsonl" "$peak_key" <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "eval" not in r]
later = rows[1:] or rows
print(f"{statistics.median(r['step_ms'] for r in later):.0f} {statistics.median(r['tokens_per_s'] for r in later):.0f} "
      f"{max(r.get(sys.argv[2]) or 0 for r in rows):.0f}")
PY
}

cpu="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# $device ($cpu), dense 2 x 256 (8 heads, 2 KV), $dtype, micro batch 1, median of steps 2-$steps; peak: rank 0's $peak_key"
printf '%8s %3s %10s %10s %12s %16s %10s\n' tokens SP "step ms" "tokens/s" "peak MiB" "activations MiB" "vs SP 1"
declare -A base
for sp in 1 2 4; do
  read -r _ _ base[$sp] < <(run 256 $sp)
done
for length in "${lengths[@]}"; do
  one=""
  for sp in 1 2 4; do
    read -r ms tps peak < <(run "$length" $sp)
    act=$(( peak - base[$sp] ))
    [ -n "$one" ] || one=$act
    printf '%8s %3s %10s %10s %12s %16s %10s\n' "$length" "$sp" "$ms" "$tps" "$peak" "$act" \
      "$(python3 -c "print(f'{$act / max($one, 1):.2f}x')")"
  done
done
echo "baseline peaks at 256 tokens (subtracted): SP 1 ${base[1]} MiB, SP 2 ${base[2]} MiB, SP 4 ${base[4]} MiB"
