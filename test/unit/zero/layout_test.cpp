#include "catch_torch.h"

#include <numeric>

#include "dstrain/zero/layout.h"

using namespace dstrain::zero;

namespace {
std::vector<Layout::Param> tiny_model() {
  // Groups and decay as a model declares them (model::ParamPlace).
  return {{"model.embed_tokens.weight", 100, 0, true},
          {"model.layers.0.input_layernorm.weight", 10, 1, false},
          {"model.layers.0.self_attn.q_proj.weight", 37, 1, true},
          {"model.layers.0.mlp.down_proj.bias", 5, 1, false},
          {"model.layers.1.self_attn.q_proj.weight", 300, 2, true},
          {"model.norm.weight", 10, 3, false},
          {"lm_head.weight", 100, 3, true}};
}
}  // namespace

TEST_CASE("layout: units follow layer groups, are padded and split into equal chunks", "[zero]") {
  for (int world : {1, 2, 3, 4}) {
    const Layout l(tiny_model(), world, 1000);
    CHECK(l.numel() == 562);
    CHECK(l.num_groups() == 4);
    REQUIRE(l.units().size() == 4);  // embeddings, layer 0, layer 1, norm + head
    int64_t flat = 0;
    for (const Unit& u : l.units()) {
      CHECK(u.padded % (world * kAlignment) == 0);
      CHECK(u.padded >= u.numel);
      CHECK(u.padded - u.numel < world * kAlignment);  // the tail is at most one quantum
      CHECK(u.flat_offset == flat);
      CHECK(u.shard_offset == flat / world);
      flat += u.padded;
    }
    CHECK(l.flat_numel() == flat);
    CHECK(l.shard_numel() * world == flat);
    // Every real element is owned by exactly one rank, once.
    std::vector<int> owned(562, 0);
    std::vector<int64_t> param_start(l.params().size(), 0);
    for (size_t i = 1; i < param_start.size(); ++i) param_start[i] = param_start[i - 1] + l.params()[i - 1].numel;
    for (int r = 0; r < world; ++r) {
      int64_t last_end = 0;
      for (const ShardSegment& s : l.segments(r)) {
        CHECK(s.shard_offset >= last_end);  // in shard order, not overlapping
        CHECK(s.shard_offset + s.numel <= l.shard_numel());
        last_end = s.shard_offset + s.numel;
        for (int64_t e = 0; e < s.numel; ++e) ++owned[static_cast<size_t>(param_start[static_cast<size_t>(s.param)] + s.param_offset + e)];
      }
    }
    CHECK(std::all_of(owned.begin(), owned.end(), [](int n) { return n == 1; }));
  }
}

TEST_CASE("layout: a bucket size splits a group; a bigger parameter gets a unit of its own", "[zero]") {
  const Layout l(tiny_model(), 2, 40);
  // embed(100) | norm(10)+q(37)? no: 47 > 40 -> norm | q | bias | q1(300) | norm(10) | head(100)
  REQUIRE(l.units().size() == 7);
  CHECK(l.units()[1].num_params == 1);
  CHECK(l.units()[2].num_params == 1);
  CHECK(l.units()[3].numel == 5);
  for (const Unit& u : l.units()) CHECK((u.num_params == 1 || u.numel <= 40));
}

TEST_CASE("layout: groups and weight decay are the model's, whatever the names say", "[zero]") {
  // A name that looks like a decoder layer does not move a parameter: an MTP layer named
  // model.layers.61.* stays in the group its model gives it.
  std::vector<Layout::Param> params = tiny_model();
  params.insert(params.end() - 2, {"model.layers.61.eh_proj.weight", 20, 2, true});
  const Layout moved(params, 2, 1000);
  CHECK(moved.num_groups() == 4);
  CHECK(moved.params()[5].group == 2);
  CHECK(moved.params().back().group == 3);
  CHECK(Layout(tiny_model(), 1, 1000, 0, 6).num_groups() == 6);  // groups without parameters count too
  std::vector<Layout::Param> backwards = tiny_model();
  backwards[1].group = 3;
  CHECK_THROWS(Layout(backwards, 1, 1000));
  const Layout l(tiny_model(), 2, 1000);
  for (const ShardSegment& s : l.segments(1))
    CHECK(s.decay == (l.params()[static_cast<size_t>(s.param)].name.find("proj.weight") != std::string::npos ||
                      l.params()[static_cast<size_t>(s.param)].name.find("embed") != std::string::npos ||
                      l.params()[static_cast<size_t>(s.param)].name == "lm_head.weight"));
}

TEST_CASE("layout: with expert parallelism the routed experts' units are split over the expert-data-parallel ranks", "[zero]") {
  // Layer 1 holds this rank's block: experts 2 and 3, between the router and a shared expert.
  const std::vector<Layout::Param> params = {{"model.embed_tokens.weight", 100, 0, true, false},
                                             {"model.layers.1.mlp.gate.weight", 40, 2, true, false},
                                             {"model.layers.1.mlp.experts.2.up_proj.weight", 70, 2, true, true},
                                             {"model.layers.1.mlp.experts.3.up_proj.weight", 70, 2, true, true},
                                             {"model.layers.1.mlp.shared_experts.up_proj.weight", 50, 2, true, false},
                                             {"lm_head.weight", 100, 3, true, false}};
  const int world = 4, expert_world = 2;  // E = 2: each expert on 2 of the 4 ranks
  const Layout l(params, world, 1000, expert_world);
  // A unit never spans the two domains: embeddings | gate | experts | shared | head.
  REQUIRE(l.units().size() == 5);
  CHECK(l.units()[2].expert);
  CHECK(l.units()[2].num_params == 2);
  CHECK(l.units()[2].world == expert_world);
  CHECK(l.units()[2].padded % (expert_world * kAlignment) == 0);
  for (int u : {0, 1, 3, 4}) CHECK(l.units()[static_cast<size_t>(u)].world == world);
  int64_t shard = 0;
  for (const Unit& u : l.units()) {
    CHECK(u.shard_offset == shard);
    shard += u.chunk();
  }
  CHECK(l.shard_numel() == shard);
  // Rank r is at place r / 2 of its expert-data-parallel group {r % 2, r % 2 + 2}: the dense
  // elements once over the 4 ranks, the expert elements once per group (each group holds a block).
  int64_t dense = 0, expert = 0;
  for (int rank = 0; rank < world; ++rank)
    for (const ShardSegment& s : l.segments(rank, rank / 2)) {
      CHECK(s.shard_offset + s.numel <= l.shard_numel());
      (l.params()[static_cast<size_t>(s.param)].expert ? expert : dense) += s.numel;
    }
  CHECK(dense == 100 + 40 + 50 + 100);
  CHECK(expert == 2 * 140);
}
