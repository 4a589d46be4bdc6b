#include "catch_torch.h"

#include <algorithm>
#include <set>

#include "dstrain/data/global_sampler.h"

using dstrain::data::first_position;
using dstrain::data::GlobalSampler;

TEST_CASE("each epoch is a permutation of all samples, reproducible from the seed", "[data]") {
  GlobalSampler a(97, 7), b(97, 7), c(97, 8);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    for (int64_t i = 0; i < 97; ++i) {
      const int64_t p = epoch * 97 + i;
      seen.insert(a.sample_at(p));
      CHECK(a.sample_at(p) == b.sample_at(p));
    }
    CHECK(seen.size() == 97);
  }
  bool differs = false;
  for (int64_t i = 0; i < 97; ++i) differs |= a.sample_at(i) != c.sample_at(i);
  CHECK(differs);
  bool epochs_differ = false;
  for (int64_t i = 0; i < 97; ++i) epochs_differ |= a.sample_at(i) != a.sample_at(97 + i);
  CHECK(epochs_differ);
}

TEST_CASE("every world size reads the same global batch", "[data]") {
  const int64_t global = 16, micro = 2;
  for (int64_t step : {0, 3}) {
    std::set<int64_t> reference;
    for (int64_t p = step * global; p < (step + 1) * global; ++p) reference.insert(p);
    for (int64_t world : {1, 2, 4, 8}) {
      const int64_t accum = global / (micro * world);
      std::multiset<int64_t> read;
      for (int64_t rank = 0; rank < world; ++rank)
        for (int64_t m = 0; m < accum; ++m)
          for (int64_t i = 0; i < micro; ++i) read.insert(first_position(step * global, m, micro, rank, world) + i);
      INFO("world " << world);
      CHECK(std::set<int64_t>(read.begin(), read.end()) == reference);
      CHECK(read.size() == reference.size());  // nothing read twice
    }
  }
}

TEST_CASE("for every world size 1..8: each sample once per epoch, the same global batches, resumable on another N", "[data]") {
  const int64_t samples = 1000, global = 840;  // 840 = lcm(1..8): every N divides the batch
  GlobalSampler sampler(samples, 11);
  auto read_step = [&](int64_t step, int64_t world) {
    std::multiset<int64_t> got;
    const int64_t micro = global / world;  // one micro-step per rank
    for (int64_t rank = 0; rank < world; ++rank)
      for (int64_t i = 0; i < micro; ++i) got.insert(sampler.sample_at(first_position(step * global, 0, micro, rank, world) + i));
    return got;
  };
  for (int64_t world = 1; world <= 8; ++world) {
    INFO("N = " << world);
    // Positions [0, samples) are one epoch: whatever the rank split, every sample exactly once.
    std::multiset<int64_t> epoch;
    for (int64_t rank = 0; rank < world; ++rank)
      for (int64_t p = rank; p < samples; p += world) epoch.insert(sampler.sample_at(p));
    CHECK(epoch.size() == static_cast<size_t>(samples));
    CHECK(std::set<int64_t>(epoch.begin(), epoch.end()).size() == static_cast<size_t>(samples));
    // Step 3's global batch is the same set for every N (it straddles epochs 2 and 3).
    CHECK(read_step(3, world) == read_step(3, 1));
  }
  // Resume: steps 0..4 on 2 ranks then 5..9 on 7 ranks read what 10 steps on 1 rank read.
  std::multiset<int64_t> split, whole;
  for (int64_t step = 0; step < 10; ++step) {
    const auto a = read_step(step, step < 5 ? 2 : 7), b = read_step(step, 1);
    split.insert(a.begin(), a.end());
    whole.insert(b.begin(), b.end());
  }
  CHECK(split == whole);
}

TEST_CASE("weighted shares split each global batch by weight and cover it exactly", "[data]") {
  using dstrain::data::weighted_shares;
  CHECK(weighted_shares(16, {1, 1}) == std::vector<int64_t>{8, 8});
  CHECK(weighted_shares(16, {3, 1}) == std::vector<int64_t>{12, 4});
  CHECK(weighted_shares(10, {2, 1, 1, 1}) == std::vector<int64_t>{4, 2, 2, 2});
  CHECK(weighted_shares(7, {1, 1, 1}) == std::vector<int64_t>{3, 2, 2});          // remainder to the lower rank
  CHECK(weighted_shares(4, {100, 1, 1, 1}) == std::vector<int64_t>{1, 1, 1, 1});  // nobody idles
  CHECK(weighted_shares(6, {0, 0}) == std::vector<int64_t>{3, 3});
  for (int64_t g : {1, 5, 16, 99}) {
    const auto c = weighted_shares(g, {0.7, 1.3, 2.9});
    CHECK(c[0] + c[1] + c[2] == g);
  }
}
