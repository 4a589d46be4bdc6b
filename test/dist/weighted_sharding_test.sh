#!/usr/bin/env bash
# Heterogeneous ranks: explicit shard weights and auto balancing (one rank made 3x slower) give
# the gradients of the whole global batch, so the losses equal equal sharding's within fp32
# rounding; a resume keeps the measured shares and stays bit-exact.
source "$(dirname "$0")/../lib.sh"
common=(--set train.steps=20 --set checkpoint.interval_steps=10 --set checkpoint.keep_last=0 --set launch.threads_per_worker=1)
cmp="$SRC/test/dist/compare_metrics.py"
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=equal
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=weighted --set "data.shard_weights=[3, 1]"
python3 "$cmp" equal/metrics.jsonl weighted/metrics.jsonl --rtol 1e-5 || fail "weighted shares change the training"
ok "shard_weights [3, 1] (12 and 4 of each 16 samples) trains like equal shares (rtol 1e-5)"

DSTRAIN_TEST_FAULTS=slow_rank=1:3 expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=auto --set data.shard_weights=auto --set data.balance_steps=3
expect_out "auto balance: measured"
shares=$(grep -o 'shares of 16 samples: \[[0-9]*, [0-9]*\]' <<<"$OUT" | grep -o '\[.*\]')
python3 -c "import sys; a, b = eval(sys.argv[1]); sys.exit(0 if a > b and a + b == 16 else 1)" "$shares" || fail "the slow rank did not get fewer samples: $shares"
python3 "$cmp" equal/metrics.jsonl auto/metrics.jsonl --rtol 1e-5 || fail "auto balancing changes the training"
ok "auto balancing gives the 3x slower rank fewer samples ($shares) and trains like equal shares"

DSTRAIN_TEST_FAULTS=slow_rank=1:3 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=cut --set data.shard_weights=auto --set data.balance_steps=3 > cut.log 2>&1 &
kill_worker_when cut/ckpt/step_00000010/COMMITTED $!
expect_status 0 "$DSTRAIN" resume cut
python3 - auto/ckpt/step_00000020 cut/ckpt/step_00000010 <<'PY' || fail "the measured shares were not checkpointed"
import json, sys
for d in sys.argv[1:]:
    names = [t["name"] for t in json.load(open(d + "/manifest.json"))["tensors"]]
    assert "data.shard_weights" in names, d
PY
python3 "$cmp" equal/metrics.jsonl cut/metrics.jsonl --rtol 1e-5 || fail "the resumed auto-balanced run differs"
ok "the measured shares are checkpointed and a resumed run continues with them"
finish
