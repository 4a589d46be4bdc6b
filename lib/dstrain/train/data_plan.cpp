#include "dstrain/train/data_plan.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/data/global_sampler.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/packing.h"
#include "dstrain/data/sample_stream.h"
#include "dstrain/data/token_file.h"
#include "dstrain/train/eval_sets.h"

namespace dstrain::train {

// A fine-tuning set's conversations, packed once (in a seeded order) into rows.
struct PackedConversations {
  std::unique_ptr<data::TokenFile> file;
  std::unique_ptr<data::LossMask> mask;
  std::vector<data::PackedRow> rows;
  std::unique_ptr<data::GlobalSampler> order;  // global position -> row, a permutation per epoch
  int64_t pad = 0;
};

namespace {

data::Packing packing_of(config::Packing p) {
  return p == config::Packing::kBestFit  ? data::Packing::kBestFit
         : p == config::Packing::kGreedy ? data::Packing::kGreedy
                                         : data::Packing::kNone;
}

std::vector<int64_t> document_lengths(const data::TokenFile& file) {
  const auto& starts = file.document_starts();
  std::vector<int64_t> lengths;
  for (size_t d = 0; d < starts.size(); ++d) lengths.push_back((d + 1 < starts.size() ? starts[d + 1] : file.size()) - starts[d]);
  return lengths;
}

// The conversations in a seeded order (not the file's: a set sorted by source or length would
// pack alike conversations together), packed into rows.
std::vector<data::PackedRow> pack_rows(const config::Recipe& r, const std::vector<int64_t>& lengths, uint64_t seed) {
  data::GlobalSampler shuffle(static_cast<int64_t>(lengths.size()), seed ^ 0x5041434bULL);  // "PACK": the order conversations are packed in
  std::vector<int64_t> order;
  for (int64_t i = 0; i < static_cast<int64_t>(lengths.size()); ++i) order.push_back(shuffle.sample_at(i));
  return data::pack_documents(lengths, order, r.data.seq_len, packing_of(r.data.packing));
}

uint64_t data_seed(const config::Recipe& r) { return r.data.seed >= 0 ? static_cast<uint64_t>(r.data.seed) : r.seed; }

bool is_fine_tuning_set(const config::Recipe& r) {
  return r.data.format == config::DataFormat::kMegatron && r.data.paths.empty() && !r.data.path.empty() &&
         data::has_loss_mask(config::megatron_prefix(r.data.path));
}

std::unique_ptr<PackedConversations> pack_conversations(const config::Recipe& r, std::unique_ptr<data::TokenFile> file, uint64_t seed,
                                                        int rank) {
  const std::string prefix = config::megatron_prefix(r.data.path);
  auto p = std::make_unique<PackedConversations>();
  p->mask = std::make_unique<data::LossMask>(prefix, file->size());
  const auto sidecar = config::read_dataset_sidecar(r.data.path);
  const bool recorded = sidecar && sidecar->lossmask_bytes >= 0;
  if (recorded) p->mask->verify(sidecar->lossmask_bytes, sidecar->lossmask_crc32c);
  for (int64_t i = 0; i < file->size(); ++i)
    if (const int64_t t = file->at(i); t < 0 || t >= r.model.vocab_size)
      throw Error(ErrorCode::kData,
                  fmt::format("{}: token {} at offset {} is outside model.vocab_size {}", file->path(), t, i, r.model.vocab_size),
                  "prepare the data with the model's tokenizer");
  const std::vector<int64_t> lengths = document_lengths(*file);
  p->rows = pack_rows(r, lengths, seed);
  p->order = std::make_unique<data::GlobalSampler>(static_cast<int64_t>(p->rows.size()), seed);
  p->pad = r.data.eos_token >= 0 ? r.data.eos_token : 0;
  p->file = std::move(file);
  if (rank == 0) {
    int64_t trained = recorded ? sidecar->trained_tokens : 0;  // the verified mask's own count
    for (int64_t i = 0; !recorded && i < p->file->size(); ++i) trained += p->mask->trained(i);
    log::info(
        fmt::format("fine-tuning set {}: {} conversations, {} tokens ({} trained), packed ({}) into {} rows of {}: {:.1f}% of the "
                    "row tokens hold conversations",
                    prefix, lengths.size(), p->file->size(), trained, config::name(r.data.packing), p->rows.size(), r.data.seq_len,
                    100.0 * data::packing_efficiency(p->rows, r.data.seq_len)));
  }
  return p;
}

// A contiguous run of global positions one micro-batch reads.
struct Chunk {
  int64_t first;
  int64_t count;
};

std::vector<Chunk> plan_step(const config::Recipe& r, int64_t step, int64_t first, const std::vector<double>& weights, int64_t rank,
                             int64_t world) {
  const int64_t micro = r.train.micro_batch_size;
  std::vector<Chunk> chunks;
  if (weights.empty()) {
    for (int64_t m = 0; m < config::accumulation_at(r, step); ++m)
      chunks.push_back({data::first_position(first, m, micro, rank, world), micro});
    return chunks;
  }
  const std::vector<int64_t> counts = data::weighted_shares(config::global_batch_at(r, step), weights);
  int64_t start = first;
  for (int64_t q = 0; q < rank; ++q) start += counts[static_cast<size_t>(q)];
  for (int64_t done = 0; done < counts[static_cast<size_t>(rank)]; done += micro)
    chunks.push_back({start + done, std::min(micro, counts[static_cast<size_t>(rank)] - done)});
  return chunks;
}

}  // namespace

DataPlan::DataPlan(const config::Recipe& recipe, int rank, int world)
    : DataPlan(recipe, rank, world, open_data_sources(recipe, /*with_eval=*/false).train) {}

DataPlan::DataPlan(const config::Recipe& recipe, int rank, int world, std::vector<std::unique_ptr<data::TokenFile>> files)
    : recipe_(recipe), rank_(rank), world_(world) {
  const uint64_t seed = data_seed(recipe);
  if (files.size() == 1 && is_fine_tuning_set(recipe)) {
    packed_ = pack_conversations(recipe, std::move(files.front()), seed, rank);
    return;
  }
  stream_ = std::make_unique<data::SampleStream>(std::move(files), recipe.data.weights, recipe.data.seq_len, seed, recipe.model.vocab_size);
}

DataPlan::~DataPlan() { discard(); }

int64_t packed_rows_of(const config::Recipe& recipe) {
  const std::string prefix = config::megatron_prefix(recipe.data.path);
  if (recipe.data.format == config::DataFormat::kMegatron && !std::filesystem::exists(prefix + ".idx")) return 0;  // reported by the config
  if (!is_fine_tuning_set(recipe)) return -1;
  const auto file = data::open_token_file(recipe.data.path, recipe.data.format, recipe.data.seq_len);
  return static_cast<int64_t>(pack_rows(recipe, document_lengths(*file), data_seed(recipe)).size());
}

int64_t DataPlan::num_samples() const { return packed_ ? static_cast<int64_t>(packed_->rows.size()) : stream_->num_samples(); }

void DataPlan::prefetch(int64_t step, int64_t first, std::vector<double> weights) {
  pending_ = std::async(std::launch::async, [this, step, first, w = std::move(weights)] { return build(step, first, w); });
}

std::vector<data::Batch> DataPlan::take() { return pending_.get(); }

void DataPlan::discard() {
  if (pending_.valid()) pending_.get();
}

std::vector<data::Batch> DataPlan::build(int64_t step, int64_t first, const std::vector<double>& weights) {
  const int64_t seq_len = recipe_.data.seq_len;
  const auto& d = recipe_.data;
  const int64_t eos = d.document_mask || d.reset_positions ? d.eos_token : -1;
  std::vector<data::Batch> batches;
  for (const Chunk& c : plan_step(recipe_, step, first, weights, rank_, world_)) {
    if (packed_) {
      std::vector<const data::PackedRow*> rows;
      for (int64_t i = 0; i < c.count; ++i) rows.push_back(&packed_->rows[static_cast<size_t>(packed_->order->sample_at(c.first + i))]);
      batches.push_back(data::packed_batch(rows, *packed_->file, *packed_->mask, seq_len, packed_->pad));
    } else {
      at::Tensor batch = at::empty({c.count, seq_len + 1}, at::kLong);
      auto* out = batch.data_ptr<int64_t>();
      for (int64_t i = 0; i < c.count; ++i) stream_->read(c.first + i, out + i * (seq_len + 1));
      batches.push_back(data::pretraining_batch(batch, eos, d.document_mask, d.reset_positions));
    }
    if (recipe_.train.loss_normalization == config::LossNormalization::kPerSample) data::weigh_per_sample(batches.back());
  }
  return batches;
}

ShardBalancer::ShardBalancer(const config::Recipe& recipe, int rank, int world)
    : recipe_(recipe), rank_(rank), world_(world), weighted_(!recipe.data.shard_weights.empty() || recipe.data.auto_balance) {
  weights_ = recipe.data.shard_weights;
  if (recipe.data.auto_balance) weights_.assign(static_cast<size_t>(world), 1.0);
}

void ShardBalancer::add_compute(double seconds, int64_t samples) {
  compute_s_ += seconds;
  computed_samples_ += samples;
}

bool ShardBalancer::rebalance_due(int64_t done) const {
  return recipe_.data.auto_balance && done == recipe_.data.balance_steps && done < recipe_.train.steps;
}

double ShardBalancer::rate() const {
  // fp32, as the rates are summed (and were all-reduced before): the shares stay bit-identical.
  return static_cast<float>(static_cast<double>(computed_samples_) / std::max(compute_s_, 1e-9));
}

void ShardBalancer::rebalance(int64_t done, const std::vector<double>& rates) {
  weights_.clear();
  for (double r : rates) weights_.push_back(static_cast<float>(r));
  if (rank_ == 0) {
    const int64_t next_batch = config::global_batch_at(recipe_, done);
    log::info(fmt::format("auto balance: measured {:.1f} samples/s per rank -> shares of {} samples: [{}]", fmt::join(weights_, ", "),
                          next_batch, fmt::join(data::weighted_shares(next_batch, weights_), ", ")));
  }
}

model::NamedTensors ShardBalancer::state() const {
  if (!weighted_) return {};
  return {{"data.shard_weights", at::tensor(std::vector<float>(weights_.begin(), weights_.end()), at::kFloat)}};
}

void ShardBalancer::load_state(const model::NamedTensors& state) {
  if (state.empty()) return;
  const at::Tensor w = state.at(0).tensor.to(at::kFloat).contiguous();
  weights_.assign(w.data_ptr<float>(), w.data_ptr<float>() + w.numel());
}

}  // namespace dstrain::train
