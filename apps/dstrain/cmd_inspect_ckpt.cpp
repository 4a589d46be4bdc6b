#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "commands.h"
#include "dstrain/ckpt/base_model.h"
#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/model/lora.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/tasks/export.h"
#include "dstrain/tasks/peft_export.h"

namespace dstrain::app {
namespace {

struct Options {
  std::string path;
  bool tensors = false, verify = false, json = false;
  std::string diff, export_dir;
};

// A tensor's values as doubles, read from whichever pieces hold it.
std::vector<double> values_of(const ckpt::Reader& reader, const ckpt::TensorMeta& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype == "float64") {
    reader.read(t.name, 0, t.numel(), out.data(), t.dtype);
  } else {
    std::vector<float> f(out.size());
    reader.read(t.name, 0, t.numel(), f.data(), t.dtype);
    std::copy(f.begin(), f.end(), out.begin());
  }
  return out;
}

struct Stats {
  double norm = 0, min = 0, max = 0;
  uint32_t crc = 0;
};
Stats stats_of(const std::vector<double>& v) {
  Stats s{0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
          crc32c(v.data(), v.size() * sizeof(double))};
  for (double x : v) s.norm += x * x, s.min = std::min(s.min, x), s.max = std::max(s.max, x);
  s.norm = std::sqrt(s.norm);
  if (v.empty()) s.min = s.max = 0;
  return s;
}

// PATH as the user may give it: a checkpoint, a directory of checkpoints, or a run directory (its
// checkpoint directory). A directory of checkpoints gives the one resume, eval and export-hf would
// take: `latest`, or the newest committed one when `latest` is missing or broken (said on stderr).
std::string resolve_dir(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path))
    throw Error(ErrorCode::kUsage, fmt::format("'{}' does not exist", path),
                "pass a run directory, its ckpt/ directory, or one checkpoint (RUN_DIR/ckpt/step_XXXXXXXX)");
  std::string dir = path;
  const bool run = fs::exists(fs::path(path) / "config.resolved.json");
  std::string logs;
  if (run) {
    const run::RunDir run_dir(path);
    dir = run_dir.ckpt_dir(config::read_resolved_config(run_dir.config_path()));
    logs = run_dir.log_dir();
  }
  std::vector<std::string> skipped;
  const std::vector<std::string> candidates =
      fs::is_directory(dir) ? ckpt::checkpoint_candidates(dir, &skipped) : std::vector<std::string>{};
  for (const auto& why : skipped) std::fprintf(stderr, "note: %s\n", why.c_str());
  if (!candidates.empty()) {
    if (!fs::exists(fs::path(dir) / "latest"))
      std::fprintf(stderr, "note: %s has no 'latest' file; showing its newest committed checkpoint, which resume would take\n",
                   dir.c_str());
    return candidates.front();
  }
  if (run)
    throw Error(ErrorCode::kCheckpoint, fmt::format("run '{}' has no committed checkpoint yet (none in {})", path, dir),
                "it stopped before its first save; its logs are in " + logs);
  return dir;
}

// What differs between a checkpoint's base and the files at its path now ("" when nothing).
std::string base_problem_of(const ckpt::BaseModel& base) {
  try {
    return ckpt::base_difference(base, ckpt::identify_base(base.path));
  } catch (const Error& e) {
    return e.what();
  }
}

// LoRA's adapters (<module>.lora_A.weight [r, in], .lora_B.weight [out, r]) in a checkpoint.
struct AdapterCount {
  int64_t tensors = 0, elements = 0;
  int64_t rank = 0, max_rank = 0;       // ranks differ with a rank_pattern
  int64_t projections = 0, routed = 0;  // adapted projections; of them the routed experts' (lora.experts)
};
template <typename IsParameter>
AdapterCount count_adapters(const ckpt::Inspection& in, IsParameter&& is_parameter) {
  AdapterCount c;
  for (const auto& t : in.tensors) {
    if (!is_parameter(t.name) || !tasks::is_adapter_tensor(t.name)) continue;
    ++c.tensors, c.elements += t.numel();
    const std::string module = model::lora_a_module(t.name);
    if (module.empty() || t.shape.empty()) continue;
    c.rank = c.projections == 0 ? t.shape[0] : std::min(c.rank, t.shape[0]), ++c.projections;
    c.max_rank = std::max(c.max_rank, t.shape[0]);
    c.routed += model::routed_expert_index_at(module) != std::string::npos;
  }
  return c;
}

int inspect(const Options& o) {
  const std::string dir = resolve_dir(o.path);
  const ckpt::Inspection in = ckpt::inspect_checkpoint(dir);
  bool ok = in.committed && in.manifest_problem.empty();
  uint64_t bytes = 0;
  for (const auto& f : in.files) ok &= f.ok, bytes += f.bytes;
  int64_t elements = 0;
  for (const auto& t : in.tensors) elements += t.numel();
  // Frozen parameters (train.freeze) are saved as values alone: a parameter whose exp_avg is absent.
  std::set<std::string> names;
  for (const auto& t : in.tensors) names.insert(t.name);
  int64_t frozen = 0, frozen_elements = 0;
  const bool has_optimizer_state =
      std::any_of(names.begin(), names.end(), [](const std::string& n) { return n.rfind("exp_avg.", 0) == 0; });
  auto is_parameter = [](const std::string& n) {  // the model's tensors but its buffer (V3's selection bias)
    return (n.rfind("model.", 0) == 0 || n.rfind("lm_head.", 0) == 0 || n.rfind("score.", 0) == 0) &&
           n.find("e_score_correction_bias") == std::string::npos;
  };
  for (const auto& t : in.tensors)
    if (has_optimizer_state && is_parameter(t.name) && !names.count("exp_avg." + t.name)) ++frozen, frozen_elements += t.numel();
  const AdapterCount lora = count_adapters(in, is_parameter);
  const int64_t adapters = lora.tensors, adapter_elements = lora.elements, lora_rank = lora.rank, max_rank = lora.max_rank,
                projections = lora.projections, routed = lora.routed;
  // A LoRA checkpoint that names its base: with --verify, the base's files are checked too.
  const ckpt::BaseModel& base = in.state.base;
  const std::string base_problem = o.verify && !base.empty() ? base_problem_of(base) : "";
  ok &= base_problem.empty();
  uint64_t base_bytes = 0;
  for (const auto& f : base.files) base_bytes += f.bytes;
  nlohmann::json j;
  if (o.json) {
    j = {{"dir", in.dir},
         {"committed", in.committed},
         {"step", in.state.step},
         {"samples_consumed", in.state.samples_consumed},
         {"tokens_consumed", in.state.tokens_consumed},
         {"world_size", in.state.world_size},
         {"zero_stage", in.state.zero_stage},
         {"precision", in.state.precision},
         {"config_hash", in.state.config_hash},
         {"model", in.state.model},
         {"created", in.state.created},
         {"bytes", bytes},
         {"elements", elements},
         {"ok", ok},
         {"manifest_problem", in.manifest_problem},
         {"frozen_parameters", frozen},
         {"lora", adapters > 0 ? nlohmann::json{{"rank", lora_rank},
                                                {"max_rank", max_rank},
                                                {"tensors", adapters},
                                                {"elements", adapter_elements},
                                                {"projections", projections},
                                                {"routed_expert_projections", routed}}
                               : nlohmann::json(nullptr)},
         {"base", base.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(ckpt::to_json(base))},
         {"files", nlohmann::json::array()},
         {"tensors", nlohmann::json::array()}};
    if (o.verify && !base.empty()) j["base"]["problem"] = base_problem;
    for (const auto& f : in.files) j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}, {"ok", f.ok}, {"problem", f.problem}});
  } else {
    fmt::print(
        "checkpoint   {}\ncommitted    {}\nstep         {}\ntokens       {} ({} samples)\nworld size   {} (ZeRO stage {}, {})\nmodel       "
        " {}\n"
        "created      {}\nconfig hash  {}\ntensors      {} ({} elements, {:.1f} MiB in {} files)\n",
        in.dir, in.committed ? "yes" : "NO (incomplete save)", in.state.step, in.state.tokens_consumed, in.state.samples_consumed,
        in.state.world_size, in.state.zero_stage, in.state.precision, in.state.model, in.state.created, in.state.config_hash,
        in.tensors.size(), elements, static_cast<double>(bytes) / 1048576.0, in.files.size());
    if (adapters > 0)
      fmt::print("lora         {} adapter tensors of rank {} on {} projections{} ({} elements), with their optimizer state\n", adapters,
                 max_rank > lora_rank ? fmt::format("{} to {}", lora_rank, max_rank) : std::to_string(lora_rank), projections,
                 routed > 0 ? fmt::format(" ({} of them routed experts')", routed) : "", adapter_elements);
    if (frozen > 0)
      fmt::print("frozen       {} parameters ({} elements): values alone, no optimizer state ({})\n", frozen, frozen_elements,
                 adapters > 0 ? "the LoRA base" : "train.freeze");
    if (!base.empty())
      fmt::print("base         {} ({} file{}, {}): named, not held; a resume, eval or merge reads it from there{}\n", base.path,
                 base.files.size(), base.files.size() == 1 ? "" : "s", cost::bytes_text(static_cast<double>(base_bytes)),
                 !o.verify              ? ""
                 : base_problem.empty() ? " (verified: the same files)"
                                        : "\nbase         CHANGED: " + base_problem);
  }
  if (o.tensors && ok) {
    const ckpt::Reader reader(dir);
    if (!o.json)
      fmt::print("  {:<52} {:<8} {:<16} {:>6} {:>12} {:>12} {:>12} {:>8}\n", "tensor", "dtype", "shape", "files", "norm", "min", "max",
                 "crc32c");
    for (const auto& t : in.tensors) {
      const Stats s = stats_of(values_of(reader, t));
      const auto& files = in.files_of_tensor.at(t.name);
      if (o.json) {
        j["tensors"].push_back({{"name", t.name},
                                {"dtype", t.dtype},
                                {"shape", t.shape},
                                {"files", files},
                                {"norm", s.norm},
                                {"min", s.min},
                                {"max", s.max},
                                {"crc32c", s.crc}});
      } else {
        fmt::print("  {:<52} {:<8} {:<16} {:>6} {:>12.6g} {:>12.6g} {:>12.6g} {:08x}\n", t.name, t.dtype,
                   fmt::format("[{}]", fmt::join(t.shape, ",")), files.size(), s.norm, s.min, s.max, s.crc);
      }
    }
  }
  if (o.json) {
    fmt::print("{}\n", j.dump(1));
  } else {
    if (!in.manifest_problem.empty()) fmt::print("manifest     CORRUPT: {}\n", in.manifest_problem);
    for (const auto& f : in.files)
      if (!f.ok || o.verify || in.files.size() <= 8)
        fmt::print("file         {} {} bytes: {}\n", f.name, f.bytes, f.ok ? "OK (crc32c)" : "CORRUPT: " + f.problem);
    if (o.verify || in.files.size() > 8)
      fmt::print("{}\n", ok ? fmt::format("verified: all {} files OK (crc32c)", in.files.size()) : "verification FAILED");
  }
  return ok ? exit_status::kOk : exit_status::kCheckpoint;
}

int diff(const Options& o) {
  const ckpt::Reader a(resolve_dir(o.path)), b(resolve_dir(o.diff));
  int differing = 0;
  for (const auto& t : a.tensors()) {
    const ckpt::TensorMeta* u = b.find(t.name);
    if (!u) {
      fmt::print("only in {}: {}\n", a.dir(), t.name);
      ++differing;
      continue;
    }
    if (u->shape != t.shape) {
      fmt::print("{}: shape [{}] vs [{}]\n", t.name, fmt::join(t.shape, ","), fmt::join(u->shape, ","));
      ++differing;
      continue;
    }
    const auto x = values_of(a, t), y = values_of(b, *u);
    double max_abs = 0, diff_sq = 0, ref_sq = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double d = x[i] - y[i];
      max_abs = std::max(max_abs, std::abs(d)), diff_sq += d * d, ref_sq += x[i] * x[i];
    }
    if (max_abs > 0) {
      fmt::print("{:<56} max |a-b| {:.3g}, relative L2 {:.3g}\n", t.name, max_abs, std::sqrt(diff_sq / std::max(ref_sq, 1e-300)));
      ++differing;
    }
  }
  for (const auto& t : b.tensors())
    if (!a.find(t.name)) fmt::print("only in {}: {}\n", b.dir(), t.name), ++differing;
  fmt::print("{} of {} tensors differ\n", differing, a.tensors().size());
  return exit_status::kOk;
}

}  // namespace

void register_inspect_ckpt(CLI::App& app, Run& run) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("inspect-ckpt", "Show what a checkpoint holds and verify its checksums");
  cmd->footer(
      "PATH is a run directory or its ckpt/ directory (the newest committed checkpoint, `latest`), or one\n"
      "checkpoint directory (ckpt/step_XXXXXXXX).\n"
      "The summary checks every file's size and CRC-32C. Exit status 0 when every file checks out,\n"
      "4 when one is missing, truncated or corrupt (the message names the file and its tensors).\n\n"
      "Examples:\n"
      "  dstrain inspect-ckpt runs/demo\n"
      "  dstrain inspect-ckpt runs/demo/ckpt/step_00000030 --tensors\n"
      "  dstrain inspect-ckpt runs/demo/ckpt --verify --json\n"
      "  dstrain inspect-ckpt runs/a/ckpt --diff runs/b/ckpt\n"
      "  dstrain inspect-ckpt runs/demo/ckpt --export exported/demo");
  cmd->add_option("path", o->path, "A run directory, its ckpt/ directory, or one checkpoint directory")->required();
  cmd->add_flag("--tensors", o->tensors, "Every tensor: dtype, shape, files holding it, norm, min, max, CRC-32C of its values");
  cmd->add_flag(
      "--verify", o->verify,
      "Report every file's check (the summary verifies too); a LoRA checkpoint's base (named, not held) is checked against its files too");
  cmd->add_flag("--json", o->json, "Machine-readable output");
  cmd->add_option("--diff", o->diff, "Another checkpoint: which tensors differ, and by how much");
  cmd->add_option("--export", o->export_dir, "Write the weights as a Hugging Face model (config.json + safetensors) into this directory");
  cmd->callback([o, &run] {
    run = [o] {
      if (!o->diff.empty()) return diff(*o);
      if (!o->export_dir.empty()) {
        const std::string dir = resolve_dir(o->path);
        const auto run_dir = std::filesystem::path(dir).parent_path().parent_path();
        if (!std::filesystem::exists(run_dir / "config.resolved.json"))
          throw Error(ErrorCode::kUsage, fmt::format("--export needs the run directory around {} (its config.resolved.json)", dir),
                      "use `dstrain export-hf RUN_DIR OUT --checkpoint DIR` when the checkpoint lives elsewhere");
        tasks::ExportOptions options;
        options.checkpoint = dir;
        tasks::export_run_to_hf(run_dir.string(), o->export_dir, options);
        fmt::print("exported {} to {}\n", dir, o->export_dir);
        return 0;
      }
      return inspect(*o);
    };
  });
}

}  // namespace dstrain::app
