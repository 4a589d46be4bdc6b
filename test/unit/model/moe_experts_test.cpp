// The routed experts: grouped compute against a dense per-expert reference (values and every
// gradient, fp32), and expert parallelism over 2 and 4 ranks against the same layer on one rank;
// then the whole MLA + MoE model with its experts spread over ranks.
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/gloo_ranks.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/layers.h"
#include "dstrain/model/mla_moe_model.h"
#include "dstrain/model/moe_experts.h"
#include "gpu/moe_experts_check.h"
#include "tiny_models.h"

using namespace dstrain;

namespace {

constexpr int64_t kExperts = 8, kHidden = 16, kInner = 12, kTopK = 3;

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen, at::kFloat);
}

// Every expert's weights, drawn from one seed (leaves with gradients).
model::LocalExperts all_experts(uint64_t seed) {
  model::LocalExperts x;
  for (int64_t e = 0; e < kExperts; ++e) {
    x.gate.push_back((randn({kInner, kHidden}, seed + 3 * e) * 0.3).set_requires_grad(true));
    x.up.push_back((randn({kInner, kHidden}, seed + 3 * e + 1) * 0.3).set_requires_grad(true));
    x.down.push_back((randn({kHidden, kInner}, seed + 3 * e + 2) * 0.3).set_requires_grad(true));
  }
  return x;
}

model::LocalExperts block_of(const model::LocalExperts& all, int64_t first, int64_t count) {
  model::LocalExperts x;
  x.first = first;
  for (int64_t e = first; e < first + count; ++e) {
    x.gate.push_back(all.gate[e].detach().clone().set_requires_grad(true));
    x.up.push_back(all.up[e].detach().clone().set_requires_grad(true));
    x.down.push_back(all.down[e].detach().clone().set_requires_grad(true));
  }
  return x;
}

// One rank's tokens and routing: idx from the top-k of random scores (+ `avoid` pushes experts
// [0, avoid) out of every choice), weights that carry gradients.
struct Tokens {
  at::Tensor flat, idx, weights, upstream;
};
Tokens tokens_of(int rank, int64_t n, int64_t avoid) {
  Tokens t;
  t.flat = randn({n, kHidden}, 100 + rank).set_requires_grad(true);
  at::Tensor scores = randn({n, kExperts}, 200 + rank);
  if (avoid > 0) scores.narrow(1, 0, avoid).sub_(100);
  t.idx = std::get<1>(scores.topk(kTopK, -1));
  t.weights = at::softmax(randn({n, kTopK}, 300 + rank), -1).set_requires_grad(true);
  t.upstream = randn({n, kHidden}, 400 + rank);
  return t;
}

at::Tensor grad_or_zeros(const at::Tensor& t) { return t.grad().defined() ? t.grad() : at::zeros_like(t); }

double worst(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
}

}  // namespace

TEST_CASE("grouped routed experts equal a dense per-expert reference, values and gradients (fp32, 1e-6)", "[model][moe]") {
  // The expert loop, and the grouped GEMMs (at::_grouped_mm: on the CPU in fp32 too).
  const model::ExpertKernels kernels = GENERATE(model::ExpertKernels::kLoop, model::ExpertKernels::kGroupedMm);
  const bool selective = GENERATE(false, true);
  INFO("grouped GEMMs " << (kernels == model::ExpertKernels::kGroupedMm) << ", selective " << selective);
  const Tokens t = tokens_of(0, 37, 0);
  const model::LocalExperts grouped = all_experts(7), dense = block_of(grouped, 0, kExperts);
  const model::RoutedOutput got = model::routed_experts(t.flat, t.idx, t.weights, kExperts, grouped, nullptr, selective, kernels);
  // Reference: every expert on every token, times the token's weight for it (zero when not chosen).
  const at::Tensor flat2 = t.flat.detach().clone().set_requires_grad(true), weights2 = t.weights.detach().clone().set_requires_grad(true);
  at::Tensor want = at::zeros_like(flat2);
  for (int64_t e = 0; e < kExperts; ++e) {
    const at::Tensor w = (weights2 * t.idx.eq(e).to(at::kFloat)).sum(-1, true);
    want = want + w * model::swiglu(flat2, dense.gate[e], dense.up[e], dense.down[e]);
  }
  CHECK(worst(got.out, want) <= 1e-6);
  CHECK(at::equal(got.counts, at::bincount(t.idx.reshape({-1}), {}, kExperts)));
  (got.out * t.upstream).sum().backward();
  (want * t.upstream).sum().backward();
  CHECK(worst(t.flat.grad(), flat2.grad()) <= 1e-6);
  CHECK(worst(t.weights.grad(), weights2.grad()) <= 1e-6);
  for (int64_t e = 0; e < kExperts; ++e) {
    INFO("expert " << e);
    CHECK(worst(grad_or_zeros(grouped.gate[e]), grad_or_zeros(dense.gate[e])) <= 1e-6);
    CHECK(worst(grad_or_zeros(grouped.up[e]), grad_or_zeros(dense.up[e])) <= 1e-6);
    CHECK(worst(grad_or_zeros(grouped.down[e]), grad_or_zeros(dense.down[e])) <= 1e-6);
  }
}

TEST_CASE(
    "routed experts with adapters (lora.experts): the loop and the grouped GEMMs equal the merged experts W + s·B·A, and "
    "the adapters' gradients are the merged weights' carried through (fp32)",
    "[model][moe][lora]") {
  const model::ExpertKernels kernels = GENERATE(model::ExpertKernels::kLoop, model::ExpertKernels::kGroupedMm);
  const bool selective = GENERATE(false, true);
  INFO("grouped GEMMs " << (kernels == model::ExpertKernels::kGroupedMm) << ", selective " << selective);
  constexpr int64_t kRank = 4;
  constexpr double kScale = 2.5;
  const Tokens t = tokens_of(0, 37, 2);  // experts 0 and 1 get no rows
  model::LocalExperts adapted = all_experts(7);
  adapted.gate_lora.scale = adapted.up_lora.scale = adapted.down_lora.scale = kScale;
  model::LocalExperts merged;
  uint64_t seed = 900;
  for (int64_t e = 0; e < kExperts; ++e)
    for (auto [weights, lora, into] :
         {std::tuple{&adapted.gate, &adapted.gate_lora, &merged.gate}, std::tuple{&adapted.up, &adapted.up_lora, &merged.up},
          std::tuple{&adapted.down, &adapted.down_lora, &merged.down}}) {
      const at::Tensor& w = (*weights)[static_cast<size_t>(e)];
      lora->a.push_back((randn({kRank, w.size(1)}, ++seed) * 0.3).set_requires_grad(true));
      lora->b.push_back((randn({w.size(0), kRank}, ++seed) * 0.3).set_requires_grad(true));
      into->push_back((w.detach() + at::mm(lora->b.back().detach(), lora->a.back().detach()) * kScale).set_requires_grad(true));
    }
  const model::RoutedOutput got = model::routed_experts(t.flat, t.idx, t.weights, kExperts, adapted, nullptr, selective, kernels);
  const model::RoutedOutput want =
      model::routed_experts(t.flat.detach(), t.idx, t.weights.detach(), kExperts, merged, nullptr, false, model::ExpertKernels::kLoop);
  CHECK(worst(got.out, want.out) <= 1e-6);
  (got.out * t.upstream).sum().backward();
  (want.out * t.upstream).sum().backward();
  for (int64_t e = 0; e < kExperts; ++e) {
    const auto i = static_cast<size_t>(e);
    for (auto [lora, weight, reference] :
         {std::tuple{&adapted.gate_lora, &adapted.gate[i], &merged.gate[i]}, std::tuple{&adapted.up_lora, &adapted.up[i], &merged.up[i]},
          std::tuple{&adapted.down_lora, &adapted.down[i], &merged.down[i]}}) {
      INFO("expert " << e);
      const at::Tensor g = grad_or_zeros(*reference);
      if (e < 2) CHECK(g.abs().max().item<float>() == 0.0f);  // no rows: nothing (and no hang)
      CHECK(worst(grad_or_zeros(*weight), g) <= 1e-6);
      CHECK(worst(grad_or_zeros(lora->b[i]), at::mm(g, lora->a[i].detach().t()) * kScale) <= 1e-5);
      CHECK(worst(grad_or_zeros(lora->a[i]), at::mm(lora->b[i].detach().t(), g) * kScale) <= 1e-5);
    }
  }
}

TEST_CASE("gpu.kernels' expert check runs on the CPU: grouped GEMMs against the loop, fp32, every gradient", "[model][moe]") {
  // The GPU test's own code (moe_experts_check.h) on the CPU, so that its plumbing is tested
  // where there is no GPU: it joined [I, H] and [H, I] gradients along dim 1 and failed on every GPU.
  const int64_t lora_rank = GENERATE(0, 16);  // 16: with lora.experts' adapters
  INFO("adapters of rank " << lora_rank);
  const auto c = dstrain::test::expert_case(at::kCPU, at::kFloat, lora_rank);
  std::string unavailable;
  const auto grouped = dstrain::test::run_experts(c, model::ExpertKernels::kGroupedMm, &unavailable);
  INFO(unavailable);
  REQUIRE(grouped);
  const auto loop = dstrain::test::run_experts(c, model::ExpertKernels::kLoop, nullptr);
  REQUIRE(loop);
  CHECK(grouped->grad_experts.numel() == c.experts * 3 * (128 * 256 + lora_rank * (128 + 256)));
  for (const double d : dstrain::test::expert_differences(*grouped, *loop)) CHECK(d < 1e-5);
  // Expert 5 got no rows: its gradients are zeros, joined all the same.
  CHECK(loop->grad_experts.slice(0, 5 * 3 * 128 * 256, 6 * 3 * 128 * 256).abs().max().item<float>() == 0.0f);
}

TEST_CASE("expert parallelism over 2 and 4 ranks gives the one-rank outputs and gradients", "[model][moe][expert-parallel]") {
  const model::ExpertKernels kernels = GENERATE(model::ExpertKernels::kLoop, model::ExpertKernels::kGroupedMm);
  INFO("grouped GEMMs " << (kernels == model::ExpertKernels::kGroupedMm));
  for (const int E : {2, 4})
    for (const int64_t avoid : {int64_t{0}, kExperts / E}) {  // avoid: nobody routes to rank 0's experts
      INFO(fmt::format("{} ranks, experts [0, {}) never chosen", E, avoid));
      const int64_t local = kExperts / E;
      std::vector<std::string> failures(static_cast<size_t>(E));
      comm::run_on_threads(E, [&](comm::Communicator& group) {
        const int r = group.rank();
        const Tokens t = tokens_of(r, 11 + 5 * r, avoid);  // a different number of tokens per rank
        const model::LocalExperts all = all_experts(7), mine = block_of(all, r * local, local);
        const model::RoutedOutput got = model::routed_experts(t.flat, t.idx, t.weights, kExperts, mine, &group, false, kernels);
        (got.out * t.upstream).sum().backward();
        // The reference: every rank's tokens through all experts here (the expert gradients sum over ranks).
        std::string& fail = failures[static_cast<size_t>(r)];
        for (int src = 0; src < E; ++src) {
          const Tokens s = tokens_of(src, 11 + 5 * src, avoid);
          const model::RoutedOutput want = model::routed_experts(s.flat, s.idx, s.weights, kExperts, all, nullptr, false);
          (want.out * s.upstream).sum().backward();
          if (src != r) continue;
          if (worst(got.out, want.out) > 1e-6) fail += " output;";
          if (worst(t.flat.grad(), s.flat.grad()) > 1e-6) fail += " input gradient;";
          if (worst(t.weights.grad(), s.weights.grad()) > 1e-6) fail += " weight gradient;";
        }
        for (int64_t e = 0; e < local; ++e) {
          const int64_t g = r * local + e;
          if (worst(grad_or_zeros(mine.gate[e]), grad_or_zeros(all.gate[g])) > 1e-6 ||
              worst(grad_or_zeros(mine.up[e]), grad_or_zeros(all.up[g])) > 1e-6 ||
              worst(grad_or_zeros(mine.down[e]), grad_or_zeros(all.down[g])) > 1e-6)
            fail += fmt::format(" expert {} gradient;", g);
        }
      });
      for (int r = 0; r < E; ++r) {
        INFO("rank " << r);
        CHECK(failures[static_cast<size_t>(r)] == "");
      }
    }
}

TEST_CASE("the MLA + MoE model with its experts over 2 ranks: one rank's losses and gradients", "[model][moe][expert-parallel]") {
  const config::ModelConfig cfg = dstrain::test::tiny_v3();  // 4 experts
  const int E = 2;
  std::vector<std::string> failures(E);
  comm::run_on_threads(E, [&](comm::Communicator& world) {
    const int r = world.rank();
    std::unique_ptr<comm::Communicator> group = world.split({{0, 1}});
    model::MlaMoeModel spread(cfg, 11, c10::ScalarType::Float, group.get());
    auto batch = [&](int src) {
      at::Generator gen = at::detail::createCPUGenerator(50 + src);
      return at::randint(cfg.vocab_size, {2, 9}, gen, at::kLong);
    };
    std::map<std::string, at::Tensor> spread_params;
    for (const auto& p : spread.parameters()) spread_params[p.name] = p.tensor;
    const at::Tensor loss = model::mean_loss(spread, batch(r), batch(r).roll(-1, 1));
    loss.backward();
    std::string& fail = failures[static_cast<size_t>(r)];
    if (spread_params.count("model.layers.1.mlp.experts.0.gate_proj.weight") != (r == 0 ? 1u : 0u)) fail += " wrong experts held;";
    // The reference: the whole model on each rank's batch; expert gradients sum over the ranks.
    model::MlaMoeModel whole(cfg, 11);
    std::map<std::string, at::Tensor> sum;
    for (int src = 0; src < E; ++src) {
      for (const auto& p : whole.parameters()) p.tensor.mutable_grad() = at::Tensor();
      const at::Tensor want = model::mean_loss(whole, batch(src), batch(src).roll(-1, 1));
      want.backward();
      if (src == r && std::abs(want.item<double>() - loss.item<double>()) > 1e-6 * std::abs(want.item<double>())) fail += " loss;";
      for (const auto& p : whole.parameters()) {
        const at::Tensor g = grad_or_zeros(p.tensor);
        const bool expert = p.name.find(".mlp.experts.") != std::string::npos;
        if (expert) sum[p.name] = sum.count(p.name) ? sum[p.name] + g : g.clone();
        if (!expert && src == r && worst(grad_or_zeros(spread_params.at(p.name)), g) > 1e-5) fail += " " + p.name + ";";
      }
    }
    for (const auto& [name, t] : spread_params)
      if (name.find(".mlp.experts.") != std::string::npos && worst(grad_or_zeros(t), sum.at(name)) > 1e-5) fail += " " + name + ";";
  });
  for (int r = 0; r < E; ++r) {
    INFO("rank " << r);
    CHECK(failures[static_cast<size_t>(r)] == "");
  }
}

TEST_CASE("expert parallelism on real Gloo ranks: the dispatch overlaps the caller's work, and the exchange waits are counted",
          "[model][moe][expert-parallel]") {
  // Rank 1's work during the dispatch takes 150 ms; rank 0's does nothing. Rank 0 then waits for
  // rank 1's combine: its counted wait is at least ~150 ms, in forward. In backward rank 1 starts
  // 150 ms late: rank 0's counted wait grows by as much again. The outputs equal the run without work.
  const std::string run_id = "moe-overlap";
  comm::StoreServer server("127.0.0.1", 0, run_id, std::chrono::seconds(30));
  std::vector<std::string> failures(2);
  const model::LocalExperts all = all_experts(7);
  const auto errors = ::test::on_gloo_ranks(
      2, std::chrono::seconds(30),
      [&](comm::Communicator& group) {
        const int r = group.rank();
        std::string& fail = failures[static_cast<size_t>(r)];
        const model::LocalExperts mine = block_of(all, r * kExperts / 2, kExperts / 2);
        const Tokens t = tokens_of(r, 24, 0);
        std::atomic<int64_t> wait_ns{0};
        int calls = 0;
        at::Tensor side;
        model::ExchangeHooks hooks;
        hooks.wait_ns = &wait_ns;
        hooks.while_dispatching = [&] {
          ++calls;
          side = t.flat * 2;  // recorded: its gradient must reach flat
          if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
        };
        const model::RoutedOutput got =
            model::routed_experts(t.flat, t.idx, t.weights, kExperts, mine, &group, false, model::ExpertKernels::kLoop, hooks);
        const double forward_ms = static_cast<double>(wait_ns.load()) / 1e6;
        if (calls != 1) fail += fmt::format(" the work ran {} times;", calls);
        if (r == 0 && forward_ms < 120) fail += fmt::format(" forward wait {:.1f} ms;", forward_ms);
        const model::RoutedOutput plain =
            model::routed_experts(t.flat.detach(), t.idx, t.weights.detach(), kExperts, mine, &group, false, model::ExpertKernels::kLoop);
        if (!at::equal(got.out, plain.out)) fail += " outputs differ;";
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
        const int64_t before = wait_ns.load();
        (got.out * t.upstream + side).sum().backward();
        const double backward_ms = static_cast<double>(wait_ns.load() - before) / 1e6;
        if (r == 0 && backward_ms < 120) fail += fmt::format(" backward wait {:.1f} ms;", backward_ms);
        if (!t.flat.grad().defined()) fail += " no gradient;";
      },
      server, run_id);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<size_t>(r)] == "");
    CHECK(failures[static_cast<size_t>(r)] == "");
  }
}
