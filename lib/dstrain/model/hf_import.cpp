// Hugging Face weights in: the folder's files checked against the model from their headers alone,
// then read one tensor at a time (FP8 dequantized with scales that may sit in another shard).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/io/safetensors.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"

namespace dstrain::model {
namespace fs = std::filesystem;

namespace {

const std::map<std::string, at::ScalarType>& plain_types() {
  static const std::map<std::string, at::ScalarType> types = {{"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F16", at::kHalf}};
  return types;
}
const std::map<std::string, at::ScalarType>& fp8_types() {
  static const std::map<std::string, at::ScalarType> types = {{"F8_E4M3", at::kFloat8_e4m3fn}, {"F8_E5M2", at::kFloat8_e5m2}};
  return types;
}
// What a block scale may be stored as: float32 as DeepSeek does, or narrower.
const std::map<std::string, at::ScalarType>& scale_types() {
  static const std::map<std::string, at::ScalarType> types = {
      {"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"F8_E8M0", at::kFloat8_e8m0fnu}};
  return types;
}

// Which file of an HF model directory holds which tensor ("" key: one model.safetensors holds all).
std::map<std::string, std::string> weight_files(const std::string& dir) {
  std::map<std::string, std::string> where;
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    try {
      const auto j = nlohmann::json::parse(read_file(index));
      for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it) where[it.key()] = dir + "/" + it->get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::kCheckpoint, fmt::format("{}: not a valid safetensors index: {}", index, e.what()), "re-download the model");
    }
  } else if (fs::exists(dir + "/model.safetensors")) {
    where[""] = dir + "/model.safetensors";
  } else {
    throw Error(ErrorCode::kCheckpoint, fmt::format("'{}' has neither model.safetensors nor model.safetensors.index.json", dir),
                "point model.init_from at a Hugging Face model directory");
  }
  return where;
}

// The files of a folder, opened (mapped, headers parsed) as they are first needed.
class Files {
 public:
  explicit Files(const std::string& dir) : where_(weight_files(dir)) {}
  // The tensor and the file that holds it; {nullptr, file or ""} when absent.
  std::pair<const io::TensorInfo*, std::string> find(const std::string& name) {
    auto it = where_.find(name);
    if (it == where_.end()) it = where_.find("");
    if (it == where_.end()) return {nullptr, ""};
    auto& file = open_[it->second];
    if (!file) file = std::make_unique<io::SafetensorsFile>(it->second);
    return {file->find(name), it->second};
  }

 private:
  std::map<std::string, std::string> where_;
  std::map<std::string, std::unique_ptr<io::SafetensorsFile>> open_;
};

at::Tensor view_of(const io::TensorInfo& info, at::ScalarType type) {
  return at::from_blob(const_cast<uint8_t*>(info.data), info.shape, at::TensorOptions().dtype(type));
}

// What is wrong with an FP8 weight's scales ("" when nothing).
std::string fp8_problem(Files& files, const std::string& dir, const std::string& file, const io::TensorInfo& info,
                        const std::optional<Fp8Format>& fp8) {
  if (!fp8)
    return fmt::format("{}: '{}' is {}, but {}/config.json has no quantization_config to give its block size", file, info.name, info.dtype,
                       dir);
  if (info.shape.size() != 2)
    return fmt::format("{}: '{}' is {} with {} dimensions; FP8 weights are 2-D", file, info.name, info.dtype, info.shape.size());
  const std::string scale = scale_name_of(info.name);
  const auto [s, scale_file] = files.find(scale);
  if (!s) return fmt::format("{}: '{}' is {} but its block scales '{}' are in no file of the folder", file, info.name, info.dtype, scale);
  if (!scale_types().count(s->dtype))
    return fmt::format("{}: '{}' has dtype {}; block scales are F32 (or BF16, F8_E8M0)", scale_file, scale, s->dtype);
  const auto grid = scale_grid(info.shape, *fp8);
  if (s->shape != grid)
    return fmt::format("{}: '{}' has shape [{}], but {}×{} blocks of the [{}] weight need [{}]", scale_file, scale,
                       fmt::join(s->shape, ", "), fp8->block_rows, fp8->block_cols, fmt::join(info.shape, ", "), fmt::join(grid, ", "));
  return "";
}

}  // namespace

struct HfWeights::Impl {
  Impl(const std::string& d, const config::ModelConfig& c) : dir(d), config(c), files(d), fp8(read_fp8_format(d)) {}
  std::string dir;
  config::ModelConfig config;
  mutable Files files;
  std::optional<Fp8Format> fp8;
};

HfWeights::HfWeights(const std::string& dir, const config::ModelConfig& config) : impl_(std::make_unique<Impl>(dir, config)) {}
HfWeights::~HfWeights() = default;

bool HfWeights::has(const std::string& name) const { return impl_->files.find(name).first != nullptr; }

const std::optional<Fp8Format>& HfWeights::fp8() const { return impl_->fp8; }

std::optional<Fp8Weight> HfWeights::read_fp8(const std::string& name) const {
  const auto [info, file] = impl_->files.find(name);
  if (!info || !fp8_types().count(info->dtype) || !fp8_problem(impl_->files, impl_->dir, file, *info, impl_->fp8).empty())
    return std::nullopt;
  const io::TensorInfo* s = impl_->files.find(scale_name_of(name)).first;
  c10::NoGradGuard no_grad;
  Fp8Weight w;
  w.scale_inv = view_of(*s, scale_types().at(s->dtype)).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  if (!at::isfinite(w.scale_inv).all().item<bool>() || !(w.scale_inv > 0).all().item<bool>()) return std::nullopt;
  // The model's RoPE row order (permute_rope_rows) moves rows within a head's rotary part; kept
  // as stored only when that part lies within one block row.
  const int64_t rows = info->shape[0];
  const at::Tensor order = permute_rope_rows(impl_->config, name, at::arange(rows, at::kLong).view({rows, 1}), false).view(-1);
  if (!at::equal(at::floor_divide(order, impl_->fp8->block_rows), at::floor_divide(at::arange(rows, at::kLong), impl_->fp8->block_rows)))
    return std::nullopt;
  const at::Tensor bytes = view_of(*info, at::kByte).index_select(0, order);
  w.weight = bytes.view(fp8_types().at(info->dtype));
  return w;
}

bool HfWeights::stored_alike(const std::string& a, const std::string& b) const {
  const io::TensorInfo* x = impl_->files.find(a).first;
  const io::TensorInfo* y = impl_->files.find(b).first;
  if (!x || !y) throw Error(ErrorCode::kInternal, fmt::format("{}: comparing '{}' with '{}', one of them absent", impl_->dir, a, b));
  return x->dtype == y->dtype && x->shape == y->shape && x->nbytes() == y->nbytes() && std::memcmp(x->data, y->data, x->nbytes()) == 0;
}

at::Tensor HfWeights::read(const std::string& name) const {
  const auto [info, file] = impl_->files.find(name);
  if (!info)
    throw Error(ErrorCode::kCheckpoint, fmt::format("{}: no tensor '{}'", impl_->dir, name),
                "the model's sizes differ from the weights': `dstrain train RECIPE --dry-run` checks every tensor and says why");
  c10::NoGradGuard no_grad;
  at::Tensor value;
  if (const auto plain = plain_types().find(info->dtype); plain != plain_types().end()) {
    value = view_of(*info, plain->second).to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  } else if (const auto fp8 = fp8_types().find(info->dtype); fp8 != fp8_types().end()) {
    if (const std::string problem = fp8_problem(impl_->files, impl_->dir, file, *info, impl_->fp8); !problem.empty())
      throw Error(ErrorCode::kCheckpoint, problem, "re-download the checkpoint; its FP8 weights and scales do not fit together");
    const auto [s, scale_file] = impl_->files.find(scale_name_of(name));
    const at::Tensor scale = view_of(*s, scale_types().at(s->dtype)).to(at::kFloat);
    if (!at::isfinite(scale).all().item<bool>())
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{}: the block scales '{}' of '{}' hold a non-finite value (NaN or infinity)", scale_file, s->name, name),
                  "the checkpoint is corrupt: re-download it");
    // DeepSeek's scales are amax / 448 with amax clamped above zero: a scale of 0 or below, or one
    // so large that a weight overflows float32, is damage, not a weight.
    if (!(scale > 0).all().item<bool>())
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{}: the block scales '{}' of '{}' hold a value of 0 or below", scale_file, s->name, name),
                  "the checkpoint is corrupt: re-download it");
    value = dequantize_fp8(view_of(*info, fp8->second), scale, *impl_->fp8);
    if (!at::isfinite(value).all().item<bool>())
      throw Error(ErrorCode::kCheckpoint,
                  fmt::format("{}: '{}' dequantized with its block scales '{}' holds values beyond float32 (a scale too large)", scale_file,
                              name, s->name),
                  "the checkpoint is corrupt: re-download it");
  } else {
    throw Error(ErrorCode::kCheckpoint, fmt::format("{}: '{}' has dtype {}, which dstrain does not load", file, name, info->dtype),
                "convert the weights to F32, BF16, F16 or DeepSeek's block-scaled FP8");
  }
  return permute_rope_rows(impl_->config, name, value, false);
}

std::vector<std::string> hf_weight_problems(const std::string& dir, const std::vector<NamedShape>& tensors) {
  Files files(dir);
  const auto fp8 = read_fp8_format(dir);
  std::vector<std::string> problems;
  std::map<int64_t, std::pair<std::vector<std::string>, int64_t>> mtp;  // depth -> (missing, present)
  for (const auto& t : tensors) {
    const auto [info, file] = files.find(t.name);
    if (t.mtp_depth > 0) {
      auto& [missing, present] = mtp[t.mtp_depth];
      if (info)
        ++present;
      else
        missing.push_back(t.name);
    }
    if (!info) {
      if (t.required)
        problems.push_back(file.empty() ? fmt::format("{}: no tensor '{}' in the weight map", dir, t.name)
                                        : fmt::format("{}: no tensor '{}'", file, t.name));
    } else if (info->shape != t.shape) {
      problems.push_back(fmt::format("{}: '{}' has shape [{}], the model needs [{}]", file, t.name, fmt::join(info->shape, ", "),
                                     fmt::join(t.shape, ", ")));
    } else if (fp8_types().count(info->dtype)) {
      if (std::string problem = fp8_problem(files, dir, file, *info, fp8); !problem.empty()) problems.push_back(std::move(problem));
    } else if (!plain_types().count(info->dtype)) {
      problems.push_back(fmt::format("{}: '{}' has dtype {}, which dstrain does not load (F32, BF16, F16, or FP8 with block scales)", file,
                                     t.name, info->dtype));
    }
  }
  for (const auto& [depth, seen] : mtp)  // a module is loaded whole or not at all
    if (seen.second > 0 && !seen.first.empty())
      problems.push_back(fmt::format("{}: the multi-token prediction module of depth {} lacks {} of its tensors, e.g. '{}'", dir, depth,
                                     seen.first.size(), seen.first.front()));
  return problems;
}

std::string hf_sequence_classifier(const std::string& dir) {
  const std::string path = dir + "/config.json";
  if (!fs::is_regular_file(path)) return "";
  const auto config = nlohmann::json::parse(read_file(path), nullptr, false);
  if (!config.is_object() || !config.contains("architectures") || !config["architectures"].is_array()) return "";
  const std::string suffix = "ForSequenceClassification";
  for (const auto& a : config["architectures"]) {
    const std::string name = a.is_string() ? a.get<std::string>() : "";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) return name;
  }
  return "";
}

void check_hf_weights(const std::string& dir, const std::vector<NamedShape>& tensors, const std::string& hint) {
  const auto problems = hf_weight_problems(dir, tensors);
  if (problems.empty()) return;
  const size_t shown = std::min<size_t>(problems.size(), 8);
  // A reward model's folder where a causal LM was expected: the model wants lm_head, the folder holds score.
  const bool wants_lm_head = std::any_of(tensors.begin(), tensors.end(), [](const NamedShape& t) { return t.name == "lm_head.weight"; });
  const std::string classifier = wants_lm_head ? hf_sequence_classifier(dir) : "";
  std::string why = hint;
  if (!classifier.empty())
    why = fmt::format(
        "{} is a sequence classifier ({}: a reward model's score.weight in place of lm_head): train it with "
        "train.objective: reward, or start from a causal LM's folder",
        dir, classifier);
  else if (why.empty())
    why = fmt::format("{}/config.json does not describe the weights beside it: export the folder again, or fix its config.json", dir);
  throw Error(ErrorCode::kCheckpoint,
              fmt::format("model.init_from: {} of the model's {} tensors do not match the weights in {}:\n  {}{}", problems.size(),
                          tensors.size(), dir, fmt::join(problems.begin(), problems.begin() + static_cast<std::ptrdiff_t>(shown), "\n  "),
                          problems.size() > shown ? fmt::format("\n  ... and {} more", problems.size() - shown) : ""),
              why);
}

namespace {

// The released MTP layout holds copies of the embedding and head in each module, which dstrain
// shares with the main model: a copy that differs is said (the main one is used).
void check_mtp_copies(const HfWeights& weights, const config::ModelConfig& config, const std::string& dir) {
  for (int64_t k = 1; k <= config.mtp_depth; ++k) {
    const std::string l = fmt::format("model.layers.{}.", config.num_layers + k - 1);
    for (const auto& [copy, main] : {std::pair{l + "embed_tokens.weight", std::string("model.embed_tokens.weight")},
                                     std::pair{l + "shared_head.head.weight", std::string("lm_head.weight")}}) {
      if (!weights.has(copy) || !weights.has(main) || weights.stored_alike(copy, main)) continue;
      const at::Tensor a = weights.read(copy), b = weights.read(main);  // converted only to say by how much they differ
      if (a.sizes() != b.sizes() || !at::equal(a, b))
        log::warn(fmt::format("{}: '{}' differs from '{}'{}; dstrain shares the main one between the model and its MTP module", dir, copy,
                              main, a.sizes() == b.sizes() ? fmt::format(" (max |diff| {:.3g})", (a - b).abs().max().item<double>()) : ""));
    }
  }
}

}  // namespace

void load_hf_weights(const std::string& dir, const config::ModelConfig& config, const NamedTensors& params, const NamedTensors& buffers) {
  std::vector<NamedShape> shapes;
  for (const auto* group : {&params, &buffers})
    for (const auto& p : *group) {
      const int64_t depth = mtp_depth_of(config, p.name);
      shapes.push_back({p.name, p.tensor.sizes().vec(), group == &params && depth == 0 && !starts_fresh_in_folder(config, p.name), depth});
    }
  check_hf_weights(dir, shapes);  // every mismatch at once, before any copy
  const HfWeights weights(dir, config);
  c10::NoGradGuard no_grad;
  // One tensor at a time, in float32, rounded once into the model's dtype (as weight_dequant's cast).
  std::set<int64_t> absent;                      // MTP modules the folder lacks (checked: wholly)
  for (const auto* group : {&params, &buffers})  // buffers: e_score_correction_bias, which V3 has and V2 not
    for (const auto& p : *group) {
      if (weights.has(p.name))
        p.tensor.copy_(weights.read(p.name));
      else if (const int64_t depth = mtp_depth_of(config, p.name); depth > 0)
        absent.insert(depth);
      else if (starts_fresh_in_folder(config, p.name))
        log::info(
            fmt::format("{} has no '{}' (a causal LM's folder): the reward model's score starts from model.seed's values, "
                        "normal with std model.init_std, as transformers starts it",
                        dir, p.name));
    }
  for (const int64_t depth : absent)
    log::warn(
        fmt::format("{} has no weights for the multi-token prediction module of depth {} (model.layers.{}.*), which model.mtp_depth "
                    "{} asks for: it starts from random values (transformers writes num_nextn_predict_layers: 1 without the module; "
                    "set model.mtp_depth: 0 to train without it)",
                    dir, depth, config.num_layers + depth - 1, config.mtp_depth));
  check_mtp_copies(weights, config, dir);
}

}  // namespace dstrain::model
