// The stage split (issue 39): contiguous, non-empty, balanced by cost with the embedding on the
// first stage and the head on the last; hand-given splits checked.
#include <algorithm>

#include "catch_torch.h"
#include "dstrain/core/error.h"
#include "dstrain/pipeline/stage_split.h"

using namespace dstrain::pipeline;

TEST_CASE("equal layers split evenly, the head's cost moves layers off the last stage", "[pipeline]") {
  CHECK(balanced_split({std::vector<double>(8, 1.0), 0, 0}, 4) == std::vector<int>{2, 2, 2, 2});
  CHECK(balanced_split({std::vector<double>(8, 1.0), 0, 0}, 3) == std::vector<int>{2, 3, 3});
  // The head costs two layers: the last stage takes fewer (torchtitan's last-stage weight).
  CHECK(balanced_split({std::vector<double>(10, 1.0), 0, 2}, 4) == std::vector<int>{3, 3, 3, 1});
  // DeepSeek-V3's shape: 3 dense layers, 58 MoE layers twice as expensive; the embedding free.
  std::vector<double> v3(61, 2.0);
  v3[0] = v3[1] = v3[2] = 1.0;
  const auto split = balanced_split({v3, 0, 3}, 16);
  int layers = 0;
  for (int n : split) {
    REQUIRE(n >= 1);
    layers += n;
  }
  CHECK(layers == 61);
  const auto costs = stage_costs({v3, 0, 3}, split);
  CHECK(*std::max_element(costs.begin(), costs.end()) == Approx(8.0));  // 122 + 3 = 125 over 16: 7.8, so 8 at best
}

TEST_CASE("the split minimizes the most expensive stage", "[pipeline]") {
  const LayerCosts c{{5, 1, 1, 1, 1, 5, 1, 1}, 1, 1};
  const auto split = balanced_split(c, 3);
  const auto costs = stage_costs(c, split);
  const double worst = *std::max_element(costs.begin(), costs.end());
  // Every other split into 3 non-empty runs is no better.
  for (int a = 1; a < 8; ++a)
    for (int b = 1; a + b < 8; ++b) {
      const auto other = stage_costs(c, {a, b, 8 - a - b});
      CHECK(*std::max_element(other.begin(), other.end()) >= worst);
    }
}

TEST_CASE("too many stages and bad hand-given splits are refused", "[pipeline]") {
  CHECK_THROWS_WITH(balanced_split({std::vector<double>(3, 1.0), 0, 0}, 4),
                    Catch::Contains("3 decoder layers cannot fill 4 pipeline stages"));
  CHECK(split_problem({2, 2}, 4, 2).empty());
  CHECK(split_problem({2, 2}, 4, 4).find("has 2 entries for 4 stages") != std::string::npos);
  CHECK(split_problem({4, 0}, 4, 2).find("stage 1 0 layers") != std::string::npos);
  CHECK(split_problem({2, 3}, 4, 2).find("adds up to 5 layers, but the model has 4") != std::string::npos);
}
