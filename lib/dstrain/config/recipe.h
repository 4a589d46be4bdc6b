#pragma once
// The validated, immutable description of a training run. Built once by load_recipe() (the
// launcher) from recipe YAML + ds_config JSON + --set overrides, or read back from
// run_dir/config.resolved.json by read_resolved_config() (workers). Every module takes only its
// own section; only train/ sees the whole.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dstrain/config/enums.h"
#include "dstrain/config/parallel_layout.h"

namespace dstrain::config {

struct ModelConfig {
  // dense: LLaMA-style (deepseek-llm, deepseek-coder). mla_moe: DeepSeek-V2/V3 (MLA attention,
  // DeepSeekMoE feed-forward after first_k_dense_replace dense layers).
  ModelFamily family = ModelFamily::kDense;
  std::string hf_config;  // a Hugging Face config.json to take the sizes from ("" = none)
  std::string init_from;  // a Hugging Face model directory to start from ("" = random init)
  int64_t vocab_size = 256;
  int64_t hidden_size = 64;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 0;  // dense: grouped KV heads; 0 = num_heads
  int64_t intermediate_size = 172;
  int64_t max_seq_len = 64;
  double rope_theta = 10000.0;
  // RoPE scaling as Hugging Face's rope_parameters / rope_scaling give it: linear (positions /
  // factor) or YaRN (Peng et al. 2023; DeepSeek-V2/V3's context extension).
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_factor = 1.0;
  int64_t rope_original_max_position = 0;  // yarn: the pretraining context; 0: max_seq_len
  double rope_beta_fast = 32, rope_beta_slow = 1;
  double rope_mscale = 0, rope_mscale_all_dim = 0;  // yarn: 0 = not given
  double rope_attention_factor = 0;                 // yarn: cos/sin scale; 0 = derived from factor and mscale
  double rms_norm_eps = 1e-6;
  double init_std = 0.02;
  // MLA (mla_moe)
  int64_t q_lora_rank = 0;  // 0: a direct q_proj (V2-Lite)
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
  // DeepSeekMoE (mla_moe)
  int64_t moe_intermediate_size = 1408;
  int64_t n_routed_experts = 64;
  int64_t n_shared_experts = 2;
  int64_t num_experts_per_tok = 6;
  int64_t first_k_dense_replace = 1;
  int64_t moe_layer_freq = 1;
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;  // softmax (V2) or sigmoid (V3)
  TopkMethod topk_method = TopkMethod::kGreedy;      // greedy, group_limited_greedy, noaux_tc (V3)
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  double aux_loss_alpha = 0.001;     // sequence-wise balance loss weight; 0 disables
  double bias_update_speed = 0.001;  // gamma of V3's aux-loss-free bias (noaux_tc)
  // Multi-token prediction (DeepSeek-V3, mla_moe): mtp_depth sequential modules after the main
  // model, module k predicting the token k + 1 ahead; loss weight λ (the MTP loss is λ / D times
  // the sum of the depths' cross-entropies over the step's trained targets), optionally changed
  // to mtp_loss_weight_after once mtp_loss_weight_until_tokens tokens were trained (V3: 0.3 for
  // the first 10T tokens, then 0.1).
  int64_t mtp_depth = 0;
  double mtp_loss_weight = 0.3;
  // The head is transformers' `score` [1, hidden] (a reward model, *ForSequenceClassification with
  // num_labels 1) instead of lm_head [vocab, hidden]: set from train.objective reward, not a key.
  bool score_head = false;
  int64_t mtp_loss_weight_until_tokens = 0;  // 0: the weight never changes
  double mtp_loss_weight_after = 0.1;
  // λ for a step that starts after `tokens` trained tokens.
  double mtp_weight_at(int64_t tokens) const {
    return mtp_loss_weight_until_tokens > 0 && tokens >= mtp_loss_weight_until_tokens ? mtp_loss_weight_after : mtp_loss_weight;
  }

  bool is_moe_layer(int64_t layer) const {
    return family == ModelFamily::kMlaMoe && layer >= first_k_dense_replace && layer % std::max<int64_t>(1, moe_layer_freq) == 0;
  }
};

struct DataConfig {
  std::string path;                        // absolute after loading (relative paths are to the recipe file)
  std::vector<std::string> paths;          // several sources (absolute after loading); data.path unused then
  std::vector<double> weights;             // blend weights of `paths`; empty: by size
  DataFormat format = DataFormat::kBytes;  // bytes: one token per byte of the file (vocab 256)
  int64_t seq_len = 64;
  bool document_mask = false;    // attention stays within documents (ends marked by eos_token)
  int64_t eos_token = -1;        // the end-of-document token; -1: none (256 for prepare-data output)
  bool reset_positions = false;  // RoPE positions restart at 0 in each document (needs eos_token)
  // A fine-tuning set (prepare-data --chat: a loss mask beside the data) trains whole
  // conversations, packed into rows of seq_len tokens (data/packing.h); pretraining text ignores it.
  Packing packing = Packing::kNone;
  int64_t seed = -1;                  // data order seed; -1: the run's seed
  bool other_tokenizer = false;       // train on data tokenized otherwise than model.init_from's tokenizer
  std::vector<double> shard_weights;  // per-rank share of each global batch; empty: equal
  bool auto_balance = false;          // `shard_weights: auto`: measure the ranks' speed, then weight
  int64_t balance_steps = 5;          // steps measured (with equal shares) before auto weights apply
  // The training sources: data.paths, or data.path alone.
  std::vector<std::string> sources() const { return paths.empty() ? std::vector<std::string>{path} : paths; }
};

// Held-out evaluation (train/evaluator.h): the token-weighted validation loss of fixed sets.
struct EvalConfig {
  std::vector<std::string> paths;       // evaluation datasets (absolute after loading), data.format
  std::vector<std::string> names;       // their names in metrics; empty: each path's file stem
  double split = 0;                     // hold out whole training documents: < 1 a fraction, >= 1 a count; 0: none
  int64_t interval_steps = 0;           // evaluate every N steps (0: not during training)
  bool at_start = false;                // before the first step (a baseline: not a best-checkpoint candidate)
  bool at_end = true;                   // after the last step
  int64_t max_batches = 0;              // micro-batches per rank and set (0: the whole set)
  int64_t micro_batch_size = 0;         // 0: train.micro_batch_size
  int64_t early_stopping_patience = 0;  // stop after this many evaluations without improvement (0: never)
  double early_stopping_min_delta = 0;  // an improvement must exceed this
  // Task files (multiple-choice or generative) scored at each evaluation (absolute after loading), as dstrain eval --task
  // scores them, in task_format's rows.
  std::vector<std::string> tasks;
  TaskFormat task_format = TaskFormat::kDstrain;
  int64_t task_batch_size = 1;  // generative questions per generate() on a rank (lm-eval's --batch_size)
  // Text written at each evaluation from these prompts (JSON Lines, absolute after loading; "": none).
  std::string samples;
  int64_t sample_tokens = 64;     // new tokens per prompt at most
  double sample_temperature = 0;  // 0: greedy
  bool enabled() const { return !paths.empty() || split > 0; }
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;  // adamw (decoupled decay) or adam (L2 decay added to the gradient)
  double lr = 3e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

struct ScheduleConfig {
  // warmup_cosine: linear warmup (step+1)/warmup, cosine to lr*min_lr_ratio at the last step.
  // ds_warmup_cosine, ds_warmup, ds_warmup_decay: DeepSpeed's WarmupCosineLR, WarmupLR and
  // WarmupDecayLR, formula for formula. constant: lr throughout. wsd: warmup, stable at the peak,
  // then a linear decay to lr*min_lr_ratio over the last decay_ratio of the steps. ds_one_cycle:
  // DeepSpeed's OneCycle (LR and beta1 cycle, then decay).
  ScheduleType type = ScheduleType::kWarmupCosine;
  int64_t warmup_steps = 10;
  WarmupType warmup_type = WarmupType::kLinear;  // linear or log (ds_* types)
  double warmup_min_ratio = 0.0;                 // warmup starts at lr*warmup_min_ratio (ds_* types)
  double min_lr_ratio = 0.1;                     // where cosine / decay ends
  double decay_ratio = 0.1;                      // wsd: the last fraction of the steps decays linearly
  // How the LR follows the global batch when staged accumulation changes it: none, linear
  // (lr x batch / first batch) or sqrt (lr x sqrt(batch / first batch)).
  BatchScaling batch_scaling = BatchScaling::kNone;
  // ds_one_cycle (DeepSpeed's OneCycle), absolute LRs; cycle_max_lr 0: optimizer.lr.
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = 0;  // 0: the first's
  double decay_lr_rate = 0.0;
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

struct AccumulationStage {
  int64_t until_step = 0;    // this stage covers steps < until_step; 0: to the end
  int64_t steps = 1;         // gradient accumulation steps in the stage
  int64_t until_tokens = 0;  // or: the stage ends once this many tokens were consumed (made into
                             // until_step when the config is resolved; 0: not given)
};

struct TrainConfig {
  int64_t steps = 0;   // optimizer steps; 0: derived from tokens
  int64_t tokens = 0;  // training length in tokens; 0: given as steps
  double epochs = 0;   // passes over a fine-tuning set's packed rows; 0: given as steps or tokens
  // DeepSpeed's batch triple; 0 = not given, inferred as DeepSpeed infers it.
  int64_t micro_batch_size = 0;                 // train_micro_batch_size_per_gpu
  int64_t global_batch_size = 0;                // train_batch_size
  int64_t gradient_accumulation_steps = 0;      // gradient_accumulation_steps
  std::vector<AccumulationStage> accumulation;  // staged accumulation; empty: one stage
  // A batch-size ramp (DeepSeek-V3: 3072 -> 15360 over the first 469B tokens): the global batch
  // starts at batch_ramp_start and grows linearly, one accumulation step at a time, to the
  // global batch over batch_ramp_steps steps or batch_ramp_tokens tokens. Expanded into
  // accumulation stages when the config is resolved. 0: no ramp.
  int64_t batch_ramp_start = 0;
  int64_t batch_ramp_steps = 0;
  int64_t batch_ramp_tokens = 0;
  double grad_clip = 1.0;  // gradient_clipping; 0 disables
  // A NaN/Inf loss or gradient norm outside fp16's loss scaling: "stop" (exit 8), "skip" the
  // update (at most max_bad_steps in a run), or "rollback" to the latest checkpoint in-process.
  BadStepAction on_bad_step = BadStepAction::kStop;
  int64_t max_bad_steps = 10;
  // The LM head and the cross-entropy run this many tokens at a time, fused: the logits of the
  // whole micro-batch never exist (model/chunked_cross_entropy.h). 0: all logits, then the loss.
  int64_t loss_chunk_tokens = 4096;
  // PaLM's z-loss: this weight x logsumexp(logits)^2, averaged over the trained targets, added to
  // the objective (model/z_loss.h) and logged as z_loss. 0: off.
  double z_loss_weight = 0;
  // Activation checkpointing: "full" keeps only each decoder layer's input and recomputes the
  // layer in backward; "selective" keeps the GEMM outputs and recomputes the norms, SwiGLU's
  // activation and the attention core (Korthikanti et al.); "none" keeps everything.
  Recompute activation_checkpointing = Recompute::kNone;
  // What a step's summed token losses are divided by (train/loss_share.h): the
  // step's trained targets (global_tokens), its micro-batches' count after each micro-batch's
  // own mean (micro_batch_mean: DeepSpeed's and Megatron's default), or its samples after each
  // sample's own mean (per_sample: each conversation weighs the same).
  LossNormalization loss_normalization = LossNormalization::kGlobalTokens;
  // What a step minimises: sft (the next-token cross-entropy over the trained tokens), dpo
  // (preference pairs: TRL's DPO losses against the reference's log-probs, `preference`) or
  // reward (preference pairs: a scalar score per sequence, TRL's RewardTrainer's Bradley-Terry loss).
  TrainObjective objective = TrainObjective::kSft;
  // Whether the objective reads preference pairs (prepare-data --preference): all but sft.
  bool trains_pairs() const { return objective != TrainObjective::kSft; }
  // Parameters that do not train (LLaMA-Factory's finetuning_type freeze): Hugging Face name
  // globs (model.layers.[0-3].*) and roles (embeddings, attention, mlp, experts, router, norms,
  // head, mtp). Matched against the model's parameters when it is built (model/freeze.h).
  std::vector<std::string> freeze;
};

// What train.freeze freezes, by layer group (0 the embeddings, 1..L the decoder layers, L+1 the
// final norm, head and MTP): parameter elements outside the routed experts (`dense`) and of
// every routed expert (`routed`); with lora, the whole base but lora.modules_to_save, and the
// adapters it adds. Derived when the recipe is loaded, by the model layer
// (LoadOptions::frozen_counts), from the parameters the model declares; empty when nothing is
// frozen or the loader was not given the counter.
struct FrozenCounts {
  std::vector<double> dense, routed;
  std::vector<double> adapters;         // lora: the adapters' elements by layer group (they train), outside the routed experts
  std::vector<double> routed_adapters;  // lora.experts: the routed experts' adapters by layer group (split over expert parallelism)
  // lora.base nf4 | fp8: of the frozen elements (dense, routed), those kept quantized, by layer group
  // (held whole by every data-parallel rank, outside ZeRO).
  std::vector<double> quantized, quantized_routed;
  bool empty() const { return dense.empty(); }
  // The frozen elements of groups [first, last]: dense or routed.
  double in_groups(int first, int last, bool experts) const { return sum(experts ? routed : dense, first, last); }
  // The adapters' elements of groups [first, last] (model parameters beyond the config's counts).
  double adapters_in(int first, int last) const { return sum(adapters, first, last); }
  double routed_adapters_in(int first, int last) const { return sum(routed_adapters, first, last); }
  double quantized_in(int first, int last, bool experts) const { return sum(experts ? quantized_routed : quantized, first, last); }

 private:
  static double sum(const std::vector<double>& v, int first, int last) {
    double n = 0;
    for (int g = std::max(first, 0); g <= last && g < static_cast<int>(v.size()); ++g) n += v[static_cast<size_t>(g)];
    return n;
  }
};

struct PrecisionConfig {
  Dtype dtype = Dtype::kFp32;  // fp32, bf16 or fp16
  // fp16 dynamic loss scaling, DeepSpeed's fp16 section.
  double loss_scale = 0.0;  // 0: dynamic
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  int64_t min_loss_scale = 1;
};

struct ZeroConfig {
  int64_t stage = 0;
  int64_t reduce_bucket_size = 500000000;     // elements
  int64_t allgather_bucket_size = 500000000;  // elements
  bool overlap_comm = false;                  // DeepSpeed: true iff stage 3 when not given
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  OffloadDevice offload_optimizer = OffloadDevice::kNone;
  OffloadDevice offload_param = OffloadDevice::kNone;  // stage 3
  bool pin_memory = true;                              // offloaded host state and staging page-locked
  bool delayed_update = false;                         // offload: ZeRO-Offload's one-step delayed parameter update (changes the math)
  int64_t delayed_update_after = 40;                   // ... from this many applied updates on (the first ones undelayed)
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  int64_t sub_group_size = 1000000000;
};

// train.objective dpo: the loss and its reference, with TRL's DPOConfig names (model/preference_loss.h);
// cpo, simpo and orpo (no reference) with CPOConfig's and ORPOConfig's (model/reference_free_loss.h);
// reward reads center_rewards_coefficient alone (model/reward_loss.h).
struct PreferenceConfig {
  double beta = 0.1;                                 // DPO's beta (IPO's tau)
  std::vector<std::string> loss_type = {"sigmoid"};  // TRL's loss_type: one or several, summed with loss_weights
  std::vector<double> loss_weights;                  // one per loss_type; empty: 1 each
  double label_smoothing = 0;                        // cDPO's and robust DPO's epsilon, EXO's
  double discopop_tau = 0.05;                        // DiscoPOP's temperature (loss_type discopop)
  std::string f_divergence_type = "reverse_kl";      // f-DPO: reverse_kl, forward_kl, js_divergence, alpha_divergence
  double f_alpha_divergence_coef = 0.5;              // alpha_divergence's alpha
  // LD-DPO: each completion's tokens past the pair's shorter completion weigh this much in its
  // log-prob sum (policy and reference alike); 1: plain sums (TRL's ld_alpha None).
  double ld_alpha = 1.0;
  bool use_weighting = false;  // WPO: each pair's loss times both completions' length-normalized probabilities
  // train.objective cpo and simpo (TRL's CPOConfig): the chosen completions' mean negative
  // log-likelihood per token, times cpo_alpha, is added to the loss (resolved: 1 for cpo, 0 for
  // simpo, as SimPO trains); simpo_gamma is SimPO's target reward margin.
  double cpo_alpha = 1.0;
  double simpo_gamma = 0.5;
  double alpha = 0;  // AlphaPO (cpo, simpo): each reward is (1 - p^-alpha) / alpha of its probability p; 0: log p
  // train.objective reward: TRL's center_rewards_coefficient, times the pairs' mean of
  // (chosen score + rejected score)^2 added to the loss (0: TRL's None).
  double center_rewards_coefficient = 0;
  // train.objective dpo and kto: where the reference's log-probs come from: precomputed (one pass
  // by the starting model, kept beside the set: train/reference_logps.h), live (with LoRA: the model
  // with its adapters off, at every micro-batch: train/live_reference.h) or none (0: the loss on the
  // policy's log-probs alone, TRL < 1's reference_free).
  std::string reference = "precomputed";
  // TR-DPO (TRL's sync_ref_model, dpo and kto with reference live without LoRA): every
  // ref_model_sync_steps steps the reference copy becomes ref_model_mixup_alpha x the policy +
  // (1 - ref_model_mixup_alpha) x itself (train/live_reference.h); checkpoints then hold the copy.
  bool sync_ref_model = false;
  double ref_model_mixup_alpha = 0.6;
  int64_t ref_model_sync_steps = 512;
  // train.objective kto (TRL's KTOConfig): each desirable example's loss, and each undesirable one's, times these.
  double desirable_weight = 1.0;
  double undesirable_weight = 1.0;
};

// Low-rank adapters (PEFT's LoraConfig, under its names): each targeted projection gets
// y += (x Aᵀ) Bᵀ · alpha / rank (alpha / √rank with use_rslora); the base does not train.
struct LoraConfig {
  int64_t rank = 0;    // PEFT's r; 0: no adapters (every parameter trains)
  double alpha = 8;    // lora_alpha (PEFT's default)
  double dropout = 0;  // lora_dropout
  // Projections by module name (q_proj, q_a_proj, kv_b_proj, o_proj, gate_proj, ...) or all-linear.
  std::vector<std::string> targets = {"all-linear"};
  bool use_rslora = false;
  bool use_dora = false;                     // DoRA: a trained magnitude per output row
  std::vector<std::string> modules_to_save;  // modules trained in full beside the adapters (embed_tokens, lm_head)
  std::string init_from;                     // a PEFT adapter folder to start from (absolute); "": fresh adapters
  // Per-module overrides (PEFT's rank_pattern and alpha_pattern): key a regular expression that
  // matches the module's name or its last dotted parts (PEFT's (.*\.)?(key)$), value its rank or alpha.
  std::map<std::string, int64_t> rank_pattern;
  std::map<std::string, double> alpha_pattern;
  // The routed experts' gate_proj, up_proj and down_proj (those targets names) get adapters too:
  // per expert, beside its weights (exported as PEFT's per-expert modules, which PEFT under
  // transformers 5 fuses into target_parameters).
  bool experts = false;
  // How the frozen projections are kept: in the model's dtype, in 4-bit NF4 as bitsandbytes makes
  // it (QLoRA), or in DeepSeek's 128x128-block FP8 (as the release stores them, or quantized so).
  LoraBase base = LoraBase::kModel;
  bool enabled() const { return rank > 0; }
};

struct MoeConfig {
  // Expert parallelism: each MoE layer's routed experts are spread over this many consecutive
  // ranks (tokens dispatched by all-to-all); each expert is data-parallel over world / this.
  int64_t expert_parallel_size = 1;
};

struct ParallelConfig {
  // Pipeline parallelism: the model's layers split into this many consecutive stages, each on its
  // own rank; the world is data-parallel x pipeline, each stage data-parallel (and ZeRO-sharded,
  // expert-parallel) over world / this ranks.
  int64_t pipeline_parallel_size = 1;
  // Ulysses sequence parallelism: this many consecutive ranks of a data-parallel group share each
  // sample, T / this tokens each, exchanging heads for tokens around attention (all-to-all).
  int64_t sequence_parallel_size = 1;
};

struct PipelineConfig {
  PipelineSchedule schedule = PipelineSchedule::k1F1B;
  int64_t virtual_stages = 1;            // stages per pipeline rank (interleaved_1f1b: 2 or more)
  std::vector<double> layers_per_stage;  // decoder layers of each stage; empty: balanced by cost
};

struct CheckpointConfig {
  std::string dir;              // "" = run_dir/ckpt
  int64_t interval_steps = 0;   // 0: no step-based saves (the end is saved unless at_end is false)
  double interval_minutes = 0;  // 0: no time-based saves
  int64_t keep_last = 2;        // 0 keeps all
  int64_t keep_every = 0;       // also keep every checkpoint whose step is a multiple; 0: none
  bool async = false;
  bool keep_best = false;  // also keep the checkpoint with the lowest validation loss (ckpt/best)
  bool at_end = true;      // save after the last step (benchmarks turn it off: a large model's checkpoint fills a disk)
  double mtbf_hours = 24;  // expected hours between failures: for the Young/Daly interval suggestion
};

struct LoggingConfig {
  int64_t steps_per_print = 10;  // 0: never
  std::vector<Sink> sinks = {Sink::kConsole, Sink::kJsonl};
  bool has_sink(Sink sink) const { return std::find(sinks.begin(), sinks.end(), sink) != sinks.end(); }
  std::string tensorboard_dir;        // "" = run_dir/tensorboard (ds_config: tensorboard.output_path/job_name)
  std::string csv_dir;                // "" = run_dir/csv (ds_config: csv_monitor.output_path/job_name)
  bool wall_clock_breakdown = false;  // forward/backward/reduce/gather/optimizer/checkpoint times per step
  int64_t straggler_interval = 20;    // steps between straggler checks (0: never)
  double straggler_threshold = 0.2;   // slower than the median compute time by this fraction
  int64_t profile_step = 0;           // this step (1-based) recorded with the PyTorch profiler (0: none)
  // wandb and mlflow sinks: a side process of the launcher on node 0 (launch/tracker.h).
  std::string python;    // the interpreter with their SDKs; "" = $DSTRAIN_PYTHON, else python3
  std::string run_name;  // "" = run_dir's name
  std::string wandb_project = "dstrain";
  std::string wandb_entity;  // "" = the SDK's default (ds_config: wandb.team)
  std::string wandb_group;   // ds_config: wandb.group
  std::string mlflow_experiment = "dstrain";
  bool has_tracker() const { return has_sink(Sink::kWandb) || has_sink(Sink::kMlflow); }
};

struct LaunchConfig {
  int64_t nproc_per_node = 1;
  int64_t nnodes = 1;
  int64_t node_rank = 0;
  int64_t threads_per_worker = 0;  // 0: the node's cores divided among its workers
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;  // 0: pick a free port
  int64_t max_restarts = 0;
  int64_t stop_grace_s = 60;           // after SIGTERM/SIGINT: time to reach a step boundary and save before SIGKILL
  double max_time_minutes = 0;         // wall-time budget of each launch: then a coordinated stop (0: none)
  int64_t timeout_s = 300;             // rendezvous timeout
  int64_t collective_timeout_s = 600;  // a collective waiting longer is a hang
  int64_t heartbeat_timeout_s = 60;    // a worker or launcher silent this long is frozen or gone
  bool env_check = true;               // the workers compare their facts before training (check-env)
};

struct Recipe {
  std::string source_path;     // the recipe file it came from
  std::string ds_config_path;  // absolute; "" when none (or inline `deepspeed:`)
  std::string run_dir;         // absolute
  uint64_t seed = 1234;
  ModelConfig model;
  DataConfig data;
  EvalConfig eval;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  TrainConfig train;
  PreferenceConfig preference;
  LoraConfig lora;
  PrecisionConfig precision;
  ZeroConfig zero;
  MoeConfig moe;
  ParallelConfig parallel;
  PipelineConfig pipeline;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  LaunchConfig launch;
  // Where each value came from, by key path: "default", "recipe.yaml:12:3",
  // "ds_config.json:4:5", "--set", or a derivation ("derived: train_batch_size / ...").
  std::map<std::string, std::string> sources;
  std::vector<std::string> warnings;  // printed by the launcher; not part of the hash
  FrozenCounts frozen;                // what train.freeze or lora freezes (derived at load; not part of the hash)

  int64_t world_size() const { return launch.nproc_per_node * launch.nnodes; }
  // The ranks over the parallel axes (config/parallel_layout.h).
  ParallelLayout layout() const {
    return {static_cast<int>(world_size()), static_cast<int>(std::max<int64_t>(1, parallel.pipeline_parallel_size)),
            static_cast<int>(std::max<int64_t>(1, moe.expert_parallel_size)),
            static_cast<int>(std::max<int64_t>(1, parallel.sequence_parallel_size))};
  }
  // The ranks of a pipeline stage that read distinct rows: what the batch math counts (a sequence
  // group's ranks share their rows).
  int64_t data_parallel_size() const { return layout().samples(); }
  // The data order's seed: data.seed, or the run's.
  uint64_t data_seed() const { return data.seed >= 0 ? static_cast<uint64_t>(data.seed) : seed; }
};

// A last layer, after --set and before the config is resolved: a function of the layered recipe
// that returns more "key.path=value" assignments, each with the source to record for it (the
// launcher's topology decision, which reads the launch section, is one).
struct LayerValue {
  std::string assignment;
  std::string source;
};
using LastLayer = std::function<std::vector<LayerValue>(const Recipe& layered)>;

// Reads and validates a recipe. `overrides` are "key.path=value" strings (--set), then `last`
// (called only when the layers so far have no problem). Every problem is collected; one
// Error{kConfig} lists them all, each with file:line:column.
// data_may_be_missing (check-env): a dataset this node lacks is a warning, not an Error{kData},
// so that the rank goes on to report it among its facts instead of leaving the others waiting.
// packed_rows (train.epochs): the number of rows the fine-tuning sets pack into under the layered
// recipe (data.packing, data.seq_len, eval.split, the seed), -1 when the data are not fine-tuning
// sets, 0 when a source does not exist (validation reports that).
// The data layer answers it (train::packed_rows_of); without it train.epochs is refused.
struct LoadOptions {
  bool data_may_be_missing = false;
  std::function<int64_t(const Recipe&)> packed_rows;
  // train.freeze: the frozen parameter counts of the layered recipe's model (Recipe::frozen);
  // throws Error{kConfig} for a pattern that matches nothing. The model layer answers it
  // (model::frozen_counts_of); without it the counts stay empty (the worker freezes all the same).
  std::function<FrozenCounts(const Recipe&)> frozen_counts;
};
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {}, const LastLayer& last = {},
                   const LoadOptions& options = {});

// The same run on another number of ranks (resume after losing or gaining nodes): the global
// batch stays, the accumulation steps follow. Throws Error{kUsage} when the global batch does not
// split over the new ranks, or when staged accumulation or shard weights tie the math to the
// old rank count.
Recipe resized_for(const Recipe& recipe, int64_t nproc_per_node, int64_t nnodes);

// The accumulation steps at optimizer step `step` (0-based), and the global batch then.
int64_t accumulation_at(const Recipe& recipe, int64_t step);
int64_t global_batch_at(const Recipe& recipe, int64_t step);
// Samples consumed by steps [0, step): the global data cursor before `step`.
int64_t samples_before(const Recipe& recipe, int64_t step);

// Canonical JSON of the config values (sorted keys, no sources) and its hash, as written to
// run_dir/config.resolved.json together with the sources. Workers read only that file.
std::string to_canonical_json(const Recipe& recipe);
std::string config_hash(const Recipe& recipe);
void write_resolved_config(const Recipe& recipe, const std::string& path);
// Reads config.resolved.json and checks its recorded hash; throws Error{kConfig} on mismatch.
Recipe read_resolved_config(const std::string& path);

}  // namespace dstrain::config
