#pragma once
// What each rank reads, step by step, and how the global batch is shared:
//   DataPlan       the recipe's training source (data::BatchSource: text windows in one global
//                  sample order, or fine-tuning sets' packed rows; data/data_sources.h), this
//                  rank's micro-batches of each step (equal shares: micro-batches dealt
//                  rank-major; weighted shares: this rank's contiguous slice, cut into
//                  micro-batches) as data::Batch, weighed per sample for per_sample
//                  normalization, built one step ahead on a background thread, the only user
//                  of the source.
//   ShardBalancer  the shares (data.shard_weights): equal, the recipe's weights, or, with auto,
//                  equal until balance_steps are measured and then by each rank's samples per
//                  second. Checkpointed (data.shard_weights) so a resume splits alike.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "dstrain/data/batch.h"
#include "dstrain/data/sequence_shard.h"
#include "dstrain/model/stateful.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::data {
class BatchSource;
}

namespace dstrain::train {

class DataPlan {
 public:
  // Opens and validates the token files (Error{kData} naming the file), the training side of
  // eval.split when it holds documents out.
  DataPlan(const config::Recipe& recipe, int rank, int world);
  // Reads what data::open_data_sources opened for training (data/data_sources.h), in the recipe's blend.
  // rank, world: the sample ranks (a sequence group's ranks are one); sequence: this rank's share
  // of each row's tokens (data/sequence_shard.h).
  DataPlan(const config::Recipe& recipe, int rank, int world, std::unique_ptr<data::BatchSource> source, data::SequenceShare sequence = {});
  ~DataPlan();  // waits for a prefetch in flight
  int64_t num_samples() const;
  bool fine_tuning() const;  // fine-tuning sets' packed rows, not pretraining windows
  // Starts building step `step`'s batches, global positions from `first`, with `weights` (empty: equal).
  void prefetch(int64_t step, int64_t first, std::vector<double> weights);
  // The prefetched step's micro-batches (on the CPU); waits for them.
  std::vector<data::Batch> take();
  // Drops a prefetch that is no longer wanted (a rollback, new shares).
  void discard();

 private:
  std::vector<data::Batch> build(int64_t step, int64_t first, const std::vector<double>& weights);
  const config::Recipe& recipe_;
  int rank_, world_;
  std::unique_ptr<data::BatchSource> source_;
  data::SequenceShare sequence_;
  std::future<std::vector<data::Batch>> pending_;
};

class ShardBalancer final : public model::Stateful {
 public:
  ShardBalancer(const config::Recipe& recipe, int rank, int world);
  // The shares of the global batch, by rank (empty: equal).
  const std::vector<double>& weights() const { return weights_; }
  // This rank's forward + backward time for `samples` samples (auto balancing measures them).
  void add_compute(double seconds, int64_t samples);
  // Whether step `done` (1-based) ends auto balancing's measured steps: then every rank's rate()
  // travels in the step's all-reduce (StepSums) and rebalance() sets the shares from them.
  bool rebalance_due(int64_t done) const;
  double rate() const;  // this rank's samples per second of compute so far
  void rebalance(int64_t done, const std::vector<double>& rates);

  model::NamedTensors state() const override;  // data.shard_weights, when the shares are weighted
  void load_state(const model::NamedTensors& state) override;

 private:
  const config::Recipe& recipe_;
  int rank_, world_;
  bool weighted_;
  std::vector<double> weights_;
  double compute_s_ = 0;
  int64_t computed_samples_ = 0;
};

}  // namespace dstrain::train
