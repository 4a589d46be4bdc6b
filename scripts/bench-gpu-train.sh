#!/usr/bin/env bash
# Training throughput and MFU on one GPU (issue 12): `dstrain train` on the deepseek-coder-1.3b
# preset (bf16, ZeRO 0, 1 rank, sequence 2048 x micro batch 4, no accumulation) and on a small MoE
# preset (DeepSeek-V2-Lite with 4 of its 27 layers: 2.25B parameters, 0.75B active; micro batch 2
# x 2048). Median tokens/s and MFU over the steps after the first 5; MFU against the peak the run
# logs (the datasheet's dense bf16 peak for known GPUs). Then the PyTorch peers of the dense run
# (bench/torch_peer.py: eager with autocast, eager bf16, torch.compile; the same model, batch and
# FLOPs formula) and the ratio dstrain / best peer. No run saves its end (checkpoint.at_end false:
# the 1.3b's is 21.6 GB, and the rows would fill the disk). Run by scripts/gpu-check.sh.
#   scripts/bench-gpu-train.sh [DSTRAIN_BINARY] [STEPS]
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dstrain="${1:-$root/build/dstrain}"
steps="${2:-25}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! "$dstrain" --version 2>/dev/null | grep -q "^cuda: yes"; then echo "skipped: this dstrain was built without CUDA"; exit 0; fi
if ! nvidia-smi -L > /dev/null 2>&1; then echo "skipped: no GPU visible"; exit 0; fi
common=(--nproc-per-node 1 --nnodes 1 --set zero.stage=0 --set zero.offload_optimizer=none --set data.seq_len=2048 --set train.steps="$steps"
        --set schedule.warmup_steps=5 --set checkpoint.interval_steps=0 --set checkpoint.interval_minutes=0 --set checkpoint.at_end=false
        --set launch.env_check=false)
profiles=()
# Each row is printed as soon as it is measured: a time limit that cuts the script short keeps
# the rows measured before it.
echo "| run (1 GPU, $steps steps, medians after step 5) | tokens/s | TFLOP/s | MFU | step ms | fwd / bwd / optimizer / issue ms | GPU GiB alloc / reserved peak; host GiB peak RSS | MFU peak used |"
echo "|---|---|---|---|---|---|---|---|"
bench() {  # bench LABEL RECIPE [--set ...]
  local label=$1 recipe=$2; shift 2
  local dir="$work/$label" status=0
  "$dstrain" train "$recipe" "${common[@]}" --set run_dir="$dir" "$@" > "$work/$label.out" 2>&1 || status=$?
  if [ $status -ne 0 ]; then
    echo "| $label | failed (exit $status): $(grep -m1 -A1 -E "error" "$work/$label.out" | tr -s '\n ' ' ' | cut -c1-200) | | | | | | |"
    tail -5 "$work/$label.out"
    return
  fi
  local peak profile
  profile=$(grep -m1 -o "profile of step .*; trace" "$dir/logs/rank_00000.log" | sed 's/; trace$//')
  [ -n "$profile" ] && profiles+=("| $label | $profile |")
  peak=$(grep -o "against a peak of [0-9.]* TFLOP/s per rank, [^)]*" "$dir/logs/rank_00000.log" | head -1 | sed 's/against a peak of //')
  python3 - "$dir/metrics.jsonl" "$label" "$peak" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][5:]
med = lambda k: statistics.median(r[k] for r in rows)
last = rows[-1]
phases = " / ".join(f"{med(k):.0f}" if rows[0].get(k) is not None else "-" for k in ("forward_ms", "backward_ms", "optimizer_ms", "issue_ms"))
print(f"| {sys.argv[2]} | {med('tokens_per_s'):,.0f} | {med('tflops_per_rank'):.1f} | {100 * med('mfu'):.1f}% | {med('step_ms'):.0f} | {phases} | "
      f"{(last['device_alloc_peak_mb'] or 0) / 1024:.1f} / {(last['device_reserved_peak_mb'] or 0) / 1024:.1f}; host {(last.get('host_peak_rss_mb') or 0) / 1024:.1f} | {sys.argv[3]} |")
PY
}
# The main rows (DSTRAIN_BENCH_OFFLOAD=only skips them).
if [ "${DSTRAIN_BENCH_OFFLOAD:-0}" != only ]; then
bench "deepseek-coder-1.3b bf16 ZeRO-0, 4x2048" "$root/recipes/deepseek-coder-1.3b.yaml" --set train.micro_batch_size=4 --set 'train.accumulation=[{steps: 1}]'
# Where the step's time goes (wall_clock_breakdown waits for the GPU at each phase's end), and
# the same run with the full logits instead of the fused, chunked cross-entropy.
bench "1.3b, phases timed" "$root/recipes/deepseek-coder-1.3b.yaml" --set train.micro_batch_size=4 --set 'train.accumulation=[{steps: 1}]' \
  --set logging.wall_clock_breakdown=true
bench "1.3b, full logits (loss_chunk_tokens 0)" "$root/recipes/deepseek-coder-1.3b.yaml" --set train.micro_batch_size=4 \
  --set 'train.accumulation=[{steps: 1}]' --set train.loss_chunk_tokens=0
DSTRAIN_FUSED_LAYERS=0 bench "1.3b, ATen element-wise layers (DSTRAIN_FUSED_LAYERS=0)" "$root/recipes/deepseek-coder-1.3b.yaml" \
  --set train.micro_batch_size=4 --set 'train.accumulation=[{steps: 1}]'
# The PyTorch peers of the dense run (issue 21), same model and batch from its resolved config.
dense="$work/deepseek-coder-1.3b bf16 ZeRO-0, 4x2048"
if [ -f "$dense/config.resolved.json" ] && python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  timeout 600 python3 "$root/bench/torch_peer.py" --config "$dense/config.resolved.json" --steps "$steps" --label "4x2048" \
    > "$work/peer.out" 2> "$work/peer.err" || tail -5 "$work/peer.err"
  grep "^| PyTorch" "$work/peer.out"
  ratio=$(python3 - "$dense/metrics.jsonl" "$work/peer.out" <<'PY'
import json, statistics, sys
ours = statistics.median(json.loads(l)["tokens_per_s"] for l in list(open(sys.argv[1]))[5:])
peers = [json.loads(l[len("peer-json "):]) for l in open(sys.argv[2]) if l.startswith("peer-json ")]
best = max(peers, key=lambda p: p["tokens_per_s"])
print(f"| dstrain / best PyTorch peer ({best['mode']}) | {ours / best['tokens_per_s']:.2f}x | | | | | | |")
PY
)
  echo "$ratio"
fi
bench "V2-Lite 4 layers (MoE) bf16 ZeRO-0, 2x2048" "$root/recipes/deepseek-v2-lite.yaml" --set model.num_layers=4 --set train.tokens=0 \
  --set train.micro_batch_size=2 --set train.global_batch_size=2
# Issue 21, deliverables 4 and 5: micro batch 1, 2 and 8 and the recipe's own seq 4096, phases
# timed: issue ms near fwd + bwd means the host's launches, not the GPU, set the pace.
# Step 7 of each is recorded with the PyTorch profiler: its kernel launches and kernel time.
for micro in 1 2 8; do
  bench "1.3b, ${micro}x2048, phases timed" "$root/recipes/deepseek-coder-1.3b.yaml" --set train.micro_batch_size=$micro \
    --set 'train.accumulation=[{steps: 1}]' --set logging.wall_clock_breakdown=true --set logging.profile_step=7
done
bench "1.3b, 2x4096, phases timed" "$root/recipes/deepseek-coder-1.3b.yaml" --set train.micro_batch_size=2 --set data.seq_len=4096 \
  --set 'train.accumulation=[{steps: 1}]' --set logging.wall_clock_breakdown=true
fi
# Issue 23 (DSTRAIN_BENCH_OFFLOAD=1 adds these rows, =only runs only them, in a call of its own:
# these steps take seconds): ZeRO-3 with the optimizer on the CPU at accumulation 8 against ZeRO-0
# on the device, and with the one-step delayed update (zero.delayed_update, from the first step)
# that hides the CPU Adam; full recompute; the 7B model with parameter offload.
if [ "${DSTRAIN_BENCH_OFFLOAD:-0}" != 0 ]; then
  acc8=(--set train.micro_batch_size=4 --set 'train.accumulation=[{steps: 8}]' --set logging.wall_clock_breakdown=true)
  bench "1.3b, 4x2048 x 8 accumulation, ZeRO-0" "$root/recipes/deepseek-coder-1.3b.yaml" "${acc8[@]}"
  bench "1.3b, x 8, ZeRO-3 + offload_optimizer" "$root/recipes/deepseek-coder-1.3b.yaml" "${acc8[@]}" --set zero.stage=3 \
    --set zero.offload_optimizer=cpu
  bench "1.3b, x 8, ZeRO-3 + offload_optimizer, delayed update" "$root/recipes/deepseek-coder-1.3b.yaml" "${acc8[@]}" --set zero.stage=3 \
    --set zero.offload_optimizer=cpu --set zero.delayed_update=true --set zero.delayed_update_after=0
  # Full recompute at the recipe's own 4 x 4096 (about 30 GiB of activations without it).
  bench "1.3b, 4x4096, full recompute" "$root/recipes/deepseek-coder-1.3b.yaml" --set train.micro_batch_size=4 --set data.seq_len=4096 \
    --set 'train.accumulation=[{steps: 1}]' --set train.activation_checkpointing=full --set logging.wall_clock_breakdown=true
  # deepseek-llm-7b on one GPU: parameters and optimizer in host memory (--dry-run: 20.6 GiB on
  # the device, 103 GiB of host memory), full recompute, 1 x 4096, 8 steps (a step takes seconds).
  bench "7b, 1x4096, ZeRO-3 + offload_optimizer + offload_param, full recompute" "$root/recipes/deepseek-llm-7b.yaml" --set train.tokens=0 \
    --set train.steps=8 --set data.seq_len=4096 --set train.micro_batch_size=1 --set train.global_batch_size=1 --set zero.stage=3 \
    --set zero.offload_optimizer=cpu --set zero.offload_param=cpu --set train.activation_checkpointing=full --set logging.wall_clock_breakdown=true
fi
if [ ${#profiles[@]} -gt 0 ]; then
  echo
  echo "| run | logging.profile_step: what the recorded step ran |"
  echo "|---|---|"
  printf '%s\n' "${profiles[@]}"
fi
