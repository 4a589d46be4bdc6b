#!/usr/bin/env bash
# train.freeze (issue 57): frozen parameters stay bitwise at their initial values (an lr-0 run's)
# at ZeRO 0-3 on 2 ranks, with expert parallelism 2 and with a 2-stage pipeline, and the losses
# equal one process within 1e-5; --dry-run's model states per rank are what the engine holds; a
# resume with another freeze set is refused by name, one with the same set continues exactly;
# inspect-ckpt says which parameters a checkpoint holds without optimizer state;
# patterns that match nothing, unknown roles and a set that freezes everything are refused by key.
source "$(dirname "$0")/../lib.sh"
cmp="$SRC/test/dist/compare_metrics.py"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
moe="$SRC/recipes/tiny-mla-moe.yaml"
common=(--set train.steps=20 --set launch.threads_per_worker=1 --set checkpoint.interval_steps=0 --set checkpoint.keep_last=0
        --set zero.stage3_param_persistence_threshold=0)
dense_freeze='train.freeze=[model.embed_tokens.*, "model.layers.0.*"]'
moe_freeze='train.freeze=[model.embed_tokens.*, "model.layers.0.*", experts]'
run() {  # run RECIPE NAME NPROC [--set ...]
  local recipe=$1 name=$2 n=$3; shift 3
  expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node "$n" --set run_dir="$name" "$@"
}
# frozen_at_initial INITIAL RUN PATTERN...: the run's final weights, exported, hold the initial
# run's values bit for bit where a pattern (or role's names) matches, and differ everywhere else.
frozen_at_initial() {
  local initial=$1 name=$2; shift 2
  for r in "$initial" "$name"; do [ -d "$r-hf" ] || expect_status 0 "$DSTRAIN" export-hf "$r" "$r-hf"; done
  "$py" - "$initial-hf" "$name-hf" "$@" <<'PY' || fail "$name: frozen parameters moved, or trained ones did not"
import fnmatch, json, os, sys
from safetensors.numpy import load_file
a, b, patterns = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"): out.update(load_file(os.path.join(d, f)))
    return out
x, y = load(a), load(b)
frozen = [n for n in x if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
assert frozen, "no frozen tensor"
moved = [n for n in frozen if not (x[n] == y[n]).all()]
still = [n for n in x if n not in frozen and (x[n] == y[n]).all() and "e_score_correction_bias" not in n]
if moved or still:
    sys.exit(f"frozen but moved: {moved[:4]}; trained but unchanged: {still[:4]}")
print(f"{len(frozen)} frozen tensors bitwise at their initial values, {len(x) - len(frozen)} trained")
PY
}

# --- refused by key, before anything runs ------------------------------------------------------
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set 'train.freeze=[norms, model.embed.*]' --dry-run
expect_out "train.freeze[1]: 'model.embed.*' matches no parameter of this model"
expect_out "model.embed_tokens.weight"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set 'train.freeze=[embedding]' --dry-run
expect_out "the roles are embeddings, attention, mlp, experts, router, norms, head"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set 'train.freeze=[experts]' --dry-run
expect_out "it has no parameters of that role"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set 'train.freeze=["*"]' --dry-run
expect_out "freezes every parameter of the model"
ok "a pattern that matches nothing, an unknown role and a set that freezes everything are refused by key (exit 2)"

# --- dense: ZeRO 0-3 on 2 ranks against one process and the initial values ------------------------
run "$demo_recipe" init 1 --set optimizer.lr=0 --set train.steps=1 --set schedule.warmup_steps=0  # lr 0: the initial values, checkpointed
run "$demo_recipe" one 1 --set "$dense_freeze"
expect_out "train.freeze: 230656 of 461440 parameters frozen (50.0%, 10 tensors)"
frozen_at_initial init one 'model.embed_tokens.*' 'model.layers.0.*'
expect_status 0 "$DSTRAIN" inspect-ckpt one
expect_out "frozen       10 parameters (230656 elements): values alone, no optimizer state"
for stage in 0 1 2 3; do
  run "$demo_recipe" z$stage 2 --set "$dense_freeze" --set zero.stage=$stage
  python3 "$cmp" one/metrics.jsonl z$stage/metrics.jsonl --rtol 1e-5 --grad-norm || fail "ZeRO $stage with frozen parameters differs from one process"
  frozen_at_initial init z$stage 'model.embed_tokens.*' 'model.layers.0.*'
done
ok "embeddings and layer 0 frozen: 20 steps at ZeRO 0-3 on 2 ranks leave them bitwise at their initial values, losses within 1e-5 of one process"

# --- model states: the engine's (its log line) are what --dry-run planned --------------------------
for stage in 1 3; do
  expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 2 --set "$dense_freeze" --set zero.stage=$stage --dry-run
  planned=$(grep -o "model states per rank   [0-9.]* [KM]iB" <<<"$OUT" | grep -o "[0-9.]* [KM]iB")
  expect_out "train.freeze            230.7k parameters frozen (50.0%; 901.0 KiB in fp32)"
  measured=$(grep -o "; model states [0-9.]* MiB" z$stage/logs/rank_00000.log | grep -o "[0-9.]* MiB")
  [ -n "$planned" ] && [ "$planned" = "$measured" ] || fail "ZeRO $stage: the engine holds $measured of model states per rank, --dry-run planned $planned"
done
ok "model states per rank with frozen parameters are what --dry-run plans (ZeRO 1 and 3)"

# --- resume: the same set continues exactly; another set is refused by name ----------------------
run "$demo_recipe" half 2 --set "$dense_freeze" --set zero.stage=2 --set train.steps=20 --set checkpoint.interval_steps=10
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 2 --set "$dense_freeze" --set zero.stage=3 \
  --set run_dir=resumed --resume half/ckpt/step_00000010
python3 "$cmp" half/metrics.jsonl resumed/metrics.jsonl --resumed --rtol 1e-6 || fail "a resume with the same frozen set does not continue the run"
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 1 --set "$dense_freeze" --set zero.stage=1 \
  --set run_dir=alone --resume half/ckpt/step_00000010
python3 "$cmp" half/metrics.jsonl alone/metrics.jsonl --resumed --rtol 1e-5 || fail "a resume on one rank does not continue the run"
frozen_at_initial init alone 'model.embed_tokens.*' 'model.layers.0.*'
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 2 --set 'train.freeze=[model.embed_tokens.*]' \
  --set run_dir=other --resume half/ckpt/step_00000010
expect_out "train.freeze: checkpoint"
expect_out "9 parameter(s) frozen there would train now (model.layers.0.input_layernorm.weight"
ok "a resume with the same frozen set (ZeRO 2 -> 3, and 2 ranks -> 1) continues the run; one with another set is refused, naming the parameters"

# --- MoE: expert parallelism 2, the routed experts frozen ----------------------------------------
run "$moe" minit 1 --set optimizer.lr=0 --set train.steps=1 --set schedule.warmup_steps=0
run "$moe" mone 1 --set "$moe_freeze"
if grep -qF "frozen router" <<<"$OUT"; then fail "no router is frozen, yet the log says one is"; fi
run "$moe" mep 2 --set "$moe_freeze" --set moe.expert_parallel_size=2 --set zero.stage=2
python3 "$cmp" mone/metrics.jsonl mep/metrics.jsonl --rtol 1e-5 || fail "expert parallelism with frozen experts differs from one process"
frozen_at_initial minit mep 'model.embed_tokens.*' 'model.layers.0.*' '*.mlp.experts.*'
run "$moe" mrouter 2 --set 'train.freeze=[router]' --set zero.stage=1
expect_out "frozen router(s): their selection bias (e_score_correction_bias) is not updated either"
ok "MoE: embeddings, layer 0 and every routed expert frozen at EP 2 stay bitwise, losses within 1e-5 of one process; a frozen router is said"

# --- a pipeline of 2 stages ----------------------------------------------------------------------
pp=(--set model.num_layers=4 --set train.global_batch_size=16 --set train.micro_batch_size=2)
run "$demo_recipe" pinit 1 "${pp[@]}" --set optimizer.lr=0 --set train.steps=1 --set schedule.warmup_steps=0
run "$demo_recipe" pone 1 "${pp[@]}" --set "$dense_freeze"
run "$demo_recipe" pp2 2 "${pp[@]}" --set "$dense_freeze" --set parallel.pipeline_parallel_size=2 --set pipeline.schedule=1f1b
python3 "$cmp" pone/metrics.jsonl pp2/metrics.jsonl --rtol 1e-5 || fail "a 2-stage pipeline with frozen parameters differs from one process"
frozen_at_initial pinit pp2 'model.embed_tokens.*' 'model.layers.0.*'
ok "a 2-stage 1F1B pipeline with the embeddings and layer 0 frozen: bitwise at their initial values, losses within 1e-5 of one process"

finish
