#include "dstrain/data/data_sources.h"

#include "dstrain/data/preference_pairs.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/data/document_split.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/fine_tuning.h"
#include "dstrain/data/sample_stream.h"
#include "dstrain/data/text_windows.h"
#include "dstrain/data/token_file.h"

namespace dstrain::data {
namespace {

std::string stem_of(const std::string& path) {
  std::filesystem::path p(path);
  if (p.extension() == ".bin" || p.extension() == ".idx") p.replace_extension();
  return p.stem().string();
}

void check_names(const std::vector<EvalSet>& sets) {
  std::set<std::string> seen;
  for (const EvalSet& s : sets)
    if (s.name().empty() || !seen.insert(s.name()).second)
      throw Error(ErrorCode::kConfig, fmt::format("two evaluation sets are named '{}'", s.name()),
                  "name them apart with eval.names (one name per set, the split last)");
}

bool has_mask(const std::string& path, config::DataFormat format) {
  return format == config::DataFormat::kMegatron && has_loss_mask(config::megatron_prefix(path));
}

int64_t pad_token(const config::Recipe& r) { return r.data.eos_token >= 0 ? r.data.eos_token : 0; }

}  // namespace

EvalSet::EvalSet(std::string name, std::unique_ptr<BatchSource> source) : name_(std::move(name)), source_(std::move(source)) {}
EvalSet::EvalSet(EvalSet&&) noexcept = default;
EvalSet& EvalSet::operator=(EvalSet&&) noexcept = default;
EvalSet::~EvalSet() = default;

WindowOptions window_options(const config::Recipe& r) {
  WindowOptions o;
  o.eos_token = r.data.eos_token;
  o.document_mask = r.data.document_mask;
  o.reset_positions = r.data.reset_positions;
  o.vocab_size = r.model.vocab_size;
  return o;
}

DataSources open_data_sources(const config::Recipe& recipe, bool with_eval, int rank) {
  const auto& d = recipe.data;
  const auto& e = recipe.eval;
  const std::string split_name = e.names.size() > e.paths.size() ? e.names.back() : "heldout";
  DataSources out;
  std::unique_ptr<BatchSource> held_out;  // eval.split's
  // dpo and kto read a reference model's log-probs, precomputed into a table here (or live:
  // train/live_reference.h; or none); reward, cpo, simpo and orpo have none.
  const bool reference =
      (recipe.train.objective == config::TrainObjective::kDpo || recipe.train.objective == config::TrainObjective::kKto) &&
      recipe.preference.reference == "precomputed";
  if (recipe.train.trains_pairs()) {
    auto pairs = std::make_unique<PreferencePairs>(recipe, rank);
    if (reference) out.preference.push_back(pairs.get());
    if (with_eval) held_out = pairs->held_out();
    out.train = std::move(pairs);
  } else if (is_fine_tuning_data(recipe)) {
    FineTuningSources sources = open_fine_tuning_sources(recipe);
    if (with_eval && e.split > 0)
      held_out = std::make_unique<ConversationsInOrder>(split_name, ConversationSet(sources.sources, sources.held_out), d.seq_len,
                                                        pad_token(recipe));
    out.train = std::make_unique<PackedConversations>(recipe, std::move(sources), rank);
  } else {
    std::vector<std::unique_ptr<TokenFile>> files, held_files;
    for (const auto& path : d.sources()) {
      std::unique_ptr<TokenFile> file = open_token_file(path, d.format, d.seq_len);
      if (e.split <= 0) {
        files.push_back(std::move(file));
        continue;
      }
      DocumentSplit split = split_documents(std::move(file), d.eos_token, e.split, recipe.data_seed(), d.seq_len);
      files.push_back(std::move(split.train));
      held_files.push_back(std::move(split.held_out));
    }
    if (with_eval && e.split > 0)
      held_out = std::make_unique<HeldOutWindows>(split_name, std::move(held_files), d.seq_len, window_options(recipe));
    out.train = std::make_unique<TextWindows>(
        std::make_unique<SampleStream>(std::move(files), d.weights, d.seq_len, recipe.data_seed(), recipe.model.vocab_size), d.seq_len,
        window_options(recipe));
  }
  if (!with_eval) return out;
  if (recipe.train.trains_pairs()) {
    out.eval = open_eval_pairs(recipe);
    if (reference)
      for (const EvalSet& set : out.eval) out.preference.push_back(static_cast<const PreferencePairs*>(&set.source()));
  } else {
    out.eval = open_eval_files(e.paths, e.names, d.format, d.seq_len, window_options(recipe), pad_token(recipe));
  }
  if (held_out) out.eval.emplace_back(split_name, std::move(held_out));
  check_names(out.eval);
  return out;
}

std::vector<EvalSet> open_eval_pairs(const config::Recipe& recipe) {
  std::vector<EvalSet> sets;
  const auto& e = recipe.eval;
  for (size_t i = 0; i < e.paths.size(); ++i) {
    std::string name = i < e.names.size() ? e.names[i] : stem_of(e.paths[i]);
    sets.emplace_back(std::move(name), std::make_unique<PreferencePairs>(recipe, e.paths[i]));
  }
  check_names(sets);
  return sets;
}

std::vector<EvalSet> open_eval_sets(const config::Recipe& recipe) {
  if (recipe.eval.split > 0) return open_data_sources(recipe, true).eval;
  if (recipe.train.trains_pairs()) return open_eval_pairs(recipe);
  return open_eval_files(recipe.eval.paths, recipe.eval.names, recipe.data.format, recipe.data.seq_len, window_options(recipe),
                         pad_token(recipe));
}

std::vector<EvalSet> open_eval_files(const std::vector<std::string>& paths, const std::vector<std::string>& names,
                                     config::DataFormat format, int64_t seq_len, const WindowOptions& options, int64_t pad) {
  std::vector<EvalSet> sets;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::string name = i < names.size() ? names[i] : stem_of(paths[i]);
    std::unique_ptr<BatchSource> source;
    if (has_mask(paths[i], format)) {
      source = std::make_unique<ConversationsInOrder>(name, ConversationSet::all_of({open_masked_tokens(paths[i], options.vocab_size)}),
                                                      seq_len, pad);
    } else {
      std::vector<std::unique_ptr<TokenFile>> files;
      files.push_back(open_token_file(paths[i], format, seq_len));
      source = std::make_unique<HeldOutWindows>(name, std::move(files), seq_len, options);
    }
    sets.emplace_back(std::move(name), std::move(source));
  }
  check_names(sets);
  return sets;
}

}  // namespace dstrain::data
