#!/usr/bin/env bash
# Trains the same configurations with two dstrain binaries and checks that they are bit for bit
# the same: every step's loss, grad_norm, lr, loss_scale and skipped flag, and every file of the
# last checkpoint (the manifest's run id, times and config hash aside). For changes that must not change the
# numbers (a refactor of the training step): build the old commit into another directory first.
#   scripts/compare-builds.sh OLD_DSTRAIN NEW_DSTRAIN [WORK_DIR]
# The configurations: the demo (document mask, 2 ranks), ZeRO-3 bf16, fp16 ZeRO-2 with an injected
# overflow, a NaN loss rolled back, weighted shares, tiny-mla-moe at ZeRO-1, expert parallelism,
# activation checkpointing with the chunked loss, optimizer offload, a 2-stage 1F1B pipeline, and
# multi-token prediction over packed documents. Then the old binary's demo
# checkpoint of step 50 is resumed by the new binary, which must continue exactly as the old did.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
[ $# -ge 2 ] || die "usage: scripts/compare-builds.sh OLD_DSTRAIN NEW_DSTRAIN [WORK_DIR]"
old=$(realpath "$1"); new=$(realpath "$2")
work=${3:-$(mktemp -d /tmp/dstrain-compare-XXXXXX)}
mkdir -p "$work"
cd "$work"
data="$DSTRAIN_ROOT/recipes/data/pycode"
if [ ! -f "$data.idx" ]; then
  stdlib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
  "$new" prepare-data "$stdlib" --ext .py --output "$data" --max-bytes 8000000 >/dev/null
fi
demo="$DSTRAIN_ROOT/recipes/demo.yaml" coder="$DSTRAIN_ROOT/recipes/demo-coder.yaml" moe="$DSTRAIN_ROOT/recipes/tiny-mla-moe.yaml"
short=(--set launch.threads_per_worker=1 --set checkpoint.keep_last=0)
# name | environment | recipe and overrides
configs=(
  "demo||$coder"
  "zero3_bf16||$demo --set zero.stage=3 --set precision.dtype=bf16 --set train.steps=30"
  "fp16_overflow|DSTRAIN_TEST_FAULTS=inf_step=4|$demo --set zero.stage=2 --set precision.dtype=fp16 --set train.steps=20"
  "nan_rollback|DSTRAIN_TEST_FAULTS=nan_loss=1:8|$demo --set precision.dtype=bf16 --set train.on_bad_step=rollback --set checkpoint.interval_steps=5 --set train.steps=20"
  "weighted_shares||$demo --set data.shard_weights=[3,1] --set train.steps=20"
  "tiny_mla_moe||$moe --set zero.stage=1 --set train.steps=20"
  "expert_parallel||$moe --set moe.expert_parallel_size=2 --set zero.stage=2 --set train.steps=20"
  "recompute_chunked||$demo --set train.activation_checkpointing=full --set train.loss_chunk_tokens=64 --set zero.stage=3 --set train.steps=20"
  "offload||$demo --set zero.stage=2 --set zero.offload_optimizer=cpu --set train.steps=20"
  "pipeline_1f1b||$demo --set parallel.pipeline_parallel_size=2 --set pipeline.schedule=1f1b --set model.num_layers=4 --set train.global_batch_size=16 --set train.micro_batch_size=2 --set train.steps=20"
  "mtp_documents||$moe --set model.mtp_depth=2 --set data.document_mask=true --set data.eos_token=10 --set train.micro_batch_size=2 --set train.global_batch_size=8 --set train.steps=20"
)
status=0
printf '%-18s %6s  %s\n' config steps result
for entry in "${configs[@]}"; do
  IFS='|' read -r name env args <<<"$entry"
  for side in old new; do
    bin=$old; [ "$side" = new ] && bin=$new
    rm -rf "$work/$name-$side"
    # shellcheck disable=SC2086  # the overrides are words
    if ! env $env "$bin" train $args "${short[@]}" --set run_dir="$work/$name-$side" > "$work/$name-$side.log" 2>&1; then
      echo "$name: the $side binary failed; see $work/$name-$side.log" >&2
      status=1
      continue 2
    fi
  done
  result=$(python3 - "$work/$name-old" "$work/$name-new" <<'EOF'
import hashlib, json, os, sys
old, new = sys.argv[1:3]
keys = ("loss", "grad_norm", "lr", "loss_scale", "skipped", "mtp_loss")
def steps(run):
    out = {}
    for line in open(os.path.join(run, "metrics.jsonl")):
        m = json.loads(line)
        out[m["step"]] = tuple(m.get(k) for k in keys)
    return out
a, b = steps(old), steps(new)
if a != b:
    bad = [s for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)]
    print(f"DIFFERENT metrics at steps {bad[:5]}: {a.get(bad[0])} vs {b.get(bad[0])}")
    sys.exit(1)
def files(run):
    ckpt = os.path.join(run, "ckpt")
    last = sorted(d for d in os.listdir(ckpt) if d.startswith("step_"))[-1]
    out = {}
    for root, _, names in os.walk(os.path.join(ckpt, last)):
        for n in names:
            path = os.path.join(root, n)
            rel = os.path.relpath(path, os.path.join(ckpt, last))
            data = open(path, "rb").read()
            if n == "COMMITTED":  # the manifest's checksum: the manifest is compared below
                continue
            if n.endswith(".json"):  # run ids, times, paths, the config's hash (a key added to the schema changes it)
                def strip(x):
                    if isinstance(x, dict):
                        return {k: strip(v) for k, v in x.items() if k not in ("run_id", "config_hash", "created", "created_unix", "time", "wall_time", "run_dir", "hostname", "saved_at", "seconds")}
                    if isinstance(x, list):
                        return [strip(v) for v in x]
                    return x
                try:
                    data = json.dumps(strip(json.loads(data)), sort_keys=True).encode()
                except ValueError:
                    pass
            out[rel] = hashlib.sha256(data).hexdigest()
    return last, out
(la, fa), (lb, fb) = files(old), files(new)
if la != lb or fa != fb:
    diff = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))
    print(f"DIFFERENT checkpoint {la} vs {lb}: {diff[:6]}")
    sys.exit(1)
print(f"{len(a)} | identical (metrics and {len(fa)} checkpoint files of {la})")
EOF
) || status=1
  printf '%-18s %s\n' "$name" "$result"
done
# An old checkpoint, resumed by the new binary: steps 51-150 as the old binary computed them.
if [ -d "$work/demo-old/ckpt/step_00000050" ]; then
  rm -rf "$work/demo-resumed" && cp -r "$work/demo-old" "$work/demo-resumed"
  rm -rf "$work/demo-resumed/ckpt/step_00000100" "$work/demo-resumed/ckpt/step_00000150"
  printf 'step_00000050\n' > "$work/demo-resumed/ckpt/latest"
  if "$new" resume "$work/demo-resumed" > "$work/demo-resumed.log" 2>&1 &&
     python3 - "$work/demo-old/metrics.jsonl" "$work/demo-resumed/metrics.jsonl" <<'EOF'
import json, sys
keys = ("step", "loss", "grad_norm", "lr", "loss_scale", "skipped", "eval", "val_loss")
a, b = ([tuple(json.loads(l).get(k) for k in keys) for l in open(p)] for p in sys.argv[1:3])
sys.exit(0 if a == b and sum(r[6] is None for r in a) == 150 else 1)  # 150 steps, and the evaluations alike
EOF
  then
    printf '%-18s %s\n' "old_ckpt_resumed" "steps 51-150 identical to the old binary's own run"
  else
    printf '%-18s %s\n' "old_ckpt_resumed" "DIFFERENT (see $work/demo-resumed.log)"
    status=1
  fi
fi
[ "$status" = 0 ] && say "every configuration is bit-identical between the two binaries" || say "some configurations differ (logs in $work)"
exit "$status"
