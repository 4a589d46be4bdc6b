#!/usr/bin/env bash
# bench/torch_peer.py, the PyTorch peer that scripts/bench-gpu-train.sh runs beside dstrain on a
# GPU (issue 21), smoke-run on CPU: it reads a dstrain run's resolved config, trains its model in
# the eager modes, and counts the same FLOPs per token as dstrain's metrics. No timing is judged.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
if ! "$py" -c 'import torch' 2>/dev/null; then echo "SKIPPED: torch is not importable from $py (run scripts/setup.sh)"; exit 77; fi
expect_status 0 "$DSTRAIN" train "$SRC/recipes/demo.yaml" --nproc-per-node 1 --set train.steps=2 --set schedule.warmup_steps=1 \
  --set train.global_batch_size=8 --set train.micro_batch_size=8 --set launch.threads_per_worker=1 --set run_dir=demo
ours=$(grep -o "MFU: [0-9.e+]* model FLOPs per token" demo/logs/rank_00000.log | awk '{print $2}')
[ -n "$ours" ] || fail "no FLOPs per token in dstrain's log"
expect_status 0 "$py" "$SRC/bench/torch_peer.py" --config demo/config.resolved.json --modes eager-autocast,eager-bf16 --steps 2 --warmup 1 --device cpu
[ "$(grep -c "^| PyTorch eager" <<<"$OUT")" = 2 ] || fail "the peer did not print its two rows: $OUT"
"$py" - "$SRC/bench" demo/config.resolved.json "$ours" <<'PY' || fail "the peer's FLOPs per token differ from dstrain's ($ours)"
import json, sys
sys.path.insert(0, sys.argv[1])
import torch_peer
c = json.load(open(sys.argv[2]))["config"]
theirs = torch_peer.flops_per_token(c["model"], c["data"]["seq_len"])
assert abs(theirs / float(sys.argv[3]) - 1) < 1e-2, (theirs, sys.argv[3])
PY
ok "the PyTorch peer trains the run's model from its resolved config and counts dstrain's FLOPs per token"

# bench/torch_moe.py, the PyTorch MoE layer beside `dstrain bench moe` (issue 22).
expect_status 0 "$py" "$SRC/bench/torch_moe.py" --tokens 64 --hidden 32 --inner 16 --experts 8 --top-k 2 --iters 1
expect_out "torch grouped_mm"
expect_out "torch loop"
ok "the PyTorch MoE reference runs both of its layers (CPU smoke run)"
finish
