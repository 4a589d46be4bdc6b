#!/usr/bin/env bash
# Every collective, on 1, 2 and 4 local CPU ranks, on random data of odd sizes, float32 and
# bfloat16, against a locally computed reference; plus a benchmark smoke run.
source "$(dirname "$0")/../lib.sh"
for n in 1 2 4; do
  expect_status 0 "$DSTRAIN" bench comm --nproc-per-node $n --check
  expect_out "collective check on $n ranks (gloo): 82 passed, 0 failed"
done
ok "all_reduce, reduce_scatter, all_gather, broadcast, uneven all_to_all, split groups, barrier and the byte ops are correct on 1, 2 and 4 ranks"

expect_status 0 "$DSTRAIN" bench comm --nproc-per-node 2 --max-bytes 65536
expect_out "# memcpy 256 MiB"
expect_out "algbw (GB/s)"
for op in all_reduce reduce_scatter all_gather all_to_all; do expect_out "64 KiB  $op"; done
ok "the benchmark prints the nccl-tests-style table (smoke run)"
# Gloo's pairs connect on first use: the control ops reach a few peers (ring and tree
# neighbours, ~2 log2 N), not the N-1 sockets of PyTorch's full mesh (issue 26).
sockets_after_control_ops() {  # prints the most sockets any rank held
  sed -n 's/^sockets per rank after the control ops.*: [0-9]*-\([0-9]*\) (15 peers.*/\1/p' <<<"$OUT"
}
expect_status 0 "$DSTRAIN" bench comm --nproc-per-node 16 --max-bytes 1024 --iters 2
expect_out "gloo pairs connect on first use"
lazy=$(sockets_after_control_ops)
export DSTRAIN_GLOO_FULL_MESH=1
expect_status 0 "$DSTRAIN" bench comm --nproc-per-node 16 --max-bytes 1024 --iters 2
expect_out "gloo full mesh"
mesh=$(sockets_after_control_ops)
unset DSTRAIN_GLOO_FULL_MESH
[[ -n "$lazy" && -n "$mesh" ]] || fail "no socket counts in the output"
(( mesh >= 15 )) || fail "the full mesh holds $mesh sockets, expected at least one per peer (15)"
(( lazy + 6 <= mesh )) || fail "lazy pairs hold $lazy sockets per rank, the full mesh $mesh: expected far fewer"
ok "16 ranks: the control ops hold at most $lazy sockets per rank with lazy pairs, $mesh with a full mesh"
finish
