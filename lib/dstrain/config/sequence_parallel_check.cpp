#include "dstrain/config/sequence_parallel_check.h"

#include <fmt/format.h>

namespace dstrain::config {

std::string sequence_world_problem(const Recipe& r) {
  const int64_t s = r.parallel.sequence_parallel_size, p = std::max<int64_t>(1, r.parallel.pipeline_parallel_size);
  if (s <= 1 || r.world_size() % p != 0 || (r.world_size() / p) % s == 0) return "";
  return fmt::format(
      "parallel.sequence_parallel_size {} does not divide the {} data-parallel ranks (world {} = {} node(s) x {} per node{}): each "
      "sample is shared by that many ranks; pick a size that divides them",
      s, r.world_size() / p, r.world_size(), r.launch.nnodes, r.launch.nproc_per_node,
      p > 1 ? fmt::format(", / parallel.pipeline_parallel_size {}", p) : "");
}

void check_sequence_parallel(const Recipe& r, const std::function<void(const std::string&)>& problem) {
  const int64_t s = r.parallel.sequence_parallel_size;
  if (s <= 1) return;
  if (const std::string world = sequence_world_problem(r); !world.empty()) problem(world);
  if (r.data.seq_len % s != 0)
    problem(
        fmt::format("data.seq_len {} is not divisible by parallel.sequence_parallel_size {}: each rank holds seq_len / {} tokens of "
                    "every sample; make seq_len a multiple of it",
                    r.data.seq_len, s, s));
  if (r.model.num_heads % s != 0)
    problem(
        fmt::format("parallel.sequence_parallel_size {} does not divide model.num_heads {}: attention runs heads / {} on each rank "
                    "(key and value heads fewer than that are repeated); pick a size that divides the heads",
                    s, r.model.num_heads, s));
  const auto refuse = [&](bool when, const std::string& what) {
    if (when) problem(fmt::format("parallel.sequence_parallel_size {} with {}: not supported yet", s, what));
  };
  refuse(r.model.mtp_depth > 0 && r.parallel.pipeline_parallel_size > 1,
         "model.mtp_depth > 0 and parallel.pipeline_parallel_size > 1 together (either works with it alone)");
  refuse(r.train.objective != TrainObjective::kSft,
         fmt::format("train.objective {} (sequence losses over whole rows)", name(r.train.objective)));
  refuse(r.train.loss_normalization == LossNormalization::kMicroBatchMean,
         "train.loss_normalization micro_batch_mean (a micro-batch's mean needs its whole count: use global_tokens or per_sample)");
  refuse(!r.data.shard_weights.empty() || r.data.auto_balance, "data.shard_weights (the ranks of a sequence group read one share)");
}

}  // namespace dstrain::config
