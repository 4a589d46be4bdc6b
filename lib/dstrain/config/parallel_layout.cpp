#include "dstrain/config/parallel_layout.h"

#include <cstddef>

namespace dstrain::config {

std::vector<std::vector<int>> ParallelLayout::data_groups() const {
  std::vector<std::vector<int>> groups(static_cast<size_t>(pipeline));
  for (int r = 0; r < world; ++r) groups[static_cast<size_t>(pipeline_rank(r))].push_back(r);
  return groups;
}

std::vector<std::vector<int>> ParallelLayout::pipeline_groups() const {
  std::vector<std::vector<int>> groups(static_cast<size_t>(data()));
  for (int r = 0; r < world; ++r) groups[static_cast<size_t>(data_rank(r))].push_back(r);
  return groups;
}

std::vector<std::vector<int>> ParallelLayout::sequence_groups() const {
  std::vector<std::vector<int>> groups(static_cast<size_t>(world / sequence));
  for (int r = 0; r < world; ++r) groups[static_cast<size_t>(r / sequence)].push_back(r);
  return groups;
}

}  // namespace dstrain::config
