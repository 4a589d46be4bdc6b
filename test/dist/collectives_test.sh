#!/usr/bin/env bash
# Every collective, on 1, 2 and 4 local CPU ranks, on random data of odd sizes, float32 and
# bfloat16, against a locally computed reference; plus a benchmark smoke run.
source "$(dirname "$0")/../lib.sh"
for n in 1 2 4; do
  expect_status 0 "$DSTRAIN" bench comm --nproc-per-node $n --check
  expect_out "collective check on $n ranks (gloo): 76 passed, 0 failed"
done
ok "all_reduce, reduce_scatter, all_gather, broadcast, barrier and all_gather_bytes are correct on 1, 2 and 4 ranks"

expect_status 0 "$DSTRAIN" bench comm --nproc-per-node 2 --max-bytes 65536
expect_out "# memcpy 256 MiB"
expect_out "algbw (GB/s)"
for op in all_reduce reduce_scatter all_gather; do expect_out "64 KiB  $op"; done
ok "the benchmark prints the nccl-tests-style table (smoke run)"
finish
