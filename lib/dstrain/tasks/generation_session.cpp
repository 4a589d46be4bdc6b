#include "dstrain/tasks/generation_session.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/data/prompts.h"
#include "dstrain/device/training_device.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/tasks/eval_target.h"
#include "dstrain/tasks/target_weights.h"
#include "dstrain/train/choice_scores.h"

namespace dstrain::tasks {
namespace fs = std::filesystem;

std::vector<int64_t> generation_config_eos(const std::string& folder, int64_t vocab) {
  std::vector<int64_t> ids;
  const fs::path config = fs::path(folder) / "generation_config.json";
  if (folder.empty() || !fs::is_regular_file(config)) return ids;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(config), nullptr, false);
  if (!j.is_object() || !j.contains("eos_token_id")) return ids;
  const nlohmann::json& e = j["eos_token_id"];
  for (const auto& v : e.is_array() ? e : nlohmann::json::array({e}))
    if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab) ids.push_back(v.get<int64_t>());
  return ids;
}

struct GenerationSession::Impl {
  GenerateRequest request;
  EvalTarget target;
  device::TrainingDevice device;
  config::Recipe recipe;
  std::unique_ptr<data::PromptCodec> codec;
  std::unique_ptr<model::CausalLM> model;
  model::GenerateOptions options;
};

namespace {

std::string device_spec(const std::string& asked) {
  if (asked != "auto") return asked == "cuda" ? "cuda:0" : asked;
  return at::hasCUDA() ? "cuda:0" : "cpu";
}

// The end of sequence, the folder's generation_config.json eos_token_id(s) (a tokenizer's model),
// and --stop-id.
std::vector<int64_t> stop_ids_of(const std::vector<int64_t>& given, const data::PromptCodec& codec, const std::string& folder,
                                 int64_t vocab) {
  std::vector<int64_t> ids = given;
  for (const int64_t id : ids)
    if (id < 0 || id >= vocab)
      throw Error(ErrorCode::kUsage, fmt::format("--stop-id {} is not a token of this model (its vocabulary is 0..{})", id, vocab - 1),
                  "pass the id of a token the tokenizer has");
  if (codec.end_of_sequence() >= 0) ids.push_back(codec.end_of_sequence());
  for (const int64_t id : generation_config_eos(folder, vocab)) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// A run trained on bytes (prepare-data without a tokenizer, or data.format bytes) and no
// tokenizer given: text is its UTF-8 bytes. Returns the end-of-document id (-1: none), or
// nullopt when the run has a tokenizer to find.
std::optional<int64_t> byte_level(const GenerateRequest& r, const EvalTarget& target, const config::Recipe& recipe) {
  if (!r.tokenizer.empty() || !target.hf_dir.empty()) return std::nullopt;
  return train::byte_level_end(recipe);
}

}  // namespace

GenerationSession::GenerationSession(const GenerateRequest& r, const std::string& command) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.request = r;
  s.target = resolve_eval_target(r.target, r.step);
  s.device = device::open_training_device(device_spec(r.device), 0);
  EvalFlags flags;
  flags.model_only = true;
  flags.dtype = !r.dtype.empty() ? r.dtype : s.target.hf_dir.empty() ? "" : s.device.device.is_cuda() ? "bf16" : "fp32";
  s.recipe = eval_recipe(s.target, flags);
  s.options = r.options;
  const std::optional<int64_t> bytes_end = byte_level(r, s.target, s.recipe);
  const std::string dir = bytes_end ? "" : target_tokenizer_dir(r.tokenizer, s.target, s.recipe, command);
  s.codec = std::make_unique<data::PromptCodec>(dir, bytes_end.value_or(-1));
  s.options.stop_ids = stop_ids_of(r.stop_ids, *s.codec, s.target.hf_dir.empty() ? dir : s.target.hf_dir, s.recipe.model.vocab_size);
  // transformers pads with the end of sequence when the model names no pad token; padding is never attended to.
  if (s.codec->end_of_sequence() >= 0) s.options.pad_id = s.codec->end_of_sequence();
  s.model = model::make_model(s.recipe.model, s.recipe.seed, model::scalar_type(s.recipe.precision.dtype));
  load_target_weights(*s.model, s.recipe, s.target.checkpoint, s.device.device);
}

GenerationSession::~GenerationSession() = default;

std::vector<int64_t> GenerationSession::encode_text(const std::string& text) const { return impl_->codec->encode_text(text); }
std::vector<int64_t> GenerationSession::encode_messages(const std::string& json) { return impl_->codec->encode_messages(json); }
std::string GenerationSession::decode(const std::vector<int64_t>& ids) const { return impl_->codec->decode(ids); }
data::PromptCodec& GenerationSession::codec() { return *impl_->codec; }

std::string GenerationSession::text_of(const model::Generation& g) const {
  std::vector<int64_t> ids = g.tokens;
  if (g.stopped_by_id) ids.pop_back();
  std::string s = decode(ids);
  size_t cut = std::string::npos;
  for (const auto& stop : impl_->request.stop) cut = std::min(cut, s.find(stop));
  return cut == std::string::npos ? s : s.substr(0, cut);
}

GenerationSession::Batch GenerationSession::run(const std::vector<std::vector<int64_t>>& prompts, bool stream) {
  Impl& s = *impl_;
  Batch out;
  model::GenerateOptions options = s.options;
  const std::vector<std::string>& stops = s.request.stop;
  // Decoding every row's text at every token is for stop strings and the stream alone.
  if (stops.empty() && !stream)
    options.stop_check = nullptr;
  else
    options.stop_check = [&](size_t row, const std::vector<int64_t>& generated) {
      const std::string so_far = decode(generated);
      bool stop = false;
      for (const auto& str : stops) stop = stop || so_far.find(str) != std::string::npos;
      const bool at_stop_id = std::find(options.stop_ids.begin(), options.stop_ids.end(), generated.back()) != options.stop_ids.end();
      if (stream && row == 0 && !stop && !at_stop_id) {
        // Hold back an unfinished character (decoded as U+FFFD) and what may begin a stop string.
        size_t show = so_far.size();
        if (show >= 3 && so_far.compare(show - 3, 3, "\xEF\xBF\xBD") == 0) show -= 3;
        for (const auto& str : stops) show = std::min(show, so_far.size() >= str.size() ? so_far.size() - str.size() + 1 : size_t{0});
        if (show > out.streamed.size() && so_far.compare(0, out.streamed.size(), out.streamed) == 0) {
          std::fputs(so_far.substr(out.streamed.size(), show - out.streamed.size()).c_str(), stdout);
          std::fflush(stdout);
          out.streamed = so_far.substr(0, show);
        }
      }
      return stop;
    };
  const auto start = std::chrono::steady_clock::now();
  out.rows = model::generate(*s.model, prompts, options, s.device.device);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (stream && !out.rows.empty()) {  // the rest of the first row's text
    const std::string text = text_of(out.rows.front());
    if (text.size() > out.streamed.size()) std::fputs(text.substr(out.streamed.size()).c_str(), stdout);
    std::fflush(stdout);
  }
  return out;
}

int64_t GenerationSession::context() const { return impl_->recipe.model.max_seq_len; }
int64_t GenerationSession::max_new_tokens() const { return impl_->options.max_new_tokens; }

std::string GenerationSession::describe() const {
  const Impl& s = *impl_;
  return fmt::format("{} on {} ({}, {})", s.target.describe(), s.device.name, config::name(s.recipe.precision.dtype),
                     s.options.use_cache ? "key/value cache" : "no cache");
}

}  // namespace dstrain::tasks
