#include "dstrain/pipeline/zero_bubble.h"

#include <algorithm>

namespace dstrain::pipeline {

std::vector<std::vector<Action>> zero_bubble_h1(int ranks, int m) {
  std::vector<std::vector<Action>> out(ranks);
  for (int r = 0; r < ranks; ++r) {
    const int warmup = std::min(ranks - r - 1, m), defer = r;
    auto& list = out[r];
    int next_w = 0;
    auto input_gradient = [&](int i) {
      list.push_back({Op::kBackwardInput, r, i, -1});
      if (i - defer >= 0) list.push_back({Op::kBackwardWeight, r, next_w++, -1});
    };
    for (int i = 0; i < warmup; ++i) list.push_back({Op::kForward, r, i, -1});
    for (int i = 0; i + warmup < m; ++i) list.push_back({Op::kForward, r, i + warmup, -1}), input_gradient(i);
    for (int i = m - warmup; i < m; ++i) input_gradient(i);
    while (next_w < m) list.push_back({Op::kBackwardWeight, r, next_w++, -1});
  }
  return out;
}

}  // namespace dstrain::pipeline
