#!/usr/bin/env bash
# dstrain check-env across ranks (issue 10): 4 local ranks agree; a rank that reports another
# LibTorch version, or that holds a different copy of the dataset, is named with its fact and
# the groups of ranks holding each value (exit 1); --json follows docs/check-env.schema.json;
# torchrun-style ranks take the same path; train's preflight stops a job on a mismatch (exit 5)
# unless --skip-env-check.
source "$(dirname "$0")/../lib.sh"
py="${DSTRAIN_VENV:-$HOME/.cache/dstrain/venv-torch-2.11.0}/bin/python"
schema="$SRC/docs/check-env.schema.json"
validate() {  # validate FILE: the JSON report against the documented schema
  "$py" - "$schema" "$1" <<'PY'
import json, sys, jsonschema
jsonschema.validate(json.load(open(sys.argv[2])), json.load(open(sys.argv[1])))
PY
}

expect_status 0 "$DSTRAIN" check-env --nproc-per-node 4
expect_out "check-env: 4 ranks on 1 node"
expect_out "consistent: "
for fact in "libtorch" "libtorch build" "nccl" "glibc" "cpu isa" "/dev/shm" "ulimit open files" "clock offset from rank 0" "all-reduce result" "all-to-all result" \
            "gemm throughput"; do
  grep -q "✓ $fact " <<<"$OUT" || fail "no passing '$fact' row: $OUT"
done
# What has no rule to pass is shown as such (·), not ticked: the host, rank 0's bandwidth, and on a
# machine without GPUs the GPU facts say what they mean.
grep -q "· all-reduce bus bandwidth  *[0-9.]* GB/s (16 MiB, 4 ranks)" <<<"$OUT" || fail "the bandwidth is not shown as unchecked: $OUT"
grep -q "· host " <<<"$OUT" || fail "the host is not shown as unchecked: $OUT"
grep -q "· checkpoint dir write speed  *[0-9]* MB/s" <<<"$OUT" || fail "the disk speed is not shown as unchecked: $OUT"
if ! command -v nvidia-smi >/dev/null; then
  grep -q "gpus  *0 (none visible: the ranks would train on the CPU)" <<<"$OUT" || fail "gpus 0 does not say what it means: $OUT"
fi
ok "4 local ranks: every fact agrees, probes pass; what has no rule is marked · (shown, not checked)"
expect_status 0 "$DSTRAIN" check-env --nproc-per-node 1
expect_out "· all-reduce bus bandwidth"
expect_out "not measured (one rank has no peer)"
ok "one rank: no bandwidth of 0.00 GB/s, but 'not measured'"

DSTRAIN_TEST_FAULTS="fact=2:libtorch=2.10.0" expect_status 1 "$DSTRAIN" check-env --nproc-per-node 4 --skip probes
expect_out "✗ libtorch"
expect_out "2.11.0: ranks 0–1, 3; 2.10.0: rank 2"
expect_out "1 mismatch: libtorch"
ok "rank 2 with another LibTorch version: exit 1, the fact and the rank groups named"

DSTRAIN_TEST_FAULTS="fact=2:libtorch=2.10.0" "$DSTRAIN" check-env --nproc-per-node 4 --skip probes --json > mismatch.json && fail "--json: a mismatch must exit 1"
validate mismatch.json || fail "the mismatch report does not follow the schema: $(cat mismatch.json)"
python3 - mismatch.json <<'PY' || fail "the JSON report does not name the mismatch"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["consistent"] is False and r["mismatches"] == ["libtorch"] and r["world_size"] == 4, r
row = next(f for f in r["facts"] if f["name"] == "libtorch")
assert row["rule"] == "same" and not row["ok"] and {v["value"]: v["ranks"] for v in row["values"]} == {"2.11.0": [0, 1, 3], "2.10.0": [2]}, row
PY
ok "--json: the same report, valid against docs/check-env.schema.json"

# A recipe: its config, recipe file and dataset are hashed on every rank.
cp "$SRC/recipes/data/demo_corpus.txt" other.txt
printf 'X' | dd of=other.txt bs=1 seek=100 conv=notrunc status=none
DSTRAIN_TEST_FAULTS="data_path=2:$WORK/other.txt" expect_status 1 "$DSTRAIN" check-env "$demo_recipe" --nproc-per-node 4 --set train.micro_batch_size=4 --set run_dir=envrun --skip probes
expect_out "✗ data "
grep -q "✗ data .*: ranks 0–1, 3; .*: rank 2" <<<"$OUT" || fail "the data row does not group the ranks: $OUT"
expect_out "✓ config hash"
expect_out "✓ recipe file"
expect_out "✓ checkpoint dir writable"
ok "rank 2 with a different copy of the dataset: exit 1, the data fact and the rank groups named"

"$DSTRAIN" check-env "$demo_recipe" --nproc-per-node 2 --set run_dir=envrun --json --skip pairwise > ok.json || fail "a consistent check failed: $(cat ok.json)"
validate ok.json || fail "the consistent report does not follow the schema"
ok "a consistent run with a recipe, as JSON, valid against the schema"

# A node without the dataset (the launcher's own node is checked when the recipe loads).
DSTRAIN_TEST_FAULTS="data_path=1:$WORK/gone.bin" expect_status 1 "$DSTRAIN" check-env "$demo_recipe" --nproc-per-node 2 --set run_dir=envgone --skip probes
expect_out "✗ data "
expect_out "missing: $WORK/gone.bin: rank 1"
expect_out "[rank 1: not found on this rank's node: copy it there or fix the path]"
ok "a dataset missing on a rank is named with what to do"

expect_status 0 "$DSTRAIN" check-env --local
expect_out "check-env: 1 rank on 1 node"
"$DSTRAIN" check-env --local --json > local.json || fail "--local --json failed"
validate local.json || fail "--local --json does not follow the schema"
ok "--local: this machine's facts, no workers (text and JSON)"

# torchrun-style ranks: each process is a rank; rank 0 prints the report.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_RUN_ID=env1 DSTRAIN_TEST_FAULTS="fact=1:nccl=2.19.3" \
    "$DSTRAIN" check-env --skip probes > direct$r.log 2>&1 &
  pids[$r]=$!
done
set +e; wait ${pids[0]}; s0=$?; wait ${pids[1]}; s1=$?; set -e
[ $s0 -eq 1 ] && [ $s1 -eq 0 ] || fail "torchrun-style check-env: rank 0 exit $s0 (want 1), rank 1 exit $s1 (want 0): $(cat direct0.log)"
grep -q "✗ nccl .*: rank 0; 2.19.3: rank 1" direct0.log || fail "rank 0 does not report rank 1's NCCL: $(cat direct0.log)"
ok "torchrun-style ranks: the same check, reported by rank 0"

# Plain env:// ranks where one node lacks the dataset: that rank still joins and says so at once,
# and rank 0's report names it and the path, within seconds rather than at the join deadline.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$SECONDS
for r in 0 1; do
  data=$SRC/recipes/data/demo_corpus.txt; [ $r -eq 1 ] && data=$WORK/not-on-this-node.txt
  RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 \
    "$DSTRAIN" check-env "$demo_recipe" --set data.path="$data" --skip probes --set launch.timeout_s=50 > nodata$r.log 2>&1 &
  pids[$r]=$!
done
set +e; wait ${pids[0]}; s0=$?; wait ${pids[1]}; s1=$?; set -e
[ $s0 -eq 1 ] && [ $s1 -eq 1 ] || fail "env:// check-env without data on rank 1: exits $s0 and $s1 (want 1 and 1): $(cat nodata0.log nodata1.log)"
[ $((SECONDS - start)) -lt 40 ] || fail "check-env took $((SECONDS - start)) s: a rank waited for the join deadline"
grep -q "missing: $WORK/not-on-this-node.txt: rank 1" nodata0.log || fail "rank 0 does not name rank 1's missing data: $(cat nodata0.log)"
grep -q "check-env: rank 1 (.*): data: missing: $WORK/not-on-this-node.txt" nodata1.log || fail "rank 1 does not say what it lacks: $(cat nodata1.log)"
ok "env:// ranks: a rank without the dataset joins, says what it lacks, and rank 0 reports it ($((SECONDS - start)) s)"

# train's preflight.
common=(--nproc-per-node 2 --set train.steps=3 --set schedule.warmup_steps=1 --set checkpoint.interval_steps=0 --set launch.threads_per_worker=1)
DSTRAIN_TEST_FAULTS="fact=1:libtorch=2.10.0" expect_status 5 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=pre1
expect_out "environment check failed"
expect_out "2.11.0: rank 0; 2.10.0: rank 1"
expect_out "the ranks' environments differ: libtorch"
[ ! -e pre1/ckpt/latest ] || fail "the job trained despite the mismatch"
DSTRAIN_TEST_FAULTS="fact=1:libtorch=2.10.0" expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=pre2 --skip-env-check
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=pre3
expect_out "environment check: "
ok "train's preflight stops a mismatched job before training (exit 5); --skip-env-check trains anyway"
finish
