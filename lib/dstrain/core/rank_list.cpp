#include "dstrain/core/rank_list.h"

#include <algorithm>

namespace dstrain {

std::string format_ranks(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "\u2013" + std::to_string(ranks[j]);  // en dash
    i = j + 1;
  }
  return out;
}

}  // namespace dstrain
