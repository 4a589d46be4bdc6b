#include "dstrain/tasks/eval_target.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <filesystem>

#include "dstrain/ckpt/base_model.h"
#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/train/choice_scores.h"
#include "dstrain/config/enums.h"
#include "dstrain/config/load_context.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/tasks/run_checkpoint.h"
#include "dstrain/data/data_sources.h"

namespace dstrain::tasks {
namespace fs = std::filesystem;
namespace {

bool is_hf_folder(const fs::path& p) {
  return fs::is_regular_file(p / "config.json") &&
         (fs::is_regular_file(p / "model.safetensors") || fs::is_regular_file(p / "model.safetensors.index.json"));
}

// A checkpoint directory's run: the directory above it, or above its checkpoint directory,
// whose config names that checkpoint directory.
std::optional<std::string> run_of_checkpoint(const fs::path& checkpoint) {
  for (const fs::path& up : {checkpoint.parent_path(), checkpoint.parent_path().parent_path()}) {
    if (!fs::is_regular_file(up / "config.resolved.json")) continue;
    const run::RunDir run_dir(up.string());
    const config::Recipe recipe = config::read_resolved_config(run_dir.config_path());
    if (fs::equivalent(run_dir.ckpt_dir(recipe), checkpoint.parent_path())) return up.string();
  }
  return std::nullopt;
}

// verified: usable_checkpoint has checked every file already (the latest); else it is checked
// here, once, and the workers then read without checking CRCs again.
void fill_from_checkpoint(EvalTarget& t, bool verified) {
  const ckpt::Reader reader(t.checkpoint, verified);
  if (!verified) reader.verify();
  t.step = reader.state().step;
  t.written_by = reader.state().world_size;
}

// --data given a file of records (what prepare-data reads) rather than a dataset: says so
// before anything else about it. `tokenizer` is the folder whose tokenizer.json to name.
void refuse_unprepared_data(const EvalFlags& flags, const std::string& tokenizer) {
  if (!flags.format.empty()) return;  // --format says what the file is
  for (const auto& d : flags.data) {
    const std::string name = fs::path(d).filename().string();
    const bool records = [&] {
      for (const char* ext : {".jsonl", ".json", ".parquet", ".jsonl.gz", ".json.gz"})
        if (name.size() > std::strlen(ext) && name.compare(name.size() - std::strlen(ext), std::string::npos, ext) == 0) return true;
      return false;
    }();
    if (records && fs::is_regular_file(d) && !fs::is_regular_file(config::megatron_prefix(d) + ".idx"))
      throw Error(ErrorCode::kUsage, fmt::format("--data '{}' is a file of records, not a dataset: eval reads what prepare-data writes", d),
                  fmt::format("tokenize it first: `dstrain prepare-data {} --tokenizer {} --output PREFIX` (it finds conversations by "
                              "their messages key), then pass --data PREFIX",
                              d, tokenizer));
  }
}

// A recipe for a Hugging Face folder: its config.json gives the model, the data flags the rest.
// The recipe of `dstrain eval DIR` (a Hugging Face folder): no file of its own, these settings.
config::Recipe folder_recipe(const std::string& dir, const std::vector<std::string>& sets) {
  const std::string recipe_name = "dstrain eval " + dir;
  return config::load_recipe_with(recipe_name, sets, [&](const std::string& path) -> std::optional<std::string> {
    if (path == recipe_name) return std::string();
    if (!fs::is_regular_file(path)) return std::nullopt;
    return read_file(path);
  });
}

// A Hugging Face folder scored on --task files alone, or generating: the recipe only builds the
// model (its data section names the first task file, or config.json, read by nothing).
config::Recipe task_recipe(const std::string& dir, const EvalFlags& flags) {
  const std::vector<std::string> sets = {
      "model.init_from=" + dir,
      "data.other_tokenizer=true",
      "run_dir=" + (fs::temp_directory_path() / "dstrain-eval").string(),
      "data.path=" + fs::absolute(flags.tasks.empty() ? (fs::path(dir) / "config.json").string() : flags.tasks.front()).string(),
      "data.format=bytes",
      "data.seq_len=1",
      "train.micro_batch_size=1",
      "train.steps=1",
      "schedule.warmup_steps=0",
      "logging.steps_per_print=1",
      "precision.dtype=" + (flags.dtype.empty() ? std::string("fp32") : flags.dtype),
  };
  return folder_recipe(dir, sets);
}

config::Recipe hf_recipe(const std::string& dir, const EvalFlags& flags) {
  if (!flags.tasks.empty() || flags.model_only) return task_recipe(dir, flags);
  if (flags.data.empty())
    throw Error(ErrorCode::kUsage, fmt::format("a Hugging Face model folder ({}) has no evaluation data of its own", dir),
                "pass --data PATH (prepare-data's output, or a file in --format)");
  refuse_unprepared_data(flags, dir);
  if (!flags.seq_len)
    throw Error(ErrorCode::kUsage, fmt::format("a Hugging Face model folder ({}) does not say how long the windows are", dir),
                "pass --seq-len N (at most its max_position_embeddings)");
  std::string format = flags.format;
  if (format.empty()) format = fs::is_regular_file(config::megatron_prefix(flags.data.front()) + ".idx") ? "megatron" : "bytes";
  // A fine-tuning set's longest conversation is checked against data.seq_len as the recipe loads:
  // it gets --seq-len itself (text gets 1, so that --seq-len is checked against the model next,
  // naming the flag).
  const bool conversations = format == "megatron" && data::has_loss_mask(config::megatron_prefix(flags.data.front()));
  std::vector<std::string> sets = {
      "model.init_from=" + dir,
      "data.other_tokenizer=true",  // every --data set is checked against the folder's tokenizer, as --data (check_sets)
      "run_dir=" + (fs::temp_directory_path() / "dstrain-eval").string(),  // required by the recipe; nothing is written there
      "data.path=" + flags.data.front(),
      "data.format=" + format,
      "data.seq_len=" + (conversations ? std::to_string(*flags.seq_len) : std::string("1")),
      "train.micro_batch_size=4",  // the windows per micro-batch unless --micro-batch-size
      "train.steps=1",             // (a recipe trains; nothing here does)
      "schedule.warmup_steps=0",
      "logging.steps_per_print=1",
      "precision.dtype=" + (flags.dtype.empty() ? std::string("fp32") : flags.dtype),
  };
  // A reward model's folder scores preference pairs (accuracy, margin, mean_reward).
  if (!model::hf_sequence_classifier(dir).empty()) sets.push_back("train.objective=reward");
  return folder_recipe(dir, sets);
}

void check_flags(config::Recipe& r, const EvalTarget& target, const EvalFlags& f) {
  if (!f.tasks.empty() && !f.data.empty())
    throw Error(ErrorCode::kUsage, "--task and --data score different things: multiple-choice accuracy, and a set's loss",
                "score them in two calls of dstrain eval");
  if (!f.tasks.empty() && r.model.score_head)
    throw Error(ErrorCode::kUsage, "--task scores next-token log-likelihoods, and this is a reward model (a score head, no logits)",
                "score a causal language model's run or folder");
  if (f.model_only && r.model.score_head)
    throw Error(ErrorCode::kUsage, "this is a reward model (a score head, no next-token logits): it scores text and generates none",
                "generate with a causal language model's run or folder");
  if (!f.names.empty() && f.names.size() != f.data.size())
    throw Error(ErrorCode::kUsage, fmt::format("{} --name for {} --data sets", f.names.size(), f.data.size()),
                "give one --name per --data, or none (each set is then named by its file stem)");
  if (!f.data.empty()) {
    const auto trained_on = config::read_dataset_sidecar(r.data.sources().front());  // the run's tokenizer travels with its data
    refuse_unprepared_data(f, trained_on && !trained_on->tokenizer_dir.empty() ? trained_on->tokenizer_dir : std::string("DIR"));
    r.eval.paths.clear();
    for (const auto& d : f.data) r.eval.paths.push_back(fs::absolute(d).lexically_normal().string());
    r.eval.names = f.names;
    r.eval.split = 0;
  } else if (!f.format.empty()) {
    throw Error(ErrorCode::kUsage, "--format describes --data files, and none were given",
                "leave --format out to evaluate the run's own sets in its data.format");
  } else if (!r.eval.enabled() && f.tasks.empty() && !f.model_only) {
    throw Error(ErrorCode::kUsage, fmt::format("run '{}' has no evaluation sets of its own (no eval.paths or eval.split)", target.run_dir),
                "pass --data PATH (repeatable): datasets tokenized like its training data");
  }
  if (!f.format.empty() && !config::parse_enum(f.format, r.data.format))
    throw Error(ErrorCode::kUsage,
                fmt::format("--format '{}' is not one of {}", f.format, fmt::join(config::enum_names<config::DataFormat>(), ", ")), "");
  if (!f.dtype.empty() && !config::parse_enum(f.dtype, r.precision.dtype))
    throw Error(ErrorCode::kUsage, fmt::format("--dtype '{}' is not fp32, bf16 or fp16", f.dtype), "");
  if (f.seq_len) r.data.seq_len = *f.seq_len;
  if (r.data.seq_len > r.model.max_seq_len)
    throw Error(
        ErrorCode::kUsage,
        fmt::format("--seq-len {} is longer than the model's longest sequence, {} (max_seq_len; max_position_embeddings in config.json)",
                    r.data.seq_len, r.model.max_seq_len),
        fmt::format("pass --seq-len {} or less", r.model.max_seq_len));
  if (f.max_batches) r.eval.max_batches = *f.max_batches;
  if (f.micro_batch_size) r.eval.micro_batch_size = *f.micro_batch_size;
  const int64_t ep = f.expert_parallel_size;
  if (ep > 1 && (r.model.family != config::ModelFamily::kMlaMoe || r.model.n_routed_experts % ep != 0 || f.world_size % ep != 0))
    throw Error(ErrorCode::kUsage,
                fmt::format("--expert-parallel-size {} must divide the model's routed experts ({}) and the {} ranks", ep,
                            r.model.family == config::ModelFamily::kMlaMoe ? r.model.n_routed_experts : 0, f.world_size),
                "leave it out to hold every expert on every rank");
  r.moe.expert_parallel_size = ep;
}

// The sets' sidecars against the model (and the training data's tokenizer), the sets opened
// once (each has a window; every token in the vocabulary is checked by the workers as they read).
void check_sets(const config::Recipe& r, bool from_flags, const std::string& hf_dir) {
  std::vector<std::string> problems = config::sidecar_problems(r, [](const std::string& path) -> std::optional<std::string> {
    if (!fs::is_regular_file(path)) return std::nullopt;
    return read_file(path);
  });
  if (from_flags)
    for (auto& p : problems)
      if (p.rfind("eval.paths: ", 0) == 0) p = "--data: " + p.substr(12);
  if (!hf_dir.empty())  // an HF folder's own tokenizer (hf_recipe leaves this check to here, to name --data)
    for (const auto& path : r.eval.paths)
      if (const std::string other = config::other_tokenizer_than(hf_dir, path); !other.empty())
        problems.push_back("--data: " + other + ": its token ids would mean other words to the model");
  if (!problems.empty())
    throw Error(ErrorCode::kData, fmt::format("{}", fmt::join(problems, "; ")), "evaluate data tokenized with the model's tokenizer");
  for (const auto& path : r.eval.paths) {
    const bool megatron = r.data.format == config::DataFormat::kMegatron;
    const std::string prefix = config::megatron_prefix(path);
    if (megatron ? !fs::is_regular_file(prefix + ".idx") || !fs::is_regular_file(prefix + ".bin") : !fs::is_regular_file(path))
      throw Error(ErrorCode::kData,
                  fmt::format("{} '{}' does not exist or is not a {} (format {})", from_flags ? "--data" : "eval.paths", path,
                              megatron ? "Megatron dataset (PREFIX.idx and PREFIX.bin)" : "file", config::name(r.data.format)),
                  from_flags ? "pass prepare-data's output prefix, or the file with --format" : "");
  }
  (void)data::open_eval_sets(r);
}

void check_weights(const config::Recipe& r, const EvalTarget& t) {
  const std::vector<model::NamedShape> shapes = model::model_tensor_shapes(r.model);
  if (!t.hf_dir.empty()) return model::check_hf_weights(t.hf_dir, shapes);
  const ckpt::Reader reader(t.checkpoint, /*verified=*/true);
  const ckpt::BaseModel& base = reader.state().base;
  if (!base.empty()) {  // a LoRA checkpoint's base: the run's model.init_from, if it is the one the checkpoint names
    ckpt::check_checkpoint_base(t.checkpoint, base, ckpt::identify_base(r.model.init_from));
    model::check_hf_weights(r.model.init_from, shapes);
  }
  std::vector<std::string> problems;
  for (const auto& s : shapes) {
    const ckpt::TensorMeta* m = reader.find(s.name);
    if (!m && s.required && base.empty()) problems.push_back(fmt::format("no tensor '{}'", s.name));
    if (m && m->shape != s.shape)
      problems.push_back(fmt::format("'{}' is [{}], the model's is [{}]", s.name, fmt::join(m->shape, ", "), fmt::join(s.shape, ", ")));
  }
  if (!problems.empty())
    throw Error(ErrorCode::kCheckpoint,
                fmt::format("checkpoint {} does not hold the model of {}: {}{}", t.checkpoint, t.run_dir,
                            fmt::join(problems.begin(), problems.begin() + std::min<size_t>(problems.size(), 5), "; "),
                            problems.size() > 5 ? fmt::format(" (and {} more)", problems.size() - 5) : ""),
                "pass the run directory that wrote the checkpoint");
}

}  // namespace

std::string EvalTarget::describe() const {
  if (!hf_dir.empty()) return "Hugging Face model " + hf_dir;
  return fmt::format("{} (step {}, written by {} rank{})", checkpoint, step.value_or(0), written_by, written_by == 1 ? "" : "s");
}

EvalTarget resolve_eval_target(const std::string& target, const std::string& step) {
  if (!fs::exists(target))
    throw Error(ErrorCode::kUsage, fmt::format("'{}' does not exist", target),
                "pass a run directory, one of its checkpoints (RUN_DIR/ckpt/step_XXXXXXXX) or a Hugging Face model folder");
  const fs::path t = fs::absolute(target).lexically_normal();
  EvalTarget out;
  bool verified = false;  // by usable_checkpoint, for a run's latest
  fs::path run = t;
  if (!fs::is_regular_file(t / "config.resolved.json") && fs::is_regular_file(t / "latest") &&
      fs::is_regular_file(t.parent_path() / "config.resolved.json"))
    run = t.parent_path();  // a run's checkpoint directory
  if (fs::is_regular_file(run / "config.resolved.json")) {
    out.run_dir = run.string();
    const run::RunDir run_dir(out.run_dir);
    out.checkpoint = run_checkpoint(out.run_dir, run_dir.ckpt_dir(config::read_resolved_config(run_dir.config_path())), step);
    verified = step.empty();
  } else if (fs::is_regular_file(t / "manifest.json")) {
    if (!step.empty())
      throw Error(ErrorCode::kUsage, fmt::format("--step picks a checkpoint of a run, and '{}' is one checkpoint", target),
                  "leave --step out, or pass the run directory");
    const auto of = run_of_checkpoint(t);
    if (!of)
      throw Error(ErrorCode::kUsage,
                  fmt::format("checkpoint '{}' is not inside its run directory (no config.resolved.json above it that names it): "
                              "the model it holds is unknown",
                              target),
                  "pass the run directory, with --step N");
    if (!fs::is_regular_file(t / "COMMITTED"))
      throw Error(ErrorCode::kCheckpoint, fmt::format("checkpoint '{}' was never committed (a save that did not finish)", target),
                  "evaluate a committed checkpoint of the run");
    out.run_dir = *of, out.checkpoint = t.string();
  } else if (is_hf_folder(t)) {
    if (!step.empty())
      throw Error(ErrorCode::kUsage, fmt::format("--step picks a checkpoint of a run, and '{}' is a Hugging Face model folder", target),
                  "leave --step out");
    out.hf_dir = t.string();
    return out;
  } else {
    throw Error(ErrorCode::kUsage,
                fmt::format("'{}' is not a run directory (config.resolved.json), a checkpoint (manifest.json) or a Hugging Face "
                            "model folder (config.json and model.safetensors)",
                            target),
                "pass what `dstrain train` wrote (its run_dir), one of its checkpoints, or a folder `export-hf` wrote");
  }
  fill_from_checkpoint(out, verified);
  return out;
}

config::Recipe eval_recipe(const EvalTarget& target, const EvalFlags& flags) {
  config::Recipe r =
      target.hf_dir.empty() ? config::read_resolved_config(run::RunDir(target.run_dir).config_path()) : hf_recipe(target.hf_dir, flags);
  check_flags(r, target, flags);
  if (flags.tasks.empty() && !flags.model_only) check_sets(r, !flags.data.empty(), target.hf_dir);
  check_weights(r, target);
  return r;
}

std::string target_tokenizer_dir(const std::string& given, const EvalTarget& target, const config::Recipe& r, const std::string& needs,
                                 const std::string& flag) {
  if (!given.empty()) return given;
  if (!target.hf_dir.empty() && fs::is_regular_file(fs::path(target.hf_dir) / "tokenizer.json")) return target.hf_dir;
  if (std::string dir = train::run_tokenizer_dir(r); !dir.empty()) return dir;
  throw Error(ErrorCode::kUsage, fmt::format("{} needs the model's tokenizer, and neither the target nor its run's data names one", needs),
              fmt::format("pass {} DIR (a folder with tokenizer.json)", flag));
}

}  // namespace dstrain::tasks
