// load_recipe: defaults < recipe YAML < ds_config < --set < a last layer (the topology), each value remembering its source.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "dstrain/config/assign.h"
#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/config/hf_weight_names.h"
#include "dstrain/config/load_context.h"
#include "dstrain/config/peft_adapter.h"
#include "dstrain/config/schema.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"

namespace dstrain::config {
namespace fs = std::filesystem;

bool LoadContext::set(const std::string& path, const Node& value, const Location& where, bool lax, const std::string& origin) {
  // `data.shard_weights: auto` is spelled as a weights value but means "measure them".
  if (path == "data.shard_weights" && value.kind == Node::Kind::kString && value.text == "auto")
    return set("data.auto_balance", Node{Node::Kind::kBool, "true", {}, {}, {}, where}, where, false, path);
  const Field* field = find_field(path);
  if (!field) {
    problem(where, fmt::format("{}: no such recipe key", path));
    return false;
  }
  std::string message = assign_node(*field, value, recipe, lax);
  if (!message.empty()) {
    if (!origin.empty() && origin != path) message = origin + " (" + message + ")";
    problem(where, message);
    return false;
  }
  recipe.sources[path] = where.str();
  return true;
}

bool LoadContext::explicitly_set(const std::string& path) const {
  const auto it = recipe.sources.find(path);
  return it != recipe.sources.end() && it->second.rfind("default", 0) != 0;
}

namespace {

constexpr size_t kMaxConfigBytes = 16 << 20;  // configs are small; refuse a mistaken multi-GB file early

std::string resolve_relative(const std::string& base_file, const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(base_file).parent_path() / path).lexically_normal().string();
}

void read_recipe_mapping(const Node& node, const std::string& section, LoadContext& ctx, const Node** inline_ds,
                         Location* inline_ds_where) {
  const auto known = keys_under(section);
  const auto& sections = recipe_sections();
  for (size_t i = 0; i < node.members.size(); ++i) {
    const std::string& key = node.members[i].first;
    const Node& value = node.members[i].second;
    const Location& where = node.key_locations[i];
    const std::string path = section.empty() ? key : section + "." + key;
    if (section.empty() && key == "deepspeed") {
      if (!value.is_object())
        ctx.problem(where, "deepspeed: expected an inline ds_config mapping");
      else
        *inline_ds = &value, *inline_ds_where = where;
      continue;
    }
    if (section.empty() && std::find(sections.begin(), sections.end(), key) != sections.end()) {
      if (!value.is_object())
        ctx.problem(value.where, fmt::format("{}: expected a mapping of keys, found a {}", key, value.kind_name()));
      else
        read_recipe_mapping(value, key, ctx, inline_ds, inline_ds_where);
      continue;
    }
    if (!find_field(path)) {
      std::string hint = did_you_mean(key, known);
      for (const auto& other : sections)  // the right key in the wrong section
        if (hint.empty() && other != section && find_field(other + "." + key))
          hint = fmt::format(" (it belongs in the {} section: {}.{})", other, other, key);
      ctx.problem(where, fmt::format("{}: unknown key{}", path, hint));
      continue;
    }
    ctx.set(path, value, value.where, /*lax=*/false);
  }
}

std::string key_of(const std::string& spec) { return spec.substr(0, spec.find('=')); }

// Keys whose values name files the recipe layers read: --set for them applies before those
// files are read, so that it wins like every other --set.
bool names_a_config_file(const std::string& key) { return key == "ds_config" || key == "model.hf_config" || key == "model.init_from"; }

// model.init_from without model.hf_config: the weights' own config.json gives the model, so that
// the sizes match the weights. A size the recipe or --set gives beside it overrides that field
// (e.g. a longer model.max_seq_len), with its own source.
void imply_hf_config_from_weights(LoadContext& ctx) {
  ModelConfig& m = ctx.recipe.model;
  if (!m.hf_config.empty() || m.init_from.empty()) return;
  const std::string config_json = (fs::path(resolve_relative(ctx.recipe.source_path, m.init_from)) / "config.json").string();
  if (!ctx.read(config_json)) return;  // the weights' shapes are checked against the recipe's sizes instead
  m.hf_config = config_json;
  ctx.recipe.sources["model.hf_config"] = fmt::format("implied by model.init_from ({})", ctx.recipe.sources["model.init_from"]);
}

// Paths in the recipe are relative to the recipe file; on the command line (--set) they are
// relative to the current directory, as a shell user expects.
void make_set_path_absolute(const std::string& key, Recipe& r) {
  auto absolute = [](std::string& p) {
    if (!p.empty()) p = fs::absolute(p).lexically_normal().string();
  };
  if (key == "ds_config") absolute(r.ds_config_path);
  if (key == "model.hf_config") absolute(r.model.hf_config);
  if (key == "model.init_from") absolute(r.model.init_from);
  if (key == "lora.init_from") absolute(r.lora.init_from);
  if (key == "data.path") absolute(r.data.path);
  if (key == "data.paths")
    for (auto& p : r.data.paths) absolute(p);
  if (key == "eval.paths")
    for (auto& p : r.eval.paths) absolute(p);
  if (key == "eval.tasks")
    for (auto& p : r.eval.tasks) absolute(p);
  if (key == "eval.samples") absolute(r.eval.samples);
}

// prepare-data's PREFIX.json beside the dataset gives what the recipe leaves out: the format,
// the vocabulary and the end-of-document token (its checks against what the recipe does set are
// in dataset_sidecar.cpp).
void take_defaults_from_sidecar(LoadContext& ctx) {
  Recipe& r = ctx.recipe;
  const std::string& first = r.data.paths.empty() ? r.data.path : r.data.paths.front();
  if (first.empty()) return;
  const auto sidecar = read_dataset_sidecar(first, ctx.read);
  if (!sidecar) return;
  const Location where{sidecar->file, 0, 0};
  const std::string origin = fmt::format("{} (prepare-data's description of the dataset)", sidecar->file);
  auto take = [&](const char* key, const std::string& value, Node::Kind kind) {
    if (!ctx.explicitly_set(key) && ctx.set(key, Node{kind, value, {}, {}, {}, where}, where, false)) r.sources[key] = origin;
  };
  take("data.format", "megatron", Node::Kind::kString);
  if (r.data.format != DataFormat::kMegatron) return;  // the recipe says the files are something else
  if (sidecar->vocab_size > 0) take("model.vocab_size", std::to_string(sidecar->vocab_size), Node::Kind::kNumber);
  if (sidecar->eos >= 0) take("data.eos_token", std::to_string(sidecar->eos), Node::Kind::kNumber);
}

// One "key.path=value" of --set (or of a last layer, recorded under its own source).
void apply_override(const std::string& spec, LoadContext& ctx, const std::string& source = "--set") {
  const Location where{source, 0, 0};
  const auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) {
    ctx.problems.push_back(fmt::format("--set '{}': expected key.path=value, e.g. --set train.steps=20", spec));
    return;
  }
  const std::string path = spec.substr(0, eq);
  if (!find_field(path)) {
    std::vector<std::string> all;
    for (const auto& f : recipe_schema()) all.push_back(f.path);
    std::string hint = did_you_mean(path, all);
    const std::string leaf = path.substr(path.find('.') + 1);
    for (const auto& f : recipe_schema())  // the right key in the wrong section
      if (hint.empty() && f.path.size() > leaf.size() &&
          f.path.compare(f.path.size() - leaf.size() - 1, std::string::npos, "." + leaf) == 0)
        hint = fmt::format(" (did you mean '{}'?)", f.path);
    ctx.problems.push_back(fmt::format("--set {}: unknown key{}", path, hint));
    return;
  }
  std::vector<std::string> problems;
  Node value = parse_yaml(spec.substr(eq + 1), "--set " + path, problems);
  if (value.kind == Node::Kind::kNull && spec.size() == eq + 1) value = Node{Node::Kind::kString, "", {}, {}, {}, where};
  for (auto& p : problems) ctx.problems.push_back(p);
  if (problems.empty() && ctx.set(path, value, where, false)) {
    ctx.recipe.sources[path] = source;
    if (source == "--set") make_set_path_absolute(path, ctx.recipe);
  }
}

}  // namespace

std::string recipe_relative_note(const Recipe& r, const std::string& key, const std::string& path) {
  const auto it = r.sources.find(key);
  if (it == r.sources.end() || r.source_path.empty() || fs::exists(path)) return "";
  const std::string& source = it->second;
  for (const char* layer : {"default", "--set", "implied", "derived"})
    if (source.rfind(layer, 0) == 0) return "";
  const fs::path dir = fs::path(r.source_path).parent_path();
  const fs::path written = fs::path(path).lexically_relative(dir);  // the text as the recipe has it
  if (written.empty() || written.is_absolute()) return "";
  std::string note = fmt::format(" (a recipe's paths are relative to its own directory, {}", dir.string());
  const fs::path meant = fs::absolute(written).lexically_normal();
  if (fs::exists(meant) || fs::exists(meant.string() + ".idx"))  // a file, a directory, or a Megatron PREFIX
    note += fmt::format("; '{}' from the current directory exists: write {}", meant.string(),
                        meant.lexically_relative(dir).lexically_normal().string());
  return note + ")";
}

// transformers writes num_nextn_predict_layers without the modules' weights: training them from
// random values (and exporting them) only because config.json names them would be a silent surprise.
void leave_out_missing_mtp(LoadContext& ctx) {
  ModelConfig& m = ctx.recipe.model;
  if (m.init_from.empty() || m.mtp_depth <= 0 || m.hf_config.empty()) return;
  std::string& source = ctx.recipe.sources["model.mtp_depth"];
  if (source.find(m.hf_config) == std::string::npos) return;  // the recipe or --set asks for them
  const std::string dir = resolve_relative(ctx.recipe.source_path, m.init_from);
  if (!fs::is_directory(dir) || hf_folder_holds(dir, fmt::format("model.layers.{}.eh_proj.weight", m.num_layers))) return;
  const int64_t named = m.mtp_depth;
  m.mtp_depth = 0;
  source = fmt::format("model.init_from: {} holds no MTP weights (num_nextn_predict_layers {} in config.json left out)", dir, named);
  ctx.warnings.push_back(
      fmt::format("{}/config.json names {} multi-token prediction module{} (num_nextn_predict_layers) but its weights "
                  "hold none: training without MTP; set model.mtp_depth: {} to train new ones from random values",
                  dir, named, named == 1 ? "" : "s", named));
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides, const LastLayer& last, const LoadOptions& options) {
  return load_recipe_with(
      path, overrides,
      [](const std::string& file) -> std::optional<std::string> {
        if (!fs::is_regular_file(file)) return std::nullopt;
        std::string text = read_file(file);
        if (text.size() > kMaxConfigBytes)
          throw Error(ErrorCode::kConfig,
                      fmt::format("'{}' is {} bytes; config files are limited to {} bytes", file, text.size(), kMaxConfigBytes),
                      "point the recipe at the right file");
        return text;
      },
      last, options);
}

Recipe load_recipe_with(const std::string& path, const std::vector<std::string>& overrides, FileReader read, const LastLayer& last,
                        const LoadOptions& options) {
  LoadContext ctx;
  ctx.read = std::move(read);
  ctx.packed_rows = options.packed_rows;
  ctx.frozen_counts = options.frozen_counts;
  const auto recipe_text = ctx.read(path);
  if (!recipe_text)
    throw Error(ErrorCode::kConfig, fmt::format("recipe '{}' does not exist or is not a file", path),
                "pass the path of a recipe YAML file, e.g. recipes/demo.yaml");
  for (const auto& f : recipe_schema()) ctx.recipe.sources[f.path] = "default";
  ctx.recipe.source_path = fs::absolute(path).lexically_normal().string();

  // 1. The recipe.
  const Node root = parse_yaml(*recipe_text, path, ctx.problems);
  if (root.kind == Node::Kind::kNull && !ctx.problems.empty())  // a syntax error: what would follow is noise
    throw Error(ErrorCode::kConfig, ctx.problems.front(), "fix the YAML syntax at that position");
  const Node* inline_ds = nullptr;
  Location inline_ds_where;
  if (root.kind == Node::Kind::kObject)
    read_recipe_mapping(root, "", ctx, &inline_ds, &inline_ds_where);
  else if (root.kind != Node::Kind::kNull && ctx.problems.empty())
    ctx.problem(root.where, "a recipe is a mapping of keys; see recipes/demo.yaml");
  for (const auto& spec : overrides)
    if (names_a_config_file(key_of(spec))) apply_override(spec, ctx);
  imply_hf_config_from_weights(ctx);
  if (!ctx.recipe.model.hf_config.empty()) {
    ctx.recipe.model.hf_config = resolve_relative(ctx.recipe.source_path, ctx.recipe.model.hf_config);
    apply_hf_config(ctx.recipe.model.hf_config, Location{path, 0, 0}, ctx);
  }

  // 2. The ds_config: a file, or inline under `deepspeed:`.
  if (!ctx.recipe.ds_config_path.empty() && inline_ds) {
    ctx.problem(inline_ds_where, "give either ds_config (a file) or an inline deepspeed: mapping, not both");
  } else if (!ctx.recipe.ds_config_path.empty()) {
    const std::string ds_path = resolve_relative(ctx.recipe.source_path, ctx.recipe.ds_config_path);
    ctx.recipe.ds_config_path = ds_path;
    if (const auto ds_text = ctx.read(ds_path); !ds_text) {
      ctx.problem(Location{ctx.recipe.sources["ds_config"]}, fmt::format("ds_config: '{}' does not exist or is not a file{}", ds_path,
                                                                         recipe_relative_note(ctx.recipe, "ds_config", ds_path)));
    } else {
      const Node ds = parse_json_with_comments(*ds_text, ds_path, ctx.problems);
      apply_ds_config(ds, ctx);
    }
  } else if (inline_ds) {
    apply_ds_config(*inline_ds, ctx);
  }

  // 3. Command-line overrides, then what depends on all layers.
  for (const auto& spec : overrides)
    if (!names_a_config_file(key_of(spec))) apply_override(spec, ctx);
  if (last && ctx.problems.empty())
    for (const auto& v : last(ctx.recipe)) apply_override(v.assignment, ctx, v.source);
  finish_ds_config(ctx);
  apply_fine_tuning_defaults(ctx);
  leave_out_missing_mtp(ctx);
  resolve_autos(ctx);
  if (!ctx.recipe.model.init_from.empty()) {
    ctx.recipe.model.init_from = resolve_relative(ctx.recipe.source_path, ctx.recipe.model.init_from);
    if (!fs::is_directory(ctx.recipe.model.init_from))
      ctx.problems.push_back(fmt::format("{}: model.init_from: '{}' is not a directory{}", path, ctx.recipe.model.init_from,
                                         recipe_relative_note(ctx.recipe, "model.init_from", ctx.recipe.model.init_from)));
  }
  if (!ctx.recipe.lora.init_from.empty()) {
    ctx.recipe.lora.init_from = resolve_relative(ctx.recipe.source_path, ctx.recipe.lora.init_from);
    for (const std::string& problem : peft_adapter_problems(ctx.recipe.lora, ctx.recipe.sources["lora.init_from"]))
      ctx.problems.push_back(problem);
  }
  if (!ctx.recipe.data.paths.empty()) {
    if (!ctx.recipe.data.path.empty()) ctx.problems.push_back(fmt::format("{}: give data.path or data.paths, not both", path));
    for (auto& p : ctx.recipe.data.paths) p = resolve_relative(ctx.recipe.source_path, p);
  } else if (ctx.recipe.data.path.empty()) {
    ctx.problems.push_back(fmt::format("{}: data.path (or data.paths) is required", path));
  } else {
    ctx.recipe.data.path = resolve_relative(ctx.recipe.source_path, ctx.recipe.data.path);
  }
  for (auto& p : ctx.recipe.eval.paths) p = resolve_relative(ctx.recipe.source_path, p);
  for (auto& p : ctx.recipe.eval.tasks) p = resolve_relative(ctx.recipe.source_path, p);
  if (!ctx.recipe.eval.samples.empty()) ctx.recipe.eval.samples = resolve_relative(ctx.recipe.source_path, ctx.recipe.eval.samples);
  if (ctx.problems.empty()) take_defaults_from_sidecar(ctx);
  if (ctx.recipe.run_dir.empty())
    ctx.problems.push_back(fmt::format("{}: run_dir is required (where logs, metrics and checkpoints go)", path));
  else
    ctx.recipe.run_dir = fs::absolute(ctx.recipe.run_dir).lexically_normal().string();
  if (!ctx.recipe.checkpoint.dir.empty()) ctx.recipe.checkpoint.dir = fs::absolute(ctx.recipe.checkpoint.dir).lexically_normal().string();
  if (ctx.problems.empty()) resolve_and_validate(ctx);

  if (!ctx.problems.empty()) ctx.problems.insert(ctx.problems.end(), ctx.data_problems.begin(), ctx.data_problems.end());
  if (ctx.problems.empty() && !ctx.data_problems.empty() && options.data_may_be_missing) {
    for (const auto& p : ctx.data_problems) ctx.warnings.push_back("training data: " + p);
    ctx.data_problems.clear();
  }
  if (ctx.problems.empty() && !ctx.data_problems.empty())
    throw Error(ErrorCode::kData,
                fmt::format("{} problem{} with the training data:\n  {}", ctx.data_problems.size(),
                            ctx.data_problems.size() == 1 ? "" : "s", fmt::join(ctx.data_problems, "\n  ")),
                "point data.path (relative to the recipe file, or to the current directory with --set) at the dataset, and check "
                "data.format; `dstrain prepare-data` makes one from text");
  if (!ctx.problems.empty()) {
    throw Error(ErrorCode::kConfig,
                fmt::format("{} problem{} in the configuration:\n  {}", ctx.problems.size(), ctx.problems.size() == 1 ? "" : "s",
                            fmt::join(ctx.problems, "\n  ")),
                "fix each one; recipes/README.md lists every key, and `dstrain train RECIPE --dry-run` shows the result");
  }
  ctx.recipe.warnings = std::move(ctx.warnings);
  return std::move(ctx.recipe);
}

}  // namespace dstrain::config
