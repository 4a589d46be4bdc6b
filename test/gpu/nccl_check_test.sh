#!/usr/bin/env bash
# The NCCL communicator on the GPUs of this machine: every collective against a local reference
# (as dist/collectives_test.sh does for Gloo). Skips without a GPU.
source "$(dirname "$0")/../lib.sh"
gpus=$("$DSTRAIN" check-env --local --skip probes --json | python3 -c 'import json,sys; print(next(f["values"][0]["value"] for f in json.load(sys.stdin)["facts"] if f["name"] == "gpus"))')
gpus=${gpus%% *}  # "0 (none visible: ...)" without a GPU
if [ "$gpus" = "0" ]; then echo "SKIPPED: no GPU visible"; exit 77; fi
n=$(( gpus >= 2 ? 2 : 1 ))
expect_status 0 "$DSTRAIN" bench comm --backend nccl --nproc-per-node $n --check
expect_out "collective check on $n ranks (nccl): 82 passed, 0 failed"
ok "NCCL collectives are correct on $n GPU rank(s)"
expect_status 0 "$DSTRAIN" bench comm --backend nccl --nproc-per-node $n --max-bytes 268435456
echo "$OUT" | grep -v INFO
ok "NCCL benchmark table"
finish
