#include "dstrain/data/fine_tuning.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/data/blend_order.h"
#include "dstrain/data/document_split.h"
#include "dstrain/data/global_sampler.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/token_file.h"

namespace dstrain::data {
namespace {

Packing packing_of(config::Packing p) {
  return p == config::Packing::kBestFit ? Packing::kBestFit : p == config::Packing::kGreedy ? Packing::kGreedy : Packing::kNone;
}

// Source s's seed, as SampleStream gives text sources theirs.
uint64_t source_seed(const config::Recipe& r, size_t s) { return r.data_seed() + 1000003ull * s; }

// The documents of a source of `n` that training reads: all but eval.split's.
std::vector<int64_t> training_documents(const config::Recipe& r, int64_t n, const std::string& path, std::vector<int64_t>* held) {
  if (r.eval.split <= 0) return documents_left(n, {});
  const std::vector<int64_t> held_out = held_out_documents(n, r.eval.split, r.data_seed(), path, "conversations");
  if (held) *held = held_out;
  return documents_left(n, held_out);
}

// Source s's rows: its training conversations (`ids`, indices into `lengths`) in a seeded order,
// packed. The order's seed is the one data plans before blends used for their single source.
std::vector<PackedRow> pack_source(const config::Recipe& r, const std::vector<int64_t>& lengths, const std::vector<int64_t>& ids,
                                   size_t s) {
  GlobalSampler shuffle(static_cast<int64_t>(ids.size()), source_seed(r, s) ^ 0x5041434bULL);  // "PACK"
  std::vector<int64_t> order;
  order.reserve(ids.size());
  for (int64_t i = 0; i < static_cast<int64_t>(ids.size()); ++i) order.push_back(ids[static_cast<size_t>(shuffle.sample_at(i))]);
  return pack_documents(lengths, order, r.data.seq_len, packing_of(r.data.packing));
}

// rank 0's line per source: conversations, tokens (trained), rows and how full they are.
void log_source(const config::Recipe& r, const ConversationSet& set, size_t s, const std::vector<int64_t>& ids, int64_t held_out_trained,
                const std::vector<PackedRow>& rows, double weight) {
  const MaskedTokens& source = set.sources()[s];
  int64_t tokens = 0, trained = source.trained >= 0 ? source.trained - held_out_trained : 0;
  for (const int64_t i : ids) {
    tokens += set.length(i);
    if (source.trained < 0) trained += set.trained_tokens(i);
  }
  log::info(
      fmt::format("fine-tuning set {}: {} conversations{}, {} tokens ({} trained), packed ({}) into {} rows of {}: {:.1f}% of the "
                  "row tokens hold conversations{}",
                  config::megatron_prefix(source.tokens->path()), ids.size(), r.eval.split > 0 ? " left to train on" : "", tokens, trained,
                  config::name(r.data.packing), rows.size(), r.data.seq_len, 100.0 * packing_efficiency(rows, r.data.seq_len),
                  weight >= 0 ? fmt::format("; blend weight {:.4g}", weight) : std::string()));
}

}  // namespace

bool is_fine_tuning_data(const config::Recipe& r) {
  if (r.data.format != config::DataFormat::kMegatron) return false;
  const std::vector<std::string> paths = r.data.sources();
  size_t masked = 0;
  for (const auto& path : paths) masked += !path.empty() && has_loss_mask(config::megatron_prefix(path));
  if (masked > 0 && masked < paths.size())  // the config says so from the sidecars; this holds without them too
    throw Error(
        ErrorCode::kData,
        fmt::format("data.paths: {} of the {} sources have a loss mask (fine-tuning sets) and the others not", masked, paths.size()),
        "blend sets of one kind: conversations (prepare-data --chat) or text");
  return masked == paths.size();
}

FineTuningSources open_fine_tuning_sources(const config::Recipe& r) {
  FineTuningSources out;
  const std::vector<std::string> paths = r.data.sources();
  for (size_t s = 0; s < paths.size(); ++s) {
    out.sources.push_back(open_masked_tokens(paths[s], r.model.vocab_size));
    const auto n = static_cast<int64_t>(out.sources.back().tokens->document_starts().size());
    std::vector<int64_t> held;
    out.training.push_back(training_documents(r, n, out.sources.back().tokens->path(), &held));
    for (const int64_t d : held) out.held_out.push_back({s, d});
  }
  return out;
}

PackedConversations::PackedConversations(const config::Recipe& r, FineTuningSources sources, int rank)
    : seq_len_(r.data.seq_len), pad_(r.data.eos_token >= 0 ? r.data.eos_token : 0) {
  // What eval.split took from each source's recorded trained tokens (a few conversations: cheaper
  // than counting the rest again).
  std::vector<int64_t> held_out_trained(sources.sources.size(), 0);
  if (rank == 0) {
    const ConversationSet held(sources.sources, sources.held_out);
    for (int64_t i = 0; i < held.size(); ++i) held_out_trained[held.ref(i).source] += held.trained_tokens(i);
  }
  std::vector<ConversationRef> refs;
  std::vector<std::vector<int64_t>> ids(sources.sources.size());  // per source, indices into refs
  for (size_t s = 0; s < sources.sources.size(); ++s)
    for (const int64_t d : sources.training[s]) ids[s].push_back(static_cast<int64_t>(refs.size())), refs.push_back({s, d});
  conversations_ = std::make_unique<ConversationSet>(std::move(sources.sources), std::move(refs));
  const std::vector<int64_t> lengths = conversations_->lengths();
  std::vector<double> weights;
  for (size_t s = 0; s < ids.size(); ++s) {
    rows_.push_back(pack_source(r, lengths, ids[s], s));
    orders_.emplace_back(static_cast<int64_t>(rows_.back().size()), source_seed(r, s));
    total_rows_ += static_cast<int64_t>(rows_.back().size());
    weights.push_back(r.data.weights.empty() ? static_cast<double>(rows_.back().size()) : r.data.weights[s]);
    if (rank == 0) log_source(r, *conversations_, s, ids[s], held_out_trained[s], rows_.back(), ids.size() > 1 ? weights.back() : -1);
  }
  blend_ = std::make_unique<BlendOrder>(weights);
}

PackedConversations::~PackedConversations() = default;

Batch PackedConversations::batch(int64_t first, int64_t count, int64_t end) {
  const PackedRow empty;  // past `end`: padding only, nothing trained
  std::vector<const PackedRow*> rows;
  for (int64_t p = first; p < first + count; ++p) {
    int64_t k = 0;
    const size_t s = blend_->source_of(p, k);
    rows.push_back(p < end ? &rows_[s][static_cast<size_t>(orders_[s].sample_at(k))] : &empty);
  }
  return packed_batch(rows, *conversations_, seq_len_, pad_);
}

std::string PackedConversations::describe() const {
  return fmt::format("{} conversations packed into {} rows of {} tokens from {} source(s)", conversations_->size(), total_rows_, seq_len_,
                     rows_.size());
}

ConversationsInOrder::ConversationsInOrder(std::string name, ConversationSet conversations, int64_t seq_len, int64_t pad)
    : name_(std::move(name)), conversations_(std::make_unique<ConversationSet>(std::move(conversations))), seq_len_(seq_len), pad_(pad) {
  if (conversations_->size() == 0)
    throw Error(ErrorCode::kData, fmt::format("evaluation set '{}' holds no conversation", name_), "give a set of conversations");
  try {
    rows_ = pack_in_order(*conversations_, seq_len);
  } catch (const Error& e) {
    throw Error(ErrorCode::kData, fmt::format("evaluation set '{}': {}", name_, e.what()), e.hint());
  }
}

ConversationsInOrder::~ConversationsInOrder() = default;

Batch ConversationsInOrder::batch(int64_t first, int64_t count, int64_t end) {
  const int64_t real = std::clamp<int64_t>(std::min(end, rows()) - first, 0, count);
  const PackedRow empty;  // padding only: nothing trained
  std::vector<const PackedRow*> rows;
  for (int64_t i = 0; i < count; ++i) rows.push_back(i < real ? &rows_[static_cast<size_t>(first + i)] : &empty);
  return packed_batch(rows, *conversations_, seq_len_, pad_);
}

std::string ConversationsInOrder::describe() const {
  int64_t tokens = 0;
  for (const auto& row : rows_) tokens += row.tokens;
  return fmt::format(
      "evaluation set '{}': {} conversations ({} tokens), packed in order into {} rows of {}; the tokens their loss "
      "masks train are scored",
      name_, conversations_->size(), tokens, rows_.size(), seq_len_);
}

int64_t ConversationsInOrder::conversations_in(int64_t rows) const {
  int64_t n = 0;
  for (size_t i = 0; i < rows_.size() && static_cast<int64_t>(i) < rows; ++i) n += static_cast<int64_t>(rows_[i].documents.size());
  return n;
}

int64_t packed_rows_of(const config::Recipe& r) {
  if (r.data.format != config::DataFormat::kMegatron) return -1;
  const std::vector<std::string> paths = r.data.sources();
  for (const auto& path : paths)
    if (!path.empty() && !std::filesystem::exists(config::megatron_prefix(path) + ".idx")) return 0;  // reported by the config
  if (r.train.trains_pairs()) {  // a pass is every pair once, but those eval.split holds out
    const auto sidecar = config::read_dataset_sidecar(paths.front());
    const int64_t units = !sidecar                                            ? 0
                          : r.train.objective == config::TrainObjective::kKto ? sidecar->kto_examples
                                                                              : sidecar->preference_pairs;
    const int64_t pairs = std::max<int64_t>(units, 0);
    if (pairs == 0 || r.eval.split <= 0) return pairs;
    return pairs -
           static_cast<int64_t>(held_out_documents(pairs, r.eval.split, r.data_seed(), paths.front(),
                                                   r.train.objective == config::TrainObjective::kKto ? "KTO examples" : "preference pairs")
                                    .size());
  }
  if (!is_fine_tuning_data(r)) return -1;
  int64_t rows = 0;
  for (size_t s = 0; s < paths.size(); ++s) {
    const auto file = open_token_file(paths[s], config::DataFormat::kMegatron, 1);
    const std::vector<int64_t> lengths = document_lengths(*file);
    const std::vector<int64_t> ids = training_documents(r, static_cast<int64_t>(lengths.size()), file->path(), nullptr);
    rows += static_cast<int64_t>(pack_source(r, lengths, ids, s).size());
  }
  return rows;
}

std::vector<PackedRow> pack_in_order(const ConversationSet& conversations, int64_t seq_len) {
  std::vector<int64_t> order(static_cast<size_t>(conversations.size()));
  std::iota(order.begin(), order.end(), 0);
  return pack_documents(conversations.lengths(), order, seq_len, Packing::kGreedy);
}

}  // namespace dstrain::data
