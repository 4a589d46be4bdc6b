#!/usr/bin/env bash
# LoRA against full fine-tuning of the same model, in one script (issue 59): step time (median
# after warm-up, with its forward / backward / optimizer parts), the engine's model states and the
# worker's peak host memory. A dense model of 4 layers x 512 with deepseek-coder's 32,256-token
# vocabulary (46M parameters, a third of them the head), one rank, fp32 on the CPU; LoRA rank 16 on
# all-linear. No gradient is computed for a frozen weight (the head's included, in the chunked
# loss) and the optimizer steps the adapters alone, so LoRA should take well under full
# fine-tuning's time. A third row adds lora.dropout 0.05 (a mask per sample and projection).
# Then a DeepSeek-MoE-shaped model (MLA, 4 layers x 512, 16 routed experts of 256 top-4 and a shared
# one): full fine-tuning, LoRA on attention alone, and LoRA on every projection with the routed
# experts' too (lora.experts: two more GEMMs per expert projection; grouped on a GPU in bf16).
# Last, the dense model's LoRA from an exported base (model.init_from) with the base kept in the
# model's dtype, in NF4 (QLoRA) and in FP8 blocks (lora.base): what the frozen projections take, and
# the step time of dequantizing each weight in forward and again in backward.
#   scripts/bench-lora.sh [STEPS] [--set KEY=VALUE ...]   (e.g. --set precision.dtype=bf16 on a GPU)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps="${1:-20}"
[ $# -gt 0 ] && shift
"$DSTRAIN_ROOT/scripts/build.sh" dstrain >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dense=(--set model.vocab_size=32256 --set model.hidden_size=512 --set model.num_layers=4 --set model.num_heads=8 --set model.intermediate_size=1376
       --set data.seq_len=128 --set train.micro_batch_size=8 --set train.global_batch_size=8 --set schedule.warmup_steps=0)
moe=(--set model.family=mla_moe --set model.vocab_size=32256 --set model.hidden_size=512 --set model.num_layers=4 --set model.num_heads=8
     --set model.intermediate_size=1376 --set model.q_lora_rank=0 --set model.kv_lora_rank=128 --set model.qk_nope_head_dim=64
     --set model.qk_rope_head_dim=32 --set model.v_head_dim=64 --set model.moe_intermediate_size=256 --set model.n_routed_experts=16
     --set model.n_shared_experts=1 --set model.num_experts_per_tok=4 --set model.first_k_dense_replace=1
     --set data.seq_len=128 --set train.micro_batch_size=8 --set train.global_batch_size=8 --set schedule.warmup_steps=0)
declare -A step_ms rss states
# measure MODE NAME ARGS...: one run; prints its row and keeps its step time, model states and peak RSS.
measure() {
  local mode=$1 name=$2; shift 2
  "$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" --nproc-per-node 1 --set launch.threads_per_worker="$(nproc)" \
    --set train.steps="$steps" --set checkpoint.interval_steps=0 --set checkpoint.at_end=false \
    --set logging.wall_clock_breakdown=true --set run_dir="$work/$mode" "$@" "${extra_sets[@]}" >/dev/null 2>&1 || die "the $mode run failed"
  # The engine's line: "per rank: params A MiB, grads B MiB, master + Adam states C MiB".
  states[$mode]=$(python3 -c "import re,sys; m=re.search(r'per rank: params ([\d.]+) MiB, grads ([\d.]+) MiB, master \+ Adam states ([\d.]+) MiB', open(sys.argv[1]).read()); print(f'{sum(map(float, m.groups())):.1f} MiB')" "$work/$mode/logs/rank_00000.log")
  local line
  read -r step_ms[$mode] rss[$mode] line < <(python3 - "$work/$mode/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][3:]
med = lambda k: statistics.median(r.get(k) or 0 for r in rows)
print(f"{med('step_ms'):.1f} {max(r['host_peak_rss_mb'] for r in rows):.0f} "
      f"{med('step_ms'):9.1f} {med('forward_ms'):9.1f} {med('backward_ms'):9.1f} {med('optimizer_ms'):9.1f} {med('tokens_per_s'):12.0f}")
PY
)
  printf '%-26s %s %14s %11s MiB\n' "$name" "$line" "${states[$mode]}" "${rss[$mode]}"
}
extra_sets=("$@")
columns() { printf '%-26s %9s %9s %9s %9s %12s %14s %14s\n' mode "step ms" forward backward optimizer "tokens/s" "model states" "peak host RSS"; }
cpu="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); 1 rank x $(nproc) threads"
echo "# $cpu, 4 x 512 dense, vocabulary 32256, batch 8 x 128, $steps steps"
columns
lora=(--set lora.rank=16 --set lora.alpha=32)
measure full 'full fine-tuning' "${dense[@]}"
measure lora 'LoRA r16 all-linear' "${dense[@]}" "${lora[@]}"
measure dropout 'LoRA r16, dropout 0.05' "${dense[@]}" "${lora[@]}" --set lora.dropout=0.05
python3 - "${step_ms[full]}" "${step_ms[lora]}" "${rss[full]}" "${rss[lora]}" "${states[full]% MiB}" "${states[lora]% MiB}" "${step_ms[dropout]}" <<'PY'
import sys
f, l, rf, rl, sf, sl, d = map(float, sys.argv[1:])
print(f"ratio  LoRA / full: step time {l / f:.2f}, model states {sl / sf:.3f}, peak host RSS {rl / rf:.2f}")
print(f"ratio  dropout / LoRA: step time {d / l:.2f}")
PY
echo
echo "# $cpu, MLA + MoE 4 x 512 (16 routed experts of 256, top 4, 1 shared; layer 0 dense), vocabulary 32256, batch 8 x 128, $steps steps"
columns
measure mfull 'full fine-tuning' "${moe[@]}"
measure mattn 'LoRA r16 attention' "${moe[@]}" "${lora[@]}" --set 'lora.targets=[q_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj]'
measure mexperts 'LoRA r16 + routed experts' "${moe[@]}" "${lora[@]}" --set lora.experts=true
python3 - "${step_ms[mfull]}" "${step_ms[mattn]}" "${step_ms[mexperts]}" "${states[mfull]% MiB}" "${states[mattn]% MiB}" "${states[mexperts]% MiB}" <<'PY'
import sys
f, a, e, sf, sa, se = map(float, sys.argv[1:])
print(f"ratio  LoRA attention / full: step time {a / f:.2f}, model states {sa / sf:.3f}")
print(f"ratio  LoRA + routed experts / full: step time {e / f:.2f}, model states {se / sf:.3f}")
PY

echo
echo "# $cpu, the dense model from an exported base: LoRA r16 all-linear with the frozen projections in each storage, $steps steps"
columns
"$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" --nproc-per-node 1 "${dense[@]}" --set train.steps=1 \
  --set checkpoint.interval_steps=0 --set run_dir="$work/base" >/dev/null 2>&1 || die "the base run failed"
"$DSTRAIN_BUILD_DIR/dstrain" export-hf "$work/base" "$work/hf-base" >/dev/null 2>&1 || die "the base export failed"
declare -A base_mib
for kind in model nf4 fp8; do
  measure "q$kind" "LoRA r16, base $kind" "${dense[@]}" "${lora[@]}" --set model.init_from="$work/hf-base" --set lora.base=$kind
  base_mib[$kind]=$(python3 -c "import re,sys; m=re.search(r'base in \w+: \d+ frozen projections \([\d.]+M weights\), ([\d.]+) MiB on this rank \(([\d.]+) MiB', open(sys.argv[1]).read()); print(m.group(1) + ' ' + m.group(2) if m else 'none')" "$work/q$kind/logs/rank_00000.log")
done
python3 - "${step_ms[qmodel]}" "${step_ms[qnf4]}" "${step_ms[qfp8]}" "${base_mib[nf4]}" "${base_mib[fp8]}" <<'PY'
import sys
m, n, f = map(float, sys.argv[1:4])
nf4, fp8 = sys.argv[4].split(), sys.argv[5].split()
print(f"the frozen projections: {nf4[1]} MiB in the model's dtype, {nf4[0]} MiB in NF4 ({float(nf4[1]) / float(nf4[0]):.2f}x less), {fp8[0]} MiB in FP8 ({float(fp8[1]) / float(fp8[0]):.2f}x less)")
print(f"ratio  NF4 / model-dtype base: step time {n / m:.2f}; FP8 / model-dtype base: {f / m:.2f}")
PY
