// ds_config JSON → Recipe, following DeepSpeed's own parsing: its key names, types, defaults,
// deprecated aliases and conditional defaults. What dstrain does not implement is reported key by
// key: an error when it would change the math, a warning when it would not. Keys left at their
// DeepSpeed default ask for nothing and pass silently.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "dstrain/config/assign.h"
#include "dstrain/config/load_context.h"
#include "dstrain/config/schema.h"

namespace dstrain::config {
namespace {

enum class Policy { kSilent, kWarn, kError };

// A DeepSpeed key dstrain accepts but does not act on: what it does when set away from `deflt`.
struct Unimplemented {
  const char* key;
  const char* deflt;  // DeepSpeed's default, as JSON text ("false", "1", "null", "\"mean\"")
  Policy policy;
  const char* instead;  // what dstrain does or supports instead
};

bool is_auto(const Node& n) { return n.kind == Node::Kind::kString && n.text == "auto"; }

// Does `value` equal the JSON default text? Numbers compare numerically, bools and strings by text.
bool equals_default(const Node& value, const std::string& deflt) {
  if (deflt == "null") return value.kind == Node::Kind::kNull;
  double a = 0;
  if (value.kind == Node::Kind::kNumber && node_number(value, false, a)) {
    char* end = nullptr;
    const double b = std::strtod(deflt.c_str(), &end);
    if (end && *end == '\0' && end != deflt.c_str()) return a == b;
  }
  bool flag = false;
  if ((deflt == "true" || deflt == "false") && node_bool(value, true, flag)) return flag == (deflt == "true");
  if (deflt.size() >= 2 && deflt.front() == '"')
    return value.kind == Node::Kind::kString && value.text == deflt.substr(1, deflt.size() - 2);
  return false;
}

std::string shown(const Node& v) {
  switch (v.kind) {
    case Node::Kind::kString:
      return "\"" + v.text + "\"";
    case Node::Kind::kArray:
      return "[...]";
    case Node::Kind::kObject:
      return "{...}";
    default:
      return v.text;
  }
}

class DsReader {
 public:
  explicit DsReader(LoadContext& ctx) : ctx_(ctx) {}

  void read(const Node& root) {
    if (!root.is_object()) {
      ctx_.problem(root.where, fmt::format("a ds_config is a JSON object, found a {}", root.kind_name()));
      return;
    }
    top(root);
  }

 private:
  // --- helpers ---------------------------------------------------------------------------------
  static std::string join(const std::string& section, const std::string& key) { return section.empty() ? key : section + "." + key; }

  // DeepSpeed reads these without pydantic's conversion: a number written as a string is kept
  // as a string there and fails later (a micro batch of "4" becomes "4444"), so it is an error.
  static bool read_without_conversion(const std::string& ds_key) {
    static const char* const kTop[] = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                       "gradient_clipping", "steps_per_print"};
    return std::find(std::begin(kTop), std::end(kTop), ds_key) != std::end(kTop) || ds_key.rfind("optimizer.params.", 0) == 0 ||
           ds_key.rfind("scheduler.params.", 0) == 0;
  }

  static bool numeric(const std::string& target) {
    const Field* f = find_field(target);
    if (!f) return false;
    Recipe probe;
    const FieldTarget t = f->target(probe);
    return std::holds_alternative<int64_t*>(t) || std::holds_alternative<uint64_t*>(t) || std::holds_alternative<double*>(t);
  }

  // Maps a ds_config value onto a recipe key; "auto" is resolved later from the recipe.
  void map(const std::string& ds_key, const Node& value, const Location& where, const std::string& target) {
    if (is_auto(value)) {
      ctx_.autos.push_back({ds_key, where, target});
      return;
    }
    if (value.kind == Node::Kind::kString && read_without_conversion(ds_key) && numeric(target)) {
      ctx_.problem(where, fmt::format("{}: expected a number, found the string \"{}\"; DeepSpeed reads this key without converting it "
                                      "and would fail on it: write {} without quotes",
                                      ds_key, value.text, value.text));
      return;
    }
    note_conflict(ds_key, value, where, target);
    ctx_.set(target, value, where, /*lax=*/true, ds_key);
  }

  // The ds_config wins over the recipe; say so when they disagree.
  void note_conflict(const std::string& ds_key, const Node& value, const Location& where, const std::string& target) {
    if (!ctx_.explicitly_set(target) || ctx_.recipe.sources[target] == "--set") return;
    Recipe probe = ctx_.recipe;
    const Field* f = find_field(target);
    if (!f || !assign_node(*f, value, probe, true).empty()) return;
    const std::string before = value_text(*f, ctx_.recipe), after = value_text(*f, probe);
    if (before != after)
      ctx_.warning(where, fmt::format("{} = {} overrides {} = {} from {} (the ds_config takes precedence over the recipe)", ds_key, after,
                                      target, before, ctx_.recipe.sources[target]));
  }

  void unimplemented(const std::string& ds_key, const Node& value, const Location& where, const Unimplemented& u) {
    if (u.policy == Policy::kSilent || equals_default(value, u.deflt)) return;
    if (u.policy == Policy::kError)
      ctx_.problem(where, fmt::format("{} = {} is not supported by dstrain, and it would change the training math. {}", ds_key,
                                      shown(value), u.instead));
    else
      ctx_.warning(where, fmt::format("{} = {} has no effect in dstrain. {}", ds_key, shown(value), u.instead));
  }

  // Walks a section's keys: `handle` returns true for the keys it knows; the rest are checked
  // against `ignored`, and anything else is an unknown key (DeepSpeed's extra="forbid").
  template <typename Handle>
  void section(const Node& node, const std::string& name, const std::vector<Unimplemented>& ignored, const std::vector<std::string>& known,
               Handle handle) {
    if (!node.is_object()) {
      ctx_.problem(node.where, fmt::format("{}: expected a JSON object, found a {}", name, node.kind_name()));
      return;
    }
    for (size_t i = 0; i < node.members.size(); ++i) {
      const std::string& key = node.members[i].first;
      const Node& value = node.members[i].second;
      const Location& where = node.key_locations[i];
      if (handle(key, value, where)) continue;
      const auto it = std::find_if(ignored.begin(), ignored.end(), [&](const Unimplemented& u) { return key == u.key; });
      if (it != ignored.end()) {
        unimplemented(join(name, key), value, where, *it);
        continue;
      }
      std::vector<std::string> candidates = known;
      for (const auto& u : ignored) candidates.push_back(u.key);
      ctx_.problem(where, fmt::format("{}: unknown key{}; DeepSpeed rejects it too", join(name, key), did_you_mean(key, candidates)));
    }
  }

  // A section that only matters when `enabled` is true.
  bool enabled(const Node& node) {
    const Node* e = node.is_object() ? node.find("enabled") : nullptr;
    bool on = false;
    return e && node_bool(*e, true, on) && on;
  }

  // --- top level ---------------------------------------------------------------------------------
  void top(const Node& root) {
    const Node* bf16 = root.find("bf16");
    for (size_t i = 0; i < root.members.size(); ++i) {
      const std::string& key = root.members[i].first;
      const Node& value = root.members[i].second;
      const Location& where = root.key_locations[i];
      if (key == "train_batch_size")
        map(key, value, where, "train.global_batch_size");
      else if (key == "train_micro_batch_size_per_gpu")
        map(key, value, where, "train.micro_batch_size");
      else if (key == "gradient_accumulation_steps")
        map(key, value, where, "train.gradient_accumulation_steps");
      else if (key == "gradient_clipping")
        map(key, value, where, "train.grad_clip");
      else if (key == "steps_per_print") {
        if (value.kind == Node::Kind::kNull)
          ctx_.set("logging.steps_per_print", Node{Node::Kind::kNumber, "0", {}, {}, {}, where}, where, true, key);
        else
          map(key, value, where, "logging.steps_per_print");
      } else if (key == "optimizer")
        optimizer(value);
      else if (key == "scheduler")
        scheduler(value);
      else if (key == "fp16")
        fp16(value);
      else if (key == "bf16")
        bf16_section(value, "bf16");
      else if (key == "bfloat16") {
        if (bf16)
          ctx_.warning(where, "bfloat16 is the deprecated name of bf16, and bf16 is also given: bfloat16 is ignored, as DeepSpeed does");
        else
          bf16_section(value, "bfloat16");
      } else if (key == "zero_optimization")
        zero(value, where, root);
      else if (key == "wall_clock_breakdown")
        map(key, value, where, "logging.wall_clock_breakdown");
      else if (key == "tensorboard")
        monitor(value, key, "tensorboard");
      else if (key == "csv_monitor")
        monitor(value, key, "csv");
      else if (key == "wandb")
        wandb(value);
      else if (key == "comet") {
        if (enabled(value))
          ctx_.warning(where,
                       "comet.enabled = true has no effect in dstrain; metrics go to metrics.jsonl, CSV, TensorBoard, and with "
                       "logging.sinks to Weights & Biases or MLflow");
      } else if (key == "amp" || key == "torch_autocast") {
        if (enabled(value))
          ctx_.problem(where, fmt::format("{}.enabled = true is not supported by dstrain, and it would change the training math. Use "
                                          "\"bf16\": {{\"enabled\": true}} or \"fp16\"",
                                          key));
      } else if (key == "sequence_parallel_size") {
        map(key, value, where, "parallel.sequence_parallel_size");
      } else if (key == "vocabulary_size") {
        ctx_.warning(where, "vocabulary_size has no effect in dstrain: the model's vocabulary comes from the recipe (model.vocab_size)");
      } else if (!top_unimplemented(key, value, where)) {
        // A typo of a known key would silently leave that setting at its default (DeepSpeed ignores unknown keys).
        const std::string hint = did_you_mean(key, known_top());
        if (hint.empty())
          ctx_.warning(where, fmt::format("{}: unknown top-level key, ignored (DeepSpeed ignores it silently)", key));
        else
          ctx_.problem(where, fmt::format("{}: unknown top-level key{}; DeepSpeed would ignore it and leave that setting at its default, "
                                          "so dstrain refuses it: fix the name, or remove the key",
                                          key, hint));
      }
    }
  }

  static std::vector<std::string> known_top() {
    std::vector<std::string> keys = {"train_batch_size",
                                     "train_micro_batch_size_per_gpu",
                                     "gradient_accumulation_steps",
                                     "gradient_clipping",
                                     "steps_per_print",
                                     "optimizer",
                                     "scheduler",
                                     "fp16",
                                     "bf16",
                                     "bfloat16",
                                     "zero_optimization",
                                     "tensorboard",
                                     "csv_monitor",
                                     "wandb",
                                     "comet",
                                     "amp",
                                     "torch_autocast",
                                     "sequence_parallel_size",
                                     "vocabulary_size"};
    for (const auto& u : top_ignored()) keys.push_back(u.key);
    for (const auto& s : out_of_scope()) keys.push_back(s.first);
    return keys;
  }

  static const std::vector<Unimplemented>& top_ignored() {
    static const std::vector<Unimplemented> keys = {
        {"managed_gradient_accumulation", "true", Policy::kError,
         "dstrain always decides the accumulation boundary itself (train.gradient_accumulation_steps / train.accumulation)"},
        {"memory_breakdown", "false", Policy::kWarn, "dstrain reports memory in its metrics"},
        {"dump_state", "false", Policy::kWarn, "use `dstrain train --dry-run` to see the resolved config"},
        {"prescale_gradients", "false", Policy::kWarn, "dstrain averages gradients in fp32, which is the same math"},
        {"gradient_predivide_factor", "1", Policy::kWarn, "dstrain averages gradients in fp32, which is the same math"},
        {"gradient_allreduce_op", "\"mean\"", Policy::kError, "dstrain averages gradients over ranks (\"mean\")"},
        {"communication_data_type", "null", Policy::kWarn, "dstrain reduces gradients in fp32"},
        {"seq_parallel_communication_data_type", "\"fp32\"", Policy::kWarn, "dstrain has no sequence parallelism"},
        {"sparse_gradients", "false", Policy::kWarn, "embedding gradients are dense in dstrain (same math)"},
        {"disable_allgather", "false", Policy::kWarn, "legacy DeepSpeed option"},
        {"zero_allow_untested_optimizer", "false", Policy::kSilent, ""},
        {"zero_force_ds_cpu_optimizer", "true", Policy::kSilent, ""},
        {"allgather_size", "500000000", Policy::kSilent, ""},
        {"dataloader_drop_last", "false", Policy::kWarn, "dstrain's sampler never drops samples: it continues into the next epoch"},
        {"log_level", "null", Policy::kSilent, ""},
        {"graph_harvesting", "false", Policy::kWarn, "not applicable to dstrain"},
        {"aio", "null", Policy::kWarn, "dstrain has no NVMe offload"},
        {"activation_checkpointing", "null", Policy::kWarn, "it sets train.activation_checkpointing: full"},
        {"flops_profiler", "null", Policy::kWarn, "dstrain reports MFU in its metrics"},
        {"comms_logger", "null", Policy::kWarn, "dstrain's communication benchmark is `scripts/bench-comm.sh`"},
        {"checkpoint", "null", Policy::kWarn, "dstrain checkpoints are always resharded on load (universal) and checksummed"},
        {"data_types", "null", Policy::kWarn, "dstrain accumulates gradients in fp32"},
    };
    return keys;
  }

  // Sections DeepSpeed parses that dstrain v1 does not implement: (name, changes the math).
  static const std::vector<std::pair<std::string, bool>>& out_of_scope() {
    static const std::vector<std::pair<std::string, bool>> keys = {
        {"sparse_attention", true},
        {"progressive_layer_drop", true},
        {"eigenvalue", true},
        {"quantize_training", true},
        {"compression_training", true},
        {"data_efficiency", true},
        {"curriculum_learning", true},
        {"elasticity", true},
        {"autotuning", true},
        {"tensor_parallel", true},
        {"expert_parallel", true},
        {"weight_quantization", true},
        {"use_data_before_expert_parallelism", false},
        {"nebula", false},
        {"hybrid_engine", false},
        {"compile", false},
        {"timers", false},
    };
    return keys;
  }

  bool top_unimplemented(const std::string& key, const Node& value, const Location& where) {
    for (const auto& u : top_ignored()) {
      if (key != u.key) continue;
      // Sections (deflt "null"): set means "asks for something" when enabled or non-empty.
      if (std::string(u.deflt) == "null" && value.is_object()) {
        if (key == "checkpoint")
          checkpoint_section(value, where);
        else if (key == "data_types")
          data_types(value);
        else if (key == "activation_checkpointing")
          activation_checkpointing(value, where);
        else if (enabled(value) || (value.find("enabled") == nullptr && !value.members.empty() && key != "aio"))
          ctx_.warning(where, fmt::format("{} has no effect in dstrain. {}", key, u.instead));
        return true;
      }
      unimplemented(key, value, where, u);
      return true;
    }
    if (key == "pipeline" && value.is_object()) {
      pipeline_section(value);
      return true;
    }
    for (const auto& [name, changes_math] : out_of_scope()) {
      if (key != name) continue;
      const Node* e = value.is_object() ? value.find("enabled") : nullptr;
      bool on = true;
      if (e) node_bool(*e, true, on);
      if (value.kind == Node::Kind::kNull || (value.is_object() && value.members.empty()) || !on) return true;
      if (changes_math)
        ctx_.problem(where, fmt::format("{} is not supported by dstrain, and it would change the training math. dstrain implements data "
                                        "parallelism with ZeRO stages 0-3; remove the section",
                                        key));
      else
        ctx_.warning(where, fmt::format("{} has no effect in dstrain; remove the section to silence this", key));
      return true;
    }
    return false;
  }

  // DeepSpeed's pipeline block (runtime/config.py): `stages` is the pipeline's size; the rest
  // belongs to DeepSpeed's PipelineModule or has a dstrain key of its own.
  void pipeline_section(const Node& node) {
    section(node, "pipeline",
            {{"partition", "best", Policy::kWarn, "dstrain splits the stages by training FLOPs, or as pipeline.layers_per_stage says"},
             {"seed_layers", "false", Policy::kWarn, "every stage's parameters are those of the whole model from the run's seed"},
             {"activation_checkpoint_interval", "0", Policy::kWarn, "use train.activation_checkpointing (full or selective)"},
             {"pipe_partitioned", "true", Policy::kSilent, ""},
             {"grad_partitioned", "true", Policy::kSilent, ""},
             {"use_reentrant", "true", Policy::kSilent, ""}},
            {"stages"}, [&](const std::string& key, const Node& value, const Location& where) {
              if (key != "stages") return false;
              // "auto": DeepSpeed takes the stages from the PipelineModule; without one, no pipeline.
              if (!(value.kind == Node::Kind::kString && value.text == "auto"))
                map("pipeline.stages", value, where, "parallel.pipeline_parallel_size");
              return true;
            });
  }

  void checkpoint_section(const Node& node, const Location&) {
    section(node, "checkpoint",
            {{"load_universal", "false", Policy::kWarn, "dstrain loads any checkpoint on any number of ranks without conversion"},
             {"use_node_local_storage", "false", Policy::kWarn, "dstrain writes checkpoints to checkpoint.dir"},
             {"parallel_write", "null", Policy::kSilent, ""}},
            {"tag_validation"}, [&](const std::string& key, const Node& value, const Location& where) {
              if (key != "tag_validation") return false;
              std::string v = value.text;
              std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
              if (v != "warn" && v != "ignore" && v != "fail")
                ctx_.problem(where, fmt::format("checkpoint.tag_validation: '{}' is not one of Warn, Ignore, Fail", value.text));
              return true;
            });
  }

  // DeepSpeed's block configures checkpointing that the model code opts into; here it asks for
  // full recompute unless the recipe chose a mode itself.
  void activation_checkpointing(const Node& node, const Location& where) {
    const std::string target = "train.activation_checkpointing";
    if (!ctx_.explicitly_set(target))
      ctx_.set(target, Node{Node::Kind::kString, "full", {}, {}, {}, where}, where, false, "activation_checkpointing");
    else if (ctx_.recipe.train.activation_checkpointing == Recompute::kNone)
      ctx_.warning(where, fmt::format("activation_checkpointing is ignored: {} sets {} = none", ctx_.recipe.sources[target], target));
    section(node, "activation_checkpointing",
            {{"partition_activations", "false", Policy::kWarn,
              "It splits checkpoints over model-parallel ranks, and dstrain has no tensor parallelism"},
             {"contiguous_memory_optimization", "false", Policy::kWarn, "Checkpointed inputs come from the caching allocator"},
             {"number_checkpoints", "null", Policy::kWarn, "Every decoder layer is a checkpoint"},
             {"synchronize_checkpoint_boundary", "false", Policy::kWarn, "dstrain does not synchronize at checkpoint boundaries"},
             {"profile", "false", Policy::kWarn, "Use logging.wall_clock_breakdown for forward and backward times"}},
            {"cpu_checkpointing"}, [&](const std::string& key, const Node& value, const Location& at) {
              if (key != "cpu_checkpointing") return false;
              bool on = false;
              if (!node_bool(value, true, on))
                ctx_.problem(at, "activation_checkpointing.cpu_checkpointing: expected true or false");
              else if (on)
                ctx_.problem(at,
                             "activation_checkpointing.cpu_checkpointing = true is not supported by dstrain: checkpointed layer inputs "
                             "stay on the device (one micro-batch x seq_len x hidden_size tensor per layer). Set it to false; "
                             "zero.offload_optimizer: cpu or a smaller train.micro_batch_size free GPU memory instead");
              return true;
            });
  }

  void data_types(const Node& node) {
    section(node, "data_types",
            {{"param_dtype", "null", Policy::kWarn, "parameters follow precision.dtype"},
             {"buffer_dtype", "null", Policy::kWarn, "buffers follow precision.dtype"}},
            {"grad_accum_dtype"}, [&](const std::string& key, const Node& value, const Location& where) {
              if (key != "grad_accum_dtype") return false;
              if (value.kind != Node::Kind::kNull && value.text != "fp32")
                ctx_.warning(where, fmt::format("data_types.grad_accum_dtype = {} has no effect: dstrain accumulates gradients in fp32",
                                                shown(value)));
              return true;
            });
  }

  // DeepSpeed's wandb monitor: enabled, team, group, project.
  void wandb(const Node& node) {
    if (!node.is_object()) return ctx_.problem(node.where, "wandb: expected a JSON object");
    section(node, "wandb", {}, {"enabled", "team", "group", "project"},
            [&](const std::string& key, const Node& value, const Location& where) {
              if (key == "enabled") {
                bool on = false;
                if (!node_bool(value, true, on)) ctx_.problem(where, "wandb.enabled: expected true or false");
                if (on && !ctx_.recipe.logging.has_sink(Sink::kWandb)) {
                  ctx_.recipe.logging.sinks.push_back(Sink::kWandb);
                  ctx_.recipe.sources["logging.sinks"] = where.str();
                }
              } else {
                map("wandb." + key, value, where, key == "team" ? "logging.wandb_entity" : "logging.wandb_" + key);
              }
              return true;
            });
  }

  void monitor(const Node& node, const std::string& name, const std::string& sink) {
    if (!node.is_object()) return ctx_.problem(node.where, fmt::format("{}: expected a JSON object", name));
    // DeepSpeed writes to output_path/job_name; without an output_path dstrain keeps the run
    // directory's default (run_dir/tensorboard, run_dir/csv).
    std::string output_path, job_name = "DeepSpeedJobName";
    Location path_where = node.where;
    section(node, name, {}, {"enabled", "output_path", "job_name"}, [&](const std::string& key, const Node& value, const Location& where) {
      if (key == "output_path" || key == "job_name") {
        if (value.kind != Node::Kind::kString) {
          ctx_.problem(where, fmt::format("{}.{}: expected a string", name, key));
        } else if (key == "output_path") {
          output_path = value.text, path_where = where;
        } else {
          job_name = value.text;
        }
        return true;
      }
      if (key != "enabled") return false;
      bool on = false;
      if (!node_bool(value, true, on)) ctx_.problem(where, fmt::format("{}.enabled: expected true or false", name));
      Sink kind{};
      parse_enum(sink, kind);
      if (on && !ctx_.recipe.logging.has_sink(kind)) {
        ctx_.recipe.logging.sinks.push_back(kind);
        ctx_.recipe.sources["logging.sinks"] = where.str();
      }
      return true;
    });
    if (!output_path.empty())
      ctx_.set(fmt::format("logging.{}_dir", sink), Node{Node::Kind::kString, output_path + "/" + job_name, {}, {}, {}, path_where},
               path_where, true, name + ".output_path");
  }

  // --- optimizer and scheduler ---------------------------------------------------------------------
  void optimizer(const Node& node) {
    std::string type;
    const Node* params = nullptr;
    section(node, "optimizer", {}, {"type", "params"}, [&](const std::string& key, const Node& value, const Location& where) {
      if (key == "type") {
        type = value.text;
        std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::tolower(c); });
        if (type != "adam" && type != "adamw")
          ctx_.problem(
              where, fmt::format("optimizer.type '{}' is not supported by dstrain; it implements Adam and AdamW (as DeepSpeed's FusedAdam)",
                                 value.text));
        type_where_ = where;
        return true;
      }
      if (key == "params") return params = &value, true;
      return false;
    });
    bool adam_w_mode = true;  // DeepSpeed's default for both "Adam" and "AdamW"
    if (params) {
      section(
          *params, "optimizer.params",
          {{"torch_adam", "false", Policy::kSilent, ""},
           {"bias_correction", "true", Policy::kError, "dstrain's Adam always corrects the bias"},
           {"amsgrad", "false", Policy::kError, "AMSGrad is not implemented"},
           {"fused", "null", Policy::kSilent, ""}},
          {"lr", "betas", "eps", "weight_decay", "adam_w_mode", "max_grad_norm"},
          [&](const std::string& key, const Node& value, const Location& where) {
            const std::string ds_key = "optimizer.params." + key;
            if (key == "lr")
              map(ds_key, value, where, "optimizer.lr");
            else if (key == "eps")
              map(ds_key, value, where, "optimizer.eps");
            else if (key == "weight_decay")
              map(ds_key, value, where, "optimizer.weight_decay");
            else if (key == "betas") {
              if (is_auto(value)) {
                ctx_.autos.push_back({ds_key, where, "optimizer.beta1"});
                ctx_.autos.push_back({ds_key, where, "optimizer.beta2"});
              } else if (value.kind != Node::Kind::kArray || value.items.size() != 2) {
                ctx_.problem(where, fmt::format("{}: expected a list of two numbers [beta1, beta2]", ds_key));
              } else {
                map(ds_key, value.items[0], where, "optimizer.beta1");
                map(ds_key, value.items[1], where, "optimizer.beta2");
              }
            } else if (key == "adam_w_mode") {
              if (!node_bool(value, true, adam_w_mode)) ctx_.problem(where, "optimizer.params.adam_w_mode: expected true or false");
            } else if (key == "max_grad_norm") {
              ctx_.problem(
                  where,
                  "'max_grad_norm' is not supported as an optimizer parameter (as in DeepSpeed): use the top-level \"gradient_clipping\"");
            } else {
              return false;
            }
            return true;
          });
    }
    if (type == "adam" || type == "adamw") {
      const std::string resolved = (type == "adamw" || adam_w_mode) ? "adamw" : "adam";
      ctx_.set("optimizer.type", Node{Node::Kind::kString, resolved, {}, {}, {}, type_where_}, type_where_, false, "optimizer.type");
    }
  }

  // OneCycle's parameters map one to one onto schedule.* keys (DeepSpeed's defaults are dstrain's).
  void one_cycle(const Node* params, const std::string& default_source, const Location& type_where) {
    ctx_.set("schedule.warmup_steps", Node{Node::Kind::kNumber, "0", {}, {}, {}, type_where}, type_where, false);
    ctx_.recipe.sources["schedule.warmup_steps"] = default_source + ": OneCycle has no separate warmup";
    if (!params) return;
    static const std::vector<std::string> kMapped = {"cycle_min_lr",           "cycle_max_lr",    "decay_lr_rate",  "cycle_first_step_size",
                                                     "cycle_second_step_size", "decay_step_size", "cycle_momentum", "cycle_min_mom",
                                                     "cycle_max_mom",          "decay_mom_rate"};
    std::vector<std::string> known = kMapped;
    known.insert(known.end(), {"cycle_first_stair_count", "cycle_second_stair_count"});
    section(*params, "scheduler.params",
            {{"last_batch_iteration", "-1", Policy::kError, "dstrain resumes the schedule from the checkpoint's step"},
             {"cycle_first_stair_count", "0", Policy::kError, "dstrain's OneCycle is continuous (staircase cycles are not implemented)"},
             {"cycle_second_stair_count", "0", Policy::kError, "dstrain's OneCycle is continuous (staircase cycles are not implemented)"}},
            known, [&](const std::string& key, const Node& value, const Location& where) {
              if (std::find(kMapped.begin(), kMapped.end(), key) == kMapped.end()) return false;
              map("scheduler.params." + key, value, where, "schedule." + key);
              return true;
            });
  }

  void scheduler(const Node& node) {
    std::string type;
    Location type_where = node.where;
    const Node* params = nullptr;
    section(node, "scheduler", {}, {"type", "params"}, [&](const std::string& key, const Node& value, const Location& where) {
      if (key == "type") return type = value.text, type_where = where, true;
      if (key == "params") return params = &value, true;
      return false;
    });
    static const std::map<std::string, std::string> kTypes = {{"WarmupCosineLR", "ds_warmup_cosine"},
                                                              {"WarmupLR", "ds_warmup"},
                                                              {"WarmupDecayLR", "ds_warmup_decay"},
                                                              {"OneCycle", "ds_one_cycle"}};
    const auto it = kTypes.find(type);
    if (it == kTypes.end()) {
      if (!type.empty())
        ctx_.problem(type_where,
                     fmt::format("scheduler.type '{}' is not supported by dstrain; it implements WarmupCosineLR, WarmupLR, WarmupDecayLR "
                                 "and OneCycle exactly, and its own warmup_cosine and wsd (schedule.type in the recipe)",
                                 type));
      else
        ctx_.problem(node.where, "scheduler: \"type\" is missing");
      return;
    }
    auto text_node = [&](const std::string& t, Node::Kind kind = Node::Kind::kNumber) { return Node{kind, t, {}, {}, {}, type_where}; };
    // The HF Trainer's trap: a ds_config scheduler silently replaces --lr_scheduler_type. Here
    // the replacement is the same, and said (warn_ds_scheduler).
    if (ctx_.explicitly_set("schedule.type") && name(ctx_.recipe.schedule.type) != it->second)
      ctx_.ds.replaced_schedule = fmt::format("{} ({})", name(ctx_.recipe.schedule.type), ctx_.recipe.sources["schedule.type"]);
    ctx_.ds.scheduler = type, ctx_.ds.scheduler_where = type_where;
    ctx_.set("schedule.type", text_node(it->second, Node::Kind::kString), type_where, false, "scheduler.type");
    // DeepSpeed's defaults for the scheduler's parameters, unless the params say otherwise.
    // "default ..." so that these count as defaults: the params and the recipe override them quietly.
    const std::string default_source = fmt::format("default of DeepSpeed's {} ({})", type, type_where.str());
    // DeepSpeed's defaults for parameters the ds_config omits, unless the recipe chose a value.
    auto ds_default = [&](const std::string& target, const std::string& value, Node::Kind kind = Node::Kind::kNumber) {
      if (ctx_.explicitly_set(target)) return;
      ctx_.set(target, text_node(value, kind), type_where, false);
      ctx_.recipe.sources[target] = default_source;
    };
    if (type == "OneCycle") {
      one_cycle(params, default_source, type_where);
      return;
    }
    ds_default("schedule.warmup_steps", "1000");
    ds_default("schedule.warmup_type", "log", Node::Kind::kString);
    ds_default("schedule.warmup_min_ratio", "0");
    if (type == "WarmupCosineLR") ds_default("schedule.min_lr_ratio", "0.0001");
    if (type == "WarmupDecayLR") ds_default("schedule.min_lr_ratio", "0");
    if (!params) return;
    std::vector<std::string> known = {"warmup_num_steps", "warmup_type"};
    if (type == "WarmupCosineLR")
      known.insert(known.end(), {"total_num_steps", "warmup_min_ratio", "cos_min_ratio"});
    else
      known.insert(known.end(), {"warmup_min_lr", "warmup_max_lr"});
    if (type == "WarmupDecayLR") known.push_back("total_num_steps");
    const Node* min_lr = nullptr;
    Location min_lr_where;
    section(*params, "scheduler.params",
            {{"last_batch_iteration", "-1", Policy::kError, "dstrain resumes the schedule from the checkpoint's step"}}, known,
            [&](const std::string& key, const Node& value, const Location& where) {
              if (std::find(known.begin(), known.end(), key) == known.end()) return false;
              const std::string ds_key = "scheduler.params." + key;
              if (key == "total_num_steps")
                map(ds_key, value, where, "train.steps");
              else if (key == "warmup_num_steps")
                map(ds_key, value, where, "schedule.warmup_steps");
              else if (key == "warmup_min_ratio")
                map(ds_key, value, where, "schedule.warmup_min_ratio");
              else if (key == "cos_min_ratio")
                map(ds_key, value, where, "schedule.min_lr_ratio");
              else if (key == "warmup_max_lr")
                map(ds_key, value, where, "optimizer.lr");
              else if (key == "warmup_min_lr")
                min_lr = &value, min_lr_where = where;
              else if (key == "warmup_type") {
                if (value.text != "log" && value.text != "linear")
                  ctx_.warning(where,
                               fmt::format("{} '{}' is unknown; DeepSpeed then uses 'log', and so does dstrain", ds_key, value.text));
                else
                  map(ds_key, value, where, "schedule.warmup_type");
              }
              return true;
            });
    // WarmupLR/WarmupDecayLR give warmup_min_lr as an absolute LR; dstrain keeps a ratio of the
    // peak, known only once every layer is read (finish_ds_config).
    if (min_lr && is_auto(*min_lr)) {
      // The HF Trainer fills "auto" with 0; a warmup_min_ratio the recipe sets is kept.
      if (!ctx_.explicitly_set("schedule.warmup_min_ratio")) {
        ctx_.set("schedule.warmup_min_ratio", Node{Node::Kind::kNumber, "0", {}, {}, {}, min_lr_where}, min_lr_where, false);
        ctx_.recipe.sources["schedule.warmup_min_ratio"] = min_lr_where.str() + " (\"auto\": 0, as the HF Trainer fills it)";
      } else {
        ctx_.recipe.sources["schedule.warmup_min_ratio"] += fmt::format(" (filled into \"auto\" at {})", min_lr_where.str());
      }
    } else if (min_lr) {
      double v = 0;
      if (min_lr->kind == Node::Kind::kString)
        ctx_.problem(min_lr_where,
                     fmt::format("scheduler.params.warmup_min_lr: expected a number, found the string \"{}\"; DeepSpeed reads "
                                 "this key without converting it and would fail on it",
                                 min_lr->text));
      else if (!node_number(*min_lr, true, v) || v < 0)
        ctx_.problem(min_lr_where, "scheduler.params.warmup_min_lr: expected a number >= 0");
      else
        ctx_.ds.warmup_min_lr = v, ctx_.ds.warmup_min_lr_where = min_lr_where;
    }
  }

  // --- precision ---------------------------------------------------------------------------------
  void fp16(const Node& node) {
    bool on = false;
    Location on_where = node.where;
    section(node, "fp16",
            {{"auto_cast", "false", Policy::kWarn, "dstrain casts inputs itself"},
             {"fp16_master_weights_and_grads", "false", Policy::kError, "dstrain keeps fp32 master weights and gradients"}},
            {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis", "min_loss_scale"},
            [&](const std::string& key, const Node& value, const Location& where) {
              const std::string ds_key = "fp16." + key;
              if (key == "enabled") {
                if (is_auto(value))
                  ctx_.ds.fp16_auto = where;
                else if (!node_bool(value, true, on))
                  ctx_.problem(where, "fp16.enabled: expected true or false");
                on_where = where;
              } else if (key == "loss_scale" || key == "initial_scale_power" || key == "loss_scale_window" || key == "hysteresis" ||
                         key == "consecutive_hysteresis" || key == "min_loss_scale") {
                map(ds_key, value, where, "precision." + key);
              } else {
                return false;
              }
              return true;
            });
    if (on)
      fp16_on_ = on_where,
      ctx_.set("precision.dtype", Node{Node::Kind::kString, "fp16", {}, {}, {}, on_where}, on_where, false, "fp16.enabled");
    check_both();
  }

  void bf16_section(const Node& node, const std::string& name) {
    bool on = false;
    Location on_where = node.where;
    section(node, name,
            {{"immediate_grad_update", "false", Policy::kWarn, "dstrain applies gradients at the accumulation boundary"},
             {"check_grad_overflow", "true", Policy::kSilent, ""},
             {"bf16_master_weights_and_grads", "false", Policy::kError, "dstrain keeps fp32 master weights and gradients"},
             {"bf16_optimizer_states", "false", Policy::kError, "dstrain keeps optimizer states in fp32"}},
            {"enabled"}, [&](const std::string& key, const Node& value, const Location& where) {
              if (key != "enabled") return false;
              if (is_auto(value))
                ctx_.ds.bf16_auto = where;
              else if (!node_bool(value, true, on))
                ctx_.problem(where, name + ".enabled: expected true or false");
              on_where = where;
              return true;
            });
    if (on)
      bf16_on_ = on_where,
      ctx_.set("precision.dtype", Node{Node::Kind::kString, "bf16", {}, {}, {}, on_where}, on_where, false, name + ".enabled");
    check_both();
  }

  void check_both() {
    if (bf16_on_.line && fp16_on_.line && !both_reported_) {
      both_reported_ = true;
      ctx_.problem(bf16_on_, fmt::format("bf16 and fp16 cannot both be enabled (fp16 is enabled at {}); pick one", fp16_on_.str()));
    }
  }

  // --- ZeRO ----------------------------------------------------------------------------------------
  void zero(const Node& node, const Location& where, const Node& root) {
    if (node.kind == Node::Kind::kBool) {
      const bool on = node.text == "true";
      ctx_.warning(where, fmt::format("\"zero_optimization\": {} is deprecated; write {{\"stage\": {}}}", node.text, on ? 1 : 0));
      ctx_.set("zero.stage", Node{Node::Kind::kNumber, on ? "1" : "0", {}, {}, {}, where}, where, false, "zero_optimization");
      if (on) {
        if (const Node* size = root.find("allgather_size"))
          map("allgather_size", *size, *root.key_location("allgather_size"), "zero.allgather_bucket_size");
      }
      return;
    }
    check_zero_conflicts(node);
    std::vector<std::string> known = {"stage",
                                      "contiguous_gradients",
                                      "reduce_scatter",
                                      "reduce_bucket_size",
                                      "allgather_bucket_size",
                                      "overlap_comm",
                                      "sub_group_size",
                                      "offload_optimizer",
                                      "offload_param",
                                      "cpu_offload",
                                      "cpu_offload_param",
                                      "cpu_offload_use_pin_memory",
                                      "stage3_gather_fp16_weights_on_model_save"};
    for (const auto& [prefixed, plain] : zero_aliases()) known.push_back(prefixed), known.push_back(plain);
    section(node, "zero_optimization",
            {{"use_multi_rank_bucket_allreduce", "true", Policy::kSilent, ""},
             {"allgather_partitions", "true", Policy::kWarn, "dstrain always all-gathers updated partitions (same math)"},
             {"load_from_fp32_weights", "true", Policy::kSilent, ""},
             {"elastic_checkpoint", "false", Policy::kWarn, "dstrain checkpoints load on any number of ranks"},
             {"round_robin_gradients", "false", Policy::kWarn, "a CPU-offload copy optimisation; same math"},
             {"ignore_unused_parameters", "true", Policy::kSilent, ""},
             {"zero_hpz_partition_size", "1", Policy::kError, "hierarchical partitioning (ZeRO++) is not implemented"},
             {"zero_quantized_weights", "false", Policy::kError, "quantized communication (ZeRO++) is not implemented"},
             {"zero_quantized_nontrainable_weights", "false", Policy::kError, "quantized communication (ZeRO++) is not implemented"},
             {"zero_quantized_gradients", "false", Policy::kError, "quantized communication (ZeRO++) is not implemented"},
             {"zeropp_loco_param", "null", Policy::kError, "ZeRO++ LoCo is not implemented"},
             {"mics_shard_size", "-1", Policy::kError, "MiCS sharding is not implemented"},
             {"mics_hierarchical_params_gather", "false", Policy::kWarn, "MiCS is not implemented"},
             {"memory_efficient_linear", "true", Policy::kSilent, ""},
             {"pipeline_loading_checkpoint", "false", Policy::kWarn, "dstrain names parameters globally, whatever the pipeline"},
             {"override_module_apply", "true", Policy::kSilent, ""},
             {"log_trace_cache_warnings", "false", Policy::kSilent, ""},
             {"enable_sanity_checks", "false", Policy::kSilent, ""},
             {"save_muon_momentum_buffer_in_memory", "false", Policy::kSilent, ""},
             {"leaf_module", "null", Policy::kWarn, "stage 3 gathers each layer's parameters as a unit"},
             {"zenflow", "null", Policy::kError, "ZenFlow is not implemented"},
             {"legacy_stage1", "false", Policy::kError, "DeepSpeed itself refuses legacy_stage1"}},
            known, [&](const std::string& key, const Node& value, const Location& kw) { return zero_key(key, value, kw); });
  }

  // DeepSpeed's stage-3 keys and their aliases without the prefix.
  static const std::vector<std::pair<std::string, std::string>>& zero_aliases() {
    static const std::vector<std::pair<std::string, std::string>> aliases = {
        {"stage3_prefetch_bucket_size", "prefetch_bucket_size"},
        {"stage3_param_persistence_threshold", "param_persistence_threshold"},
        {"stage3_model_persistence_threshold", "model_persistence_threshold"},
        {"stage3_max_live_parameters", "max_live_parameters"},
        {"stage3_max_reuse_distance", "max_reuse_distance"},
        {"stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save"},
        {"stage3_module_granularity_threshold", "module_granularity_threshold"},
        {"stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params"},
        {"stage3_allgather_sequential", "allgather_sequential"}};
    return aliases;
  }

  // Keys that DeepSpeed refuses together.
  void check_zero_conflicts(const Node& node) {
    if (node.is_object()) {
      for (const auto& [prefixed, plain] : zero_aliases())
        if (node.find(prefixed) && node.find(plain))
          ctx_.problem(*node.key_location(plain),
                       fmt::format("zero_optimization: '{}' and its alias '{}' are both given; keep one", plain, prefixed));
      if (node.find("cpu_offload") && node.find("offload_optimizer"))
        ctx_.problem(*node.key_location("cpu_offload"),
                     "Cannot provide deprecated parameter 'cpu_offload' and replacing parameter 'offload_optimizer' together");
      if (node.find("cpu_offload_param") && node.find("offload_param"))
        ctx_.problem(*node.key_location("cpu_offload_param"),
                     "Cannot provide deprecated parameter 'cpu_offload_param' and replacing parameter 'offload_param' together");
      if (node.find("stage3_gather_fp16_weights_on_model_save") && node.find("stage3_gather_16bit_weights_on_model_save"))
        ctx_.problem(*node.key_location("stage3_gather_fp16_weights_on_model_save"),
                     "Cannot provide deprecated parameter 'stage3_gather_fp16_weights_on_model_save' and replacing parameter "
                     "'stage3_gather_16bit_weights_on_model_save' together");
    }
  }

  // One zero_optimization key; false when it is not one of the keys handled here.
  bool zero_key(const std::string& key, const Node& value, const Location& kw) {
    const std::string ds_key = "zero_optimization." + key;
    std::string canonical = key;  // the stage3_ spelling of an alias
    for (const auto& [prefixed, plain] : zero_aliases())
      if (key == plain) canonical = prefixed;
    if (key == "stage") {
      double v = -1;
      if (!node_number(value, true, v) || (v != 0 && v != 1 && v != 2 && v != 3))
        ctx_.problem(kw, fmt::format("zero_optimization.stage: {} is not 0, 1, 2 or 3", shown(value)));
      else
        map(ds_key, value, kw, "zero.stage");
    } else if (key == "reduce_bucket_size" || key == "allgather_bucket_size" || key == "contiguous_gradients" || key == "reduce_scatter" ||
               key == "sub_group_size") {
      if (is_auto(value))
        ctx_.ds.derived_autos.push_back({ds_key, kw, "zero." + key});
      else
        map(ds_key, value, kw, "zero." + key);
    } else if (key == "overlap_comm") {
      if (value.kind != Node::Kind::kNull) map(ds_key, value, kw, "zero.overlap_comm"), ctx_.ds.overlap_comm_given = true;
    } else if (canonical == "stage3_prefetch_bucket_size" || canonical == "stage3_param_persistence_threshold" ||
               canonical == "stage3_max_live_parameters" || canonical == "stage3_max_reuse_distance" ||
               canonical == "stage3_gather_16bit_weights_on_model_save") {
      if (is_auto(value))
        ctx_.ds.derived_autos.push_back({ds_key, kw, "zero." + canonical});
      else
        map(ds_key, value, kw, "zero." + canonical);
    } else if (canonical == "stage3_model_persistence_threshold" || canonical == "stage3_module_granularity_threshold" ||
               canonical == "stage3_use_all_reduce_for_fetch_params" || canonical == "stage3_allgather_sequential") {
      static const std::map<std::string, Unimplemented> kStage3 = {
          {"stage3_model_persistence_threshold", {"", "9223372036854775807", Policy::kSilent, ""}},
          {"stage3_module_granularity_threshold", {"", "0", Policy::kWarn, "stage 3 gathers per layer"}},
          {"stage3_use_all_reduce_for_fetch_params", {"", "false", Policy::kWarn, "stage 3 fetches with all-gather (same math)"}},
          {"stage3_allgather_sequential", {"", "false", Policy::kWarn, "same math"}}};
      unimplemented(ds_key, value, kw, kStage3.at(canonical));
    } else if (key == "stage3_gather_fp16_weights_on_model_save") {
      ctx_.warning(kw,
                   "Config parameter stage3_gather_fp16_weights_on_model_save is deprecated use "
                   "stage3_gather_16bit_weights_on_model_save instead");
      map(ds_key, value, kw, "zero.stage3_gather_16bit_weights_on_model_save");
    } else if (key == "offload_optimizer" || key == "offload_param") {
      offload(value, key);
    } else if (key == "cpu_offload" || key == "cpu_offload_param") {
      const std::string replacement = key == "cpu_offload" ? "offload_optimizer" : "offload_param";
      ctx_.warning(kw, fmt::format("Config parameter {} is deprecated use {} instead", key, replacement));
      bool on = false;
      if (!node_bool(value, true, on)) ctx_.problem(kw, ds_key + ": expected true or false");
      if (on) ctx_.set("zero." + replacement, Node{Node::Kind::kString, "cpu", {}, {}, {}, kw}, kw, false, ds_key);
    } else if (key == "cpu_offload_use_pin_memory") {
      ctx_.warning(kw, "Config parameter cpu_offload_use_pin_memory is deprecated and has no effect");
    } else {
      return false;
    }
    return true;
  }

  void offload(const Node& node, const std::string& name) {
    const std::string ds_section = "zero_optimization." + name;
    if (node.kind == Node::Kind::kNull) return;
    std::vector<Unimplemented> ignored = {{"nvme_path", "null", Policy::kWarn, "dstrain has no NVMe offload"},
                                          {"buffer_count", name == "offload_param" ? "5" : "4", Policy::kSilent, ""}};
    if (name == "offload_optimizer") {
      ignored.insert(ignored.end(),
                     {{"pipeline_read", "false", Policy::kSilent, ""},
                      {"pipeline_write", "false", Policy::kSilent, ""},
                      {"fast_init", "false", Policy::kSilent, ""},
                      {"ratio", "1", Policy::kError, "partial offload is not implemented: the whole optimizer state is offloaded"},
                      {"super_offload", "false", Policy::kWarn, "dstrain's CPU optimizer is its own"},
                      {"cpuadam_cores_perc", "0.8", Policy::kSilent, ""}});
    } else {
      ignored.insert(ignored.end(), {{"buffer_size", "100000000", Policy::kSilent, ""}, {"max_in_cpu", "1000000000", Policy::kSilent, ""}});
    }
    section(node, ds_section, ignored, {"device", "pin_memory"}, [&](const std::string& key, const Node& value, const Location& where) {
      if (key == "pin_memory") {
        map(ds_section + ".pin_memory", value, where, "zero.pin_memory");
        return true;
      }
      if (key != "device") return false;
      if (value.text == "nvme")
        ctx_.problem(where, fmt::format("{}.device \"nvme\" is not supported by dstrain; use \"cpu\" (pinned host memory)", ds_section));
      else if (value.text == "cpu" || value.text == "none")
        ctx_.set("zero." + name, Node{Node::Kind::kString, value.text, {}, {}, {}, where}, where, false, ds_section + ".device");
      else
        ctx_.problem(where, fmt::format("{}.device: '{}' is not one of none, cpu, nvme", ds_section, value.text));
      return true;
    });
  }

 private:
  LoadContext& ctx_;
  Location type_where_;
  Location fp16_on_, bf16_on_;
  bool both_reported_ = false;
};

}  // namespace

void apply_ds_config(const Node& root, LoadContext& ctx) { DsReader(ctx).read(root); }

void finish_ds_config(LoadContext& ctx) {
  auto& z = ctx.recipe.zero;
  const auto& ds = ctx.ds;
  const int64_t h = ctx.recipe.model.hidden_size;
  for (const auto& a : ds.derived_autos) {
    int64_t value = 0;
    std::string how;
    if (a.target == "zero.reduce_bucket_size")
      value = h * h, how = "hidden_size^2";
    else if (a.target == "zero.stage3_prefetch_bucket_size")
      value = static_cast<int64_t>(0.9 * static_cast<double>(h * h)), how = "int(0.9 * hidden_size^2)";
    else if (a.target == "zero.stage3_param_persistence_threshold")
      value = 10 * h, how = "10 * hidden_size";
    else {
      ctx.autos.push_back(a);  // no model-derived rule: must come from the recipe
      continue;
    }
    const FieldTarget target = find_field(a.target)->target(ctx.recipe);
    if (auto* p = std::get_if<int64_t*>(&target)) **p = value;
    ctx.recipe.sources[a.target] = fmt::format("{} (\"auto\": {} = {})", a.where.str(), how, value);
  }
  if (!ds.overlap_comm_given && !ctx.explicitly_set("zero.overlap_comm")) {
    z.overlap_comm = z.stage == 3;  // DeepSpeed: None means true iff stage 3
    ctx.recipe.sources["zero.overlap_comm"] = "default (DeepSpeed: true iff stage 3)";
  }
  if ((ds.fp16_auto.line || ds.bf16_auto.line) && !ctx.explicitly_set("precision.dtype")) {
    // HF's Trainer fills "auto" from TrainingArguments' fp16/bf16, both False unless asked: fp32.
    const bool both = ds.fp16_auto.line && ds.bf16_auto.line;
    const Location& at = ds.fp16_auto.line ? ds.fp16_auto : ds.bf16_auto;
    const Location where{at.str(), 0, 0};
    if (ctx.set("precision.dtype", Node{Node::Kind::kString, "fp32", {}, {}, {}, where}, where, false))
      ctx.recipe.sources["precision.dtype"] = fmt::format(
          "{} ({} \"auto\" and the recipe sets no precision.dtype: fp32, as HF TrainingArguments' fp16/bf16 default to "
          "False; set precision.dtype: bf16 to train in bf16)",
          at.str(),
          both                ? "fp16.enabled and bf16.enabled are"
          : ds.bf16_auto.line ? "bf16.enabled is"
                              : "fp16.enabled is");
  }
  if (ds.warmup_min_lr >= 0) {
    const double peak = ctx.recipe.optimizer.lr;
    if (peak <= 0 || ds.warmup_min_lr > peak) {
      ctx.problem(ds.warmup_min_lr_where,
                  fmt::format("scheduler.params.warmup_min_lr {:g} must lie in [0, peak lr {:g}]", ds.warmup_min_lr, peak));
    } else {
      ctx.recipe.schedule.warmup_min_ratio = ds.warmup_min_lr / peak;
      ctx.recipe.sources["schedule.warmup_min_ratio"] = ds.warmup_min_lr_where.str() + " (warmup_min_lr / lr)";
    }
  }
}

}  // namespace dstrain::config
