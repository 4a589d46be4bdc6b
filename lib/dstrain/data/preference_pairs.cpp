#include "dstrain/data/preference_pairs.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/document_split.h"
#include "dstrain/data/packing.h"
#include "dstrain/data/score_token.h"
#include "dstrain/data/token_file.h"

namespace dstrain::data {

PreferencePairs::PreferencePairs(const config::Recipe& r, int rank)
    : path_(r.data.sources().front()), seq_len_(r.data.seq_len), pad_(r.data.eos_token >= 0 ? r.data.eos_token : 0), ordered_(false),
      order_(1, r.data_seed()) {
  open(r);
  if (r.eval.split > 0)
    held_ = held_out_documents(file_pairs_, r.eval.split, r.data_seed(), path_, labels_.empty() ? "preference pairs" : "KTO examples");
  selected_ = documents_left(file_pairs_, held_);
  for (const int64_t p : held_) trained_tokens_ -= documents_->trained_tokens(2 * p) + documents_->trained_tokens(2 * p + 1);
  order_ = GlobalSampler(rows(), r.data_seed());
  if (rank == 0) log::info(describe());
  if (rank == 0 && !labels_.empty()) warn_unbalanced(r);
  if (rank == 0 && unread_margins_)
    log::info(fmt::format("{}: its pairs' margins are left unread: only train.objective reward reads them (TRL's reward margin)", path_));
}

// The KTO paper's advice (its eq. 8, as TRL's KTOTrainer warns): with unequal numbers of desirable
// and undesirable examples, desirable_weight x desirable / (undesirable_weight x undesirable) in [1, 4/3].
void PreferencePairs::warn_unbalanced(const config::Recipe& r) const {
  const auto desirable = static_cast<double>(std::max<int64_t>(
      1, std::count_if(selected_.begin(), selected_.end(), [this](int64_t p) { return labels_[static_cast<size_t>(p)] == '1'; })));
  const double undesirable = std::max(1.0, static_cast<double>(selected_.size()) - desirable);
  const double dw = r.preference.desirable_weight, uw = r.preference.undesirable_weight;
  if (desirable == undesirable) return;
  const double d_low = undesirable * uw / desirable, u_high = desirable * dw / undesirable;
  if ((d_low <= dw && dw <= d_low * 4 / 3) || (u_high * 3 / 4 <= uw && uw <= u_high)) return;
  log::warn(
      fmt::format("{}: {:.0f} desirable and {:.0f} undesirable examples, weighed {:g} and {:g}: the KTO paper advises "
                  "preference.desirable_weight in [{:.2f}, {:.2f}] or preference.undesirable_weight in [{:.2f}, {:.2f}] (not both)",
                  path_, desirable, undesirable, dw, uw, d_low, d_low * 4 / 3, u_high * 3 / 4, u_high));
}

PreferencePairs::PreferencePairs(const config::Recipe& r, const std::string& path)
    : path_(path), seq_len_(r.data.seq_len), pad_(r.data.eos_token >= 0 ? r.data.eos_token : 0), ordered_(true), order_(1, r.data_seed()) {
  open(r);
  selected_.resize(static_cast<size_t>(file_pairs_));
  std::iota(selected_.begin(), selected_.end(), 0);
}

PreferencePairs::PreferencePairs(const PreferencePairs& training, std::vector<int64_t> held)
    : path_(training.path_), seq_len_(training.seq_len_), pad_(training.pad_), file_pairs_(training.file_pairs_),
      score_pad_(training.score_pad_), ordered_(true), owns_reference_(false), documents_(training.documents_), selected_(std::move(held)),
      order_(1, 0), reference_(training.reference_), labels_(training.labels_), margins_(training.margins_) {
  for (const int64_t p : selected_) trained_tokens_ += documents_->trained_tokens(2 * p) + documents_->trained_tokens(2 * p + 1);
}

PreferencePairs::~PreferencePairs() = default;

void PreferencePairs::open(const config::Recipe& r) {
  const auto sidecar = config::read_dataset_sidecar(path_);
  const bool kto = r.train.objective == config::TrainObjective::kKto;
  if (!sidecar || (kto ? sidecar->kto_examples : sidecar->preference_pairs) < 0)
    throw Error(ErrorCode::kData, fmt::format("{}: not a set of {}", path_, kto ? "KTO examples" : "preference pairs"),
                kto ? "prepare it with dstrain prepare-data --preference --kto" : "prepare it with dstrain prepare-data --preference");
  documents_ = std::make_shared<const ConversationSet>(ConversationSet::all_of({open_masked_tokens(path_, r.model.vocab_size)}));
  const int64_t units = kto ? sidecar->kto_examples : sidecar->preference_pairs;
  if (documents_->size() != 2 * units || documents_->size() == 0 ||
      (kto &&
       (static_cast<int64_t>(sidecar->kto_labels.size()) != units || sidecar->kto_labels.find_first_not_of("01") != std::string::npos)))
    throw Error(
        ErrorCode::kData,
        fmt::format("{}: {} documents for the {} {} {} records{}", path_, documents_->size(), units, kto ? "examples" : "pairs",
                    sidecar->file, kto ? fmt::format(", with {} labels", sidecar->kto_labels.size()) : ""),
        kto ? "prepare the set again with prepare-data --preference --kto" : "prepare the set again with prepare-data --preference");
  file_pairs_ = units;
  if (kto) labels_ = sidecar->kto_labels;
  read_margins(r, *sidecar);
  if (r.model.score_head) score_pad_ = score_pad_token(*sidecar);
  trained_tokens_ = sidecar->trained_tokens;
  for (int64_t d = 0; d < documents_->size(); ++d)
    if (documents_->length(d) > seq_len_)
      throw Error(ErrorCode::kData,
                  fmt::format("{}: {} {}'s {} sequence has {} tokens, more than data.seq_len {}", path_, kto ? "example" : "pair", d / 2,
                              kto     ? (d % 2 ? "KL" : "own")
                              : d % 2 ? "rejected"
                                      : "chosen",
                              documents_->length(d), seq_len_),
                  fmt::format("set data.seq_len: {} or more, or prepare the pairs with --max-length {}", documents_->length(d), seq_len_));
}

void PreferencePairs::read_margins(const config::Recipe& r, const config::DatasetSidecar& sidecar) {
  const std::vector<double>& m = sidecar.preference_margins;
  if (m.empty()) return;
  if (static_cast<int64_t>(m.size()) != file_pairs_ || !std::all_of(m.begin(), m.end(), [](double v) { return std::isfinite(v); }))
    throw Error(ErrorCode::kData,
                fmt::format("{}: \"margins\" holds {} values for {} pairs, or values that are not finite numbers", sidecar.file, m.size(),
                            file_pairs_),
                "prepare the set again with prepare-data --preference");
  if (r.train.objective == config::TrainObjective::kReward) margins_ = m;
  unread_margins_ = margins_.empty();
}

std::unique_ptr<PreferencePairs> PreferencePairs::held_out() const {
  if (held_.empty()) return nullptr;
  return std::unique_ptr<PreferencePairs>(new PreferencePairs(*this, held_));
}

Batch PreferencePairs::rows_of(const std::vector<int64_t>& pairs, int64_t real) const {
  std::vector<PackedRow> rows(2 * pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i)
    if (static_cast<int64_t>(i) < real)
      for (int64_t half = 0; half < 2; ++half) rows[2 * i + half].documents = {2 * pairs[i] + half};
  std::vector<const PackedRow*> pointers;
  for (const PackedRow& row : rows) pointers.push_back(&row);
  Batch b = packed_batch(pointers, *documents_, seq_len_, pad_);
  // One sequence per row from position 0, padding after it: plain causal attention sees the same.
  b.document_ids = at::Tensor();
  b.positions = at::arange(seq_len_, at::kLong).expand({b.rows(), seq_len_}).contiguous();
  b.sequential_positions = true;
  for (auto& lengths : b.document_lengths) lengths = {seq_len_};
  b.pairs = real;
  if (!labels_.empty()) {
    b.desirable = at::zeros({static_cast<int64_t>(pairs.size())}, at::kBool);
    bool* desirable = b.desirable.data_ptr<bool>();
    for (int64_t i = 0; i < real; ++i) desirable[i] = labels_[static_cast<size_t>(pairs[static_cast<size_t>(i)])] == '1';
  }
  if (!margins_.empty()) {
    b.margins = at::zeros({static_cast<int64_t>(pairs.size())}, at::kFloat);  // TRL's torch.float margins
    float* margins = b.margins.data_ptr<float>();
    for (int64_t i = 0; i < real; ++i) margins[i] = static_cast<float>(margins_[static_cast<size_t>(pairs[static_cast<size_t>(i)])]);
  }
  if (score_pad_ >= 0) {
    b.score_positions = at::zeros({b.rows()}, at::kLong);
    int64_t* at = b.score_positions.data_ptr<int64_t>();
    const int64_t* tokens = b.tokens.data_ptr<int64_t>();
    for (int64_t row = 0; row < 2 * real; ++row) {
      const int64_t length = documents_->length(2 * pairs[static_cast<size_t>(row / 2)] + row % 2);
      at[row] = score_position(std::vector<int64_t>(tokens + row * seq_len_, tokens + row * seq_len_ + length), score_pad_);
    }
  }
  if (!reference_->empty()) {
    b.reference_logps = at::zeros({b.rows()}, at::kDouble);
    double* out = b.reference_logps.data_ptr<double>();
    for (int64_t i = 0; i < real; ++i)
      for (int64_t half = 0; half < 2; ++half)
        out[2 * i + half] = (*reference_)[static_cast<size_t>(2 * pairs[static_cast<size_t>(i)] + half)];
  }
  return b;
}

Batch PreferencePairs::batch(int64_t first, int64_t count, int64_t end) {
  std::vector<int64_t> pairs;
  const int64_t last = ordered_ ? std::min(end, rows()) : end;  // evaluation: one pass
  for (int64_t p = first; p < first + count; ++p)
    pairs.push_back(p < last ? selected_[static_cast<size_t>(ordered_ ? p : order_.sample_at(p))] : 0);
  Batch b = rows_of(pairs, std::clamp<int64_t>(last - first, 0, count));
  b.first_row = 2 * first;
  return b;
}

int64_t PreferencePairs::chosen_targets_in(int64_t count) const {
  int64_t n = 0;
  for (int64_t i = 0; i < std::min(count, rows()); ++i) {
    const ConversationSet::Span s = documents_->span(2 * selected_[static_cast<size_t>(i)]);
    for (int64_t t = s.begin + 1; t < s.end; ++t) n += s.mask->trained(t);  // a target is the next token (data/packing.h)
  }
  return n;
}

int64_t PreferencePairs::chosen_sequence_targets_in(int64_t count) const {
  int64_t n = 0;
  for (int64_t i = 0; i < std::min(count, rows()); ++i)
    n += std::max<int64_t>(documents_->length(2 * selected_[static_cast<size_t>(i)]) - 1, 0);
  return n;
}

int64_t chosen_sequence_targets(const Batch& b) {
  if (b.pairs <= 0) return 0;
  // A row's sequence ends at its last trained target (the completion's last token), from position 0.
  const at::Tensor chosen = b.labels.narrow(0, 0, 2 * b.pairs).view({b.pairs, 2, -1}).select(1, 0).ne(kIgnoreIndex);
  const at::Tensor positions = at::arange(1, chosen.size(1) + 1, at::kLong).expand_as(chosen);
  return at::where(chosen, positions, at::zeros_like(positions)).amax(1).sum().item<int64_t>();
}

Batch PreferencePairs::in_order(int64_t first, int64_t count, int64_t end) const {
  std::vector<int64_t> pairs;
  for (int64_t p = first; p < first + count; ++p) pairs.push_back(p < std::min(end, file_pairs_) ? p : 0);
  return rows_of(pairs, std::clamp<int64_t>(std::min(end, file_pairs_) - first, 0, count));
}

std::string PreferencePairs::describe() const {
  int64_t tokens = 0;
  for (const int64_t p : selected_) tokens += documents_->length(2 * p) + documents_->length(2 * p + 1);
  std::string what = margins_.empty() ? "preference pairs" : "preference pairs with margins";
  if (!labels_.empty()) {
    const int64_t desirable =
        std::count_if(selected_.begin(), selected_.end(), [this](int64_t p) { return labels_[static_cast<size_t>(p)] == '1'; });
    what = fmt::format("KTO examples ({} desirable) each with its KL sequence", desirable);
  }
  return fmt::format("{}: {} {}{}, {} tokens ({} in completions), each sequence in a row of {}", path_, rows(), what,
                     ordered_        ? (owns_reference_ ? "" : " held out by eval.split")
                     : held_.empty() ? ""
                                     : fmt::format(" left to train on ({} held out by eval.split)", held_.size()),
                     tokens, trained_tokens_, seq_len_);
}

}  // namespace dstrain::data
