#include "dstrain/config/schema.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

namespace dstrain::config {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMaxInt = 9.0e15;  // exactly representable in a double
}  // namespace

#define DS_FIELD(member) [](Recipe& r) -> FieldTarget { return &r.member; }
// An enum field's choices (its names) and target, in the row's places for them.
template <typename E>
const std::vector<std::string>& names_of(const E&) {
  return enum_names<E>();
}
template <typename E>
const std::vector<std::string>& names_of(const std::vector<E>&) {
  return enum_names<E>();
}
#define DS_CHOICES(member) names_of(Recipe{}.member)
#define DS_ENUM(member) [](Recipe& r) -> FieldTarget { return enum_target(r.member); }

namespace {

// The rows, one function per section (a table: clang-format leaves the rows one per line).
// clang-format off
std::vector<Field> top_fields() {
  return {
    {"run_dir", 0, 0, {}, "Run directory (relative to the current directory): config, logs, metrics, checkpoints.", DS_FIELD(run_dir)},
    {"seed", 0, kMaxInt, {}, "Seed for weight init (and data order unless data.seed is set).", DS_FIELD(seed)},
    {"ds_config", 0, 0, {}, "A DeepSpeed ds_config.json (relative to the recipe file).", DS_FIELD(ds_config_path)},
  };
}

std::vector<Field> model_fields() {
  return {
    {"model.family", 0, 0, DS_CHOICES(model.family), "dense: LLaMA-style (deepseek-llm, deepseek-coder); mla_moe: DeepSeek-V2/V3 (MLA + DeepSeekMoE).", DS_ENUM(model.family)},
    {"model.hf_config", 0, 0, {}, "A Hugging Face config.json, or the model directory holding it (model_type llama, deepseek_v2 or deepseek_v3), to take the model from (relative to the recipe file); a model.* key set beside it overrides that field. Implied by model.init_from.", DS_FIELD(model.hf_config)},
    {"model.init_from", 0, 0, {}, "Start from the weights of a Hugging Face model directory (relative to the recipe file); its config.json gives the model (unless model.hf_config names another), and a model.* key set beside it overrides that field.", DS_FIELD(model.init_from)},
    {"model.vocab_size", 1, kMaxInt, {}, "Vocabulary size.", DS_FIELD(model.vocab_size)},
    {"model.hidden_size", 1, kMaxInt, {}, "Hidden size H.", DS_FIELD(model.hidden_size)},
    {"model.num_layers", 1, 1024, {}, "Number of decoder layers.", DS_FIELD(model.num_layers)},
    {"model.num_heads", 1, 1024, {}, "Attention heads; must divide hidden_size.", DS_FIELD(model.num_heads)},
    {"model.num_kv_heads", 0, 1024, {}, "dense: grouped key/value heads (0: num_heads); must divide num_heads.", DS_FIELD(model.num_kv_heads)},
    {"model.intermediate_size", 1, kMaxInt, {}, "SwiGLU MLP width (the dense layers).", DS_FIELD(model.intermediate_size)},
    {"model.max_seq_len", 1, kMaxInt, {}, "Longest sequence the rotary tables cover.", DS_FIELD(model.max_seq_len)},
    {"model.rope_theta", 1, kInf, {}, "RoPE base.", DS_FIELD(model.rope_theta)},
    {"model.rope_scaling", 0, 0, DS_CHOICES(model.rope_scaling), "RoPE scaling as Hugging Face applies it: none, linear (positions / rope_factor), or yarn (DeepSeek-V2/V3's context extension).", DS_ENUM(model.rope_scaling)},
    {"model.rope_factor", 1e-6, kInf, {}, "linear / yarn: the scaling factor (yarn: context / original context).", DS_FIELD(model.rope_factor)},
    {"model.rope_original_max_position", 0, kMaxInt, {}, "yarn: the context the model was pretrained at (original_max_position_embeddings); 0: model.max_seq_len.", DS_FIELD(model.rope_original_max_position)},
    {"model.rope_beta_fast", 0, kInf, {}, "yarn: rotations that mark the extrapolated (high-frequency) dims (beta_fast).", DS_FIELD(model.rope_beta_fast)},
    {"model.rope_beta_slow", 0, kInf, {}, "yarn: rotations that mark the interpolated (low-frequency) dims (beta_slow).", DS_FIELD(model.rope_beta_slow)},
    {"model.rope_mscale", 0, kInf, {}, "yarn: mscale of the attention factor (0: not given).", DS_FIELD(model.rope_mscale)},
    {"model.rope_mscale_all_dim", 0, kInf, {}, "yarn: mscale_all_dim (0: not given); DeepSeek models also scale the softmax by its mscale squared.", DS_FIELD(model.rope_mscale_all_dim)},
    {"model.rope_attention_factor", 0, kInf, {}, "yarn: the scale of cos/sin (attention_factor); 0: derived from the factor and mscales.", DS_FIELD(model.rope_attention_factor)},
    {"model.rms_norm_eps", 0, 1, {}, "RMSNorm epsilon.", DS_FIELD(model.rms_norm_eps)},
    {"model.init_std", 0, 1, {}, "Std of the normal weight init.", DS_FIELD(model.init_std)},
    {"model.q_lora_rank", 0, kMaxInt, {}, "mla_moe: query compression rank (0: a direct q_proj, as V2-Lite).", DS_FIELD(model.q_lora_rank)},
    {"model.kv_lora_rank", 1, kMaxInt, {}, "mla_moe: key/value compression rank.", DS_FIELD(model.kv_lora_rank)},
    {"model.qk_nope_head_dim", 1, kMaxInt, {}, "mla_moe: per-head query/key dims without RoPE.", DS_FIELD(model.qk_nope_head_dim)},
    {"model.qk_rope_head_dim", 2, kMaxInt, {}, "mla_moe: decoupled RoPE dims (even).", DS_FIELD(model.qk_rope_head_dim)},
    {"model.v_head_dim", 1, kMaxInt, {}, "mla_moe: per-head value dims.", DS_FIELD(model.v_head_dim)},
    {"model.moe_intermediate_size", 1, kMaxInt, {}, "mla_moe: width of each expert.", DS_FIELD(model.moe_intermediate_size)},
    {"model.n_routed_experts", 1, 65536, {}, "mla_moe: routed experts per MoE layer.", DS_FIELD(model.n_routed_experts)},
    {"model.n_shared_experts", 0, 1024, {}, "mla_moe: shared experts per MoE layer.", DS_FIELD(model.n_shared_experts)},
    {"model.num_experts_per_tok", 1, 1024, {}, "mla_moe: routed experts per token (top-k).", DS_FIELD(model.num_experts_per_tok)},
    {"model.first_k_dense_replace", 0, 1024, {}, "mla_moe: the first k layers keep a dense FFN.", DS_FIELD(model.first_k_dense_replace)},
    {"model.moe_layer_freq", 1, 1024, {}, "mla_moe: every n-th later layer is MoE.", DS_FIELD(model.moe_layer_freq)},
    {"model.scoring_func", 0, 0, DS_CHOICES(model.scoring_func), "mla_moe: router scores (V2 softmax, V3 sigmoid).", DS_ENUM(model.scoring_func)},
    {"model.topk_method", 0, 0, DS_CHOICES(model.topk_method), "mla_moe: expert selection.", DS_ENUM(model.topk_method)},
    {"model.n_group", 1, 65536, {}, "mla_moe: expert groups for group-limited routing.", DS_FIELD(model.n_group)},
    {"model.topk_group", 1, 65536, {}, "mla_moe: groups a token may use.", DS_FIELD(model.topk_group)},
    {"model.norm_topk_prob", 0, 0, {}, "mla_moe: renormalise the top-k weights.", DS_FIELD(model.norm_topk_prob)},
    {"model.routed_scaling_factor", 0, kInf, {}, "mla_moe: scale of the routed experts' weights.", DS_FIELD(model.routed_scaling_factor)},
    {"model.aux_loss_alpha", 0, kInf, {}, "mla_moe: sequence-wise balance loss weight (0: off).", DS_FIELD(model.aux_loss_alpha)},
    {"model.bias_update_speed", 0, kInf, {}, "mla_moe: gamma of the aux-loss-free bias (noaux_tc).", DS_FIELD(model.bias_update_speed)},
    {"model.mtp_depth", 0, 16, {}, "mla_moe: multi-token prediction modules (DeepSeek-V3: 1; Hugging Face's num_nextn_predict_layers). Module k predicts the token k + 1 ahead from the main model's final hidden state (after its norm) and the embedding of the token k ahead, through one decoder block; the embedding and head are the main model's. With a pipeline the modules run on the last stage, and the stages pass the embeddings' output on beside the hidden states. 0: off.", DS_FIELD(model.mtp_depth)},
    {"model.score_head", 0, 0, {}, "The head is a reward model's score (transformers' score.weight, [1, hidden_size]: one scalar per sequence, *ForSequenceClassification with num_labels 1) instead of lm_head. Set by train.objective reward, and only with it; a model.init_from folder without score.weight (a causal LM) gives its other weights and the score starts from model.seed, as transformers does.", DS_FIELD(model.score_head)},
    {"model.mtp_loss_weight", 0, kInf, {}, "mla_moe: lambda, the MTP loss weight: the loss adds lambda / mtp_depth times each depth's cross-entropy over the step's trained targets (DeepSeek-V3: 0.3).", DS_FIELD(model.mtp_loss_weight)},
    {"model.mtp_loss_weight_until_tokens", 0, kMaxInt, {}, "mla_moe: the MTP loss weight becomes mtp_loss_weight_after once this many tokens were trained (DeepSeek-V3: 10e12, then 0.1); 0: never.", DS_FIELD(model.mtp_loss_weight_until_tokens)},
    {"model.mtp_loss_weight_after", 0, kInf, {}, "mla_moe: the MTP loss weight after mtp_loss_weight_until_tokens tokens.", DS_FIELD(model.mtp_loss_weight_after)},
  };
}

std::vector<Field> data_fields() {
  return {
    {"data.path", 0, 0, {}, "Training data (relative to the recipe file); for megatron the PREFIX of PREFIX.idx/.bin.", DS_FIELD(data.path)},
    {"data.paths", 0, 0, {}, "Several sources (relative to the recipe file), blended; instead of data.path. All text, or all fine-tuning sets (prepare-data --chat).", DS_FIELD(data.paths)},
    {"data.weights", 0, kInf, {}, "Blend weights of data.paths (each sample drawn from the source furthest behind its share); empty: by size. Fine-tuning sets blend packed rows: a source with weight w gets that share of every global batch (its rows repeat or wait as the share asks); empty: by each source's rows, so that a pass reads every row once.", DS_FIELD(data.weights)},
    {"data.format", 0, 0, DS_CHOICES(data.format), "bytes: a byte per token (vocab 256); megatron: indexed dataset; llmc: llm.c .bin; raw_u16: nanoGPT.", DS_ENUM(data.format)},
    {"data.seq_len", 1, kMaxInt, {}, "Tokens per sample.", DS_FIELD(data.seq_len)},
    {"data.document_mask", 0, 0, {}, "Keep attention within documents: a sample may span several, each sees only itself.", DS_FIELD(data.document_mask)},
    {"data.packing", 0, 0, DS_CHOICES(data.packing), "Fine-tuning sets (prepare-data --chat): none (a conversation per row, padded), greedy (conversations in order, a new row when the next does not fit) or best_fit (longest first into the fullest row). Conversations are never split; attention and positions stay inside each.", DS_ENUM(data.packing)},
    {"data.reset_positions", 0, 0, {}, "Count RoPE positions from 0 in each document (Megatron's reset_position_ids); needs data.eos_token.", DS_FIELD(data.reset_positions)},
    {"data.eos_token", -1, kMaxInt, {}, "The end-of-document token (256 for prepare-data datasets); -1: none.", DS_FIELD(data.eos_token)},
    {"data.other_tokenizer", 0, 0, {}, "Accept data prepared with another tokenizer than model.init_from's (refused by default: a vocabulary of the same size is not the same tokens).", DS_FIELD(data.other_tokenizer)},
    {"data.seed", -1, kMaxInt, {}, "Seed of the data order; -1: the run's seed.", DS_FIELD(data.seed)},
    {"data.shard_weights", 0, kInf, {}, "Per-rank share of each global batch, e.g. [2, 1, 1, 1] (faster ranks get more), or auto; empty: equal. The gradient stays that of the whole batch.", DS_FIELD(data.shard_weights)},
    {"data.auto_balance", 0, 0, {}, "Measure each rank's speed for balance_steps, then weight the shares by it (set by shard_weights: auto).", DS_FIELD(data.auto_balance)},
    {"data.balance_steps", 1, kMaxInt, {}, "Steps measured before auto_balance sets the weights.", DS_FIELD(data.balance_steps)},
  };
}

std::vector<Field> eval_fields() {
  return {
    {"eval.paths", 0, 0, {}, "Evaluation datasets (relative to the recipe file), in data.format, each evaluated whole and in file order (the same windows every time) for a token-weighted validation loss. A fine-tuning set (prepare-data --chat) is scored on the tokens its loss mask trains, its conversations packed greedily in file order into rows of data.seq_len. With train.objective dpo, sets of preference pairs (prepare-data --preference) scored by the DPO loss per pair and TRL's metrics, each against reference log-probs made beside it as the run starts.", DS_FIELD(eval.paths)},
    {"eval.names", 0, 0, {}, "Names of eval.paths in the metrics (val/NAME/loss); empty: each file's stem.", DS_FIELD(eval.names)},
    {"eval.split", 0, kMaxInt, {}, "Hold out whole documents of the training data as an evaluation set named 'heldout': a fraction (< 1) or a count (>= 1) of each source, chosen from data.seed; training never reads them. Documents come from a megatron index or data.eos_token; of fine-tuning sets, whole conversations (scored on their trained tokens); of a set of preference pairs (train.objective dpo), whole pairs.", DS_FIELD(eval.split)},
    {"eval.interval_steps", 0, kMaxInt, {}, "Evaluate every N steps (0: not during training).", DS_FIELD(eval.interval_steps)},
    {"eval.at_start", 0, 0, {}, "Evaluate before the first step (a baseline; not a best-checkpoint candidate).", DS_FIELD(eval.at_start)},
    {"eval.at_end", 0, 0, {}, "Evaluate after the last step.", DS_FIELD(eval.at_end)},
    {"eval.max_batches", 0, kMaxInt, {}, "Micro-batches per set over all ranks (eval.micro_batch_size windows, or packed rows of conversations, each): the same first ones every time and at any world size (0: the whole set).", DS_FIELD(eval.max_batches)},
    {"eval.micro_batch_size", 0, kMaxInt, {}, "Samples per rank per evaluation micro-batch (preference pairs with train.objective dpo; 0: train.micro_batch_size).", DS_FIELD(eval.micro_batch_size)},
    {"eval.early_stopping_patience", 0, kMaxInt, {}, "Stop the run (exit 0, with a checkpoint) after this many evaluations without an improvement of the first set's loss by more than early_stopping_min_delta (0: never).", DS_FIELD(eval.early_stopping_patience)},
    {"eval.early_stopping_min_delta", 0, kInf, {}, "The improvement of the validation loss that counts for early stopping and keep_best.", DS_FIELD(eval.early_stopping_min_delta)},
    {"eval.tasks", 0, 0, {}, "Task files (relative to the recipe file) scored at every evaluation as `dstrain eval --task` scores them (lm-evaluation-harness's multiple_choice: acc and acc_norm; generate_until: exact_match), tokenized with the run's tokenizer (model.init_from's or its prepared data's); each named by its file stem: task/NAME/acc in the metrics.", DS_FIELD(eval.tasks)},
    {"eval.samples", 0, 0, {}, "A JSON Lines file of prompts ({\"prompt\": TEXT} or {\"messages\": [...]}, as dstrain generate --prompts reads them; relative to the recipe file): at every evaluation the model writes up to eval.sample_tokens new tokens after each, into run_dir/samples.jsonl and TensorBoard's text tab.", DS_FIELD(eval.samples)},
    {"eval.task_batch_size", 1, 4096, {}, "Generative task questions generated together on a rank, as lm-evaluation-harness's --batch_size: the questions sorted longest first and cut into batches (left-padded); 1 generates each alone, as lm-eval's default.", DS_FIELD(eval.task_batch_size)},
    {"eval.sample_tokens", 1, kMaxInt, {}, "New tokens per eval.samples prompt at most.", DS_FIELD(eval.sample_tokens)},
    {"eval.sample_temperature", 0, 100, {}, "eval.samples: 0 greedy; otherwise sampled at this temperature (the draws seeded by seed and the step).", DS_FIELD(eval.sample_temperature)},
    {"eval.task_format", 0, 0, DS_CHOICES(eval.task_format), "The eval.tasks files' rows: dstrain ({context, choices, gold} multiple-choice, or {context, target} generative rows), or hellaswag, arc, mmlu (multiple choice) or gsm8k (generative, exact match) rows as downloaded.", DS_ENUM(eval.task_format)},
  };
}

std::vector<Field> optimizer_fields() {
  return {
    {"optimizer.type", 0, 0, DS_CHOICES(optimizer.type), "adamw: decoupled weight decay; adam: L2 decay added to the gradient.", DS_ENUM(optimizer.type)},
    {"optimizer.lr", 0, kInf, {}, "Peak learning rate.", DS_FIELD(optimizer.lr)},
    {"optimizer.beta1", 0, 1, {}, "Adam beta1.", DS_FIELD(optimizer.beta1)},
    {"optimizer.beta2", 0, 1, {}, "Adam beta2.", DS_FIELD(optimizer.beta2)},
    {"optimizer.eps", 0, 1, {}, "Adam epsilon.", DS_FIELD(optimizer.eps)},
    {"optimizer.weight_decay", 0, kInf, {}, "Weight decay.", DS_FIELD(optimizer.weight_decay)},
  };
}

std::vector<Field> schedule_fields() {
  return {
    {"schedule.type", 0, 0, DS_CHOICES(schedule.type),
     "LR schedule: warmup_cosine (linear warmup, cosine to min_lr_ratio), wsd (warmup, stable, linear decay over decay_ratio), DeepSpeed's WarmupCosineLR / WarmupLR / WarmupDecayLR / OneCycle, or constant.",
     DS_ENUM(schedule.type)},
    {"schedule.warmup_steps", 0, kMaxInt, {}, "Warmup steps.", DS_FIELD(schedule.warmup_steps)},
    {"schedule.warmup_type", 0, 0, DS_CHOICES(schedule.warmup_type), "Warmup shape of the ds_* schedules.", DS_ENUM(schedule.warmup_type)},
    {"schedule.warmup_min_ratio", 0, 1, {}, "Warmup starts at lr x this (ds_* schedules).", DS_FIELD(schedule.warmup_min_ratio)},
    {"schedule.min_lr_ratio", 0, 1, {}, "Cosine / linear decay ends at lr x this.", DS_FIELD(schedule.min_lr_ratio)},
    {"schedule.decay_ratio", 0, 1, {}, "wsd: the fraction of the steps, at the end, that decays.", DS_FIELD(schedule.decay_ratio)},
    {"schedule.batch_scaling", 0, 0, DS_CHOICES(schedule.batch_scaling), "Scale the LR with the global batch when accumulation stages change it (relative to the first stage's batch).", DS_ENUM(schedule.batch_scaling)},
    {"schedule.cycle_min_lr", 0, kInf, {}, "ds_one_cycle: the LR at the cycle's ends.", DS_FIELD(schedule.cycle_min_lr)},
    {"schedule.cycle_max_lr", 0, kInf, {}, "ds_one_cycle: the LR at the cycle's peak; 0: optimizer.lr.", DS_FIELD(schedule.cycle_max_lr)},
    {"schedule.cycle_first_step_size", 1, kMaxInt, {}, "ds_one_cycle: steps of the rising half.", DS_FIELD(schedule.cycle_first_step_size)},
    {"schedule.cycle_second_step_size", 0, kMaxInt, {}, "ds_one_cycle: steps of the falling half; 0: the first's.", DS_FIELD(schedule.cycle_second_step_size)},
    {"schedule.decay_lr_rate", 0, kInf, {}, "ds_one_cycle: after the cycle, lr = cycle_min_lr / (1 + rate x steps / decay_step_size).", DS_FIELD(schedule.decay_lr_rate)},
    {"schedule.decay_step_size", 0, kMaxInt, {}, "ds_one_cycle: steps per decay interval; 0: no decay.", DS_FIELD(schedule.decay_step_size)},
    {"schedule.cycle_momentum", 0, 0, {}, "ds_one_cycle: cycle beta1 inversely to the LR (beta2 is then 0.99, as DeepSpeed sets it).", DS_FIELD(schedule.cycle_momentum)},
    {"schedule.cycle_min_mom", 0, 1, {}, "ds_one_cycle: beta1 at the LR's peak.", DS_FIELD(schedule.cycle_min_mom)},
    {"schedule.cycle_max_mom", 0, 1, {}, "ds_one_cycle: beta1 at the cycle's ends.", DS_FIELD(schedule.cycle_max_mom)},
    {"schedule.decay_mom_rate", 0, kInf, {}, "ds_one_cycle: after the cycle, beta1 = cycle_max_mom x (1 + rate x steps / decay_step_size).", DS_FIELD(schedule.decay_mom_rate)},
  };
}

std::vector<Field> train_fields() {
  return {
    {"train.steps", 0, kMaxInt, {}, "Optimizer steps (set this or train.tokens).", DS_FIELD(train.steps)},
    {"train.tokens", 0, kMaxInt, {}, "Training length in tokens (set this or train.steps).", DS_FIELD(train.tokens)},
    {"train.epochs", 0, 1e6, {}, "Training length in passes over fine-tuning sets (prepare-data --chat): steps = ceil(epochs x packed rows / global batch), shown by --dry-run; the rows of every source, less eval.split's conversations. Each epoch is reshuffled from data.seed and its number. Set this, train.steps or train.tokens.", DS_FIELD(train.epochs)},
    {"train.micro_batch_size", 1, kMaxInt, {}, "Samples per rank per micro-step (train_micro_batch_size_per_gpu).", DS_FIELD(train.micro_batch_size)},
    {"train.global_batch_size", 1, kMaxInt, {}, "Samples per optimizer step over all ranks (train_batch_size).", DS_FIELD(train.global_batch_size)},
    {"train.gradient_accumulation_steps", 1, kMaxInt, {}, "Micro-steps per optimizer step.", DS_FIELD(train.gradient_accumulation_steps)},
    {"train.accumulation", 1, kMaxInt, {}, "Staged accumulation: [{until_step: N, steps: A}, ..., {steps: C}]; a stage may end at a token count instead (until_tokens: T).", DS_FIELD(train.accumulation)},
    {"train.batch_ramp_start", 0, kMaxInt, {}, "Batch-size ramp: the global batch at step 0 (a multiple of micro x ranks); it grows linearly to the global batch. 0: no ramp.", DS_FIELD(train.batch_ramp_start)},
    {"train.batch_ramp_steps", 0, kMaxInt, {}, "Batch-size ramp: its length in steps (or give batch_ramp_tokens).", DS_FIELD(train.batch_ramp_steps)},
    {"train.batch_ramp_tokens", 0, kMaxInt, {}, "Batch-size ramp: its length in tokens, as DeepSeek-V3 gives it (or give batch_ramp_steps).", DS_FIELD(train.batch_ramp_tokens)},
    {"train.grad_clip", 0, kInf, {}, "Clip the global gradient norm to this (gradient_clipping); 0 disables.", DS_FIELD(train.grad_clip)},
    {"train.on_bad_step", 0, 0, DS_CHOICES(train.on_bad_step), "A NaN/Inf loss or gradient norm (bf16/fp32; fp16 has loss scaling): stop (exit 8), skip the update, or roll back to the latest checkpoint and go on.", DS_ENUM(train.on_bad_step)},
    {"train.max_bad_steps", 0, kMaxInt, {}, "With on_bad_step skip or rollback: more bad steps than this in one launch stop the run (exit 8).", DS_FIELD(train.max_bad_steps)},
    {"train.freeze", 0, 0, {}, "Parameters that do not train: Hugging Face name globs (model.embed_tokens.*, model.layers.[0-3].*, *.mlp.experts.*) and roles (embeddings, attention, mlp, experts, router, norms, head, mtp). Frozen parameters keep no gradient, fp32 master copy or Adam states (12 of 16 bytes per parameter in mixed precision), are never reduced, and are checkpointed as values alone; --dry-run shows the trainable and frozen counts. A frozen router also stops its selection-bias update. A pattern that matches nothing, or one that freezes everything, is refused.", DS_FIELD(train.freeze)},
    {"train.loss_chunk_tokens", 0, kMaxInt, {}, "The LM head and the cross-entropy run this many tokens at a time, fused: the full logits never exist, their gradients are computed as each chunk's loss is. 0: all logits at once, then the loss.", DS_FIELD(train.loss_chunk_tokens)},
    {"train.z_loss_weight", 0, 1e6, {}, "PaLM's z-loss: this weight x logsumexp(logits)^2 per trained target, averaged as the cross-entropy is (train.loss_normalization), added to the loss to keep the softmax's normaliser near 1 (PaLM uses 1e-4). Logged as z_loss: the mean logsumexp^2 before the weight; the logged loss stays the cross-entropy. Costs a second pass of the head (chunked as train.loss_chunk_tokens). 0: off.", DS_FIELD(train.z_loss_weight)},
    {"train.loss_normalization", 0, 0, DS_CHOICES(train.loss_normalization), "What a step's summed token losses are divided by: global_tokens (the step's trained tokens over every micro-batch and rank: the loss does not depend on how the batch is split), micro_batch_mean (each micro-batch's mean, averaged: DeepSpeed's and Megatron's default), per_sample (each sample's mean, averaged: every conversation weighs the same). Gradients, clipping and the logged loss follow it.", DS_ENUM(train.loss_normalization)},
    {"train.objective", 0, 0, DS_CHOICES(train.objective), "What a step minimises: sft (the next-token cross-entropy over the trained tokens: pretraining and supervised fine-tuning), dpo (Direct Preference Optimization on a prepare-data --preference set of chosen/rejected pairs: TRL's DPOTrainer losses, `preference`), cpo, simpo or orpo (preference tuning without a reference model, on the same pairs, as TRL's CPOTrainer and ORPOTrainer: cpo the log-prob difference under preference.loss_type plus preference.cpo_alpha x the chosen completions' NLL; simpo CPO's simpo loss on the per-token mean log-probs with preference.simpo_gamma, without the NLL; orpo the chosen sequences' NLL minus preference.beta x log sigmoid of the odds ratio; logged as dpo is, with nll_loss, and orpo's log_odds_ratio and log_odds_chosen), kto (Kahneman-Tversky Optimization on a prepare-data --preference --kto set of examples labelled desirable or not, as TRL's KTOTrainer: each example's log-ratio against the reference, shifted by a KL estimate over each micro-batch's mismatched prompt/completion rows, through preference.desirable_weight and undesirable_weight; the counts below are examples, each two rows (the example and its KL sequence); logged as TRL names it: kl, rewards/chosen, rewards/rejected, rewards/margins, logps/*, logits/*), or reward (a reward model on the same pairs, as TRL's RewardTrainer: model.score_head gives each whole sequence a score at its last token that is not the tokenizer's pad token, and the loss is -log sigmoid(chosen score - rejected score) per pair, plus preference.center_rewards_coefficient; logged as accuracy, margin, mean_reward; no reference model). With all but sft, train.global_batch_size and micro_batch_size count pairs (each pair is two rows, chosen and rejected, in the same micro-batch), data.seq_len bounds prompt + completion, the loss is the mean over the step's pairs (train.loss_normalization does not apply); with dpo and kto, the reference's log-probs are computed once, by the model as it starts, into PREFIX.ref.<hash> beside the set (reused by every later run and resume from the same model and data). dpo is logged as TRL names it: rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen, logps/rejected, logits/chosen, logits/rejected.", DS_ENUM(train.objective)},
    {"train.activation_checkpointing", 0, 0, DS_CHOICES(train.activation_checkpointing), "Recompute activations in backward instead of keeping them: full (each decoder layer from its input; least memory, one more forward), selective (the norms, SwiGLU's activation and the attention core; the GEMM outputs are kept), or none. ds_config's activation_checkpointing block sets full.", DS_ENUM(train.activation_checkpointing)},
  };
}

std::vector<Field> preference_fields() {
  return {
    {"preference.beta", 1e-12, kInf, {}, "DPO's beta (TRL's beta; IPO's tau): how far the policy may move from the reference. The rewards are beta x (policy log-prob - reference log-prob) of each completion. cpo and simpo: the temperature of the loss on the log-prob difference, the rewards beta x log-prob (SimPO's paper trains at 2 to 10); orpo: the odds-ratio term's weight (the ORPO paper's lambda).", DS_FIELD(preference.beta)},
    {"preference.loss_type", 0, 0, {}, "TRL's DPO loss_type, one or several (summed, each times its preference.loss_weights entry): sigmoid (DPO; with label_smoothing: cDPO), hinge (SLiC), ipo (on per-token mean log-probs), robust (rDPO, label_smoothing below 0.5), exo_pair (label_smoothing above 0), nca_pair, bco_pair, sppo_hard, apo_zero, apo_down, sigmoid_norm, discopop (preference.discopop_tau), aot and aot_unpaired (AOT: the micro-batch's log-ratios sorted before the smoothed sigmoid loss, so that the loss depends on train.micro_batch_size as TRL's on the per-device batch), and sft (the chosen completions' negative log-likelihood, a token mean over the step: RPO is [sigmoid, sft] with loss_weights [1, alpha]), each as TRL 1.16 computes it per pair. train.objective cpo: one of CPOTrainer's sigmoid, hinge, ipo or simpo (per-token mean log-probs for ipo and simpo). train.objective kto: KTOTrainer's kto (the default there) or apo_zero_unpaired (APO-zero on unpaired examples, without the KL estimate).", DS_FIELD(preference.loss_type)},
    {"preference.reference", 0, 0, {}, "train.objective dpo and kto: where the reference model's log-probs come from. precomputed (default): one forward pass by the starting model before the first update, kept beside the set as PREFIX.ref.<hash> (reused by later runs and resumes from the same model and data; TRL's precompute_ref_log_probs). live: with lora, each micro-batch's reference made when it comes by the model with its adapters off (the base, PEFT's disable_adapter, as TRL's reference with PEFT), one more forward per micro-batch, no file and no second copy (with lora.init_from, the base without those adapters); without lora, a frozen copy of the starting model (model.seed, model.init_from), as TRL's create_reference_model keeps one, sharded as the policy is (ZeRO-3: each rank its shard), one more forward per micro-batch and the copy's memory (--dry-run counts it); checkpoints then name model.init_from's files, and a resume checks them. none: no reference (its log-probs 0: the loss on the policy's log-probs alone, TRL < 1's reference_free).", DS_FIELD(preference.reference)},
    {"preference.sync_ref_model", 0, 0, {}, "TR-DPO (TRL's sync_ref_model; train.objective dpo and kto with preference.reference live, without lora): every preference.ref_model_sync_steps steps the frozen reference copy becomes ref_model_mixup_alpha x the policy + (1 - ref_model_mixup_alpha) x itself, parameter by parameter in the model's dtype, as TRL's SyncRefModelCallback mixes them. Checkpoints then hold the copy beside the policy (its shards, as ZeRO keeps them: a resume at any world size or stage restores it).", DS_FIELD(preference.sync_ref_model)},
    {"preference.ref_model_mixup_alpha", 0, 1, {}, "TR-DPO's alpha (TRL's ref_model_mixup_alpha): the policy's share of the reference after each sync (preference.sync_ref_model).", DS_FIELD(preference.ref_model_mixup_alpha)},
    {"preference.ref_model_sync_steps", 1, kMaxInt, {}, "TR-DPO's tau (TRL's ref_model_sync_steps): the reference is synced after every this many steps (after step s when s is a multiple; preference.sync_ref_model).", DS_FIELD(preference.ref_model_sync_steps)},
    {"preference.desirable_weight", 1e-12, kInf, {}, "train.objective kto (TRL's desirable_weight): each desirable example's loss is multiplied by this, to counter unequal numbers of desirable and undesirable examples (the KTO paper: desirable_weight x desirable examples / (undesirable_weight x undesirable ones) in [1, 4/3]).", DS_FIELD(preference.desirable_weight)},
    {"preference.undesirable_weight", 1e-12, kInf, {}, "train.objective kto (TRL's undesirable_weight): each undesirable example's loss is multiplied by this.", DS_FIELD(preference.undesirable_weight)},
    {"preference.loss_weights", 0, kInf, {}, "One weight per preference.loss_type (TRL's loss_weights); empty: 1 each.", DS_FIELD(preference.loss_weights)},
    {"preference.label_smoothing", 0, 0.5, {}, "The probability that a pair's labels are flipped (TRL's label_smoothing): cDPO for sigmoid, rDPO for robust, EXO's epsilon for exo_pair, AOT's for aot and aot_unpaired; with cpo and simpo, for loss_type sigmoid and simpo. 0: off.", DS_FIELD(preference.label_smoothing)},
    {"preference.discopop_tau", 1e-12, kInf, {}, "DiscoPOP's temperature (TRL's discopop_tau; loss_type discopop): how sharply the loss blends from the logistic to the exponential term as beta x the log-ratio margin grows. The paper's 0.05 is the default.", DS_FIELD(preference.discopop_tau)},
    {"preference.f_divergence_type", 0, 0, {}, "f-DPO's divergence between the policy and the reference (TRL's f_divergence_type): reverse_kl (DPO), forward_kl, js_divergence or alpha_divergence (preference.f_alpha_divergence_coef). It changes how each completion's log-ratio enters the sigmoid, sigmoid_norm, hinge, ipo, exo_pair, robust and discopop losses (the others need reverse_kl); the rewards/* metrics stay beta x the log-ratios.", DS_FIELD(preference.f_divergence_type)},
    {"preference.ld_alpha", 0, 1, {}, "LD-DPO (TRL's ld_alpha): in each pair, the tokens of the longer completion past the shorter one's length weigh this much in its log-prob sum, for the policy and the reference alike (the reference log-probs are made for the value). 1: plain sums (TRL's default, None).", DS_FIELD(preference.ld_alpha)},
    {"preference.use_weighting", 0, 0, {}, "WPO (TRL's use_weighting): each pair's loss is multiplied by exp of both completions' mean over their tokens of log p(token) - log sum_v p(v)^2 under the policy, without gradient. Not with loss_type sft.", DS_FIELD(preference.use_weighting)},
    {"preference.cpo_alpha", 0, kInf, {}, "train.objective cpo and simpo (TRL's cpo_alpha): the chosen completions' negative log-likelihood, a token mean over the step, is added to the loss times this (CPO's behaviour cloning term). Default 1 for cpo, 0 for simpo (SimPO trains without it; set it for CPO-SimPO).", DS_FIELD(preference.cpo_alpha)},
    {"preference.simpo_gamma", 0, kInf, {}, "SimPO's target reward margin (TRL's simpo_gamma): the loss is the sigmoid loss on beta x (the mean log-prob difference) - simpo_gamma. train.objective simpo, or cpo with loss_type simpo.", DS_FIELD(preference.simpo_gamma)},
    {"preference.alpha", -kInf, kInf, {}, "AlphaPO (TRL's alpha, train.objective cpo and simpo): each completion's reward is (1 - p^-alpha) / alpha of its probability p (the per-token mean's exponential with ipo and simpo) in place of log p. 0: log p.", DS_FIELD(preference.alpha)},
    {"preference.center_rewards_coefficient", 0, kInf, {}, "train.objective reward: TRL's center_rewards_coefficient: the loss adds this times the pairs' mean of (chosen score + rejected score)^2, which keeps the scores centred on 0 (Eisenstein et al.; TRL suggests 0.01). 0: off (TRL's None).", DS_FIELD(preference.center_rewards_coefficient)},
    {"preference.f_alpha_divergence_coef", 0, kInf, {}, "The alpha of f_divergence_type alpha_divergence (TRL's f_alpha_divergence_coef): the score of a log-ratio r is (exp((alpha - 1) r) - 1) / (alpha - 1); alpha 1 is reverse_kl.", DS_FIELD(preference.f_alpha_divergence_coef)},
  };
}

std::vector<Field> lora_fields() {
  return {
    {"lora.rank", 0, kMaxInt, {}, "Low-rank adapters (LoRA, PEFT's r): each targeted projection gets y += (x A^T) B^T * alpha/rank, A [rank, in] drawn as PEFT draws it, B [out, rank] zeros; the base model does not train (no gradients, master copies or Adam states), only the adapters and lora.modules_to_save do. Any ZeRO stage, expert and pipeline parallelism. 0: no adapters, every parameter trains.", DS_FIELD(lora.rank)},
    {"lora.alpha", 1e-12, kInf, {}, "lora_alpha: the adapters' output is scaled by alpha / rank (alpha / sqrt(rank) with lora.use_rslora). PEFT's default, 8.", DS_FIELD(lora.alpha)},
    {"lora.dropout", 0, 1, {}, "lora_dropout: the probability that an element of an adapter's input is zeroed in training (the others scaled by 1 / (1 - p), as torch's Dropout), below 1; PEFT's default 0. Each sample's mask follows from the seed, the projection and the sample's place in the data order, so any world size, ZeRO stage, accumulation, pipeline or recompute drops the same elements (not PEFT's bits: another generator). Evaluation drops nothing.", DS_FIELD(lora.dropout)},
    {"lora.targets", 0, 0, {}, "The projections that get adapters, by module name as PEFT's target_modules writes them: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; MLA's q_a_proj, q_b_proj (q_proj without a query compression), kv_a_proj_with_mqa, kv_b_proj; or all-linear (every projection but the head and the MoE router, as PEFT means it). The routed experts' gate_proj, up_proj and down_proj get adapters only with lora.experts; the MTP modules never do. A name that matches no projection is refused.", DS_FIELD(lora.targets)},
    {"lora.use_rslora", 0, 0, {}, "Rank-stabilized LoRA: scale by alpha / sqrt(rank) instead of alpha / rank.", DS_FIELD(lora.use_rslora)},
    {"lora.use_dora", 0, 0, {}, "DoRA (weight-decomposed LoRA, as PEFT's use_dora): each adapted projection also trains a magnitude per output row, starting at the base weight's row norms; its output is (m / |W + scale B A|) (x W^T + scale x A^T B^T) with the norms detached, and 1 in place of a zero norm. Exported as PEFT's lora_magnitude_vector.", DS_FIELD(lora.use_dora)},
    {"lora.modules_to_save", 0, 0, {}, "Modules trained in full beside the adapters (PEFT's modules_to_save): embed_tokens, lm_head, norm, or any module name or suffix of one (model.layers.0.mlp). Exported with the adapter. With train.objective reward, score is added (PEFT's SEQ_CLS task trains the score in full) and the adapter exports as task_type SEQ_CLS.", DS_FIELD(lora.modules_to_save)},
    {"lora.rank_pattern", 1, kMaxInt, {}, "Another rank for some projections (PEFT's rank_pattern): {pattern: rank, ...}, each pattern a regular expression that matches a projection's whole name or its last dotted parts, as PEFT matches it (model.layers.0.self_attn.q_proj, or layers\\.0\\..*_proj). A pattern that matches no adapted projection, or two patterns that give one projection different ranks, are refused. Exported as the adapter's rank_pattern.", DS_FIELD(lora.rank_pattern)},
    {"lora.alpha_pattern", 1e-12, kInf, {}, "Another alpha for some projections (PEFT's alpha_pattern), matched as lora.rank_pattern is.", DS_FIELD(lora.alpha_pattern)},
    {"lora.experts", 0, 0, {}, "Adapters on the routed experts too (DeepSeek MoE models): each expert's gate_proj, up_proj and down_proj that lora.targets names gets its own A and B (rank lora.rank, alpha lora.alpha: rank and alpha patterns may not match them), held with the expert under expert parallelism and run inside the grouped expert GEMMs. Shared experts and dense layers follow lora.targets alone. The router and its bias stay frozen. As PEFT's expert adapters (target_parameters), no lora.dropout and no lora.use_dora. Exported per expert (model.layers.N.mlp.experts.E.gate_proj.lora_A.weight), which PEFT under transformers 5 fuses into the experts' gate_up_proj and down_proj.", DS_FIELD(lora.experts)},
    {"lora.base", 0, 0, DS_CHOICES(lora.base), "How the frozen base projections (attention, dense MLPs, shared and routed experts) are kept in memory: model (in precision.dtype), nf4 (QLoRA: 4-bit NormalFloat with double quantization, bit for bit as bitsandbytes quantizes on the CPU; about 0.52 bytes per weight) or fp8 (DeepSeek's 128x128-block float8_e4m3 with float32 scales: the release's own bytes when model.init_from holds them, else quantized by amax / 448). Each use dequantizes the weight into precision.dtype, and backward dequantizes it again rather than keeping it. The embeddings, the head, the norms, the router and MTP's eh_proj stay in precision.dtype. Training needs model.init_from (the base to quantize; --dry-run plans without it); not with lora.use_dora. The quantized base is held whole by every data-parallel rank (ZeRO partitions what trains).", DS_ENUM(lora.base)},
    {"lora.init_from", 0, 0, {}, "A PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) to start the adapters and lora.modules_to_save from, on the base of model.init_from: its r, lora_alpha and use_rslora must be lora.rank, lora.alpha and lora.use_rslora, and it must hold exactly the adapters lora.targets attach (relative to the recipe file). A resume reads the checkpoint instead.", DS_FIELD(lora.init_from)},
  };
}

std::vector<Field> precision_fields() {
  return {
    {"precision.dtype", 0, 0, DS_CHOICES(precision.dtype), "Training precision.", DS_ENUM(precision.dtype)},
    {"precision.loss_scale", 0, kInf, {}, "fp16: static loss scale; 0 = dynamic.", DS_FIELD(precision.loss_scale)},
    {"precision.initial_scale_power", 0, 64, {}, "fp16: dynamic scaling starts at 2^this.", DS_FIELD(precision.initial_scale_power)},
    {"precision.loss_scale_window", 1, kMaxInt, {}, "fp16: clean steps before the scale doubles.", DS_FIELD(precision.loss_scale_window)},
    {"precision.hysteresis", 1, kMaxInt, {}, "fp16: overflows tolerated before the scale halves.", DS_FIELD(precision.hysteresis)},
    {"precision.consecutive_hysteresis", 0, 0, {}, "fp16: refill hysteresis after every clean step.", DS_FIELD(precision.consecutive_hysteresis)},
    {"precision.min_loss_scale", 1, kMaxInt, {}, "fp16: the scale never drops below this.", DS_FIELD(precision.min_loss_scale)},
  };
}

std::vector<Field> zero_fields() {
  return {
    {"zero.stage", 0, 3, {}, "ZeRO stage 0-3.", DS_FIELD(zero.stage)},
    {"zero.reduce_bucket_size", 0, kMaxInt, {}, "Elements per gradient-reduction bucket.", DS_FIELD(zero.reduce_bucket_size)},
    {"zero.allgather_bucket_size", 0, kMaxInt, {}, "No effect (DeepSpeed's all-gather bucket): units are all-gathered whole.", DS_FIELD(zero.allgather_bucket_size)},
    {"zero.overlap_comm", 0, 0, {}, "Overlap gradient reduction with backward.", DS_FIELD(zero.overlap_comm)},
    {"zero.contiguous_gradients", 0, 0, {}, "No effect: gradients always go to one flat buffer per unit.", DS_FIELD(zero.contiguous_gradients)},
    {"zero.reduce_scatter", 0, 0, {}, "No effect: gradients are always reduce-scattered.", DS_FIELD(zero.reduce_scatter)},
    {"zero.offload_optimizer", 0, 0, DS_CHOICES(zero.offload_optimizer), "Where optimizer states live.", DS_ENUM(zero.offload_optimizer)},
    {"zero.offload_param", 0, 0, DS_CHOICES(zero.offload_param), "Stage 3 with offload_optimizer cpu: the model-dtype parameter shard lives in pinned host memory, updated there by the CPU optimizer; each layer group goes up to the GPU just before its all-gather (ZeRO-Infinity's CPU tier). Ignored below stage 3.", DS_ENUM(zero.offload_param)},
    {"zero.pin_memory", 0, 0, {}, "Offload: the host memory of the offloaded states and of the gradient staging is pinned (page-locked), so that copies overlap the update; false keeps it pageable (copies then block). DeepSpeed's offload_optimizer/offload_param pin_memory; dstrain pins by default, DeepSpeed does not.", DS_FIELD(zero.pin_memory)},
    {"zero.delayed_update", 0, 0, {}, "With offload_optimizer cpu: ZeRO-Offload's one-step delayed parameter update (DPU). The CPU update from step t's gradients runs while step t+1 computes and is applied at the end of step t+1, so step t+1's forward and backward use the parameters of update t-1. This changes the math (the gradients are one update stale). A checkpoint applies the pending update before saving (the step after a save runs on fresh parameters), so a resumed run, which saves at the same steps, continues exactly. Off by default.", DS_FIELD(zero.delayed_update)},
    {"zero.delayed_update_after", 0, kMaxInt, {}, "zero.delayed_update starts after this many updates made without delay (a warm-up: stale gradients hurt most while the parameters change fast; the ZeRO-Offload paper also delays only after a few dozen steps). 0: from the first step.", DS_FIELD(zero.delayed_update_after)},
    {"zero.stage3_prefetch_bucket_size", 0, kMaxInt, {}, "Stage 3: elements prefetched ahead.", DS_FIELD(zero.stage3_prefetch_bucket_size)},
    {"zero.stage3_param_persistence_threshold", 0, kMaxInt, {}, "Stage 3: smaller params stay unpartitioned.", DS_FIELD(zero.stage3_param_persistence_threshold)},
    {"zero.stage3_max_live_parameters", 0, kMaxInt, {}, "No effect: stage 3 holds the running and the prefetched group.", DS_FIELD(zero.stage3_max_live_parameters)},
    {"zero.stage3_max_reuse_distance", 0, kMaxInt, {}, "No effect: stage 3 re-gathers a group for its backward.", DS_FIELD(zero.stage3_max_reuse_distance)},
    {"zero.stage3_gather_16bit_weights_on_model_save", 0, 0, {}, "No effect: checkpoints hold fp32 masters; use export-hf.", DS_FIELD(zero.stage3_gather_16bit_weights_on_model_save)},
    {"zero.sub_group_size", 0, kMaxInt, {}, "No effect: the optimizer steps the whole shard in one pass.", DS_FIELD(zero.sub_group_size)},
  };
}

std::vector<Field> moe_fields() {
  return {
    {"moe.expert_parallel_size", 1, 65536, {}, "mla_moe: expert parallelism (DeepSpeed-MoE's ep_size). Each MoE layer's routed experts are spread over this many consecutive ranks, and tokens go to their experts by all-to-all; each expert's parameters are data-parallel (and ZeRO-sharded) over world_size / this ranks, the rest of the model over all ranks. Must divide the world size and model.n_routed_experts. 1: every rank holds every expert.", DS_FIELD(moe.expert_parallel_size)},
  };
}

std::vector<Field> pipeline_fields() {
  return {
    {"parallel.pipeline_parallel_size", 1, 1024, {}, "Pipeline parallelism: the decoder layers split into this many consecutive stages, one per rank of a pipeline (the embedding on the first, the head and loss on the last). The world is data-parallel x pipeline: consecutive ranks form a stage's data-parallel group (ZeRO and expert parallelism inside it), so the batch math counts world_size / this ranks. Must divide the world size. 1: no pipeline. Planned by --dry-run (stages, schedule, bubble, memory per stage) and `dstrain bench pipeline`. Not yet with data.shard_weights.", DS_FIELD(parallel.pipeline_parallel_size)},
    {"parallel.sequence_parallel_size", 1, 1024, {}, "Ulysses sequence parallelism (DeepSpeed's sequence_parallel_size): this many consecutive ranks of a data-parallel group share each sample, seq_len / this tokens each, through the embeddings, norms, MLPs and experts, the head and the loss; around attention an all-to-all turns [tokens / this, all heads] into [all tokens, heads / this] and back. The batch math counts data-parallel ranks / this (they read distinct rows); ZeRO and the gradient reduction span all of them. Must divide a stage's data-parallel ranks, data.seq_len and model.num_heads (key and value heads are repeated to the heads first). Dense and MLA + MoE models (the balance loss and expert load over the whole rows), MTP (targets across shard edges), expert and pipeline parallelism, recompute, LoRA, packed documents and evaluation; activation memory per rank falls by about this factor (--dry-run shows both). eval.tasks and eval.samples generate whole sequences on each rank. Not yet with MTP and a pipeline together, pair objectives, micro_batch_mean or data.shard_weights. 1: none.", DS_FIELD(parallel.sequence_parallel_size)},
    {"pipeline.schedule", 0, 0, DS_CHOICES(pipeline.schedule), "The order of each step's forwards and backwards on every stage: gpipe (all forwards, then all backwards: m micro-batches held), 1f1b (PipeDream-Flush: at most p held, bubble (p-1)/m), interleaved_1f1b (Megatron's, with pipeline.virtual_stages v >= 2: bubble (p-1)/(v m), more transfers), zb_h1 (zero-bubble H1: backward split into input- and weight-gradient passes, bubble (p-1)(F+I-W)/(m(F+I+W)), a third of 1f1b's when the three cost the same, at 1f1b's peak memory). The micro-batches per step m are the accumulation steps; all but gpipe need m >= pipeline_parallel_size.", DS_ENUM(pipeline.schedule)},
    {"pipeline.virtual_stages", 1, 64, {}, "Stages per pipeline rank (interleaved_1f1b: 2 or more; rank r holds stages r, r + p, ...). The model then has pipeline_parallel_size x this stages, each at least one decoder layer.", DS_FIELD(pipeline.virtual_stages)},
    {"pipeline.layers_per_stage", 1, 1024, {}, "Decoder layers of each stage, in order, e.g. [3, 4, 4, 3]: one entry per stage (pipeline_parallel_size x virtual_stages), each at least 1, adding up to model.num_layers. Empty: the split that balances the stages' training FLOPs, with the embedding counted on the first stage and the head and loss on the last.", DS_FIELD(pipeline.layers_per_stage)},
  };
}

std::vector<Field> checkpoint_fields() {
  return {
    {"checkpoint.dir", 0, 0, {}, "Checkpoint directory; empty: run_dir/ckpt.", DS_FIELD(checkpoint.dir)},
    {"checkpoint.interval_steps", 0, kMaxInt, {}, "Checkpoint every N steps (0: off; the end is saved unless checkpoint.at_end is false).", DS_FIELD(checkpoint.interval_steps)},
    {"checkpoint.interval_minutes", 0, kInf, {}, "Checkpoint every N minutes of training (0: off).", DS_FIELD(checkpoint.interval_minutes)},
    {"checkpoint.keep_last", 0, kMaxInt, {}, "Keep the newest N checkpoints (0: keep all).", DS_FIELD(checkpoint.keep_last)},
    {"checkpoint.keep_every", 0, kMaxInt, {}, "Also keep checkpoints whose step is a multiple of N (0: none).", DS_FIELD(checkpoint.keep_every)},
    {"checkpoint.async", 0, 0, {}, "Write checkpoints in the background.", DS_FIELD(checkpoint.async)},
    {"checkpoint.at_end", 0, 0, {}, "Save a checkpoint after the last step (false: only the interval's, a stop's and SAVE_NOW's; for benchmarks, whose final checkpoint of a large model takes minutes and tens of GB).", DS_FIELD(checkpoint.at_end)},
    {"checkpoint.keep_best", 0, 0, {}, "Save a checkpoint at each new lowest validation loss (the first eval set) and keep it, whatever keep_last says, while it is the best; ckpt/best names it.", DS_FIELD(checkpoint.keep_best)},
    {"checkpoint.mtbf_hours", 0, kInf, {}, "Expected hours between failures of the job; the log suggests the Young/Daly checkpoint interval sqrt(2 x save time x MTBF) from it.", DS_FIELD(checkpoint.mtbf_hours)},
  };
}

std::vector<Field> logging_fields() {
  return {
    {"logging.steps_per_print", 0, kMaxInt, {}, "Print a metrics line every N steps (0: never).", DS_FIELD(logging.steps_per_print)},
    {"logging.sinks", 0, 0, DS_CHOICES(logging.sinks), "Where metrics go: console lines, run_dir/metrics.jsonl, one CSV file per metric, TensorBoard event files, Weights & Biases and MLflow (through their Python SDKs, in a side process of the launcher; WANDB_MODE, WANDB_API_KEY and MLFLOW_TRACKING_URI as the SDKs read them).", DS_ENUM(logging.sinks)},
    {"logging.tensorboard_dir", 0, 0, {}, "TensorBoard event files (ds_config: tensorboard.output_path/job_name); empty: run_dir/tensorboard.", DS_FIELD(logging.tensorboard_dir)},
    {"logging.csv_dir", 0, 0, {}, "CSV files, one per metric (ds_config: csv_monitor.output_path/job_name); empty: run_dir/csv.", DS_FIELD(logging.csv_dir)},
    {"logging.python", 0, 0, {}, "The Python interpreter whose wandb/mlflow packages the wandb and mlflow sinks use; empty: $DSTRAIN_PYTHON, else python3 on PATH.", DS_FIELD(logging.python)},
    {"logging.run_name", 0, 0, {}, "The run's name in Weights & Biases and MLflow; empty: the run directory's name.", DS_FIELD(logging.run_name)},
    {"logging.wandb_project", 0, 0, {}, "Weights & Biases project (ds_config: wandb.project).", DS_FIELD(logging.wandb_project)},
    {"logging.wandb_entity", 0, 0, {}, "Weights & Biases entity (team); empty: the SDK's default (ds_config: wandb.team).", DS_FIELD(logging.wandb_entity)},
    {"logging.wandb_group", 0, 0, {}, "Weights & Biases run group (ds_config: wandb.group).", DS_FIELD(logging.wandb_group)},
    {"logging.mlflow_experiment", 0, 0, {}, "MLflow experiment name.", DS_FIELD(logging.mlflow_experiment)},
    {"logging.wall_clock_breakdown", 0, 0, {}, "Split each step into forward, backward, gradient reduce, parameter gather, optimizer, data and checkpoint time (ds_config wall_clock_breakdown).", DS_FIELD(logging.wall_clock_breakdown)},
    {"logging.straggler_interval", 0, kMaxInt, {}, "Every N steps the ranks' compute and wait times are compared; slow ranks are reported (0: never).", DS_FIELD(logging.straggler_interval)},
    {"logging.straggler_threshold", 0, kInf, {}, "A rank whose compute time exceeds the median by more than this fraction is a straggler.", DS_FIELD(logging.straggler_threshold)},
    {"logging.profile_step", 0, kMaxInt, {}, "Record this step (1-based) with the PyTorch profiler (Kineto): a Chrome trace per rank in run_dir/profile, for Perfetto or chrome://tracing, and a log line with the CPU ops, kernel launches and GPU kernels it ran (0: none).", DS_FIELD(logging.profile_step)},
  };
}

std::vector<Field> launch_fields() {
  return {
    {"launch.nproc_per_node", 1, 1024, {}, "Worker processes per node.", DS_FIELD(launch.nproc_per_node)},
    {"launch.nnodes", 1, 65536, {}, "Number of nodes.", DS_FIELD(launch.nnodes)},
    {"launch.node_rank", 0, 65535, {}, "This node's index.", DS_FIELD(launch.node_rank)},
    {"launch.threads_per_worker", 0, 1024, {}, "Intra-op threads per worker (0: OMP_NUM_THREADS when the environment sets it, as torchrun does, else cores / workers).", DS_FIELD(launch.threads_per_worker)},
    {"launch.master_addr", 0, 0, {}, "Address of the rendezvous store.", DS_FIELD(launch.master_addr)},
    {"launch.master_port", 0, 65535, {}, "Port of the rendezvous store (0: pick a free one).", DS_FIELD(launch.master_port)},
    {"launch.max_restarts", 0, 1000, {}, "Restarts from the last checkpoint after a failure.", DS_FIELD(launch.max_restarts)},
    {"launch.max_time_minutes", 0, kInf, {}, "Wall-time budget of each launch (--max-time): when it is spent, a coordinated stop with a checkpoint (exit 75); 0: none.", DS_FIELD(launch.max_time_minutes)},
    {"launch.stop_grace_s", 1, 86400, {}, "After SIGTERM/SIGINT the workers finish the step and save a checkpoint; whatever is left after this many seconds is killed.", DS_FIELD(launch.stop_grace_s)},
    {"launch.timeout_s", 1, 86400, {}, "Rendezvous timeout in seconds: every rank must arrive within it.", DS_FIELD(launch.timeout_s)},
    {"launch.collective_timeout_s", 1, 86400, {}, "A collective that waits longer is a hang: the launcher names the stuck rank and its op, stops the group and (launch.max_restarts) restarts.", DS_FIELD(launch.collective_timeout_s)},
    {"launch.env_check", 0, 0, {}, "Before training, the workers compare software, hardware, config and data files across ranks (as `dstrain check-env`, without its probes); a mismatch stops the job (exit 5). --skip-env-check turns it off for one launch.", DS_FIELD(launch.env_check)},
    {"launch.heartbeat_timeout_s", 1, 86400, {}, "A worker (or another node's launcher) not heard from for this long is frozen or gone: reported by rank, host and phase, then handled as a failure.", DS_FIELD(launch.heartbeat_timeout_s)},
  };
}
// clang-format on

}  // namespace

const std::vector<Field>& recipe_schema() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> all;
    for (auto section :
         {top_fields, model_fields, data_fields, eval_fields, optimizer_fields, schedule_fields, train_fields, preference_fields,
          lora_fields, precision_fields, zero_fields, moe_fields, pipeline_fields, checkpoint_fields, logging_fields, launch_fields}) {
      std::vector<Field> rows = section();
      all.insert(all.end(), rows.begin(), rows.end());
    }
    return all;
  }();
  return fields;
}

#undef DS_FIELD
#undef DS_CHOICES
#undef DS_ENUM

const Field* find_field(const std::string& path) {
  for (const auto& f : recipe_schema())
    if (f.path == path) return &f;
  return nullptr;
}

const std::vector<std::string>& recipe_sections() {
  static const std::vector<std::string> sections = {"model",      "data",       "eval",      "optimizer", "schedule", "train",
                                                    "preference", "lora",       "precision", "zero",      "moe",      "parallel",
                                                    "pipeline",   "checkpoint", "logging",   "launch"};
  return sections;
}

std::vector<std::string> keys_under(const std::string& section) {
  std::vector<std::string> keys;
  for (const auto& f : recipe_schema()) {
    const auto dot = f.path.find('.');
    if (section.empty() && dot == std::string::npos) keys.push_back(f.path);
    if (!section.empty() && dot != std::string::npos && f.path.compare(0, dot, section) == 0 && dot == section.size())
      keys.push_back(f.path.substr(dot + 1));
  }
  if (section.empty()) {
    keys.insert(keys.end(), recipe_sections().begin(), recipe_sections().end());
    keys.push_back("deepspeed");
  }
  return keys;
}

namespace {
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(3, key.size() / 4);  // close matches only
  for (const auto& c : candidates) {
    const size_t d = edit_distance(key, c);
    if (d < best_d) best_d = d, best = c;
  }
  // A key cut short or run on (gradient_clip for gradient_clipping) is as likely a typo.
  for (const auto& c : candidates) {
    if (!best.empty() || std::min(key.size(), c.size()) < 6) break;
    if (c.compare(0, key.size(), key) == 0 || key.compare(0, c.size(), c) == 0) best = c;
  }
  return best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best);
}

namespace {
template <typename T>
std::string map_text(const std::map<std::string, T>& values) {
  std::vector<std::string> parts;
  for (const auto& [key, value] : values) parts.push_back(fmt::format("{}: {:g}", key, static_cast<double>(value)));
  return fmt::format("{{{}}}", fmt::join(parts, ", "));
}
}  // namespace

std::string value_text(const Field& field, Recipe& recipe) {
  struct Visitor {
    std::string operator()(int64_t* v) const { return std::to_string(*v); }
    std::string operator()(uint64_t* v) const { return std::to_string(*v); }
    std::string operator()(double* v) const { return fmt::format("{:g}", *v); }
    std::string operator()(bool* v) const { return *v ? "true" : "false"; }
    std::string operator()(std::string* v) const { return v->empty() ? "\"\"" : *v; }
    std::string operator()(std::vector<double>* v) const { return fmt::format("[{:g}]", fmt::join(*v, ", ")); }
    std::string operator()(std::vector<std::string>* v) const { return fmt::format("[{}]", fmt::join(*v, ", ")); }
    const Field& field;
    std::string operator()(const EnumTarget& e) const { return field.choices.at(e.get()); }
    std::string operator()(const EnumListTarget& e) const {
      std::vector<std::string> names;
      for (size_t i : e.get()) names.push_back(field.choices.at(i));
      return fmt::format("[{}]", fmt::join(names, ", "));
    }
    std::string operator()(std::map<std::string, int64_t>* v) const { return map_text(*v); }
    std::string operator()(std::map<std::string, double>* v) const { return map_text(*v); }
    std::string operator()(std::vector<AccumulationStage>* v) const {
      std::vector<std::string> parts;
      for (const auto& s : *v)
        parts.push_back(s.until_step ? fmt::format("{{until_step: {}, steps: {}}}", s.until_step, s.steps)
                                     : fmt::format("{{steps: {}}}", s.steps));
      return fmt::format("[{}]", fmt::join(parts, ", "));
    }
  };
  return std::visit(Visitor{field}, field.target(recipe));
}

}  // namespace dstrain::config
