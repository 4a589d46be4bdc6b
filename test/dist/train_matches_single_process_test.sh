#!/usr/bin/env bash
# The correctness oracle: the same seed and global batch on 1, 2 and 4 CPU ranks (Gloo) give the
# same losses within fp32 rounding, and the loss really falls.
source "$(dirname "$0")/../lib.sh"
cmp="$SRC/test/dist/compare_metrics.py"
common=(--set train.steps=30 --set train.micro_batch_size=4 --set train.global_batch_size=16 --set launch.threads_per_worker=1)

for n in 1 2 4; do
  expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node $n --set run_dir=np$n
  expect_out "step 30/30"
done
ok "trained 30 steps on 1, 2 and 4 ranks"

python3 "$cmp" np1/metrics.jsonl --decreases 1.5 || fail "the loss did not fall"
ok "the loss falls (single process)"

for n in 2 4; do
  python3 "$cmp" np1/metrics.jsonl np$n/metrics.jsonl --rtol 1e-4 || fail "$n ranks diverge from the single-process run"
done
ok "2 and 4 ranks match the single-process losses (rtol 1e-4)"

for n in 1 2 4; do
  expect_status 0 "$DSTRAIN" inspect-ckpt np$n/ckpt
  expect_out "step         30"
  expect_out "OK (crc32c)"
done
ok "each run ends with a committed, verified checkpoint"
finish
