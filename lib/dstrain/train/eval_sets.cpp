#include "dstrain/train/eval_sets.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/data/document_split.h"

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

}  // namespace

EvalSet::EvalSet(std::string name, std::vector<std::unique_ptr<data::TokenFile>> files, int64_t seq_len)
    : name_(std::move(name)), files_(std::move(files)), seq_len_(seq_len) {
  window_starts_.push_back(0);
  for (const auto& f : files_) window_starts_.push_back(window_starts_.back() + std::max<int64_t>(0, (f->size() - 1) / seq_len));
  if (windows() == 0)
    throw Error(ErrorCode::kData,
                fmt::format("evaluation set '{}' ({}) holds no window of data.seq_len + 1 = {} tokens", name_,
                            files_.empty() ? "no files" : files_.front()->path(), seq_len + 1),
                "give a larger evaluation set, or a shorter data.seq_len");
}

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

DataSources open_data_sources(const config::Recipe& recipe, bool with_eval) {
  const auto& d = recipe.data;
  const auto& e = recipe.eval;
  DataSources out;
  std::vector<std::unique_ptr<data::TokenFile>> held_out;
  const uint64_t seed = d.seed >= 0 ? static_cast<uint64_t>(d.seed) : recipe.seed;
  for (const auto& path : d.paths.empty() ? std::vector<std::string>{d.path} : d.paths) {
    std::unique_ptr<data::TokenFile> file = data::open_token_file(path, d.format, d.seq_len);
    if (e.split <= 0) {
      out.train.push_back(std::move(file));
      continue;
    }
    data::DocumentSplit split = data::split_documents(std::move(file), d.eos_token, e.split, seed, d.seq_len);
    out.train.push_back(std::move(split.train));
    held_out.push_back(std::move(split.held_out));
  }
  if (!with_eval) return out;
  std::vector<std::string> names = e.names;
  out.eval = open_eval_files(e.paths, names, d.format, d.seq_len);
  if (e.split > 0) out.eval.emplace_back(names.size() > e.paths.size() ? names.back() : "heldout", std::move(held_out), d.seq_len);
  check_names(out.eval);
  return out;
}

std::vector<EvalSet> open_eval_sets(const config::Recipe& recipe) {
  if (recipe.eval.split > 0) return open_data_sources(recipe, true).eval;
  return open_eval_files(recipe.eval.paths, recipe.eval.names, recipe.data.format, recipe.data.seq_len);
}

std::vector<EvalSet> open_eval_files(const std::vector<std::string>& paths, const std::vector<std::string>& names,
                                     config::DataFormat format, int64_t seq_len) {
  std::vector<EvalSet> sets;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::vector<std::unique_ptr<data::TokenFile>> files;
    files.push_back(data::open_token_file(paths[i], format, seq_len));
    sets.emplace_back(i < names.size() ? names[i] : stem_of(paths[i]), std::move(files), seq_len);
  }
  check_names(sets);
  return sets;
}

}  // namespace dstrain::train
