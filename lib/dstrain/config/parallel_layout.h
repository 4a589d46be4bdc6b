#pragma once
// How a run's ranks are laid out over its parallel axes: pipeline x data, and expert and sequence
// parallelism inside a stage's data-parallel group. Built once
// from the recipe (Recipe::layout) and used by the batch math, --dry-run's plan, training,
// evaluation and `dstrain eval`, whose process groups comm::open_parallel_groups makes from it.
// Stage-major, the one rank formula: rank = pipeline rank x D + data rank, D = world / P, so a
// stage's D data-parallel ranks are consecutive (one node when D divides its GPUs) and the P
// ranks of one data rank pass activations point to point. Within a data-parallel group, E
// consecutive ranks exchange tokens and every E-th rank holds the same experts, and S consecutive
// ranks share each sample, T / S tokens each (Ulysses sequence parallelism, DeepSpeed's
// sequence_parallel_size): they read the same rows, so the batch math counts D / S sample ranks,
// while ZeRO and the gradient reduction span all D (DeepSpeed's DP x SP).
#include <vector>

namespace dstrain::config {

struct ParallelLayout {
  int world = 1;
  int pipeline = 1;  // P: parallel.pipeline_parallel_size
  int expert = 1;    // E: moe.expert_parallel_size, inside the data-parallel group
  int sequence = 1;  // S: parallel.sequence_parallel_size, inside the data-parallel group

  int data() const { return world / pipeline; }      // D
  int samples() const { return data() / sequence; }  // the ranks that read distinct rows
  // Within a data-parallel group: the rank's sample rank (which rows) and its place in its sequence group (which tokens).
  int sample_rank(int data_rank) const { return data_rank / sequence; }
  int sequence_rank(int data_rank) const { return data_rank % sequence; }
  int pipeline_rank(int rank) const { return rank / data(); }
  int data_rank(int rank) const { return rank % data(); }
  int rank_of(int pipeline_rank, int data_rank) const { return pipeline_rank * data() + data_rank; }
  // Each pipeline rank's data-parallel ranks (P groups of D), and each data rank's pipeline (D groups of P).
  std::vector<std::vector<int>> data_groups() const;
  std::vector<std::vector<int>> pipeline_groups() const;
  // The S consecutive ranks of each data-parallel group that share samples (world / S groups of S).
  std::vector<std::vector<int>> sequence_groups() const;
};

}  // namespace dstrain::config
