// Derived values and cross-field checks, once every layer is read: DeepSpeed's batch triple,
// the length in steps, and the checks that span sections.
#include <fmt/format.h>

#include <cmath>
#include <algorithm>
#include <tuple>
#include <filesystem>
#include <set>

#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/config/inert_keys.h"
#include "dstrain/config/load_context.h"
#include "dstrain/config/pipeline_check.h"
#include "dstrain/config/schema.h"
#include "dstrain/config/sequence_parallel_check.h"
#include "dstrain/core/error.h"

#include <fmt/ranges.h>

namespace dstrain::config {
namespace {

std::string src(const Recipe& r, const std::string& key) { return r.sources.at(key); }

// DeepSpeed's _set_batch_related_parameters + _batch_assertion, with messages that give the numbers.
void resolve_batch(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  auto& t = r.train;
  // With pipeline parallelism, a step's batch is split over the data-parallel ranks only.
  const int64_t ws = r.data_parallel_size();
  const std::string ranks =
      fmt::format("{} {}rank{}", ws, r.parallel.pipeline_parallel_size > 1 ? "data-parallel " : "", ws == 1 ? "" : "s");

  if (!t.accumulation.empty()) {
    if (t.gradient_accumulation_steps)
      ctx.problems.push_back(
          fmt::format("train.gradient_accumulation_steps ({}) conflicts with train.accumulation ({}): the stages set the "
                      "accumulation steps; remove one",
                      src(r, "train.gradient_accumulation_steps"), src(r, "train.accumulation")));
    if (t.global_batch_size)
      ctx.problems.push_back(
          fmt::format("train.global_batch_size ({}) conflicts with train.accumulation ({}): with staged accumulation the global "
                      "batch is micro x ranks x the stage's steps; remove train.global_batch_size",
                      src(r, "train.global_batch_size"), src(r, "train.accumulation")));
    if (!t.micro_batch_size) ctx.problems.push_back("train.accumulation needs train.micro_batch_size (train_micro_batch_size_per_gpu)");
    return;
  }

  int64_t tb = t.global_batch_size, micro = t.micro_batch_size, gas = t.gradient_accumulation_steps;
  std::string how;
  if (tb && micro && gas) {
  } else if (tb && micro) {
    gas = tb / micro / ws, how = fmt::format("train_batch_size {} // micro {} // {}", tb, micro, ranks);
    r.sources["train.gradient_accumulation_steps"] = "derived: " + how;
  } else if (tb && gas) {
    micro = tb / ws / gas, how = fmt::format("train_batch_size {} // {} // accumulation {}", tb, ranks, gas);
    r.sources["train.micro_batch_size"] = "derived: " + how;
  } else if (micro && gas) {
    tb = micro * gas * ws;
    r.sources["train.global_batch_size"] = fmt::format("derived: micro {} x accumulation {} x {}", micro, gas, ranks);
  } else if (tb) {
    gas = 1, micro = tb / ws, how = fmt::format("train_batch_size {} // {}", tb, ranks);
    r.sources["train.gradient_accumulation_steps"] = "derived: 1 (only train_batch_size given)";
    r.sources["train.micro_batch_size"] = "derived: " + how;
  } else if (micro) {
    tb = micro * ws, gas = 1;
    r.sources["train.global_batch_size"] = fmt::format("derived: micro {} x {}", micro, ranks);
    r.sources["train.gradient_accumulation_steps"] = "derived: 1 (only the micro batch given)";
  } else {
    ctx.problems.push_back(
        "Either train.global_batch_size (train_batch_size) or train.micro_batch_size (train_micro_batch_size_per_gpu) needs to be "
        "provided, as in DeepSpeed; e.g. train: {micro_batch_size: 8, global_batch_size: 64}");
    return;
  }
  if (micro <= 0) {
    ctx.problems.push_back(
        fmt::format("the micro batch per rank is {} = 0: the global batch {} is smaller than {} x accumulation {}; "
                    "raise train.global_batch_size to at least {}",
                    how, tb, ranks, gas, ws * gas));
    return;
  }
  if (gas <= 0) {
    ctx.problems.push_back(
        fmt::format("gradient accumulation steps = {} = 0: the global batch {} is smaller than micro {} x {}; "
                    "raise train.global_batch_size to a multiple of {}",
                    how, tb, micro, ranks, micro * ws));
    return;
  }
  if (tb != micro * gas * ws) {
    ctx.problems.push_back(fmt::format(
        "train_batch_size {} != micro {} x accumulation {} x {} = {} (DeepSpeed: 'Check batch related parameters'). "
        "The global batch must be a multiple of micro x ranks = {}: use {} or {}, or change the micro batch or the number of ranks",
        tb, micro, gas, ranks, micro * gas * ws, micro * ws, std::max<int64_t>(1, tb / (micro * ws)) * micro * ws,
        (tb / (micro * ws) + 1) * micro * ws));
    return;
  }
  t.global_batch_size = tb, t.micro_batch_size = micro, t.gradient_accumulation_steps = gas;
}

// Stages that end at a token count end at the first step by which that many tokens were consumed
// (tokens per step = micro x ranks x the stage's steps x seq_len).
void resolve_token_stages(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  auto& stages = r.train.accumulation;
  int64_t step = 0, tokens = 0, prev_until = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    AccumulationStage& s = stages[i];
    const int64_t per_step = r.train.micro_batch_size * r.data_parallel_size() * s.steps * r.data.seq_len;
    if (s.until_tokens) {
      const int64_t more = s.until_tokens > tokens ? (s.until_tokens - tokens + per_step - 1) / per_step : 0;
      s.until_step = step + more;
      r.sources["train.accumulation"] += fmt::format("; stage {} until_tokens {} -> until_step {}", i, s.until_tokens, s.until_step);
    }
    if (s.until_step == 0) break;  // the last stage
    if (s.until_step <= prev_until) {
      ctx.problems.push_back(
          fmt::format("train.accumulation[{}] ends at step {} ({} tokens), not after the previous stage's step {}: the stages "
                      "must grow",
                      i, s.until_step, s.until_tokens ? s.until_tokens : s.until_step * per_step, prev_until));
      return;
    }
    tokens += (s.until_step - step) * per_step;
    step = prev_until = s.until_step;
  }
}

// train.batch_ramp_*: the ramp becomes accumulation stages, one per accumulation level, each
// covering an equal share of the ramp's steps or tokens; the global batch is the last stage's.
void expand_batch_ramp(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  auto& t = r.train;
  if (t.batch_ramp_start == 0) return;
  const std::string start_src = src(r, "train.batch_ramp_start");
  if (!t.accumulation.empty()) {
    ctx.problems.push_back(fmt::format("train.batch_ramp_start ({}) conflicts with train.accumulation ({}): give the ramp or the stages",
                                       start_src, src(r, "train.accumulation")));
    return;
  }
  if ((t.batch_ramp_steps > 0) == (t.batch_ramp_tokens > 0)) {
    ctx.problems.push_back(
        fmt::format("train.batch_ramp_start ({}) needs exactly one of train.batch_ramp_steps and train.batch_ramp_tokens", start_src));
    return;
  }
  const int64_t per_level = t.micro_batch_size * r.data_parallel_size();
  const int64_t final_batch = per_level * t.gradient_accumulation_steps;
  if (t.batch_ramp_start % per_level != 0 || t.batch_ramp_start >= final_batch) {
    ctx.problems.push_back(
        fmt::format("train.batch_ramp_start {} ({}) must be a multiple of micro {} x {} ranks = {} and below the global batch {}",
                    t.batch_ramp_start, start_src, t.micro_batch_size, r.data_parallel_size(), per_level, final_batch));
    return;
  }
  const int64_t first = t.batch_ramp_start / per_level, last = t.gradient_accumulation_steps, levels = last - first;
  int64_t step = 0, prev_until = 0;
  double tokens = 0;
  for (int64_t j = 0; j < levels; ++j) {
    int64_t until;
    if (t.batch_ramp_steps > 0) {
      until = static_cast<int64_t>(
          std::llround(static_cast<double>(t.batch_ramp_steps) * static_cast<double>(j + 1) / static_cast<double>(levels)));
    } else {
      const double target = static_cast<double>(t.batch_ramp_tokens) * static_cast<double>(j + 1) / static_cast<double>(levels);
      const double per_step = static_cast<double>((first + j) * per_level * r.data.seq_len);
      while (tokens < target) tokens += per_step, ++step;
      until = step;
    }
    if (until > prev_until) t.accumulation.push_back({until, first + j}), prev_until = until;
  }
  t.accumulation.push_back({0, last});
  r.sources["train.accumulation"] =
      fmt::format("derived: batch ramp {} -> {} over {} ({} stages)", t.batch_ramp_start, final_batch,
                  t.batch_ramp_steps > 0 ? fmt::format("{} steps", t.batch_ramp_steps) : fmt::format("{} tokens", t.batch_ramp_tokens),
                  t.accumulation.size());
}

// train.epochs: passes over the packed rows of a fine-tuning set, rounded up to whole steps (the
// last step of a pass reads on into the next pass's order, as the sampler runs on).
void resolve_epochs(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  if (!ctx.packed_rows) {
    ctx.problems.push_back("train.epochs: this command cannot count the fine-tuning set's rows; give train.steps instead");
    return;
  }
  int64_t rows = 0;
  try {
    rows = ctx.packed_rows(r);
  } catch (const Error& e) {
    // A conversation longer than a row is one cause, named once by the sidecar check in validate().
    const auto sources = r.data.sources();
    const bool too_long = std::any_of(sources.begin(), sources.end(), [&](const std::string& path) {
      const auto s = read_dataset_sidecar(path, ctx.read);
      return s && s->longest_conversation > r.data.seq_len;
    });
    if (!too_long) ctx.problems.push_back(fmt::format("train.epochs: cannot count the fine-tuning set's rows: {}", e.what()));
    return;
  }
  if (rows < 0) {
    ctx.problems.push_back(
        fmt::format("train.epochs ({}) counts passes over fine-tuning sets (prepare-data --chat), and the data are "
                    "pretraining text; give train.steps or train.tokens",
                    src(r, "train.epochs")));
    return;
  }
  const double wanted = std::ceil(r.train.epochs * static_cast<double>(rows) - 1e-9);
  int64_t steps = 0, samples = 0;
  while (static_cast<double>(samples) < wanted) samples += global_batch_at(r, steps), ++steps;
  r.train.steps = std::max<int64_t>(steps, 1);
  r.sources["train.steps"] = fmt::format("derived: ceil(train.epochs {} x {} {} / global batch {})", r.train.epochs, rows,
                                         r.train.objective == TrainObjective::kKto ? "KTO examples"
                                         : r.train.trains_pairs()                  ? "preference pairs"
                                                                                   : "packed rows",
                                         global_batch_at(r, 0));
}

void resolve_length(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  auto& t = r.train;
  const int given = (t.steps > 0) + (t.tokens > 0) + (t.epochs > 0);
  if (given > 1) {
    std::vector<std::string> keys;
    for (const char* key : {"train.steps", "train.tokens", "train.epochs"})
      if (r.sources.at(key) != "default") keys.push_back(fmt::format("{} ({})", key, src(r, key)));
    ctx.problems.push_back(
        fmt::format("{} are {} set; give the training length one way", fmt::join(keys, " and "), keys.size() == 2 ? "both" : "all"));
    return;
  }
  if (given == 0) {
    ctx.problems.push_back("the training length is missing: set train.steps, train.tokens or train.epochs");
    return;
  }
  if (t.tokens) {
    int64_t steps = 0, tokens = 0;
    while (tokens < t.tokens) tokens += global_batch_at(r, steps) * r.data.seq_len, ++steps;
    t.steps = steps;
    r.sources["train.steps"] = fmt::format("derived: ceil(train.tokens {} / tokens per step)", t.tokens);
  }
  if (t.epochs > 0) resolve_epochs(ctx);
}

// A ds_config scheduler the run follows: what it does to the LR when that is not what a user
// expects (WarmupLR never decays) or not what the recipe asked for.
void warn_ds_scheduler(LoadContext& ctx) {
  const Recipe& r = ctx.recipe;
  const DsPending& ds = ctx.ds;
  if (ds.scheduler.empty() || r.sources.at("schedule.type") == "--set") return;
  const std::string replaced =
      ds.replaced_schedule.empty()
          ? ""
          : fmt::format(
                ", in place of the recipe's schedule.type {}, as the HF Trainer lets a ds_config scheduler replace "
                "--lr_scheduler_type",
                ds.replaced_schedule);
  if (r.schedule.type == ScheduleType::kDsWarmup) {
    ctx.warning(ds.scheduler_where,
                fmt::format("the ds_config's scheduler WarmupLR warms the LR up over {} steps ({}) to {:g} and then holds it there for "
                            "the remaining {} steps: it never decays{}. For a decaying schedule remove the scheduler block, or "
                            "--set schedule.type=warmup_cosine",
                            r.schedule.warmup_steps, name(r.schedule.warmup_type), r.optimizer.lr,
                            std::max<int64_t>(0, r.train.steps - r.schedule.warmup_steps), replaced));
  } else if (!replaced.empty()) {
    ctx.warning(ds.scheduler_where, fmt::format("the ds_config's scheduler {} sets the LR schedule{}; --set schedule.type=... to choose "
                                                "another",
                                                ds.scheduler, replaced));
  }
}

// Multi-token prediction: DeepSeek-V3's (MLA + MoE).
template <typename Problem>
void check_mtp(const Recipe& r, Problem&& problem) {
  const auto& m = r.model;
  if (m.mtp_depth == 0) return;
  if (m.family != ModelFamily::kMlaMoe)
    problem(fmt::format("model.mtp_depth {}: multi-token prediction is DeepSeek-V3's, for model.family mla_moe; this model is {}",
                        m.mtp_depth, name(m.family)));
}

// lora: what is not supported yet, and keys that would do nothing. The targets are matched
// against the model's projections by the model layer (resolve_frozen).
template <typename Problem>
void check_lora(const Recipe& r, Problem&& problem) {
  const LoraConfig& l = r.lora;
  if (!l.enabled()) {
    for (const char* key : {"lora.alpha", "lora.dropout", "lora.targets", "lora.use_rslora", "lora.use_dora", "lora.modules_to_save",
                            "lora.rank_pattern", "lora.alpha_pattern", "lora.init_from", "lora.experts", "lora.base"})
      if (r.sources.count(key) && r.sources.at(key) != "default")
        problem(fmt::format("{} is set ({}) but lora.rank is 0: no adapters are attached and every parameter would train", key,
                            r.sources.at(key)));
    return;
  }
  if (l.dropout >= 1)
    problem(
        fmt::format("lora.dropout {:g}: every input element would be dropped; give a probability below 1 (PEFT's default is 0, "
                    "its examples use 0.05 or 0.1)",
                    l.dropout));
  if (l.targets.empty()) problem("lora.targets is empty: name the projections that get adapters (q_proj, o_proj, ...) or all-linear");
  // PEFT's expert adapters (target_parameters) have neither: no reference, and no export PEFT loads.
  if (l.experts && l.dropout > 0)
    problem(
        fmt::format("lora.experts with lora.dropout {:g}: the routed experts' adapters take no dropout (nor do PEFT's, "
                    "target_parameters); set lora.dropout: 0",
                    l.dropout));
  if (l.experts && l.use_dora)
    problem(
        "lora.experts with lora.use_dora: the routed experts' adapters are plain LoRA (PEFT's target_parameters have no DoRA); "
        "leave one of them out");
  if (l.base != LoraBase::kModel && l.use_dora)
    problem(
        fmt::format("lora.use_dora with lora.base {}: DoRA's magnitudes need the base weights' row norms in full precision; "
                    "leave one of them out",
                    name(l.base)));
  if (l.experts && r.model.family != ModelFamily::kMlaMoe)
    problem(fmt::format("lora.experts: model.family {} has no routed experts; leave lora.experts out", name(r.model.family)));
  if (!r.train.freeze.empty())
    problem(
        "train.freeze with lora: the adapters already freeze the whole base; name what else should train in full in "
        "lora.modules_to_save, and leave train.freeze out");
}

// moe.expert_parallel_size against the model and the world: also on a resume at another size.
// What does not go with training on preference pairs yet (train.objective dpo or reward).
template <typename Problem>
void check_pair_training(const Recipe& r, Problem&& problem) {
  const std::string objective = name(r.train.objective);
  const auto refuse = [&](bool when, const std::string& what) {
    if (when) problem(fmt::format("train.objective {} with {}: not supported yet", objective, what));
  };
  refuse(r.sources.count("train.loss_normalization") && r.sources.at("train.loss_normalization") != "default",
         "train.loss_normalization (the loss is the mean over the step's pairs; leave the key out)");
  refuse(r.parallel.pipeline_parallel_size > 1, "parallel.pipeline_parallel_size > 1 (ZeRO and expert parallelism do work)");
  refuse(r.model.mtp_depth > 0, "model.mtp_depth > 0 (set model.mtp_depth: 0)");
  refuse(r.train.z_loss_weight > 0, "train.z_loss_weight (set it to 0)");
  refuse(r.data.paths.size() > 1, "several data.paths (one preference set)");
  refuse(r.lora.base != LoraBase::kModel, "lora.base nf4 or fp8");
  if (r.data.format != DataFormat::kMegatron)
    problem(fmt::format(
        "train.objective {} reads a set of preference pairs (dstrain prepare-data --preference{}, data.format megatron); data.format is {}",
        objective, r.train.objective == TrainObjective::kKto ? " --kto" : "", name(r.data.format)));
}

// The preference keys each objective reads: those of the TRL config of the trainer it matches.
const std::vector<std::string>& preference_keys(TrainObjective objective) {
  static const std::vector<std::string> none;
  static const std::vector<std::string> dpo = {"preference.beta",
                                               "preference.loss_type",
                                               "preference.loss_weights",
                                               "preference.label_smoothing",
                                               "preference.discopop_tau",
                                               "preference.f_divergence_type",
                                               "preference.f_alpha_divergence_coef",
                                               "preference.ld_alpha",
                                               "preference.use_weighting",
                                               "preference.reference",
                                               "preference.sync_ref_model",
                                               "preference.ref_model_mixup_alpha",
                                               "preference.ref_model_sync_steps"};
  static const std::vector<std::string> cpo = {"preference.beta",      "preference.loss_type",   "preference.label_smoothing",
                                               "preference.cpo_alpha", "preference.simpo_gamma", "preference.alpha"};
  static const std::vector<std::string> simpo = {"preference.beta", "preference.label_smoothing", "preference.cpo_alpha",
                                                 "preference.simpo_gamma", "preference.alpha"};
  static const std::vector<std::string> orpo = {"preference.beta"};
  static const std::vector<std::string> reward = {"preference.center_rewards_coefficient"};
  static const std::vector<std::string> kto = {
      "preference.beta",      "preference.loss_type",      "preference.desirable_weight",      "preference.undesirable_weight",
      "preference.reference", "preference.sync_ref_model", "preference.ref_model_mixup_alpha", "preference.ref_model_sync_steps"};
  switch (objective) {
    case TrainObjective::kDpo:
      return dpo;
    case TrainObjective::kCpo:
      return cpo;
    case TrainObjective::kSimpo:
      return simpo;
    case TrainObjective::kOrpo:
      return orpo;
    case TrainObjective::kReward:
      return reward;
    case TrainObjective::kKto:
      return kto;
    case TrainObjective::kSft:
      break;
  }
  return none;
}

// A preference key set for an objective that does not read it, named with those that do.
template <typename Problem>
void check_preference_keys(const Recipe& r, Problem&& problem) {
  const TrainObjective objective = r.train.objective;
  const auto& mine = preference_keys(objective);
  std::vector<std::string> seen;
  for (const TrainObjective other : {TrainObjective::kDpo, TrainObjective::kCpo, TrainObjective::kSimpo, TrainObjective::kOrpo,
                                     TrainObjective::kKto, TrainObjective::kReward})
    for (const std::string& key : preference_keys(other)) {
      const auto source = r.sources.find(key);
      if (source == r.sources.end() || source->second == "default" || std::find(mine.begin(), mine.end(), key) != mine.end() ||
          std::find(seen.begin(), seen.end(), key) != seen.end())
        continue;
      seen.push_back(key);
      std::vector<std::string> readers;
      for (const TrainObjective o : {TrainObjective::kDpo, TrainObjective::kCpo, TrainObjective::kSimpo, TrainObjective::kOrpo,
                                     TrainObjective::kKto, TrainObjective::kReward})
        if (const auto& keys = preference_keys(o); std::find(keys.begin(), keys.end(), key) != keys.end()) readers.push_back(name(o));
      problem(fmt::format("{} is set ({}) but train.objective is {}, which does not read it (train.objective {} does); leave it out", key,
                          source->second, name(objective), fmt::join(readers, ", ")));
    }
}

// TR-DPO (preference.sync_ref_model): a reference that moves is the frozen copy of live without LoRA.
template <typename Problem>
void check_sync_ref_model(const Recipe& r, Problem&& problem) {
  const PreferenceConfig& p = r.preference;
  if (!p.sync_ref_model) {
    for (const char* key : {"preference.ref_model_mixup_alpha", "preference.ref_model_sync_steps"})
      if (const auto s = r.sources.find(key); s != r.sources.end() && s->second != "default")
        problem(
            fmt::format("{} is set ({}) but preference.sync_ref_model is false, so nothing reads it; set preference.sync_ref_model: "
                        "true (TR-DPO) or leave it out",
                        key, s->second));
    return;
  }
  if (r.lora.enabled())
    problem(
        "preference.sync_ref_model with lora: the reference is then the base with the adapters off, which cannot move (TRL refuses "
        "sync_ref_model with PEFT too); train without lora, or leave preference.sync_ref_model out");
  else if (p.reference != "live")
    problem(
        fmt::format("preference.sync_ref_model with preference.reference {}: {}; set preference.reference: live (a frozen copy "
                    "that the syncs move)",
                    p.reference,
                    p.reference == "none" ? "there is no reference to sync"
                                          : "the reference moves during training, so log-probs computed before it would be stale "
                                            "(TRL refuses it with precompute_ref_log_probs too)"));
  if (r.zero.delayed_update)
    problem(
        "preference.sync_ref_model with zero.delayed_update: at a step's end the parameters are still the step before's, so the "
        "reference would mix in stale ones; leave one of them out");
}

// preference.reference (dpo, kto): one of its three; live reads the base with the adapters off
// (LoRA) or a frozen copy of the starting model.
template <typename Problem>
void check_reference(const Recipe& r, Problem&& problem) {
  check_sync_ref_model(r, problem);
  const std::string& ref = r.preference.reference;
  if (ref != "precomputed" && ref != "live" && ref != "none")
    return problem(fmt::format("preference.reference {}: one of precomputed, live, none", ref));
  if (ref == "live" && r.lora.enabled() && !r.lora.modules_to_save.empty())
    problem(fmt::format(
        "preference.reference live with lora.modules_to_save [{}]: those modules train in place, so the base with the adapters off "
        "is no longer the starting model; use preference.reference precomputed",
        fmt::join(r.lora.modules_to_save, ", ")));
}

// train.objective kto: one of KTOTrainer's loss types.
template <typename Problem>
void check_kto(const Recipe& r, Problem&& problem) {
  const std::vector<std::string>& types = r.preference.loss_type;
  if (types.size() != 1 || (types[0] != "kto" && types[0] != "apo_zero_unpaired"))
    problem(
        fmt::format("preference.loss_type [{}] with train.objective kto: KTO takes one of kto, apo_zero_unpaired", fmt::join(types, ", ")));
}

// train.objective cpo and simpo (TRL's CPOTrainer) and orpo: one loss type of CPO's.
template <typename Problem>
void check_reference_free(const Recipe& r, Problem&& problem) {
  const PreferenceConfig& p = r.preference;
  if (r.train.objective != TrainObjective::kCpo) return;
  static const char* const kCpoLosses[] = {"sigmoid", "hinge", "ipo", "simpo"};
  if (p.loss_type.size() != 1 || std::find(std::begin(kCpoLosses), std::end(kCpoLosses), p.loss_type[0]) == std::end(kCpoLosses)) {
    problem(fmt::format(
        "preference.loss_type [{}] with train.objective cpo: CPO takes one of {}{}", fmt::join(p.loss_type, ", "),
        fmt::join(kCpoLosses, ", "),
        p.loss_type.size() == 1 && p.loss_type[0] == "alphapo" ? " (TRL's alphapo is train.objective simpo with preference.alpha)" : ""));
    return;
  }
  const std::string& type = p.loss_type[0];
  if (p.label_smoothing > 0 && (type == "hinge" || type == "ipo"))
    problem(
        fmt::format("preference.label_smoothing {:g} with train.objective cpo and loss_type {}: only sigmoid and simpo smooth "
                    "labels (TRL ignores it); leave it out",
                    p.label_smoothing, type));
  const auto gamma = r.sources.find("preference.simpo_gamma");
  if (type != "simpo" && gamma != r.sources.end() && gamma->second != "default")
    problem(
        fmt::format("preference.simpo_gamma is set ({}) but preference.loss_type is {}: it is SimPO's margin; set loss_type: simpo "
                    "(or train.objective: simpo), or leave it out",
                    gamma->second, type));
}

// The preference block against train.objective: TRL's loss types, and what does not go with
// preference pairs yet.
template <typename Problem>
void check_preference(const Recipe& r, Problem&& problem) {
  const PreferenceConfig& p = r.preference;
  const auto set = [&r](const char* key) { return r.sources.count(key) && r.sources.at(key) != "default"; };
  const TrainObjective objective = r.train.objective;
  check_preference_keys(r, problem);
  if (r.model.score_head && objective != TrainObjective::kReward)
    problem(
        fmt::format("model.score_head is set but train.objective is {}: a score head gives no next-token logits; set train.objective: "
                    "reward, or leave model.score_head out",
                    name(objective)));
  if (objective == TrainObjective::kSft) return;
  if (objective == TrainObjective::kKto) {
    check_reference(r, problem);
    check_kto(r, problem);
    return check_pair_training(r, problem);
  }
  if (objective != TrainObjective::kDpo) {
    check_reference_free(r, problem);
    return check_pair_training(r, problem);
  }
  static const char* const kLossTypes[] = {"sigmoid",      "hinge",    "ipo",       "robust",   "exo_pair",
                                           "nca_pair",     "bco_pair", "sppo_hard", "apo_zero", "apo_down",
                                           "sigmoid_norm", "discopop", "sft",       "aot",      "aot_unpaired"};
  if (p.loss_type.empty()) problem("preference.loss_type is empty: name a DPO loss, e.g. sigmoid");
  for (const std::string& t : p.loss_type) {
    if (std::find(std::begin(kLossTypes), std::end(kLossTypes), t) == std::end(kLossTypes))
      problem(fmt::format("preference.loss_type {}: not a DPO loss dstrain computes; one of {}", t, fmt::join(kLossTypes, ", ")));
    if (t == "robust" && p.label_smoothing >= 0.5)
      problem(
          fmt::format("preference.loss_type robust with preference.label_smoothing {:g}: rDPO divides by 1 - 2 x label_smoothing; give a "
                      "value below 0.5",
                      p.label_smoothing));
    if (t == "exo_pair" && p.label_smoothing <= 0)
      problem(
          "preference.loss_type exo_pair needs preference.label_smoothing above 0 (EXO's epsilon; its loss takes log(epsilon)); TRL's docs "
          "suggest 1e-3");
  }
  if (set("preference.discopop_tau") && std::find(p.loss_type.begin(), p.loss_type.end(), "discopop") == p.loss_type.end())
    problem(fmt::format("preference.discopop_tau is set ({}) but preference.loss_type has no discopop: add it, or leave the key out",
                        r.sources.at("preference.discopop_tau")));
  static const char* const kDivergences[] = {"reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"};
  static const char* const kDivergenceLosses[] = {"sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop", "sft"};
  if (std::find(std::begin(kDivergences), std::end(kDivergences), p.f_divergence_type) == std::end(kDivergences))
    problem(fmt::format("preference.f_divergence_type {}: not one of {}", p.f_divergence_type, fmt::join(kDivergences, ", ")));
  else if (p.f_divergence_type != "reverse_kl")
    for (const std::string& t : p.loss_type)
      if (std::find(std::begin(kDivergenceLosses), std::end(kDivergenceLosses), t) == std::end(kDivergenceLosses))
        problem(fmt::format(
            "preference.f_divergence_type {} with preference.loss_type {}: f-DPO applies to {} only (TRL's rule: the other losses have no "
            "valid f-divergence form); use reverse_kl with {}",
            p.f_divergence_type, t, fmt::join(kDivergenceLosses, ", "), t));
  if (set("preference.f_alpha_divergence_coef") && p.f_divergence_type != "alpha_divergence")
    problem(
        fmt::format("preference.f_alpha_divergence_coef is set ({}) but preference.f_divergence_type is {}: set it to alpha_divergence, "
                    "or leave the key out",
                    r.sources.at("preference.f_alpha_divergence_coef"), p.f_divergence_type));
  for (const char* sorted : {"aot", "aot_unpaired"})
    if (p.use_weighting && std::find(p.loss_type.begin(), p.loss_type.end(), sorted) != p.loss_type.end())
      problem(
          fmt::format("preference.use_weighting with preference.loss_type {}: AOT sorts the batch's log-ratios, which would pair "
                      "each WPO weight with another pair's loss (TRL refuses it too); leave one of them out",
                      sorted));
  if (p.use_weighting && std::find(p.loss_type.begin(), p.loss_type.end(), "sft") != p.loss_type.end())
    problem(
        "preference.use_weighting with preference.loss_type sft: TRL weighs sft's token mean over the batch by the mean of the pairs' WPO "
        "weights, which no split of the step into micro-batches reproduces; drop sft or leave use_weighting out");
  check_reference(r, problem);
  if (!p.loss_weights.empty() && p.loss_weights.size() != p.loss_type.size())
    problem(fmt::format("preference.loss_weights has {} entries for {} preference.loss_type entries; give one weight per loss type",
                        p.loss_weights.size(), p.loss_type.size()));
  check_pair_training(r, problem);
}

template <typename Problem>
void check_expert_parallel(const Recipe& r, Problem&& problem) {
  const int64_t ep = r.moe.expert_parallel_size;
  if (ep == 1) return;
  if (r.model.family != ModelFamily::kMlaMoe)
    problem(
        fmt::format("moe.expert_parallel_size {} needs an MoE model (model.family mla_moe); this model is {}", ep, name(r.model.family)));
  else if (r.model.n_routed_experts % ep != 0)
    problem(fmt::format("moe.expert_parallel_size {} does not divide model.n_routed_experts {}: every rank must hold as many experts", ep,
                        r.model.n_routed_experts));
  if (r.parallel.pipeline_parallel_size > 1 && r.data_parallel_size() % ep != 0)
    problem(
        fmt::format("moe.expert_parallel_size {} does not divide a pipeline stage's {} data-parallel ranks (world {} / "
                    "parallel.pipeline_parallel_size {}): expert groups live inside a stage",
                    ep, r.data_parallel_size(), r.world_size(), r.parallel.pipeline_parallel_size));
  else if (r.world_size() % ep != 0)
    problem(fmt::format("moe.expert_parallel_size {} does not divide the world size {} ({} node(s) x {} per node)", ep, r.world_size(),
                        r.launch.nnodes, r.launch.nproc_per_node));
}

// A Megatron dataset's PREFIX, given as the prefix or as either of its files.
std::string megatron_prefix(const std::string& path) {
  const bool named_file = path.size() > 4 && (path.rfind(".bin") == path.size() - 4 || path.rfind(".idx") == path.size() - 4);
  return named_file ? path.substr(0, path.size() - 4) : path;
}

// The eval block against the data and checkpoint sections (the files are checked when opened).
void validate_eval(LoadContext& ctx) {
  const Recipe& r = ctx.recipe;
  const EvalConfig& e = r.eval;
  auto problem = [&](const std::string& m) { ctx.problems.push_back(m); };
  if (e.split > 0 && e.split >= 1 && e.split != std::floor(e.split))
    problem(fmt::format("eval.split {} ({}): give a fraction below 1 or a whole count of documents", e.split, src(r, "eval.split")));
  if (e.split > 0 && r.data.format != DataFormat::kMegatron && r.data.eos_token < 0)
    problem(
        fmt::format("eval.split ({}) holds out whole documents, and data.format {} has none marked: set data.eos_token (256 for "
                    "prepare-data datasets), or give eval.paths",
                    src(r, "eval.split"), name(r.data.format)));
  if (!e.names.empty() && e.names.size() != e.paths.size() + (e.split > 0 ? 1 : 0))
    problem(fmt::format("eval.names has {} names for {} evaluation sets{}; give one per set, or none", e.names.size(),
                        e.paths.size() + (e.split > 0 ? 1 : 0), e.split > 0 ? " (eval.paths and the split, last)" : ""));
  for (const auto& path : e.paths) {
    const bool megatron = r.data.format == DataFormat::kMegatron;
    const std::string prefix = megatron_prefix(path);
    if (megatron ? !(std::filesystem::is_regular_file(prefix + ".idx") && std::filesystem::is_regular_file(prefix + ".bin"))
                 : !std::filesystem::is_regular_file(path))
      ctx.data_problems.push_back(fmt::format("eval.paths: '{}' does not exist or is not a {} (data.format {})", path,
                                              megatron ? "Megatron dataset (PREFIX.idx and PREFIX.bin)" : "file", name(r.data.format)));
  }
  for (const auto& path : e.tasks)
    if (!std::filesystem::is_regular_file(path)) ctx.data_problems.push_back(fmt::format("eval.tasks: '{}' is not a file", path));
  if (!e.samples.empty() && !std::filesystem::is_regular_file(e.samples))
    ctx.data_problems.push_back(fmt::format("eval.samples: '{}' is not a file", e.samples));
  for (const auto& [set, key, after] :
       {std::tuple<bool, const char*, const char*>{!e.tasks.empty(), "eval.tasks",
                                                   "score the checkpoints with `dstrain eval RUN --task FILE`"},
        {!e.samples.empty(), "eval.samples", "generate from the checkpoints with `dstrain generate RUN`"}}) {
    if (set && r.parallel.pipeline_parallel_size > 1)
      problem(fmt::format("{} with parallel.pipeline_parallel_size > 1 is not supported yet (a forward runs on one rank): {} after the run",
                          key, after));
    if (set && (r.model.score_head || r.train.objective == TrainObjective::kReward))
      problem(
          fmt::format("{} needs next-token logits, and a reward model (train.objective reward) has a score head: leave {} out", key, key));
  }
  const bool any = e.enabled() || !e.tasks.empty() || !e.samples.empty();
  if (!any && (e.interval_steps > 0 || e.at_start || e.early_stopping_patience > 0))
    problem(fmt::format("{} is set but there is nothing to evaluate: give eval.paths, eval.split, eval.tasks or eval.samples",
                        e.interval_steps > 0 ? "eval.interval_steps"
                        : e.at_start         ? "eval.at_start"
                                             : "eval.early_stopping_patience"));
  if ((r.checkpoint.keep_best || (e.early_stopping_patience > 0 && any)) && !e.enabled())
    problem(fmt::format("{} needs a validation loss: give eval.paths or eval.split, and eval.interval_steps",
                        r.checkpoint.keep_best ? "checkpoint.keep_best" : "eval.early_stopping_patience"));
  if ((r.checkpoint.keep_best || e.early_stopping_patience > 0) && e.enabled() && e.interval_steps == 0)
    problem(fmt::format("{} compares evaluations during training: set eval.interval_steps (e.g. --set eval.interval_steps={})",
                        r.checkpoint.keep_best ? "checkpoint.keep_best" : "eval.early_stopping_patience",
                        std::max<int64_t>(1, r.train.steps / 10)));
  if (e.interval_steps > r.train.steps && any)
    ctx.warnings.push_back(fmt::format("eval.interval_steps {} is more than the run's {} steps: only eval.at_start / eval.at_end evaluate",
                                       e.interval_steps, r.train.steps));
}

// What cuts documents and what packs conversations.
template <class Problem>
void validate_documents(const Recipe& r, Problem problem) {
  if (r.data.document_mask && r.data.eos_token < 0)
    problem("data.document_mask needs data.eos_token, the token that ends a document (256 for prepare-data datasets)");
  if (r.data.reset_positions && r.data.eos_token < 0)
    problem("data.reset_positions needs data.eos_token, the token that ends a document (256 for prepare-data datasets)");
  // (data that does not exist is said once, below; its format is then only the default)
  const auto sources = r.data.sources();
  const bool data_exists = std::all_of(sources.begin(), sources.end(), [](const std::string& p) { return std::filesystem::exists(p); });
  if (r.data.packing != Packing::kNone && r.data.format != DataFormat::kMegatron && data_exists)
    problem(
        fmt::format("data.packing: {} packs the conversations of a fine-tuning set, which is data.format megatron from "
                    "`dstrain prepare-data --chat`; remove data.packing for {} data",
                    name(r.data.packing), name(r.data.format)));
}

// The parameter counts are int64 sums of products of the model's sizes: a model far beyond any
// machine would wrap them around (a negative count in --dry-run). An upper bound, in double, first.
template <typename Problem>
void check_model_size(const ModelConfig& m, Problem&& problem) {
  const double H = static_cast<double>(m.hidden_size),
               widest = std::max(
                   {static_cast<double>(m.intermediate_size),
                    static_cast<double>(m.moe_intermediate_size) * static_cast<double>(m.n_routed_experts + m.n_shared_experts), H});
  const double layers = static_cast<double>(m.num_layers + m.mtp_depth);
  const double bound = 2.0 * static_cast<double>(m.vocab_size) * H + layers * 8.0 * H * (H + widest);
  if (bound > 1e17)
    problem(
        fmt::format("model: hidden_size {}, intermediate sizes and vocab_size {} make a model of up to {:.2g} parameters, beyond "
                    "what any cluster holds (DeepSeek-V3 has 6.7e11); check the sizes",
                    m.hidden_size, m.vocab_size, bound));
}

// The sections beside the model's shape: multi-token prediction, adapters, the parallel axes.
template <typename Problem, typename Warn>
void check_features(const Recipe& r, Problem&& problem, Warn&& warn) {
  check_mtp(r, problem);
  check_lora(r, problem);
  check_preference(r, problem);
  check_expert_parallel(r, problem);
  check_pipeline(r, problem, warn);
  check_sequence_parallel(r, problem);
  check_model_size(r.model, problem);
}

void validate(LoadContext& ctx) {
  validate_eval(ctx);
  const Recipe& r = ctx.recipe;
  auto problem = [&](const std::string& m) { ctx.problems.push_back(m); };
  auto warn = [&](const std::string& m) { ctx.warnings.push_back(m); };
  const auto& m = r.model;
  if (m.family == ModelFamily::kDense && m.num_kv_heads > 0 && m.num_heads % m.num_kv_heads != 0)
    problem(fmt::format("model.num_kv_heads: {} does not divide model.num_heads {}", m.num_kv_heads, m.num_heads));
  if (m.family == ModelFamily::kMlaMoe) {
    if (m.n_routed_experts % m.n_group != 0)
      problem(fmt::format("model.n_group: {} does not divide model.n_routed_experts {}", m.n_group, m.n_routed_experts));
    else if (m.topk_group > m.n_group)
      problem(fmt::format("model.topk_group {} exceeds model.n_group {}", m.topk_group, m.n_group));
    else if (m.num_experts_per_tok > m.topk_group * (m.n_routed_experts / m.n_group))
      problem(fmt::format("model.num_experts_per_tok {} exceeds the experts in the {} selected groups ({})", m.num_experts_per_tok,
                          m.topk_group, m.topk_group * (m.n_routed_experts / m.n_group)));
    if (m.qk_rope_head_dim % 2 != 0) problem(fmt::format("model.qk_rope_head_dim {} must be even", m.qk_rope_head_dim));
    if (m.topk_method == TopkMethod::kNoauxTc && m.scoring_func != ScoringFunc::kSigmoid)
      problem("model.topk_method noaux_tc (V3) needs model.scoring_func sigmoid");
  }
  check_features(r, problem, warn);
  if (m.family == ModelFamily::kMlaMoe) {
  } else if (m.hidden_size % m.num_heads != 0)
    problem(fmt::format("model.num_heads: {} does not divide model.hidden_size {}", m.num_heads, m.hidden_size));
  else if ((m.hidden_size / m.num_heads) % 2 != 0)
    problem(fmt::format("model: head dim hidden_size/num_heads = {} must be even for rotary embeddings", m.hidden_size / m.num_heads));
  if (r.data.seq_len > m.max_seq_len) {
    const bool from_hf = !r.model.hf_config.empty() && r.sources.at("model.max_seq_len").find(".json") != std::string::npos;
    problem(fmt::format("data.seq_len {} ({}) exceeds model.max_seq_len {} ({}): set data.seq_len: {} or less (--set data.seq_len={}){}",
                        r.data.seq_len, r.sources.at("data.seq_len"), m.max_seq_len, r.sources.at("model.max_seq_len"), m.max_seq_len,
                        m.max_seq_len,
                        from_hf ? "; the model's config.json sets the longest sequence (max_position_embeddings)"
                                : fmt::format(", or model.max_seq_len: {} (the RoPE tables' length)", r.data.seq_len)));
  }
  if (r.data.format == DataFormat::kBytes && m.vocab_size < 256)
    problem(fmt::format("model.vocab_size: {} is too small for data.format 'bytes', which needs 256", m.vocab_size));
  const bool megatron = r.data.format == DataFormat::kMegatron;
  const std::vector<std::string> sources = r.data.sources();
  const char* key = r.data.paths.empty() ? "data.path" : "data.paths";
  for (const auto& path : sources) {
    const std::string prefix = megatron_prefix(path);
    if (megatron && !(std::filesystem::is_regular_file(prefix + ".idx") && std::filesystem::is_regular_file(prefix + ".bin")))
      ctx.data_problems.push_back(fmt::format("{}: '{}.idx' and '{}.bin' must both exist for data.format megatron{}", key, prefix, prefix,
                                              recipe_relative_note(r, key, path)));
    else if (!megatron && !std::filesystem::is_regular_file(path))
      ctx.data_problems.push_back(
          std::filesystem::is_regular_file(prefix + ".idx") && std::filesystem::is_regular_file(prefix + ".bin")
              ? fmt::format("{}: '{}' is not a file, but '{}.idx' and '{}.bin' are a Megatron dataset: set data.format: megatron "
                            "(data.format is {}, {})",
                            key, path, prefix, prefix, name(r.data.format), r.sources.at("data.format"))
              : fmt::format("{}: '{}' does not exist or is not a file{}", key, path, recipe_relative_note(r, key, path)));
  }
  for (const auto& message : sidecar_problems(r, ctx.read)) ctx.problems.push_back(message);
  if (!r.data.weights.empty() && r.data.weights.size() != r.data.paths.size())
    problem(
        fmt::format("data.weights has {} entries for {} data.paths; give one weight per path", r.data.weights.size(), r.data.paths.size()));
  else if (!r.data.weights.empty() && *std::max_element(r.data.weights.begin(), r.data.weights.end()) <= 0)
    problem("data.weights: at least one weight must be positive");
  if (!r.data.shard_weights.empty() && static_cast<int64_t>(r.data.shard_weights.size()) != r.world_size())
    problem(fmt::format("data.shard_weights has {} entries but the run has {} ranks; give one weight per rank", r.data.shard_weights.size(),
                        r.world_size()));
  else if (!r.data.shard_weights.empty() && *std::max_element(r.data.shard_weights.begin(), r.data.shard_weights.end()) <= 0)
    problem("data.shard_weights: at least one weight must be positive");
  validate_documents(r, problem);
  if (r.data.eos_token >= m.vocab_size)
    problem(fmt::format("data.eos_token {} is not below model.vocab_size {}", r.data.eos_token, m.vocab_size));
  if (r.data.auto_balance && !r.data.shard_weights.empty()) problem("data.shard_weights: give weights or auto, not both");
  const auto& s = r.schedule;
  // train.steps 0: the length could not be derived, which is reported already; nothing to compare with.
  if (s.warmup_steps > r.train.steps && r.train.steps > 0) {
    if (s.type == ScheduleType::kWarmupCosine)
      problem(
          fmt::format("schedule.warmup_steps {} ({}) is longer than the run's {} steps ({}): shorten the warmup, e.g. --set "
                      "schedule.warmup_steps={}, or train longer, e.g. --set train.steps={}",
                      s.warmup_steps, r.sources.at("schedule.warmup_steps"), r.train.steps, r.sources.at("train.steps"), r.train.steps / 10,
                      s.warmup_steps * 10));
    else if (s.type != ScheduleType::kConstant)
      warn(fmt::format("schedule.warmup_steps {} ({}) is longer than the run's {} steps: the LR never reaches its peak", s.warmup_steps,
                       r.sources.at("schedule.warmup_steps"), r.train.steps));
  }
  if (r.logging.has_sink(Sink::kConsole) && r.logging.steps_per_print > r.train.steps)
    warn(fmt::format(
        "logging.steps_per_print {} ({}) is more than the run's {} steps: the console shows no step line (metrics.jsonl "
        "has every step); e.g. --set logging.steps_per_print={}",
        r.logging.steps_per_print, r.sources.at("logging.steps_per_print"), r.train.steps, std::max<int64_t>(1, r.train.steps / 10)));
  if (r.logging.profile_step > r.train.steps && r.train.steps > 0)
    problem(
        fmt::format("logging.profile_step {} ({}) is past the run's last step {}: pick a step the run reaches (a few after the first, "
                    "which warms up), or 0",
                    r.logging.profile_step, r.sources.at("logging.profile_step"), r.train.steps));
  for (const auto& stage : r.train.accumulation)
    if (stage.until_step > r.train.steps)
      warn(fmt::format("train.accumulation: the stage ending at step {} reaches past the last step {}", stage.until_step, r.train.steps));
  const auto& z = r.zero;
  if (z.offload_optimizer != OffloadDevice::kNone && z.stage == 0)
    problem(fmt::format("zero.offload_optimizer = {} needs ZeRO stage 1, 2 or 3 (the stage is 0, {})", name(z.offload_optimizer),
                        r.sources.at("zero.stage")));
  if (z.offload_param != OffloadDevice::kNone && z.stage != 3)
    warn(fmt::format("zero.offload_param = {} only applies to ZeRO stage 3 (the stage is {}); it is ignored, as in DeepSpeed",
                     name(z.offload_param), z.stage));
  else if (z.offload_param != OffloadDevice::kNone && z.offload_optimizer == OffloadDevice::kNone)
    problem(
        fmt::format("zero.offload_param = {} ({}) needs zero.offload_optimizer = cpu as well: the parameter shard lives where the "
                    "optimizer updates it (ZeRO-Infinity's CPU tier offloads both)",
                    name(z.offload_param), r.sources.at("zero.offload_param")));
  if (z.delayed_update && z.offload_optimizer == OffloadDevice::kNone)
    problem(fmt::format("zero.delayed_update ({}) needs zero.offload_optimizer = cpu: it delays the CPU optimizer's update",
                        r.sources.at("zero.delayed_update")));
  for (auto& w : inert_key_warnings(r)) warn(std::move(w));
  if (r.launch.node_rank >= r.launch.nnodes)
    problem(fmt::format("launch.node_rank {} must be below launch.nnodes {}", r.launch.node_rank, r.launch.nnodes));
  // An fp16 block whose "enabled" is "auto" (HF's templates) carries its loss scaling for whoever
  // picks fp16: nothing to warn about when the recipe picks another precision.
  if (r.precision.dtype != Dtype::kFp16 && !ctx.ds.fp16_auto.line &&
      (r.sources.at("precision.loss_scale") != "default" || r.sources.at("precision.initial_scale_power") != "default"))
    warn(fmt::format("loss scaling settings only apply to fp16; precision is {}", name(r.precision.dtype)));
}

// What Hugging Face's TrainingArguments fills these "auto"s with when the recipe leaves them out:
// its defaults, so that HF's stock ds_config files mean here what they mean there.
struct HfAutoDefault {
  const char* target;
  const char* value;
  const char* argument;  // the TrainingArguments field
};
// The "auto"s the recipe must fill, with what HF would have put there (for the message only).
constexpr HfAutoDefault kHfAutoHints[] = {{"optimizer.lr", "5e-05", "learning_rate"}};
constexpr HfAutoDefault kHfAutoDefaults[] = {
    {"schedule.warmup_steps", "0", "warmup_steps"},    {"optimizer.beta1", "0.9", "adam_beta1"},
    {"optimizer.beta2", "0.999", "adam_beta2"},        {"optimizer.eps", "1e-08", "adam_epsilon"},
    {"optimizer.weight_decay", "0.0", "weight_decay"}, {"train.grad_clip", "1.0", "max_grad_norm"}};

// The optimizer a fine-tuning run (model.init_from) gets where the recipe and ds_config say nothing.
constexpr HfAutoDefault kFineTuningDefaults[] = {{"optimizer.lr", "5e-05", "learning_rate"},
                                                 {"optimizer.weight_decay", "0.0", "weight_decay"},
                                                 {"optimizer.beta2", "0.999", "adam_beta2"}};

template <size_t N>
const HfAutoDefault* hf_default_of(const HfAutoDefault (&table)[N], const std::string& target) {
  for (const auto& d : table)
    if (target == d.target) return &d;
  return nullptr;
}

}  // namespace

void apply_fine_tuning_defaults(LoadContext& ctx) {
  // Fine-tuning from released weights at pretraining's lr 3e-3, weight decay 0.1 and beta2 0.95
  // would undo them: with model.init_from, what the recipe leaves out is what HF's Trainer uses.
  if (ctx.recipe.model.init_from.empty()) return;
  for (const HfAutoDefault& d : kFineTuningDefaults) {
    if (ctx.explicitly_set(d.target)) continue;
    const Location where{"model.init_from", 0, 0};
    if (ctx.set(d.target, Node{Node::Kind::kNumber, d.value, {}, {}, {}, where}, where, false))
      ctx.recipe.sources[d.target] = fmt::format("fine-tuning default with model.init_from (HF TrainingArguments' {})", d.argument);
  }
}

void resolve_autos(LoadContext& ctx) {
  // "auto" values stand for what the recipe sets, or HF's default where HF has one; anything else
  // would be a silent default. Every "auto" left open is reported at once.
  std::vector<const PendingAuto*> open;
  for (const auto& a : ctx.autos) {
    const HfAutoDefault* hf = hf_default_of(kHfAutoDefaults, a.target);
    if (ctx.explicitly_set(a.target)) {
      ctx.recipe.sources[a.target] += fmt::format(" (filled into \"auto\" at {})", a.where.str());
    } else if (a.target == "train.steps" && (ctx.explicitly_set("train.epochs") || ctx.explicitly_set("train.tokens"))) {
      // total_num_steps "auto" beside train.epochs or train.tokens: the steps they derive, as HF's Trainer fills it.
    } else if (a.target == "train.global_batch_size" || a.target == "train.micro_batch_size" ||
               a.target == "train.gradient_accumulation_steps") {
      // The batch triple: "auto" means "not given"; DeepSpeed's inference fills it from the others.
    } else if (hf) {
      if (ctx.set(a.target, Node{Node::Kind::kNumber, hf->value, {}, {}, {}, a.where}, a.where, false, a.ds_key))
        ctx.recipe.sources[a.target] =
            fmt::format("{} (\"auto\": {}, the default of HF TrainingArguments' {})", a.where.str(), hf->value, hf->argument);
    } else {
      open.push_back(&a);
    }
  }
  // One problem per recipe key, naming every "auto" it would fill (lr and warmup_max_lr are one).
  std::vector<std::string> done;
  for (const PendingAuto* a : open) {
    if (std::find(done.begin(), done.end(), a->target) != done.end()) continue;
    done.push_back(a->target);
    std::vector<std::string> keys;
    for (const PendingAuto* b : open)
      if (b->target == a->target) keys.push_back(b->ds_key);
    const Field* f = find_field(a->target);
    const HfAutoDefault* hint = hf_default_of(kHfAutoHints, a->target);
    ctx.problem(a->where, fmt::format("{} {} \"auto\", but the recipe does not set {}; set it in the recipe (e.g. {}: {}{}) or write the "
                                      "value in the ds_config",
                                      fmt::join(keys, " and "), keys.size() == 1 ? "is" : "are", a->target, a->target,
                                      f ? value_text(*f, ctx.recipe) : "...",
                                      !hint ? "" : fmt::format("; HF TrainingArguments' {} defaults to {}", hint->argument, hint->value)));
  }
}

// train.freeze or lora: what it freezes (and lora adds), counted by the model layer (patterns and
// targets that match nothing are refused there).
void resolve_frozen(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  r.frozen = {};
  if ((r.train.freeze.empty() && !r.lora.enabled()) || !ctx.frozen_counts) return;
  try {
    r.frozen = ctx.frozen_counts(r);
  } catch (const Error& e) {
    ctx.problems.push_back(e.hint().empty() ? e.what() : fmt::format("{} ({})", e.what(), e.hint()));
  }
}

// train.objective reward scores sequences: the model's head is a score, said in model.score_head;
// with LoRA the score trains in full beside the adapters, as PEFT's SEQ_CLS task adds it to
// modules_to_save.
void resolve_score_head(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  if (r.train.objective != TrainObjective::kReward) return;
  if (!r.model.score_head) {
    r.model.score_head = true;
    r.sources["model.score_head"] = "train.objective reward";
  }
  auto& saved = r.lora.modules_to_save;
  if (r.lora.enabled() && std::find(saved.begin(), saved.end(), "score") == saved.end()) {
    saved.push_back("score");
    const std::string note = "train.objective reward with lora: the score trains in full (PEFT's SEQ_CLS)";
    const auto was = r.sources.find("lora.modules_to_save");
    r.sources["lora.modules_to_save"] = was == r.sources.end() || was->second == "default" ? note : was->second + "; score from " + note;
  }
}

// train.objective kto's loss type is TRL's KTOConfig default, kto, unless given.
void resolve_kto(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  const auto source = r.sources.find("preference.loss_type");
  if (r.train.objective != TrainObjective::kKto || (source != r.sources.end() && source->second != "default")) return;
  r.preference.loss_type = {"kto"};
  r.sources["preference.loss_type"] = "train.objective kto";
}

// train.objective simpo trains without CPO's NLL term unless cpo_alpha is given (TRL's CPOConfig
// defaults it to 1 whatever the loss type; SimPO's paper and recipes set 0).
void resolve_simpo(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  const auto source = r.sources.find("preference.cpo_alpha");
  if (r.train.objective != TrainObjective::kSimpo || (source != r.sources.end() && source->second != "default")) return;
  r.preference.cpo_alpha = 0;
  r.sources["preference.cpo_alpha"] = "train.objective simpo";
}

void resolve_and_validate(LoadContext& ctx) {
  if (const std::string world = pipeline_world_problem(ctx.recipe); !world.empty()) return ctx.problems.push_back(world);
  if (const std::string world = sequence_world_problem(ctx.recipe); !world.empty()) return ctx.problems.push_back(world);
  resolve_score_head(ctx);
  resolve_simpo(ctx);
  resolve_kto(ctx);
  resolve_batch(ctx);
  if (!ctx.problems.empty()) return;
  resolve_token_stages(ctx);
  expand_batch_ramp(ctx);
  if (!ctx.problems.empty()) return;
  resolve_length(ctx);
  validate(ctx);
  if (ctx.problems.empty()) resolve_frozen(ctx);
  warn_ds_scheduler(ctx);
}

Recipe resized_for(const Recipe& recipe, int64_t nproc_per_node, int64_t nnodes) {
  Recipe r = recipe;
  const int64_t world = nproc_per_node * nnodes;
  if (world == recipe.world_size()) return r;
  const std::string what = fmt::format("this run was configured for {} ranks; resuming on {}", recipe.world_size(), world);
  if (!r.train.accumulation.empty())
    throw Error(ErrorCode::kUsage, what + " would change its global batch: staged accumulation sets it as micro x ranks x stage steps",
                "resume on the original number of ranks");
  if (!r.data.shard_weights.empty() || r.data.auto_balance)
    throw Error(ErrorCode::kUsage, what + " does not fit its per-rank data.shard_weights", "resume on the original number of ranks");
  const int64_t per_step = r.train.micro_batch_size * world;
  if (r.train.global_batch_size % per_step != 0) {
    std::vector<int64_t> fits;
    for (int64_t n = 1; n <= 4 * recipe.world_size() && fits.size() < 8; ++n)
      if (r.train.global_batch_size % (r.train.micro_batch_size * n) == 0) fits.push_back(n);
    throw Error(ErrorCode::kUsage,
                what + fmt::format(": its global batch {} does not split into micro batches of {} over {} ranks", r.train.global_batch_size,
                                   r.train.micro_batch_size, world),
                fmt::format("resume on one of these rank counts: {}", fmt::join(fits, ", ")));
  }
  if (world % r.moe.expert_parallel_size != 0)
    throw Error(ErrorCode::kUsage,
                what + fmt::format(": moe.expert_parallel_size {} does not divide {} ranks", r.moe.expert_parallel_size, world),
                "resume on a multiple of moe.expert_parallel_size ranks, or with --set moe.expert_parallel_size=N for an N that divides "
                "both (checkpoints hold every expert under its global name)");
  r.launch.nproc_per_node = nproc_per_node;
  r.launch.nnodes = nnodes;
  r.train.gradient_accumulation_steps = r.train.global_batch_size / per_step;
  const std::string source = fmt::format("resume on {} ranks", world);
  for (const char* key : {"launch.nproc_per_node", "launch.nnodes", "train.gradient_accumulation_steps"}) r.sources[key] = source;
  return r;
}

int64_t accumulation_at(const Recipe& r, int64_t step) {
  for (const auto& stage : r.train.accumulation)
    if (stage.until_step == 0 || step < stage.until_step) return stage.steps;
  return r.train.gradient_accumulation_steps > 0 ? r.train.gradient_accumulation_steps : 1;
}

int64_t global_batch_at(const Recipe& r, int64_t step) {
  return r.train.micro_batch_size * r.data_parallel_size() * accumulation_at(r, step);
}

int64_t samples_before(const Recipe& r, int64_t step) {
  int64_t samples = 0, from = 0;
  for (const auto& stage : r.train.accumulation) {
    const int64_t until = stage.until_step == 0 ? step : std::min(step, stage.until_step);
    if (until > from) samples += (until - from) * r.train.micro_batch_size * r.data_parallel_size() * stage.steps;
    from = std::max(from, until);
    if (from >= step) return samples;
  }
  return samples + (step - from) * global_batch_at(r, from);
}

}  // namespace dstrain::config
