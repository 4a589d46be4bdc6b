#!/usr/bin/env bash
# Multi-token prediction (issue 40): DeepSeek-V3's MTP at depth 2 with attention within documents
# trains; 2 ranks at ZeRO-3 and with expert parallelism give the single process's losses and
# MTP losses (1e-6, fp32), as does full recompute, and so do pipelines (zb_h1 at 2 stages;
# interleaved 1F1B at 4 stages on 2 ranks x 2 data-parallel at ZeRO-3 with expert parallelism
# 2 (the last stage's MTP block routes over the stage's expert group), whose middle stages pass the
# embeddings' output on, with validation losses through the pipeline; a pipeline's checkpoint
# resumed in one process); bf16 trains; the export is the
# released layout (model.layers.{L+k-1}.* with copies of the embedding and head,
# num_nextn_predict_layers), transformers loads it and gives dstrain's validation loss, a run
# started from it holds its tensors (export -> init_from -> export identical), --no-mtp leaves
# the modules out; a dense model with MTP is refused by key.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
cmp="$SRC/test/dist/compare_metrics.py"
py="$DSTRAIN_VENV/bin/python"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
recipe="$SRC/recipes/tiny-mla-moe.yaml"
common=(--set model.mtp_depth=2 --set data.document_mask=true --set data.eos_token=10 --set train.steps=10 --set train.micro_batch_size=2
        --set train.global_batch_size=8 --set schedule.warmup_steps=2 --set launch.threads_per_worker=1 --set checkpoint.interval_steps=0
        --set zero.stage3_param_persistence_threshold=0)
run() {  # run NAME NPROC [--set ...]
  local name=$1 n=$2; shift 2
  expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node "$n" --set run_dir="$name" "$@"
}

run one 1
expect_out "| mtp_loss "
python3 "$cmp" one/metrics.jsonl --decreases 0.5 || fail "the loss did not fall with MTP"
python3 - one/metrics.jsonl <<'PY' || fail "metrics.jsonl's mtp_loss is not one number per depth that falls"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
m = [r["mtp_loss"] for r in rows]
assert all(isinstance(x, list) and len(x) == 2 for x in m), m[:2]
assert m[-1][0] < m[0][0] - 0.3 and m[-1][1] < m[0][1] - 0.3, (m[0], m[-1])
print(f"mtp_loss {m[0]} -> {m[-1]}")
PY
run z3 2 --set zero.stage=3
python3 "$cmp" one/metrics.jsonl z3/metrics.jsonl --rtol 1e-6 --mtp || fail "MTP at 2 ranks ZeRO-3 differs from one process"
run ep 2 --set moe.expert_parallel_size=2 --set zero.stage=1
python3 "$cmp" one/metrics.jsonl ep/metrics.jsonl --rtol 1e-6 --mtp || fail "MTP with expert parallelism differs from one process"
run full 1 --set train.activation_checkpointing=full
# Not bit for bit: the embeddings' gradient sums the first layer's (one term, recomputed) and MTP's
# in another order than without recompute.
python3 "$cmp" one/metrics.jsonl full/metrics.jsonl --rtol 1e-6 --mtp || fail "MTP with full recompute differs"
run bf16 2 --set precision.dtype=bf16 --set zero.stage=2
python3 "$cmp" bf16/metrics.jsonl --decreases 0.5 || fail "MTP in bf16 did not train"
# per_sample normalization: the depths' targets weigh as their samples' do, and mtp_loss is a mean of sample means.
run ps1 1 --set train.loss_normalization=per_sample --set train.steps=4
run ps2 2 --set train.loss_normalization=per_sample --set train.steps=4 --set zero.stage=3
python3 "$cmp" ps1/metrics.jsonl ps2/metrics.jsonl --rtol 1e-6 --mtp || fail "MTP with per_sample normalization differs at 2 ranks"
python3 -c "import json,sys; r=json.loads(open('ps1/metrics.jsonl').readline()); sys.exit(0 if all(abs(m/r['loss']-1)<0.1 for m in r['mtp_loss']) else r)" ||
  fail "per_sample's mtp_loss is not a mean cross-entropy"
ok "MTP depth 2 with document masks: 2 ranks at ZeRO-3 and with expert parallelism equal one process within 1e-6 (loss and each depth's mtp_loss), full recompute and per_sample normalization too, bf16 trains"

# Pipelines: the last stage's MTP modules read the embeddings' output that the stages pass on.
run pp 2 --set parallel.pipeline_parallel_size=2 --set pipeline.schedule=zb_h1 --set checkpoint.interval_steps=5
python3 "$cmp" one/metrics.jsonl pp/metrics.jsonl --rtol 1e-6 --mtp || fail "MTP with a 2-stage zb_h1 pipeline differs from one process"
grep -q "stage 1 (layer 1, the final norm, head and MTP)" pp/logs/rank_00001.log || fail "rank 1's log does not name its stage's MTP"
# The MTP modules' parameters and Adam states resume across layouts: the pipeline's step 5 in one process.
run ppres 1 --resume pp/ckpt/step_00000005
python3 "$cmp" one/metrics.jsonl ppres/metrics.jsonl --resumed --rtol 1e-6 --mtp || fail "a pipeline's MTP checkpoint resumed in one process differs"
four=(--set model.num_layers=4 --set train.steps=6 --set eval.split=0.1 --set eval.interval_steps=3 --set eval.max_batches=4)
run one4 1 "${four[@]}"
run il 4 "${four[@]}" --set parallel.pipeline_parallel_size=2 --set pipeline.virtual_stages=2 --set pipeline.schedule=interleaved_1f1b \
  --set zero.stage=3 --set moe.expert_parallel_size=2
python3 "$cmp" one4/metrics.jsonl il/metrics.jsonl --rtol 1e-6 --mtp || fail "MTP with an interleaved 4-stage pipeline differs from one process"
python3 - one4/metrics.jsonl il/metrics.jsonl <<'PY' || fail "the validation losses through the pipeline differ from one process's"
import json, sys
a, b = ([(r["step"], r["val_loss"]) for r in map(json.loads, open(p)) if "eval" in r] for p in sys.argv[1:])
assert len(a) == 2 and [s for s, _ in a] == [s for s, _ in b], (a, b)
worst = max(abs(x - y) / x for (_, x), (_, y) in zip(a, b))
print(f"validation losses {[round(x, 6) for _, x in a]}: largest relative difference {worst:.1e}")
sys.exit(0 if worst <= 1e-6 else 1)
PY
ok "MTP with pipelines (zb_h1 at 2 stages; interleaved 1F1B at 4 stages x 2 data-parallel ranks at ZeRO-3 with expert parallelism) equals one process within 1e-6, validation and a resume without the pipeline too"

expect_status 0 "$DSTRAIN" export-hf one hf
python3 - hf <<'PY' || fail "the export is not DeepSeek-V3's MTP layout"
import json, struct, sys
d = sys.argv[1]
c = json.load(open(f"{d}/config.json"))
assert c["num_nextn_predict_layers"] == 2 and c["num_hidden_layers"] == 2, c
data = open(f"{d}/model.safetensors", "rb").read()
keys = set(json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])) - {"__metadata__"}
for layer in (2, 3):
    for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "embed_tokens.weight", "shared_head.norm.weight",
              "shared_head.head.weight", "self_attn.q_a_proj.weight", "mlp.experts.3.down_proj.weight"):
        assert f"model.layers.{layer}.{k}" in keys, (layer, k)
print(f"{len(keys)} tensors, MTP layers 2 and 3 with their copies of the embedding and head")
PY
if "$py" -c 'import transformers' 2>/dev/null; then
  tail -c 20000 "$SRC/recipes/data/demo_corpus.txt" > val.txt
  "$DSTRAIN" eval hf --data val.txt --format bytes --seq-len 64 --json > eval.json 2> eval.log || fail "dstrain eval of the export: $(cat eval.log)"
  "$py" - hf val.txt "$(python3 -c "import json; print(json.load(open('eval.json'))['datasets'][0]['val_loss'])")" <<'PY' ||
import sys, torch, transformers
d, path, want = sys.argv[1], sys.argv[2], float(sys.argv[3])
model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
data = torch.tensor(list(open(path, "rb").read()), dtype=torch.int64)
T = 64
windows = torch.stack([data[i * T:i * T + T + 1] for i in range((data.numel() - 1) // T)])
with torch.no_grad():
    logits = model(windows[:, :-1]).logits.double()
got = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1)).item()
print(f"transformers {got:.9f}, dstrain eval {want:.9f}: relative {abs(got - want) / want:.1e}")
sys.exit(0 if abs(got - want) <= 1e-6 * want else 1)
PY
    fail "transformers' loss on the MTP export differs from dstrain's"
  ok "transformers loads the export with its MTP modules and gives dstrain eval's loss within 1e-6"
else
  echo "note: transformers is not importable from $py; the export was not loaded by it"
fi
run init 1 --set model.init_from="$WORK/hf" --set optimizer.lr=0 --set schedule.type=constant --set train.steps=1 \
  --set model.bias_update_speed=0
expect_status 0 "$DSTRAIN" export-hf init hf2
cmp hf/model.safetensors hf2/model.safetensors || fail "export -> init_from -> export changed the tensors"
expect_status 0 "$DSTRAIN" export-hf one hf-main --no-mtp
python3 -c "import json,sys; c=json.load(open('hf-main/config.json')); sys.exit(0 if c['num_nextn_predict_layers']==0 else c)" ||
  fail "--no-mtp still names MTP modules"
! grep -q "eh_proj" hf-main/model.safetensors || fail "--no-mtp wrote MTP tensors"
ok "export -> init_from -> export round-trips the MTP modules byte for byte; --no-mtp leaves them out"

expect_status 2 "$DSTRAIN" train "$demo_recipe" --set model.mtp_depth=1 --set run_dir=dense
expect_out "model.mtp_depth 1: multi-token prediction is DeepSeek-V3's, for model.family mla_moe"
ok "MTP with a dense model is a config error naming the key"
finish
