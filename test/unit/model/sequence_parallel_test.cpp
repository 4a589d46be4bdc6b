// Ulysses sequence parallelism's parts: the layout's sequence groups, the exchanges of heads for
// tokens (each other's inverse), attend() over a sequence group against the whole sequence's
// attention (values and gradients, with a document mask and GQA's repeated heads), and a batch's
// share of the tokens.
#include <ATen/ATen.h>

#include <mutex>
#include <vector>

#include "catch_torch.h"
#include "dstrain/comm/parallel_groups.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"
#include "dstrain/data/sequence_shard.h"
#include "dstrain/model/attention.h"
#include "dstrain/model/sequence_parallel.h"

using namespace dstrain;

TEST_CASE("parallel layout: sequence groups are consecutive ranks of a data-parallel group", "[model]") {
  config::Recipe r;
  r.launch.nproc_per_node = 8;
  r.parallel.sequence_parallel_size = 2;
  const config::ParallelLayout l = r.layout();
  CHECK(l.data() == 8);
  CHECK(l.samples() == 4);
  CHECK(r.data_parallel_size() == 4);  // the batch math counts the ranks that read distinct rows
  CHECK(l.sequence_groups() == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  CHECK(l.sample_rank(5) == 2);
  CHECK(l.sequence_rank(5) == 1);
  std::mutex mu;
  std::vector<int> ranks(4);
  comm::run_on_threads(4, [&](comm::Communicator& world) {
    const comm::ParallelGroups g = comm::open_parallel_groups(world, config::ParallelLayout{4, 1, 1, 2});
    REQUIRE(g.sequence);
    const std::lock_guard<std::mutex> lock(mu);
    ranks[static_cast<size_t>(world.rank())] = g.sequence->world_size() * 10 + g.sequence->rank();
  });
  CHECK(ranks == std::vector<int>{20, 21, 20, 21});
  comm::run_on_threads(2, [&](comm::Communicator& world) {
    CHECK_THROWS(comm::open_parallel_groups(world, config::ParallelLayout{2, 1, 1, 4}));
  });
}

namespace {

// q, k, v [B, H, T, d] of a whole sequence, with a document mask over two documents.
struct Whole {
  at::Tensor q, k, v, documents;
  model::AttentionScope scope;
};

Whole whole_attention_inputs(int64_t B, int64_t H, int64_t T, int64_t d) {
  at::manual_seed(11);
  Whole w{at::randn({B, H, T, d}, at::kFloat), at::randn({B, H, T, d}, at::kFloat), at::randn({B, H, T, d}, at::kFloat), {}, {}};
  w.documents = (at::arange(T, at::kLong) >= T / 3).to(at::kLong).expand({B, T}).contiguous();
  w.scope = model::AttentionScope::of({}, w.documents, {});
  return w;
}

}  // namespace

TEST_CASE("sequence parallelism: the exchanges are inverses, and attend over a group is the whole attention", "[model]") {
  for (const int S : {2, 4}) {
    const int64_t B = 2, H = 4, T = 12, d = 3;
    const Whole w = whole_attention_inputs(B, H, T, d);
    at::Tensor q = w.q.clone().requires_grad_(), k = w.k.clone().requires_grad_(), v = w.v.clone().requires_grad_();
    const at::Tensor weights = at::randn({B, H, T, d}, at::kFloat);
    (model::attend(q, k, v, w.scope) * weights).sum().backward();
    std::mutex mu;
    std::vector<at::Tensor> outs(static_cast<size_t>(S)), grads(static_cast<size_t>(S));
    comm::run_on_threads(S, [&](comm::Communicator& group) {
      const int64_t r = group.rank(), t = T / S;
      const auto mine = [&](const at::Tensor& x) { return x.narrow(2, r * t, t).contiguous(); };
      // Heads to sequence: heads [r H/S, (r+1) H/S) of all T tokens; back again: this rank's tokens.
      const at::Tensor gathered = model::heads_to_sequence(mine(w.q), group);
      CHECK(at::equal(gathered, w.q.narrow(1, r * (H / S), H / S)));
      CHECK(at::equal(model::sequence_to_heads(gathered, group), mine(w.q)));
      at::Tensor lq = mine(w.q).requires_grad_(), lk = mine(w.k).requires_grad_(), lv = mine(w.v).requires_grad_();
      model::AttentionScope scope = w.scope;
      scope.sequence = &group;
      const at::Tensor out = model::attend(lq, lk, lv, scope);
      (out * mine(weights)).sum().backward();
      const std::lock_guard<std::mutex> lock(mu);
      outs[static_cast<size_t>(r)] = out.detach();
      grads[static_cast<size_t>(r)] = at::cat({lq.grad(), lk.grad(), lv.grad()}, 0);
    });
    CHECK(at::allclose(at::cat(outs, 2), model::attend(w.q, w.k, w.v, w.scope), 1e-6, 1e-6));
    CHECK(at::allclose(at::cat(grads, 2), at::cat({q.grad(), k.grad(), v.grad()}, 0), 1e-6, 1e-6));
  }
}

TEST_CASE("sequence parallelism: a batch's share of the tokens", "[model]") {
  data::Batch b = data::labelled_batch(at::arange(14, at::kLong).view({2, 7}), at::arange(14, at::kLong).view({2, 7}));
  b.labels.index_put_({0, 0}, data::kIgnoreIndex);
  b.document_ids = at::tensor({0, 0, 0, 1, 1, 1, 1}, at::kLong).expand({2, 7}).contiguous();
  b.samples = 4;
  CHECK(data::sequence_shard(b, {0, 1}).tokens.size(1) == 7);  // no sequence parallelism: the batch itself
  // 7 tokens over 2 ranks: padded to 8, 4 each; the pad trains nothing and is its own document.
  const data::Batch first = data::sequence_shard(b, {0, 2}), second = data::sequence_shard(b, {1, 2});
  CHECK(at::equal(first.tokens, at::tensor({0, 1, 2, 3, 7, 8, 9, 10}, at::kLong).view({2, 4})));
  CHECK(at::equal(second.tokens, at::tensor({4, 5, 6, 0, 11, 12, 13, 0}, at::kLong).view({2, 4})));
  CHECK(at::equal(second.positions, at::tensor({4, 5, 6, 7, 4, 5, 6, 7}, at::kLong).view({2, 4})));
  CHECK(second.labels[0][3].item<int64_t>() == data::kIgnoreIndex);
  CHECK(first.trained_targets == 7);  // one label of the first row is ignored
  CHECK(second.trained_targets == 6);
  CHECK(at::equal(second.document_ids, at::tensor({0, 0, 0, 1, 1, 1, 1, 2}, at::kLong).expand({2, 8})));
  CHECK(first.samples == 4);  // counted once per sequence group
  CHECK(second.samples == 0);
  CHECK_FALSE(second.sequential_positions);
}
