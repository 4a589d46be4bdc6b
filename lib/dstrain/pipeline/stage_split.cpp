#include "dstrain/pipeline/stage_split.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <numeric>

#include "dstrain/core/error.h"

namespace dstrain::pipeline {

std::vector<int> balanced_split(const LayerCosts& c, int stages) {
  const int n = static_cast<int>(c.layers.size());
  if (stages < 1 || n < stages)
    throw Error(ErrorCode::kConfig, fmt::format("{} decoder layers cannot fill {} pipeline stages: every stage needs a layer", n, stages));
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + c.layers[i];
  auto cost = [&](int from, int to) {  // layers [from, to) as one stage
    return prefix[to] - prefix[from] + (from == 0 ? c.embedding : 0.0) + (to == n ? c.head : 0.0);
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[k][i]: the cheapest most expensive stage when the first i layers form k stages; cut[k][i]
  // where the k-th of them starts.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  for (int i = 1; i <= n; ++i) best[1][i] = cost(0, i);
  for (int k = 2; k <= stages; ++k)
    for (int i = k; i <= n - (stages - k); ++i)
      for (int j = k - 1; j < i; ++j) {
        const double worst = std::max(best[k - 1][j], cost(j, i));
        if (worst < best[k][i] * (1 - 1e-12)) best[k][i] = worst, cut[k][i] = j;
      }
  std::vector<int> counts(stages);
  for (int k = stages, i = n; k >= 1; --k) {
    const int from = k == 1 ? 0 : cut[k][i];
    counts[k - 1] = i - from, i = from;
  }
  return counts;
}

std::vector<double> stage_costs(const LayerCosts& c, const std::vector<int>& counts) {
  std::vector<double> out;
  size_t layer = 0;
  for (size_t s = 0; s < counts.size(); ++s) {
    double sum = s == 0 ? c.embedding : 0.0;
    for (int i = 0; i < counts[s] && layer < c.layers.size(); ++i) sum += c.layers[layer++];
    if (s + 1 == counts.size()) sum += c.head;
    out.push_back(sum);
  }
  return out;
}

std::string split_problem(const std::vector<int>& counts, int layers, int stages) {
  if (static_cast<int>(counts.size()) != stages)
    return fmt::format("has {} entries for {} stages (pipeline ranks x virtual stages): give one layer count per stage", counts.size(),
                       stages);
  for (size_t s = 0; s < counts.size(); ++s)
    if (counts[s] < 1) return fmt::format("gives stage {} {} layers: every stage needs at least one", s, counts[s]);
  const long sum = std::accumulate(counts.begin(), counts.end(), 0L);
  if (sum != layers) return fmt::format("[{}] adds up to {} layers, but the model has {}", fmt::join(counts, ", "), sum, layers);
  return "";
}

}  // namespace dstrain::pipeline
