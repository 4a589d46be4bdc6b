#include "dstrain/train/data_plan.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/data/batch_source.h"
#include "dstrain/data/data_sources.h"
#include "dstrain/data/global_sampler.h"

namespace dstrain::train {

namespace {

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
    : DataPlan(recipe, rank, world, data::open_data_sources(recipe, /*with_eval=*/false, rank).train) {}

DataPlan::DataPlan(const config::Recipe& recipe, int rank, int world, std::unique_ptr<data::BatchSource> source,
                   data::SequenceShare sequence)
    : recipe_(recipe), rank_(rank), world_(world), source_(std::move(source)), sequence_(sequence) {}

DataPlan::~DataPlan() { discard(); }

int64_t DataPlan::num_samples() const { return source_->rows(); }

bool DataPlan::fine_tuning() const { return source_->conversations(); }

void DataPlan::prefetch(int64_t step, int64_t first, std::vector<double> weights) {
  pending_ = std::async(std::launch::async, [this, step, first, w = std::move(weights)] { return build(step, first, w); });
}

std::vector<data::Batch> DataPlan::take() { return pending_.get(); }

void DataPlan::discard() {
  if (pending_.valid()) pending_.get();
}

std::vector<data::Batch> DataPlan::build(int64_t step, int64_t first, const std::vector<double>& weights) {
  std::vector<data::Batch> batches;
  for (const Chunk& c : plan_step(recipe_, step, first, weights, rank_, world_)) {
    batches.push_back(source_->batch(c.first, c.count));
    batches.back().first_row = c.first;
    if (recipe_.train.loss_normalization == config::LossNormalization::kPerSample) data::weigh_per_sample(batches.back());
    batches.back() = data::sequence_shard(batches.back(), sequence_);  // after the weights: a sample's targets are counted whole
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
