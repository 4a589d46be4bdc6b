#!/usr/bin/env bash
# Preference tuning (issue 60): prepare-data --preference tokenizes TRL's rows exactly as TRL 1.16's
# DPOTrainer does (DeepSeek templates, R1's <think>, ChatML, text rows, implicit prompts,
# keep_start/keep_end truncation); train.objective dpo trains the losses TRL computes (per-step
# loss and every rewards/logps/logits metric within 1e-5 of DPOTrainer on 64 pairs, fp32, full-batch
# steps: sigmoid, cDPO, ipo, hinge, robust, the other pair losses summed in one run, RPO with
# LD-DPO, WPO, AOT on one micro-batch of the 64 pairs); the loss
# is a mean over pairs whatever the split (1 rank x accumulation 8, 2 ranks x 2 x 2, 4 ranks at
# ZeRO 3); the reference log-probs are made once beside the set and read back by later runs and
# resumes (bit-identical), refused when made for another model or data; LoRA and expert
# parallelism train on pairs; held-out pairs (eval.paths, eval.split, dstrain eval) score as TRL's
# evaluate() does; bad rows and recipes are refused by name.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
trl="$DSTRAIN_TRL_VENV/bin/python"
ref="$SRC/test/dist/dpo_reference.py"
[ -x "$trl" ] && "$trl" -c 'import trl' 2>/dev/null || { echo "SKIP: no TRL overlay ($DSTRAIN_TRL_VENV; scripts/setup.sh --test)"; exit 77; }
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks >/dev/null

# Token ids and completion masks as TRL makes them, for several templates and row formats: TRL
# tokenizes every set in one process (one import), in the background, while dstrain prepares them.
token_cases=()
token_rows() {  # token_rows NAME TOKDIR KIND [prepare-data flags...]: the rows and TRL's spec for them
  local name=$1 tokdir=$2 kind=$3 max_length=null keep_end=false; shift 3
  "$trl" "$ref" pairs corpus.jsonl "$name.jsonl" --count 40 --kind "$kind" --seed 5
  for ((i = 1; i <= $#; i++)); do
    case "${!i}" in
      --max-length) j=$((i + 1)); max_length=${!j} ;;
      --truncation-mode) j=$((i + 1)); [ "${!j}" = keep_end ] && keep_end=true ;;
    esac
  done
  printf '{"tokdir": "%s", "rows": "%s.jsonl", "out": "%s.trl.json", "max_length": %s, "keep_end": %s}\n' \
    "$tokdir" "$name" "$name" "$max_length" "$keep_end" >> tokens.jsonl
  token_cases+=("$name")
}
token_rows llm toks/deepseek-llm-chat chat
token_rows r1 toks/deepseek-r1-style think
token_rows v3 toks/deepseek-v3-style implicit
token_rows chatml toks/chatml-qwen-style chat
token_rows text toks/deepseek-llm-chat text
token_rows start toks/deepseek-llm-chat chat --max-length 24
token_rows end toks/chatml-qwen-style chat --max-length 20 --truncation-mode keep_end
"$trl" "$ref" tokens-many tokens.jsonl > trl-tokens.log 2>&1 &
tokens_pid=$!
prepare() { expect_status 0 "$DSTRAIN" prepare-data "$1.jsonl" --preference --tokenizer "$2" --output "$1" "${@:3}"; }
prepare llm toks/deepseek-llm-chat
prepare r1 toks/deepseek-r1-style
prepare v3 toks/deepseek-v3-style
prepare chatml toks/chatml-qwen-style
prepare text toks/deepseek-llm-chat
prepare start toks/deepseek-llm-chat --max-length 24
expect_out "truncated to --max-length"
expect_out "dropped: the prompt alone fills --max-length"
prepare end toks/chatml-qwen-style --max-length 20 --truncation-mode keep_end
wait $tokens_pid || fail "TRL could not tokenize the sets: $(tail -5 trl-tokens.log)"
for name in "${token_cases[@]}"; do
  "$py" "$ref" compare-tokens "$name.trl.json" "$name" >/dev/null || fail "$name: $("$py" "$ref" compare-tokens "$name.trl.json" "$name" 2>&1 | tail -3)"
done
ok "prepare-data --preference: token ids and completion masks identical to TRL's DPOTrainer (DeepSeek LLM, R1 with <think>, V3 with implicit prompts, ChatML, text rows with eos, keep_start and keep_end truncation)"

# Against DPOTrainer: 64 pairs, full-batch steps, the same AdamW and constant LR, fp32.
"$trl" "$ref" pairs corpus.jsonl pairs.jsonl --count 64 --seed 3
expect_status 0 "$DSTRAIN" prepare-data pairs.jsonl --preference --tokenizer toks/deepseek-llm-chat --output dpo
"$trl" "$ref" pairs corpus.jsonl evalpairs.jsonl --count 12 --seed 11
expect_status 0 "$DSTRAIN" prepare-data evalpairs.jsonl --preference --tokenizer toks/deepseek-llm-chat --output dpoeval
# Copies for RPO with LD-DPO, whose reference files (weighted sums) live beside them.
for f in dpo.* dpoeval.*; do cp -r "$f" "rpo${f#dpo}"; done
"$py" "$SRC/test/dist/finetune_reference.py" model hf --vocab 3000 --max-positions 128 >/dev/null || fail "the reference model could not be made"
cat > dpo.yaml <<'EOF'
run_dir: runs/dpo
seed: 7
model: {init_from: hf}
data: {path: dpo, format: megatron, seq_len: 96}
train: {objective: dpo, steps: 6, micro_batch_size: 8, global_batch_size: 64, grad_clip: 1.0}
optimizer: {lr: 1.0e-3, beta1: 0.9, beta2: 0.999, eps: 1.0e-8, weight_decay: 0.0}
schedule: {warmup_steps: 0, min_lr_ratio: 1.0}
checkpoint: {interval_steps: 3, keep_last: 0}
launch: {threads_per_worker: 1}
EOF
# TRL runs every loss type in two processes of one thread each, in the background, while dstrain
# trains the same (a TRL step takes about three times dstrain's here). The runs with held-out pairs
# take 6 steps, the others 4. TRL 1.16's sigmoid takes no label smoothing; cDPO, (1 - e) sigmoid + e
# x the flipped pair, is TRL's sigmoid x 2(1 - e) - robust x (1 - 2e) at the same e (the "cdpo" run).
cat > runs1.json <<'EOF'
{"sigmoid": {"loss_type": ["sigmoid"], "eval_rows": "evalpairs.jsonl", "eval_steps": 3},
 "ipo": {"loss_type": ["ipo"], "beta": 0.5, "steps": 4},
 "hinge": {"loss_type": ["hinge"], "steps": 4},
 "robust": {"loss_type": ["robust"], "label_smoothing": 0.2, "steps": 4},
 "cdpo": {"loss_type": ["sigmoid", "robust"], "loss_weights": [1.6, -0.6], "label_smoothing": 0.2, "steps": 4}}
EOF
cat > runs2.json <<'EOF'
{"rpo": {"loss_type": ["sigmoid", "sft"], "loss_weights": [1, 0.5], "ld_alpha": 0.6, "f_divergence_type": "js_divergence",
         "eval_rows": "evalpairs.jsonl", "eval_steps": 3},
 "others": {"loss_type": ["nca_pair", "bco_pair", "sppo_hard", "apo_zero", "apo_down", "exo_pair", "sigmoid_norm"],
            "loss_weights": [1, 0.5, 0.01, 1, 1, 1, 1], "label_smoothing": 0.1, "steps": 4},
 "discopop": {"loss_type": ["discopop"], "discopop_tau": 0.2, "steps": 4},
 "alpha": {"loss_type": ["sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop"], "loss_weights": [1, 1, 0.01, 1, 1, 1],
           "label_smoothing": 0.1, "f_divergence_type": "alpha_divergence", "f_alpha": 0.3, "steps": 4},
 "fkl": {"loss_type": ["hinge"], "f_divergence_type": "forward_kl", "steps": 4},
 "wpo": {"loss_type": ["sigmoid", "ipo"], "loss_weights": [1, 0.01], "use_weighting": true, "steps": 4},
 "aot": {"loss_type": ["aot", "aot_unpaired"], "loss_weights": [1, 0.5], "label_smoothing": 0.1, "steps": 4}}
EOF
trl_pids=()
for runs in runs1 runs2; do
  "$trl" "$ref" train-many hf toks/deepseek-llm-chat pairs.jsonl $runs.json --steps 6 --lr 1e-3 > trl-$runs.log 2>&1 &
  trl_pids+=($!)
done
dstrain_run() {  # dstrain_run NAME --set ...: 4 steps, 6 for the runs with held-out pairs
  local name=$1 steps=4; shift
  case $name in sigmoid | rpo) steps=6 ;; esac
  expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir="$name" --set train.steps=$steps "$@"
}
# The sigmoid run also scores 12 held-out pairs every 3 steps, as TRL's evaluate() does.
dstrain_run sigmoid --set 'eval.paths=[dpoeval]' --set eval.interval_steps=3
expect_out "reference log-probs: written to"
expect_out "eval step 6/6 | dpoeval | val_loss"
expect_out "| rewards/accuracies"
dstrain_run ipo --set 'preference.loss_type=[ipo]' --set preference.beta=0.5
expect_out "reference log-probs: read from"
dstrain_run hinge --set 'preference.loss_type=[hinge]'
dstrain_run robust --set 'preference.loss_type=[robust]' --set preference.label_smoothing=0.2
dstrain_run cdpo --set preference.label_smoothing=0.2
# (This one reads the head's logits 100 tokens at a time: the chunked log-probs and gradient.)
dstrain_run others --set 'preference.loss_type=[nca_pair,bco_pair,sppo_hard,apo_zero,apo_down,exo_pair,sigmoid_norm]' \
  --set 'preference.loss_weights=[1,0.5,0.01,1,1,1,1]' --set preference.label_smoothing=0.1 --set train.loss_chunk_tokens=100
dstrain_run discopop --set 'preference.loss_type=[discopop]' --set preference.discopop_tau=0.2
# f-DPO: the divergences' scores in every loss that takes them.
# (Not sigmoid with label_smoothing here: TRL 1.16's ignores it, dstrain's is cDPO; js runs sigmoid.)
dstrain_run alpha --set 'preference.loss_type=[sigmoid_norm,hinge,ipo,exo_pair,robust,discopop]' \
  --set 'preference.loss_weights=[1,1,0.01,1,1,1]' --set preference.label_smoothing=0.1 \
  --set preference.f_divergence_type=alpha_divergence --set preference.f_alpha_divergence_coef=0.3
# RPO (sft: the chosen tokens' mean NLL over the step) on LD-DPO's weighted sums with the JS
# divergence, also over held-out pairs (their own token mean); WPO's pair weights (not on hinge:
# TRL 1.16 multiplies relu's output in place, which its autograd refuses).
rpo=(--set data.path=rpo --set 'preference.loss_type=[sigmoid,sft]' --set 'preference.loss_weights=[1,0.5]' --set preference.ld_alpha=0.6
     --set preference.f_divergence_type=js_divergence --set 'eval.paths=[rpoeval]' --set eval.interval_steps=3)
dstrain_run rpo "${rpo[@]}"
dstrain_run fkl --set 'preference.loss_type=[hinge]' --set preference.f_divergence_type=forward_kl
dstrain_run wpo --set 'preference.loss_type=[sigmoid,ipo]' --set 'preference.loss_weights=[1,0.01]' --set preference.use_weighting=true
# AOT sorts the log-ratios of a batch: one micro-batch of all 64 pairs, as TRL's one batch.
dstrain_run aot --set 'preference.loss_type=[aot,aot_unpaired]' --set 'preference.loss_weights=[1,0.5]' --set preference.label_smoothing=0.1 \
  --set train.micro_batch_size=64
for i in 0 1; do
  wait "${trl_pids[$i]}" || fail "TRL failed: $(tail -5 trl-runs$((i + 1)).log)"
done
# alpha_divergence's score, (exp((alpha - 1) r) - 1) / (alpha - 1), loses digits to cancellation in
# float32 on both sides for small log-ratios r: 1e-4 there.
for name in sigmoid ipo hinge robust cdpo others discopop alpha rpo fkl wpo aot; do
  evalset=$(case $name in sigmoid) echo --eval dpoeval ;; rpo) echo --eval rpoeval ;; esac)
  "$py" "$ref" compare "$name.trl.json" "$name/metrics.jsonl" --rtol $([ $name = alpha ] && echo 1e-4 || echo 1e-5) --grad-rtol 1e-4 $evalset ||
    fail "$name differs from TRL's DPOTrainer"
done
python3 - sigmoid/metrics.jsonl <<'PY' || fail "DPO did not learn the preferences"
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "eval" not in r]
assert rows[0]["rewards/accuracies"] == 0 and rows[-1]["rewards/accuracies"] > 0.9, [r["rewards/accuracies"] for r in rows]
assert rows[-1]["loss"] < 0.6 * rows[0]["loss"] and rows[-1]["rewards/margins"] > 0
PY
ok "train.objective dpo equals TRL's DPOTrainer step by step, its head whole or 100 tokens at a time (loss, rewards/*, logps/*, logits/* within 1e-5, gradient norms within 1e-4): sigmoid, ipo, hinge, robust, cDPO and nca_pair + bco_pair + sppo_hard + apo_zero + apo_down + exo_pair + sigmoid_norm, discopop, f-DPO's alpha (6 losses, 1e-4), RPO (sigmoid + sft) with LD-DPO's ld_alpha and the JS divergence, forward KL, WPO's weights on sigmoid + ipo, AOT (aot + aot_unpaired, the 64 pairs' log-ratios sorted); rewards/accuracies 0 -> above 0.9; eval.paths' held-out pairs score as TRL's evaluate() at steps 3 and 6 (sigmoid, RPO)"

# The loss is a mean over the step's pairs: any split gives the same steps. A 4-rank ZeRO-3 run
# makes the reference log-probs again (the file moved away) and gets the same table.
refs=(dpo.ref.*)
[ ${#refs[@]} = 1 ] || fail "expected one reference file beside the set, found ${refs[*]}"
mv "${refs[0]}" first.ref
expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir=np4 --set train.micro_batch_size=4 --nproc-per-node 4 --set zero.stage=3
expect_out "reference log-probs: written to"
python3 - first.ref "${refs[0]}" <<'PY' || fail "the 4-rank ZeRO-3 pass made other reference log-probs"
import struct, sys
def table(path):
    raw = open(path, "rb").read()
    eol = raw.index(b"\n", 9)
    return struct.unpack(f"<{(len(raw) - eol - 1) // 8}d", raw[eol + 1:])
a, b = table(sys.argv[1]), table(sys.argv[2])
assert len(a) == len(b) == 128 and max(abs(x - y) / abs(x) for x, y in zip(a, b)) < 1e-6
PY
expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir=np2 --set train.micro_batch_size=2 --nproc-per-node 2
expect_out "reference log-probs: read from"
# RPO's token mean is over the whole step's chosen tokens (counted over every rank) and the eval set's.
expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir=rpo2 "${rpo[@]}" --set train.micro_batch_size=4 --set eval.micro_batch_size=5 \
  --nproc-per-node 2
python3 "$SRC/test/dist/compare_metrics.py" rpo/metrics.jsonl rpo2/metrics.jsonl --rtol 1e-5 || fail "RPO on 2 ranks differs from 1"
"$py" "$ref" compare rpo.trl.json rpo2/metrics.jsonl --rtol 1e-5 --eval rpoeval >/dev/null || fail "RPO on 2 ranks differs from TRL"
for run in np2 np4; do
  python3 "$SRC/test/dist/compare_metrics.py" sigmoid/metrics.jsonl $run/metrics.jsonl --rtol 1e-5 || fail "$run's losses differ from 1 rank x accumulation 8"
  "$py" "$ref" compare sigmoid.trl.json $run/metrics.jsonl --rtol 1e-5 >/dev/null || fail "$run's preference metrics differ"
done
ok "1 rank x micro 8 x accumulation 8, 2 ranks x micro 2 x accumulation 16 and 4 ranks x micro 4 at ZeRO 3 train the same losses and metrics (1e-5); the 4-rank pass made the same reference log-probs (1e-6); RPO on 2 ranks x micro 4 (eval micro 5) equals 1 rank and TRL"

# eval.split holds pairs out of the set (they read its reference table): 1 rank and 2 ranks at
# ZeRO 3 with another eval micro batch score them alike; dstrain eval of the run gives the last
# row again, and refuses a checkpoint whose reference file is gone; CSV files for TRL's names.
split=(--set eval.split=8 --set train.global_batch_size=56 --set eval.interval_steps=3 --set 'logging.sinks=[console,jsonl,csv,tensorboard]')
expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir=split1 "${split[@]}"
expect_out "56 preference pairs left to train on (8 held out by eval.split)"
expect_out "8 preference pairs held out by eval.split"
expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir=split2 "${split[@]}" --nproc-per-node 2 --set zero.stage=3 --set train.micro_batch_size=4 \
  --set eval.micro_batch_size=3
expect_status 0 "$DSTRAIN" eval split1 --json
echo "$OUT" | grep '^{' > split1.eval.json || fail "dstrain eval --json printed no JSON"
python3 - split1/metrics.jsonl split2/metrics.jsonl split1.eval.json <<'PY' || fail "held-out pairs scored differently"
import json, sys
one, two = ([json.loads(l) for l in open(p) if '"eval"' in l] for p in sys.argv[1:3])
assert [r["step"] for r in one] == [3, 6] and [r["pairs"] for r in one] == [8, 8], one
names = [k for k in one[0] if "/" in k]
assert len(names) == 8 and one[0]["val_ppl"] is None, one[0]
for a, b in zip(one, two):
    for k in ["val_loss"] + names:
        assert abs(a[k] - b[k]) <= 1e-6 + 1e-5 * abs(a[k]), (k, a[k], b[k])
d = json.load(open(sys.argv[3]))["datasets"][0]
assert d["name"] == "heldout" and d["pairs"] == 8 and abs(d["val_loss"] - one[-1]["val_loss"]) < 1e-8, (d, one[-1])
assert all(abs(d["metrics"][k] - one[-1][k]) < 1e-7 for k in names), d
PY
for f in rewards_accuracies val_heldout_rewards_accuracies val_heldout_loss; do
  [ -s split1/csv/$f.csv ] || fail "no CSV file $f.csv"
done
expect_status 0 "$DSTRAIN" eval split1 --step 3
expect_out "rewards/accuracies"
eval_refs=(dpoeval.ref.*)
mv "${eval_refs[0]}" aside.eval.ref
expect_status 3 "$DSTRAIN" eval sigmoid
expect_out "${eval_refs[0]} is missing: dstrain eval of a checkpoint needs the reference log-probs"
mv aside.eval.ref "${eval_refs[0]}"
ok "eval.split holds out 8 pairs: 1 rank and 2 ranks at ZeRO 3 score them alike (1e-5), dstrain eval --json of the run equals its last evaluation, TRL's metric names get CSV files; a checkpoint without its reference file is refused by name"

cp -r sigmoid cut
rm -r cut/ckpt/step_00000006 && printf 'step_00000003\n' > cut/ckpt/latest
expect_status 0 "$DSTRAIN" resume cut
expect_out "reference log-probs: read from"
python3 "$SRC/test/dist/compare_metrics.py" sigmoid/metrics.jsonl cut/metrics.jsonl --exact || fail "the resumed DPO run differs"
same_checkpoint_data sigmoid/ckpt/step_00000006 cut/ckpt/step_00000006 || fail "the resumed DPO run's final state differs"
cp -r sigmoid cut2 && rm -r cut2/ckpt/step_00000006 && printf 'step_00000003\n' > cut2/ckpt/latest
mv "${refs[0]}" aside.ref
expect_status 3 "$DSTRAIN" resume cut2
expect_out "${refs[0]} is missing: a resumed dpo run needs the reference log-probs the run's start made"
mv aside.ref "${refs[0]}"
ok "3 steps + resume + 3 equal 6 straight bit for bit (the reference read back); a resume without its reference file is refused by name"

# A reference file from another model or data, or with damaged values, is named.
cp "${refs[0]}" saved.ref
python3 - "${refs[0]}" <<'PY'
import sys
p = sys.argv[1]; raw = bytearray(open(p, "rb").read()); raw[-3] ^= 0x40; open(p, "wb").write(raw)
PY
expect_status 3 "$DSTRAIN" train dpo.yaml --set run_dir=bad1 --set train.steps=1
expect_out "its values fail their CRC-32C"
python3 - saved.ref "${refs[0]}" <<'PY'
import sys
raw = open(sys.argv[1], "rb").read().replace(b'"key":"', b'"key":"0', 1); open(sys.argv[2], "wb").write(raw)
PY
expect_status 3 "$DSTRAIN" train dpo.yaml --set run_dir=bad2 --set train.steps=1
expect_out "made for another model or data"
mv saved.ref "${refs[0]}"
expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir=seed2 --set train.steps=1 --set seed=8 --set model.init_from= \
  --set model.family=dense --set model.vocab_size=3000 --set model.hidden_size=32 --set model.num_layers=1 --set model.num_heads=2 \
  --set model.intermediate_size=64 --set model.max_seq_len=96
expect_out "reference log-probs: written to"
[ "$(ls dpo.ref.* | wc -l)" = 2 ] || fail "another model did not get a reference file of its own"
ok "a damaged reference file or one made for another model is refused by name; another model makes its own"

# LoRA on the pairs (the reference: the base as the run starts, adapters at zero) and a DeepSeek
# MoE model with expert parallelism against one process.
expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir=lora --set lora.rank=8 --set lora.alpha=16 --set optimizer.lr=5e-3
python3 "$SRC/test/dist/compare_metrics.py" lora/metrics.jsonl --decreases 0.1 || fail "LoRA DPO's loss did not fall"
moe=(--set model.init_from= --set model.family=mla_moe --set model.vocab_size=3000 --set model.hidden_size=32 --set model.num_layers=2
     --set model.num_heads=2 --set model.intermediate_size=64 --set model.moe_intermediate_size=16 --set model.n_routed_experts=4
     --set model.num_experts_per_tok=2 --set model.n_shared_experts=1 --set model.first_k_dense_replace=1 --set model.kv_lora_rank=16
     --set model.qk_nope_head_dim=8 --set model.qk_rope_head_dim=8 --set model.v_head_dim=8 --set model.max_seq_len=96 --set train.steps=4)
expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir=moe1 "${moe[@]}"
expect_status 0 "$DSTRAIN" train dpo.yaml --set run_dir=moe2 "${moe[@]}" --set train.micro_batch_size=4 --nproc-per-node 2 --set moe.expert_parallel_size=2
python3 "$SRC/test/dist/compare_metrics.py" moe1/metrics.jsonl moe2/metrics.jsonl --rtol 1e-5 || fail "expert parallelism changed the DPO losses"
ok "LoRA trains on pairs (the loss falls); an MLA + MoE model at expert parallelism 2 equals one process (1e-5)"

# Bad rows and recipes.
printf '%s\n' '{"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "a"}], "rejected": [{"role": "assistant", "content": "b"}]}' > good.jsonl
printf '%s\n' '{"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "a"}]}' > missing.jsonl
expect_status 3 "$DSTRAIN" prepare-data good.jsonl missing.jsonl --preference --tokenizer toks/deepseek-llm-chat --output bad
expect_out 'missing.jsonl:1: no "rejected"'
printf '%s\n' '{"prompt": "hi", "chosen": "", "rejected": " b"}' > empty.jsonl
expect_status 3 "$DSTRAIN" prepare-data empty.jsonl --preference --tokenizer toks/deepseek-llm-chat --output bad
expect_out "empty.jsonl:1: the chosen completion is empty"
printf '%s\n' '{"prompt": "hi", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}' > mixed.jsonl
expect_status 3 "$DSTRAIN" prepare-data mixed.jsonl --preference --tokenizer toks/deepseek-llm-chat --output bad
expect_out 'mixed.jsonl:1: "prompt" is string'
[ ! -e bad.bin ] && [ ! -e bad.json ] || fail "a refused preference set left files behind"
printf '%s\n' '{"prompt": "hi", "chosen": " same", "rejected": " same"}' >> good.jsonl
expect_status 0 "$DSTRAIN" prepare-data good.jsonl --preference --tokenizer toks/deepseek-llm-chat --output twins
expect_out "1 with chosen equal to rejected (kept; they teach nothing; the first: good.jsonl:2)"
expect_status 0 "$DSTRAIN" prepare-data missing.jsonl good.jsonl --preference --tokenizer toks/deepseek-llm-chat --output skipped --on-error skip
expect_out "1 skipped as malformed or refused"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set data.path=llm --set train.objective=sft
expect_out "holds 40 preference pairs"
expect_out "set train.objective: dpo"
"$py" "$SRC/test/text/chat_data_reference.py" chats corpus.jsonl /dev/null chats.jsonl --count 20
expect_status 0 "$DSTRAIN" prepare-data chats.jsonl --tokenizer toks/deepseek-llm-chat --output sft
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set data.path=sft
expect_out "is not a set of preference pairs"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set 'eval.paths=[sft]'
expect_out "sft' is not a set of preference pairs"
expect_out "a dpo run evaluates held-out pairs"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set preference.loss_type=[sigmoid,kto]
expect_out "preference.loss_type kto: not a DPO loss dstrain computes"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set preference.loss_type=[robust] --set preference.label_smoothing=0.5
expect_out "rDPO divides by 1 - 2 x label_smoothing"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set train.objective=sft --set preference.beta=0.2
expect_out "preference.beta is set"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set preference.discopop_tau=0.3
expect_out "but preference.loss_type has no discopop"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set preference.f_divergence_type=forward_kl --set 'preference.loss_type=[bco_pair]'
expect_out "f-DPO applies to sigmoid, sigmoid_norm, hinge, ipo, exo_pair, robust, discopop, sft only"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set 'preference.loss_type=[sigmoid,sft]' --set preference.use_weighting=true
expect_out "preference.use_weighting with preference.loss_type sft"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set 'preference.loss_type=[aot]' --set preference.use_weighting=true
expect_out "preference.use_weighting with preference.loss_type aot: AOT sorts the batch's log-ratios"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set preference.ld_alpha=1.5
expect_out "preference.ld_alpha"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set data.seq_len=32
expect_out "is shorter than the longest"
expect_status 2 "$DSTRAIN" train dpo.yaml --set run_dir=bad --set parallel.pipeline_parallel_size=2 --nproc-per-node 2
expect_out "train.objective dpo with parallel.pipeline_parallel_size > 1"
expect_status 0 "$DSTRAIN" train "$SRC/recipes/dpo-deepseek.yaml" --set run_dir=recipe --set data.path="$WORK/dpo" --set train.epochs=20 --dry-run
expect_out "the configuration is valid"
expect_out "preference.beta"
expect_out "train.epochs 20 x 63 preference pairs"
ok "a row without rejected, an empty completion and mixed row kinds are refused with file:line (nothing written; --on-error skip counts them); chosen equal to rejected is counted and named; pairs with sft, conversations with dpo, unknown loss types, rDPO at 0.5, WPO with sft or AOT, a short data.seq_len and pipelines are refused by key; recipes/dpo-deepseek.yaml dry-runs"
finish
