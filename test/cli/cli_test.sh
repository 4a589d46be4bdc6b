#!/usr/bin/env bash
# The command line as a user meets it: help texts, versions, usage errors and their exit codes.
source "$(dirname "$0")/../lib.sh"

expect_status 0 "$DSTRAIN" --help
for sub in train resume check-env inspect-ckpt report; do expect_out "$sub"; done
expect_out "Exit codes"
ok "dstrain --help lists the subcommands and exit codes"

for sub in train resume check-env inspect-ckpt report export-hf prepare-data inspect-data eval generate chat chat-template; do
  expect_status 0 "$DSTRAIN" "$sub" --help
  expect_out "Example"
  expect_out "dstrain $sub"
done
ok "every subcommand's --help explains it with an example"

expect_status 0 "$DSTRAIN" --version
for word in "dstrain 0." "commit" "compiler: GNU" "libtorch: 2." "cuda:" "nccl"; do expect_out "$word"; done
ok "--version names dstrain, commit, compiler, LibTorch, CUDA and NCCL"

expect_status 2 "$DSTRAIN" bogus
expect_out "unknown command 'bogus'"
expect_status 2 "$DSTRAIN"
expect_status 2 "$DSTRAIN" train --no-such-flag "$demo_recipe"
expect_out "usage error"
expect_status 2 "$DSTRAIN" train
expect_status 2 "$DSTRAIN" train missing.yaml
expect_out "missing.yaml"
expect_status 2 "$DSTRAIN" bench model "$demo_recipe" --seq-len 4096 --iters 1
expect_out "--seq-len 4096 exceeds model.max_seq_len 128"
ok "unknown commands, flags and missing arguments exit 2 with a message"

expect_status 2 "$DSTRAIN" trian
expect_out "unknown command 'trian' (did you mean 'train'?)"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --dryrun
expect_out "unknown option '--dryrun' (did you mean '--dry-run'?)"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --nproc-per-nod 1
expect_out "unknown option '--nproc-per-nod' (did you mean '--nproc-per-node'?)"
ok "a misspelled command or flag gets the closest one suggested"

expect_status 0 "$DSTRAIN" train "$demo_recipe" --dry-run --nproc_per_node 1 --nnodes 2 --node_rank 1 --master_addr 10.9.8.7 --master_port 29511
expect_out "node 1 of 2"
expect_out "10.9.8.7:29511"
ok "torchrun's spellings --nproc_per_node, --node_rank, --master_addr, --master_port are accepted"

expect_status 0 "$DSTRAIN" train "$demo_recipe" --dry-run --set run_dir=dry
expect_out "global batch            16 samples = 2048 tokens per step"
expect_out "optimizer.lr"
expect_out "demo.yaml:29:7"
grep -qE "^  run_dir +$WORK/dry +--set$" <<<"$OUT" || fail "no run_dir line with its source: $OUT"
expect_out "no worker started"
expect_out "keys that this run does not use are not shown"
if grep -q "model.kv_lora_rank" <<<"$OUT"; then fail "--dry-run of a dense model lists MLA keys: $OUT"; fi
[ ! -e dry ] || fail "--dry-run created the run directory"
ok "--dry-run prints every key the run uses with its source and the derived numbers, and writes nothing"

# demo-coder.yaml trains on recipes/data/pycode, which scripts/demo.sh prepares; point it at a
# dataset prepared here.
expect_status 0 "$DSTRAIN" prepare-data "$SRC/lib" --ext .cpp --output code
for recipe in "$SRC"/recipes/*.yaml; do
  extra=()
  [ "$(basename "$recipe")" = demo-coder.yaml ] && [ ! -f "$SRC/recipes/data/pycode.idx" ] && extra=(--set data.path="$WORK/code")
  # A fine-tuning set needs a chat tokenizer: dist.finetune dry-runs this recipe on one it prepares.
  case "$(basename "$recipe")" in sft-deepseek-coder.yaml|lora-deepseek-coder.yaml|qlora-deepseek-coder.yaml) [ -f "$SRC/recipes/data/sft-deepseek-coder.idx" ] || continue ;; esac
  # A preference set needs a chat tokenizer too: dist.dpo, dist.reward, dist.reference_free and dist.kto dry-run these recipes on one they prepare.
  case "$(basename "$recipe")" in dpo-deepseek.yaml|reward-deepseek.yaml|orpo-deepseek.yaml) [ -f "$SRC/recipes/data/dpo-deepseek.idx" ] || continue ;; esac
  [ "$(basename "$recipe")" = kto-deepseek.yaml ] && [ ! -f "$SRC/recipes/data/kto-deepseek.idx" ] && continue  # dist.kto dry-runs it
  # The fine-tuning demo's recipes read what scripts/demo.sh --sft makes (dist.sft_demo runs them),
  # and the preference demo's what --dpo makes in its run directory.
  case "$(basename "$recipe")" in demo-sft*.yaml) [ -f "$SRC/recipes/data/sft-demo/base-hf/config.json" ] || continue ;; esac
  [ "$(basename "$recipe")" = demo-dpo.yaml ] && continue
  expect_status 0 "$DSTRAIN" train "$recipe" --dry-run "${extra[@]}"
  expect_out "the configuration is valid"
done
ok "--dry-run succeeds on every recipe in recipes/"

# LoRA on DeepSeek-V3 as released: the adapters, and the model states of a frozen base per GPU.
expect_status 0 "$DSTRAIN" train "$SRC/recipes/lora-deepseek-v3.yaml" --dry-run
expect_out "lora                    rank 16, alpha 32 (scale 2) on [all-linear]: 126.35M adapter parameters"
expect_out "model states per rank 20.1 GiB instead of full training's 177.5 GiB"
expect_out "on 80 GiB GPUs          fits"
ok "recipes/lora-deepseek-v3.yaml: 126M adapters on the 671B base, 8 stages x 8-way expert parallelism, fit 80 GiB GPUs"
# On the FP8 base as released (lora.base: fp8): planned without the weights, refused by train without them.
expect_status 0 "$DSTRAIN" train "$SRC/recipes/lora-deepseek-v3.yaml" --set lora.base=fp8 --dry-run
expect_out "lora base               669.07B of the frozen projections' weights in FP8 blocks: 623.3 GiB (1.2 TiB in bf16)"
expect_out "model states per rank 11.0 GiB instead of full training's 177.5 GiB"
expect_out "note: lora.base fp8 quantizes model.init_from's weights: training needs it set (this plan does not)"
ok "recipes/lora-deepseek-v3.yaml with lora.base fp8: the FP8 base planned at 11.0 GiB of model states per GPU (20.1 GiB in bf16)"
# With the routed experts: 58 MoE layers x 256 experts x 3 projections x rank 16 x (7168 + 2048) = 6.57B more.
expect_status 0 "$DSTRAIN" train "$SRC/recipes/lora-deepseek-v3.yaml" --set lora.experts=true --dry-run
expect_out "on [all-linear] and the routed experts (6.57B of them): 6.69B adapter parameters"
expect_out "model states per rank 21.4 GiB instead of full training's 177.5 GiB"
ok "recipes/lora-deepseek-v3.yaml with lora.experts: the routed experts' 6.57B adapters counted and placed with their experts"

# Pipeline parallelism, as planned (issue 39): DeepSeek-V3's own layout on paper, the schedule
# printed and checked, the configuration errors by key, and training refused until it is built.
expect_status 0 "$DSTRAIN" train "$SRC/recipes/deepseek-v3-671b.yaml" --dry-run
expect_out "data-parallel ranks     128 (world 2048 / parallel.pipeline_parallel_size 16)"
expect_out "accumulation steps      120"
expect_out "16 pipeline ranks x 1 stage(s) each (16 stages, split by training FLOPs)"
expect_out "zb_h1, 120 micro-batches per step: bubble 0.042 of the compute"
expect_out "      0  0-3 +emb"
expect_out "     15  60 +head+mtp"  # the MTP module with the head: one decoder layer less
expect_out "on 80 GiB GPUs          fits"
ok "--dry-run of DeepSeek-V3 671B at PP 16 x EP 64 x ZeRO-1 on 256 x 8 GPUs: stages, bubble, and a per-GPU plan that fits 80 GB"

pp=(train "$SRC/recipes/tiny-mla-moe.yaml" --dry-run --nproc-per-node 4 --set parallel.pipeline_parallel_size=2 --set train.global_batch_size=24)
expect_status 0 "$DSTRAIN" "${pp[@]}" --set pipeline.schedule=1f1b --show-schedule
expect_out "rank 0: F0.0 SF0.0>1 F0.1 SF0.1>1 RB0.0<1 B0.0 F0.2 SF0.2>1"
expect_out "validated: every receive has its send"
expect_out "  rank  1 |"
expect_status 2 "$DSTRAIN" "${pp[@]}" --set parallel.pipeline_parallel_size=3
expect_out "parallel.pipeline_parallel_size 3 does not divide the world size 4"
expect_status 2 "$DSTRAIN" "${pp[@]}" --set parallel.pipeline_parallel_size=4
expect_out "parallel.pipeline_parallel_size 4 x pipeline.virtual_stages 1 = 4 stages, but model.num_layers is 2"
expect_status 2 "$DSTRAIN" "${pp[@]}" --set train.global_batch_size=8
expect_out "train.gradient_accumulation_steps 1 is the micro-batches per step of each pipeline (pipeline.schedule 1f1b"
expect_status 2 "$DSTRAIN" "${pp[@]}" --set pipeline.schedule=interleaved_1f1b
expect_out "pipeline.virtual_stages 1 with pipeline.schedule interleaved_1f1b: interleaved_1f1b needs at least 2 virtual stages"
expect_status 2 "$DSTRAIN" "${pp[@]}" --set "pipeline.layers_per_stage=[2,1]"
expect_out "pipeline.layers_per_stage (--set) [2, 1] adds up to 3 layers, but the model has 2"
expect_status 2 "$DSTRAIN" "${pp[@]}" --set moe.expert_parallel_size=4
expect_out "moe.expert_parallel_size 4 does not divide a pipeline stage's 2 data-parallel ranks"
expect_status 2 "$DSTRAIN" train "$SRC/recipes/tiny-mla-moe.yaml" --show-schedule
expect_out "--show-schedule prints the pipeline schedule of a --dry-run"
expect_status 2 "$DSTRAIN" train "$SRC/recipes/tiny-mla-moe.yaml" --nproc-per-node 4 --set parallel.pipeline_parallel_size=2 --set train.global_batch_size=24 --set "data.shard_weights=[3,1,3,1]" --set run_dir=pp
expect_out "data.shard_weights (--set) with parallel.pipeline_parallel_size 2: every stage of a pipeline must read the same micro-batches"
[ ! -e pp ] || fail "a refused pipeline run created its run directory"
ok "pipeline configuration errors exit 2 naming the key; uneven data shares with a pipeline are refused (exit 2) until they are planned per pipeline"

expect_status 0 "$DSTRAIN" bench pipeline --ranks 4 --micro-batches 8 --chart
expect_out "1f1b                1         33   0.3750   0.3750"
expect_out "interleaved_1f1b    2       28.5   0.1875   0.1875"
expect_out "zb_h1               1         27   0.1250   0.1250    1.222x"
expect_out "  rank  3 |...FIfiFIfiWFIwfiWFIwfiWwWw|"
expect_status 0 "$DSTRAIN" bench pipeline --ranks 4 --micro-batches 2
expect_out "1f1b                1 not run: 1f1b needs at least as many micro-batches"
ok "bench pipeline replays every schedule: bubble against the formulas, memory, charts"


expect_status 5 "$DSTRAIN" train "$SRC/recipes/deepseek-llm-7b.yaml" --set run_dir=big --nproc-per-node 2
expect_out "GiB of host memory on this node"
expect_out "only"
[ ! -e big ] || fail "a run refused for memory created its run directory"
ok "a model whose state cannot fit in this node's memory is refused before anything starts"

printf 'run_dir: r\ndata: {path: %s/recipes/data/demo_corpus.txt}\ntrain:\n  stepz: 3\n  micro_batch_size: 2\noptimizer:\n  lr: high\nmodel:\n  num_heads: 0\n' "$SRC" > bad.yaml
expect_status 2 "$DSTRAIN" train bad.yaml
expect_out "3 problems"
expect_out "bad.yaml:4:3: train.stepz: unknown key (did you mean 'steps'?)"
expect_out "bad.yaml:7:7: optimizer.lr: expected a number, found string 'high'"
expect_out "bad.yaml:9:14: model.num_heads: 0 is out of range [1, 1024]"
[ ! -e r ] || fail "a rejected recipe created its run directory"
ok "a recipe with three mistakes prints three errors, exits 2 and writes nothing"

expect_status 2 "$DSTRAIN" train "$demo_recipe" --set train.global_batch_size=24 --nproc-per-node 2 --dry-run
expect_out "train_batch_size 24 != micro 8 x accumulation 1 x 2 ranks = 16"
expect_out "use 16 or 32"
ok "an uneven batch split is refused with the numbers"

expect_status 0 "$DSTRAIN" bench model "$SRC/recipes/tiny-mla-moe.yaml" --iters 1 --seq-len 16
expect_out "tokens/s"
expect_status 0 "$DSTRAIN" bench moe --tokens 64 --hidden 32 --inner 16 --experts 8 --top-k 2 --iters 1 --threads 1
for row in "per expert (previous)" "grouped, expert loop" "grouped GEMMs"; do expect_out "$row"; done
# The three ways compute the same layer: the err column (against the per-expert output) is tiny.
awk '/^(grouped|per expert)/ { if ($NF + 0 > 1e-5) bad = 1 } END { exit bad }' <<<"$OUT" || fail "bench moe: the ways disagree: $OUT"
expect_status 2 "$DSTRAIN" bench moe --experts 8 --top-k 9
expect_out "--top-k must be between 1 and --experts"
ok "bench moe times the three expert layers on the same routing, and refuses a top-k above the experts"
expect_status 0 "$DSTRAIN" check-env
for word in host os cpu memory libtorch "cuda kernels" gpus; do expect_out "$word"; done
expect_status 0 "$DSTRAIN" check-env --local --json
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); names=[f["name"] for f in d["facts"]]; assert "libtorch" in names and "gpus" in names' "$OUT" || fail "check-env --json is not valid JSON"
ok "check-env prints the node's facts as a table and as JSON"

expect_status 2 "$DSTRAIN" resume nowhere
expect_out "run directory 'nowhere' does not exist"
mkdir -p notarun
expect_status 2 "$DSTRAIN" resume notarun
expect_out "not a dstrain run directory"
expect_status 2 "$DSTRAIN" inspect-ckpt nowhere
expect_out "'nowhere' does not exist"
mkdir -p empty_run
expect_status 2 "$DSTRAIN" report empty_run
expect_out "'$WORK/empty_run' has no metrics.jsonl"
expect_status 2 "$DSTRAIN" report nowhere
ok "resume, inspect-ckpt and report refuse paths that are not runs or checkpoints"

# The control-plane simulator (issue 26), as a smoke run: 32 fake ranks join, one heartbeat pass each way.
TORCH_CPP_LOG_LEVEL=ERROR expect_status 0 "$DSTRAIN" bench control-plane --ranks 32
for phase in rendezvous "heartbeat pass (per key)" "heartbeat pass (batched)"; do expect_out "\"phase\": \"$phase\", \"ranks\": 32"; done
ok "bench control-plane: 32 fake ranks through the real rendezvous and store, a JSON line per phase"

finish
