#include "dstrain/train/eval_sets.h"

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
#include "dstrain/train/fine_tuning_data.h"

namespace dstrain::train {
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
  return format == config::DataFormat::kMegatron && data::has_loss_mask(config::megatron_prefix(path));
}

int64_t pad_token(const config::Recipe& r) { return r.data.eos_token >= 0 ? r.data.eos_token : 0; }

}  // namespace

EvalSet::EvalSet(std::string name, std::vector<std::unique_ptr<data::TokenFile>> files, int64_t seq_len)
    : name_(std::move(name)), seq_len_(seq_len), files_(std::move(files)) {
  window_starts_.push_back(0);
  for (const auto& f : files_) window_starts_.push_back(window_starts_.back() + std::max<int64_t>(0, (f->size() - 1) / seq_len));
  if (samples() == 0)
    throw Error(ErrorCode::kData,
                fmt::format("evaluation set '{}' ({}) holds no window of data.seq_len + 1 = {} tokens", name_,
                            files_.empty() ? "no files" : files_.front()->path(), seq_len + 1),
                "give a larger evaluation set, or a shorter data.seq_len");
}

EvalSet::EvalSet(std::string name, data::ConversationSet conversations, int64_t seq_len, int64_t pad)
    : name_(std::move(name)), seq_len_(seq_len), conversations_(std::make_unique<data::ConversationSet>(std::move(conversations))),
      pad_(pad) {
  if (conversations_->size() == 0)
    throw Error(ErrorCode::kData, fmt::format("evaluation set '{}' holds no conversation", name_), "give a set of conversations");
  try {
    rows_ = pack_in_order(*conversations_, seq_len);
  } catch (const Error& e) {
    throw Error(ErrorCode::kData, fmt::format("evaluation set '{}': {}", name_, e.what()), e.hint());
  }
}

EvalSet::EvalSet(EvalSet&&) noexcept = default;
EvalSet& EvalSet::operator=(EvalSet&&) noexcept = default;
EvalSet::~EvalSet() = default;

int64_t EvalSet::samples() const { return conversations_ ? static_cast<int64_t>(rows_.size()) : window_starts_.back(); }

void EvalSet::read(int64_t w, int64_t* out, int64_t vocab_size) const {
  const size_t f = static_cast<size_t>(std::upper_bound(window_starts_.begin(), window_starts_.end(), w) - window_starts_.begin()) - 1;
  const data::TokenFile& file = *files_[f];
  const int64_t start = (w - window_starts_[f]) * seq_len_;
  for (int64_t t = 0; t <= seq_len_; ++t) {
    out[t] = file.at(start + t);
    if (vocab_size > 0 && (out[t] < 0 || out[t] >= vocab_size))
      throw Error(ErrorCode::kData,
                  fmt::format("{}: the token at offset {} is {}, outside the model's vocabulary [0, {})", file.path(), start + t,
                              out[t] == data::kNotWhole ? std::string("not a whole number") : std::to_string(out[t]), vocab_size),
                  "the evaluation set was tokenized for another vocabulary: tokenize it with the training data's tokenizer");
  }
}

std::string EvalSet::describe() const {
  if (!conversations_)
    return fmt::format("evaluation set '{}': {} windows of {} tokens, every target scored", name_, samples(), seq_len_ + 1);
  int64_t tokens = 0;
  for (const auto& row : rows_) tokens += row.tokens;
  return fmt::format(
      "evaluation set '{}': {} conversations ({} tokens), packed in order into {} rows of {}; the tokens their loss "
      "masks train are scored",
      name_, conversations_->size(), tokens, rows_.size(), seq_len_);
}

int64_t EvalSet::conversations_in(int64_t samples) const {
  int64_t n = 0;
  for (size_t i = 0; conversations_ && i < rows_.size() && static_cast<int64_t>(i) < samples; ++i)
    n += static_cast<int64_t>(rows_[i].documents.size());
  return n;
}

data::Batch EvalSet::batch(int64_t first, int64_t count, int64_t end, const WindowOptions& o) const {
  const int64_t real = std::clamp<int64_t>(std::min(end, samples()) - first, 0, count);
  if (conversations_) {
    const data::PackedRow empty;  // padding only: nothing trained
    std::vector<const data::PackedRow*> rows;
    for (int64_t i = 0; i < count; ++i) rows.push_back(i < real ? &rows_[static_cast<size_t>(first + i)] : &empty);
    return data::packed_batch(rows, *conversations_, seq_len_, pad_);
  }
  at::Tensor windows = at::empty({count, seq_len_ + 1}, at::kLong);
  int64_t* out = windows.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) read(i < real ? first + i : 0, out + i * (seq_len_ + 1), o.vocab_size);
  const int64_t eos = o.document_mask || o.reset_positions ? o.eos_token : -1;
  data::Batch b = data::pretraining_batch(windows, eos, o.document_mask, o.reset_positions);
  if (real < count) {             // rows past the set's end: same shape, nothing counted
    b.labels = b.labels.clone();  // a view of the windows that the tokens share
    b.labels.narrow(0, real, count - real).fill_(data::kIgnoreIndex);
    b.trained_targets = real * seq_len_;
  }
  return b;
}

TrainingSources::TrainingSources() = default;
TrainingSources::TrainingSources(TrainingSources&&) noexcept = default;
TrainingSources& TrainingSources::operator=(TrainingSources&&) noexcept = default;
TrainingSources::~TrainingSources() = default;

DataSources open_data_sources(const config::Recipe& recipe, bool with_eval) {
  const auto& d = recipe.data;
  const auto& e = recipe.eval;
  DataSources out;
  std::vector<std::unique_ptr<data::TokenFile>> held_out;
  if (is_fine_tuning_data(recipe)) {
    out.train.fine_tuning = std::make_unique<FineTuningSources>(open_fine_tuning_sources(recipe));
  } else {
    for (const auto& path : d.sources()) {
      std::unique_ptr<data::TokenFile> file = data::open_token_file(path, d.format, d.seq_len);
      if (e.split <= 0) {
        out.train.files.push_back(std::move(file));
        continue;
      }
      data::DocumentSplit split = data::split_documents(std::move(file), d.eos_token, e.split, recipe.data_seed(), d.seq_len);
      out.train.files.push_back(std::move(split.train));
      held_out.push_back(std::move(split.held_out));
    }
  }
  if (!with_eval) return out;
  const std::vector<std::string>& names = e.names;
  out.eval = open_eval_files(e.paths, names, d.format, d.seq_len, recipe.model.vocab_size, pad_token(recipe));
  const std::string split_name = names.size() > e.paths.size() ? names.back() : "heldout";
  if (e.split > 0 && out.train.fine_tuning) {
    const FineTuningSources& ft = *out.train.fine_tuning;
    out.eval.emplace_back(split_name, data::ConversationSet(ft.sources, ft.held_out), d.seq_len, pad_token(recipe));
  } else if (e.split > 0) {
    out.eval.emplace_back(split_name, std::move(held_out), d.seq_len);
  }
  check_names(out.eval);
  return out;
}

std::vector<EvalSet> open_eval_sets(const config::Recipe& recipe) {
  if (recipe.eval.split > 0) return open_data_sources(recipe, true).eval;
  return open_eval_files(recipe.eval.paths, recipe.eval.names, recipe.data.format, recipe.data.seq_len, recipe.model.vocab_size,
                         pad_token(recipe));
}

std::vector<EvalSet> open_eval_files(const std::vector<std::string>& paths, const std::vector<std::string>& names,
                                     config::DataFormat format, int64_t seq_len, int64_t vocab_size, int64_t pad) {
  std::vector<EvalSet> sets;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::string name = i < names.size() ? names[i] : stem_of(paths[i]);
    if (has_mask(paths[i], format)) {
      sets.emplace_back(std::move(name), data::ConversationSet::all_of({data::open_masked_tokens(paths[i], vocab_size)}), seq_len, pad);
      continue;
    }
    std::vector<std::unique_ptr<data::TokenFile>> files;
    files.push_back(data::open_token_file(paths[i], format, seq_len));
    sets.emplace_back(std::move(name), std::move(files), seq_len);
  }
  check_names(sets);
  return sets;
}

}  // namespace dstrain::train
