#!/usr/bin/env bash
# LoRA (issue 59): the recipe's lora block on a Hugging Face base (model.init_from). On the dense
# model and the MLA + MoE model: 20 steps at ZeRO 0-3 on 2 ranks (and ZeRO-3 offloaded), with expert
# parallelism 2 and a 2-stage pipeline, give the losses of one process within 1e-5; the engine's model states per rank
# are --dry-run's; the checkpoints hold what trains and name the base (its files' CRC-32C): a
# resume (2 ranks -> 1) reads the base again and continues exactly, one with another lora block or
# another base is refused, as are eval and a merge on a base changed since; `dstrain eval` of the
# run gives its training-time validation loss; the PEFT export loads with
# PeftModel.from_pretrained (every tensor taken, bit for bit) and gives that loss, as does the
# merged export in plain transformers (1e-6, fp32; MLA's RoPE rows permuted as the weights');
# lora.init_from reads the export back, and an adapter PEFT made gives PEFT's loss; DoRA and
# per-module ranks and alphas (rank_pattern, alpha_pattern) likewise against one process and PEFT;
# lora.dropout draws the same masks on any layout (DoRA at ZeRO-3, a pipeline); the routed experts'
# adapters (lora.experts) with expert parallelism, in PEFT under transformers 5 and merged; bad lora
# settings are refused by key.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
cmp="$SRC/test/dist/compare_metrics.py"
py="$DSTRAIN_VENV/bin/python"
moe="$SRC/recipes/tiny-mla-moe.yaml"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error PYTHONWARNINGS=ignore
tail -c 40000 "$SRC/recipes/data/demo_corpus.txt" > val.txt
common=(--set launch.threads_per_worker=1 --set checkpoint.interval_steps=0 --set checkpoint.keep_last=0
        --set zero.stage3_param_persistence_threshold=0)
evals=(--set eval.paths="[$WORK/val.txt]" --set eval.micro_batch_size=4 --set eval.interval_steps=0)
run() {  # run RECIPE NAME NPROC [--set ...]
  local recipe=$1 name=$2 n=$3; shift 3
  expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --set train.steps=20 --nproc-per-node "$n" --set run_dir="$name" "$@"
}
val() { python3 -c "import json; r=[json.loads(l) for l in open('$1/metrics.jsonl')]; print(repr(next(x['val_loss'] for x in r if x.get('eval')=='val' and x['step']==$2)))"; }

# --- refused by key, before anything runs ------------------------------------------------------
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.rank=4 --set 'lora.targets=[q_a_proj]' --dry-run
expect_out "lora.targets [q_a_proj] match no projection of this model"
expect_out "the model's projections are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.rank=4 --set 'lora.modules_to_save=[lm_hed]' --dry-run
expect_out "lora.modules_to_save: 'lm_hed' is no module of this model"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.rank=4 --set lora.dropout=1 --dry-run
expect_out "lora.dropout 1: every input element would be dropped"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.alpha=16 --dry-run
expect_out "lora.alpha is set (--set) but lora.rank is 0"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.rank=4 --set 'train.freeze=[norms]' --dry-run
expect_out "train.freeze with lora"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.rank=-1 --dry-run
expect_out "lora.rank"
ok "targets and modules that match nothing, dropout 1, alpha without a rank, train.freeze beside lora and a negative rank are refused by key (exit 2)"

# --- the bases: short full trainings, exported -------------------------------------------------
run "$demo_recipe" base 2 --set train.steps=12
expect_status 0 "$DSTRAIN" export-hf base hf-base
run "$moe" mbase 2 --set train.steps=12
expect_status 0 "$DSTRAIN" export-hf mbase hf-mbase
dense=(--set model.init_from="$WORK/hf-base" --set lora.rank=4 --set lora.alpha=16 --set 'lora.modules_to_save=[lm_head]')
mla=(--set model.init_from="$WORK/hf-mbase" --set lora.rank=4 --set lora.alpha=8 --set lora.use_rslora=true)

# --- dense: one process, ZeRO 0-3 on 2 ranks ---------------------------------------------------
run "$demo_recipe" one 1 "${dense[@]}" "${evals[@]}"
expect_out "lora: rank 4, alpha 16 (scale 4) on 14 projections (all-linear): 0.020M adapter parameters and 0.033M of [lm_head] train"
for stage in 0 1 2 3; do
  run "$demo_recipe" z$stage 2 "${dense[@]}" --set zero.stage=$stage
  python3 "$cmp" one/metrics.jsonl z$stage/metrics.jsonl --rtol 1e-5 --grad-norm || fail "LoRA at ZeRO $stage on 2 ranks differs from one process"
done
run "$demo_recipe" zoff 2 "${dense[@]}" --set zero.stage=3 --set zero.offload_optimizer=cpu --set zero.offload_param=cpu
python3 "$cmp" one/metrics.jsonl zoff/metrics.jsonl --rtol 1e-5 --grad-norm || fail "LoRA at ZeRO 3 with the optimizer and parameters offloaded differs from one process"
ok "dense LoRA with lm_head trained in full: ZeRO 0-3 on 2 ranks, and ZeRO-3 with offload, within 1e-5 of one process (loss and gradient norm)"

# --- model states: the engine's are what --dry-run planned ---------------------------------------
for stage in 1 3; do
  expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=20 --nproc-per-node 2 "${dense[@]}" --set zero.stage=$stage \
    --dry-run
  expect_out "lora                    rank 4, alpha 16 (scale 4) on [all-linear]: 19.5k adapter parameters, [lm_head] trained in full"
  planned=$(grep -o "model states per rank   [0-9.]* [KM]iB" <<<"$OUT" | grep -o "[0-9.]* [KM]iB")
  measured=$(grep -o "; model states [0-9.]* MiB" z$stage/logs/rank_00000.log | grep -o "[0-9.]* MiB")
  [ -n "$planned" ] && [ "$planned" = "$measured" ] || fail "ZeRO $stage: the engine holds $measured of model states per rank, --dry-run planned $planned"
done
ok "model states per rank of a LoRA run are what --dry-run plans (ZeRO 1 and 3)"

# --- resume: 2 ranks -> 1 continues exactly; another lora block is refused --------------------------
# The checkpoints hold what trains and name the base: a resume reads it again (here from a copy
# elsewhere: the same files), and refuses another base or none.
run "$demo_recipe" half 2 "${dense[@]}" --set zero.stage=2 --set checkpoint.interval_steps=10
cp -r hf-base hf-moved
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=20 --nproc-per-node 1 "${dense[@]}" --set zero.stage=3 \
  --set model.init_from="$WORK/hf-moved" --set run_dir=alone --resume half/ckpt/step_00000010
expect_out "the checkpoint's base $WORK/hf-base is at $WORK/hf-moved now (the same files)"
python3 "$cmp" half/metrics.jsonl alone/metrics.jsonl --resumed --rtol 1e-5 || fail "a LoRA run resumed on one rank does not continue the run"
perturb() {  # perturb FOLDER: one weight of the base changed
  "$py" -c "from safetensors.torch import load_file, save_file
t = load_file('$1/model.safetensors'); k = sorted(t)[0]; t[k] = t[k] + 0.01
save_file(t, '$1/model.safetensors', metadata={'format': 'pt'})"
}
cp -r hf-base hf-other && perturb hf-other
expect_status 4 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=20 --nproc-per-node 2 "${dense[@]}" \
  --set model.init_from="$WORK/hf-other" --set run_dir=other --resume half/ckpt/step_00000010
expect_out "holds adapters trained on the base $WORK/hf-base, and model.init_from $WORK/hf-other is another model: model.safetensors: CRC-32C"
expect_status 4 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=20 --nproc-per-node 2 "${dense[@]}" --set model.init_from= \
  --set run_dir=other --resume half/ckpt/step_00000010
expect_out "holds LoRA adapters without their base, which was $WORK/hf-base"
expect_status 0 "$DSTRAIN" inspect-ckpt half --verify --json --tensors
python3 -c "import json,sys; j=json.loads(sys.argv[1]); b=j['base']; assert b['path']=='$WORK/hf-base' and b['problem']=='' and len(b['files'])==1, b
assert j['frozen_parameters']==0 and not any(t['name']=='model.layers.0.self_attn.q_proj.weight' for t in j['tensors']), 'the base is in the checkpoint'" \
  "$OUT" || fail "the LoRA checkpoint holds its base, or does not name it"
perturb hf-moved  # the base of run 'alone', changed under it
expect_status 4 "$DSTRAIN" eval alone --data val.txt
expect_out "holds adapters trained on the base $WORK/hf-moved, whose files have changed since: model.safetensors"
expect_status 4 "$DSTRAIN" export-hf alone nowhere --merge
[ ! -e nowhere ] || fail "export-hf --merge on a changed base wrote something"
expect_status 4 "$DSTRAIN" inspect-ckpt alone --verify
expect_out "base         CHANGED: model.safetensors: CRC-32C"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=20 --nproc-per-node 2 "${dense[@]}" --set lora.rank=8 \
  --set run_dir=other --resume half/ckpt/step_00000010
expect_out "this run's is [8, 128]: the adapters' rank differs"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=20 --nproc-per-node 2 --set run_dir=full \
  --set model.init_from="$WORK/hf-base" --resume half/ckpt/step_00000010
expect_out "lora: checkpoint $WORK/half/ckpt/step_00000010 was written with 28 adapter tensors, this run has 0"
ok "a LoRA checkpoint holds what trains and names its base: it resumes on another world size and ZeRO stage exactly (the base read again, from a copy elsewhere); another base, none, another rank or no lora is refused; eval, a merge and inspect-ckpt --verify refuse a base changed since"

# --- inspect-ckpt, eval and the PEFT export (dense) ---------------------------------------------------
expect_status 0 "$DSTRAIN" inspect-ckpt one
expect_out "lora         28 adapter tensors of rank 4 on 14 projections (19520 elements), with their optimizer state"
expect_out "base         $WORK/hf-base (1 file, 1.8 MiB): named, not held; a resume, eval or merge reads it from there"
trained=$(val one 20)
expect_status 0 "$DSTRAIN" eval one --json
python3 -c "import json,sys; v=json.loads(sys.argv[1])['datasets'][0]['val_loss']; sys.exit(0 if abs(v-$trained)<=1e-6*$trained else f'{v} vs $trained')" \
  "$(tail -1 <<<"$OUT")" || fail "dstrain eval of the LoRA run gives another loss than its training-time evaluation"
expect_status 0 "$DSTRAIN" export-hf one adapter
expect_out "as a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors, fp32"
expect_status 0 "$DSTRAIN" export-hf one merged --merge
"$py" "$SRC/test/dist/peft_reference.py" hf-base adapter val.txt 128 "$trained" merged || fail "the dense adapter does not give dstrain's loss in PEFT"
ok "dense: dstrain eval, PEFT on the exported adapter and the merged export in transformers give the run's validation loss (1e-6)"

# --- lora.init_from: our own export back, and an adapter PEFT made ------------------------------------
start=(--set train.steps=1 --set schedule.warmup_steps=0 --set eval.at_start=true)
run "$demo_recipe" again 1 "${dense[@]}" "${evals[@]}" "${start[@]}" --set lora.init_from="$WORK/adapter"
expect_out "lora: adapters initialised from $WORK/adapter"
close() { python3 -c "import sys; a,b=float('$1'),float('$2'); sys.exit(0 if abs(a-b)<=1e-6*abs(a) else f'{a!r} vs {b!r}')"; }
close "$trained" "$(val again 0)" || fail "a run started from its own exported adapter does not score as the run did"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${dense[@]}" --set lora.rank=8 --set lora.init_from="$WORK/adapter" --dry-run
expect_out "lora.init_from (--set): the adapter's r is 4, lora.rank is 8: set lora.rank: 4"
expect_status 4 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=nosave --set model.init_from="$WORK/hf-base" --set lora.rank=4 \
  --set lora.alpha=16 --set lora.init_from="$WORK/adapter"
expect_out "base_model.model.lm_head.weight is a module saved in full this run does not train"
attention='lora.targets=[q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj]'
peft_loss=$("$py" "$SRC/test/dist/peft_reference.py" make hf-mbase peft-made val.txt 64 4 8 q_a_proj q_b_proj kv_a_proj_with_mqa kv_b_proj o_proj | tail -1)
run "$moe" imported 1 "${mla[@]}" "${evals[@]}" "${start[@]}" --set "$attention" --set lora.init_from="$WORK/peft-made"
close "$peft_loss" "$(val imported 0)" || fail "an adapter PEFT made does not give PEFT's loss here"
ok "lora.init_from: the run's own export scores as the run did; a PEFT-made MLA adapter (random A and B, rsLoRA) gives PEFT's loss (1e-6); a mismatched rank or module is refused"

# --- per-module ranks and alphas (rank_pattern, alpha_pattern): PEFT applies them as trained ------------
patterns=(--set "lora.rank_pattern={model.layers.1.mlp.down_proj: 8, o_proj: 2}"
          --set "lora.alpha_pattern={'layers\.0\.self_attn\.(q|k)_proj': 32}")
run "$demo_recipe" pat 1 "${dense[@]}" "${evals[@]}" "${patterns[@]}"
expect_out "on 14 projections (all-linear), 5 of them with their own rank or alpha"
run "$demo_recipe" pat3 2 "${dense[@]}" "${patterns[@]}" --set zero.stage=3
python3 "$cmp" pat/metrics.jsonl pat3/metrics.jsonl --rtol 1e-5 --grad-norm || fail "per-module ranks at ZeRO 3 on 2 ranks differ from one process"
expect_status 0 "$DSTRAIN" inspect-ckpt pat
expect_out "lora         28 adapter tensors of rank 2 to 8 on 14 projections"
expect_status 0 "$DSTRAIN" export-hf pat padapter
expect_status 0 "$DSTRAIN" export-hf pat pmerged --merge
"$py" "$SRC/test/dist/peft_reference.py" hf-base padapter val.txt 128 "$(val pat 20)" pmerged || fail "PEFT does not apply the exported rank and alpha patterns as trained"
run "$demo_recipe" pagain 1 "${dense[@]}" "${evals[@]}" "${start[@]}" "${patterns[@]}" --set lora.init_from="$WORK/padapter"
close "$(val pat 20)" "$(val pagain 0)" || fail "an adapter with rank and alpha patterns does not import as exported"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${dense[@]}" --set lora.init_from="$WORK/padapter" --dry-run
expect_out "the adapter's rank_pattern is {\"model.layers.1.mlp.down_proj\":8,\"o_proj\":2}, lora.rank_pattern is {}"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${dense[@]}" --set "lora.rank_pattern={q_proj: 8, 'self_attn\.q_proj': 16}" --dry-run
expect_out "lora.rank_pattern: 'q_proj' and 'self_attn\.q_proj' both match model.layers.0.self_attn.q_proj, with 8 and 16"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${dense[@]}" --set "lora.rank_pattern={q_a_proj: 8}" --dry-run
expect_out "lora.rank_pattern: 'q_a_proj' matches no adapted projection"
ok "rank_pattern and alpha_pattern: ZeRO-3 on 2 ranks within 1e-5 of one process; PEFT on the export and the merged model give the run's loss (1e-6); the export imports back; another adapter's patterns, clashing and unused patterns are refused"

# --- DoRA: ZeRO-3 on 2 ranks against one process; PEFT (use_dora) and the merged export -----------------
run "$demo_recipe" dora 1 "${dense[@]}" "${evals[@]}" --set lora.use_dora=true --set lora.dropout=0.1
expect_out "lora: rank 4, alpha 16 (scale 4, DoRA, dropout 0.1) on 14 projections"
run "$demo_recipe" dora3 2 "${dense[@]}" --set lora.use_dora=true --set lora.dropout=0.1 --set zero.stage=3 --set train.micro_batch_size=2
python3 "$cmp" dora/metrics.jsonl dora3/metrics.jsonl --rtol 1e-5 --grad-norm || fail "DoRA with dropout at ZeRO 3 on 2 ranks differs from one process"
expect_status 0 "$DSTRAIN" export-hf dora dadapter
expect_status 0 "$DSTRAIN" export-hf dora dmerged --merge
"$py" "$SRC/test/dist/peft_reference.py" hf-base dadapter val.txt 128 "$(val dora 20)" dmerged || fail "the DoRA adapter does not give dstrain's loss in PEFT"
run "$moe" mdora 1 "${mla[@]}" "${evals[@]}" --set "$attention" --set lora.use_dora=true
expect_status 0 "$DSTRAIN" export-hf mdora mdadapter
"$py" "$SRC/test/dist/peft_reference.py" hf-mbase mdadapter val.txt 64 "$(val mdora 20)" || fail "the MLA DoRA adapter does not give dstrain's loss in PEFT"
ok "DoRA with dropout: ZeRO-3 on 2 ranks (other micro-batches) within 1e-5 of one process; PEFT (use_dora) on the export and the merged model give the run's loss (dense and MLA, 1e-6)"

# --- MLA + MoE: expert parallelism, a pipeline, the RoPE rows in the export ---------------------------
run "$moe" mone 1 "${mla[@]}" "${evals[@]}" --set "$attention"
run "$moe" mep 2 "${mla[@]}" --set "$attention" --set moe.expert_parallel_size=2 \
  --set zero.stage=1
python3 "$cmp" mone/metrics.jsonl mep/metrics.jsonl --rtol 1e-5 || fail "LoRA with expert parallelism 2 differs from one process"
expect_status 0 "$DSTRAIN" export-hf mone madapter
expect_status 0 "$DSTRAIN" export-hf mone mmerged --merge
"$py" "$SRC/test/dist/peft_reference.py" hf-mbase madapter val.txt 64 "$(val mone 20)" mmerged || fail "the MLA adapter does not give dstrain's loss in PEFT"
run "$moe" mall 1 "${mla[@]}" "${evals[@]}" --set model.num_layers=4 --set train.global_batch_size=16 --set train.micro_batch_size=2 \
  --set model.init_from="" --set lora.alpha=8 --set lora.dropout=0.1
run "$moe" mpp 2 "${mla[@]}" --set model.num_layers=4 --set train.global_batch_size=16 --set train.micro_batch_size=2 --set model.init_from="" \
  --set parallel.pipeline_parallel_size=2 --set pipeline.schedule=1f1b --set lora.dropout=0.1
python3 "$cmp" mall/metrics.jsonl mpp/metrics.jsonl --rtol 1e-5 || fail "LoRA with dropout on a 2-stage pipeline differs from one process"
expect_status 2 "$DSTRAIN" export-hf mall nowhere
expect_out "no model.init_from"
expect_status 0 "$DSTRAIN" inspect-ckpt mall
expect_out "values alone, no optimizer state (the LoRA base)"  # its own random base: saved whole
expect_status 0 "$DSTRAIN" export-hf mall mall-merged --merge
expect_out "exported"
"$py" "$SRC/test/dist/peft_reference.py" - none val.txt 64 "$(val mall 20)" mall-merged || fail "the merged all-linear MoE export does not give dstrain's loss"
ok "MLA + MoE: EP 2 and a 2-stage pipeline (with dropout) within 1e-5 of one process; the attention adapter in PEFT and the merged all-linear model give dstrain's loss"

# --- the routed experts (lora.experts): EP 2 at ZeRO-3 against one process; PEFT under transformers 5 and the merge ----
# A base whose every MLP is routed (no dense layer, no shared expert): PEFT under transformers 5 reads
# gate_proj, up_proj and down_proj as the routed experts' only, so it can load this adapter whole.
run "$moe" ebase 2 --set train.steps=12 --set model.first_k_dense_replace=0 --set model.n_shared_experts=0
expect_status 0 "$DSTRAIN" export-hf ebase hf-ebase
routed=(--set model.first_k_dense_replace=0 --set model.n_shared_experts=0 --set model.init_from="$WORK/hf-ebase" --set lora.rank=4
        --set lora.alpha=8 --set lora.experts=true)
run "$moe" eone 1 "${routed[@]}" "${evals[@]}"
expect_out "on 34 projections (all-linear; 24 of them the routed experts' here)"
run "$moe" eep 2 "${routed[@]}" --set moe.expert_parallel_size=2 --set zero.stage=3
python3 "$cmp" eone/metrics.jsonl eep/metrics.jsonl --rtol 1e-5 --grad-norm || fail "LoRA on the routed experts with EP 2 at ZeRO-3 differs from one process"
expect_out "; 12 of them the routed experts' here"  # each rank: its 2 experts of 4, in 2 layers
# A checkpoint of EP 2 (each rank saves its experts' adapters under their global names) resumes in one process.
run "$moe" ehalf 2 "${routed[@]}" --set moe.expert_parallel_size=2 --set zero.stage=1 --set checkpoint.interval_steps=10
expect_status 0 "$DSTRAIN" train "$moe" "${common[@]}" --set train.steps=20 --nproc-per-node 1 "${routed[@]}" --set run_dir=ealone \
  --resume ehalf/ckpt/step_00000010
python3 "$cmp" ehalf/metrics.jsonl ealone/metrics.jsonl --resumed --rtol 1e-5 || fail "routed-expert adapters saved at EP 2 do not resume in one process"
run "$moe" epp 2 "${routed[@]}" --set parallel.pipeline_parallel_size=2 --set pipeline.schedule=1f1b \
  --set train.activation_checkpointing=selective
python3 "$cmp" eone/metrics.jsonl epp/metrics.jsonl --rtol 1e-5 || fail "LoRA on the routed experts on a 2-stage pipeline, recomputed, differs from one process"
# The model states per rank --dry-run plans are the engine's: at ZeRO-1 each rank holds its experts'
# adapters whole and the others' not at all (rank 64: the experts' adapters are most of the states).
big=(--set lora.rank=64 --set zero.stage=1 --set moe.expert_parallel_size=2)
expect_status 0 "$DSTRAIN" train "$moe" "${common[@]}" --set train.steps=20 --nproc-per-node 2 "${routed[@]}" "${big[@]}" --dry-run
expect_out "on [all-linear] and the routed experts (147.5k of them)"
expect_out "MiB more: the adapters' states outweigh what the frozen base saves"
planned=$(grep -o "model states per rank   [0-9.]* [KM]iB" <<<"$OUT" | grep -o "[0-9.]* [KM]iB")
run "$moe" eep1 2 "${routed[@]}" "${big[@]}" --set train.steps=2 --set schedule.warmup_steps=0
measured=$(grep -o "; model states [0-9.]* MiB" eep1/logs/rank_00000.log | grep -o "[0-9.]* MiB")
[ -n "$planned" ] && [ "$planned" = "$measured" ] || fail "routed-expert LoRA: the engine holds $measured of model states per rank, --dry-run planned $planned"
expect_status 0 "$DSTRAIN" inspect-ckpt eep
expect_out "lora         68 adapter tensors of rank 4 on 34 projections (24 of them routed experts')"
expect_status 0 "$DSTRAIN" export-hf eone eadapter
grep -qF 'mlp\\.experts(\\.[0-9]+)?\\.gate_proj' eadapter/adapter_config.json || fail "the adapter's target_modules do not name the routed experts by any index"
expect_status 0 "$DSTRAIN" export-hf eone emerged --merge
"$py" "$SRC/test/dist/peft_reference.py" hf-ebase eadapter val.txt 64 "$(val eone 20)" emerged \
  || fail "the routed experts' adapter does not give dstrain's loss in PEFT (transformers 5), or the merged export in transformers"
run "$moe" eagain 1 "${routed[@]}" "${evals[@]}" "${start[@]}" --set lora.init_from="$WORK/eadapter"
close "$(val eone 20)" "$(val eagain 0)" || fail "an adapter with the routed experts' does not import as exported"
# An adapter PEFT made on transformers 5's fused experts (target_parameters): split per expert here, PEFT's loss.
peft_loss=$("$py" "$SRC/test/dist/peft_reference.py" make hf-ebase peft-experts val.txt 64 4 8 q_a_proj q_b_proj kv_a_proj_with_mqa \
  kv_b_proj o_proj param:mlp.experts.gate_up_proj param:mlp.experts.down_proj | tail -1)
run "$moe" eimported 1 "${routed[@]}" "${evals[@]}" "${start[@]}" --set lora.use_rslora=true --set lora.init_from="$WORK/peft-experts"
close "$peft_loss" "$(val eimported 0)" || fail "an adapter PEFT made on the fused experts does not give PEFT's loss here"
expect_status 4 "$DSTRAIN" train "$moe" "${common[@]}" "${routed[@]}" --set lora.experts=false --set lora.use_rslora=true --set run_dir=enot \
  --set lora.init_from="$WORK/peft-experts"
expect_out "is a routed expert's adapter this run does not train"
expect_out "set lora.experts: true"
expect_status 2 "$DSTRAIN" train "$moe" "${common[@]}" "${routed[@]}" --set lora.dropout=0.1 --dry-run
expect_out "lora.experts with lora.dropout 0.1: the routed experts' adapters take no dropout"
expect_status 2 "$DSTRAIN" train "$moe" "${common[@]}" "${routed[@]}" --set "lora.rank_pattern={experts\.0\.up_proj: 8}" --dry-run
expect_out "lora.rank_pattern: 'experts\.0\.up_proj' matches the routed expert model.layers.0.mlp.experts.0.up_proj"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set lora.rank=4 --set lora.experts=true --dry-run
expect_out "lora.experts: model.family dense has no routed experts"
ok "LoRA on the routed experts: EP 2 at ZeRO-3, and a 2-stage pipeline with selective recompute, within 1e-5 of one process, with --dry-run's model states; an EP 2 checkpoint resumes in one process; PEFT under transformers 5 takes the per-expert adapter (fused, bit for bit) and gives dstrain's loss, as does the merged export (1e-6); it imports back, and so does an adapter PEFT made on the fused experts (target_parameters: PEFT's loss), refused without lora.experts; dropout, an expert's own rank and a dense model are refused by key"

finish
