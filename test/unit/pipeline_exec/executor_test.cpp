// The schedule executor (issue 39): every schedule run by threads as pipeline ranks, activations
// and gradients over the communicator's send/recv, gives the losses and the summed gradients of
// the same stages chained in one process (float64: the only difference is the order in which
// micro-batches' gradients add up). Zero-bubble's weight-gradient pass runs apart from the input
// gradient's. Middle stages add a side loss (an MoE balance loss's place) that backward starts from too.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <mutex>

#include "catch_torch.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/pipeline_exec/executor.h"

using namespace dstrain;

namespace {

constexpr int64_t kRows = 3, kWidth = 5;

// Stage s: tanh(x W_s + b_s); the last stage's loss is the squared distance to a target, / m.
struct Toy {
  int stages, micro_batches;
  std::vector<at::Tensor> weights, biases, inputs, targets;
  Toy(int stage_count, int micro_batch_count) : stages(stage_count), micro_batches(micro_batch_count) {
    at::manual_seed(7);
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    for (int s = 0; s < stages; ++s) weights.push_back(at::randn({kWidth, kWidth}, f64) * 0.5), biases.push_back(at::randn({kWidth}, f64));
    for (int i = 0; i < micro_batches; ++i)
      inputs.push_back(at::randn({kRows, kWidth}, f64)), targets.push_back(at::randn({kRows, kWidth}, f64));
  }
  at::Tensor stage(int s, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) const { return at::tanh(x.mm(w) + b); }
  at::Tensor loss(int mb, const at::Tensor& out) const { return (out - targets[mb]).pow(2).sum() / micro_batches; }
  // A middle stage's side loss (as an MoE layer's balance loss): its gradient reaches this stage's
  // parameters and, through the stage's input, the earlier stages'.
  at::Tensor side(int s, const at::Tensor& out) const { return out.pow(2).mean() * (0.01 * (s + 1)) / micro_batches; }
  bool has_side(int s) const { return s > 0 && s < stages - 1; }
};

class ToyStage : public pipeline_exec::StageModule {
 public:
  ToyStage(const Toy& toy, int s)
      : toy_(toy), s_(s), w_(toy.weights[s].clone().requires_grad_(true)), b_(toy.biases[s].clone().requires_grad_(true)) {}
  pipeline_exec::StageOutput forward(int mb, const at::Tensor& input) override {
    const at::Tensor out = toy_.stage(s_, s_ == 0 ? toy_.inputs[mb] : input, w_, b_);
    if (s_ == toy_.stages - 1) return {toy_.loss(mb, out), {}};
    // Every earlier output of this stage has been sent by now (a send follows its forward): the
    // executor holds none of them, and without a side loss (which saves its input) nothing does.
    for (const auto& earlier : sent_) held_after_send += earlier.expired() ? 0 : 1;
    sent_.emplace_back(out.getIntrusivePtr());
    return {out, toy_.has_side(s_) ? toy_.side(s_, out) : at::Tensor()};
  }
  std::vector<at::Tensor> parameters() const override { return {w_, b_}; }
  int stage() const { return s_; }
  int held_after_send = 0;

 private:
  const Toy& toy_;
  int s_;
  at::Tensor w_, b_;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> sent_;
};

pipeline_exec::Activation toy_activation() {
  pipeline_exec::Activation a;
  a.sizes = {kRows, kWidth};
  a.dtype = at::kDouble;
  return a;
}

struct Reference {
  std::vector<double> losses;
  std::vector<at::Tensor> grads;  // per stage: weight, bias
};

Reference chained(const Toy& toy) {
  std::vector<at::Tensor> params;
  for (int s = 0; s < toy.stages; ++s)
    params.push_back(toy.weights[s].clone().requires_grad_(true)), params.push_back(toy.biases[s].clone().requires_grad_(true));
  Reference ref;
  for (int mb = 0; mb < toy.micro_batches; ++mb) {
    at::Tensor x = toy.inputs[mb];
    at::Tensor sides = at::zeros({}, x.options());
    for (int s = 0; s < toy.stages; ++s) {
      x = toy.stage(s, x, params[2 * s], params[2 * s + 1]);
      if (toy.has_side(s) && s < toy.stages - 1) sides = sides + toy.side(s, x);
    }
    const at::Tensor loss = toy.loss(mb, x);
    ref.losses.push_back(loss.item<double>());
    (loss + sides).backward();
  }
  for (const auto& p : params) ref.grads.push_back(p.grad().clone());
  return ref;
}

// A pipeline rank's stages of the toy: r, r + ranks, ...
struct RankStages {
  std::vector<std::unique_ptr<ToyStage>> owned;
  std::map<int, pipeline_exec::StageModule*> modules;
  RankStages(const Toy& toy, int rank, int ranks) {
    for (int s = rank; s < toy.stages; s += ranks) {
      owned.push_back(std::make_unique<ToyStage>(toy, s));
      modules[s] = owned.back().get();
    }
  }
};

void check_schedule(pipeline::ScheduleKind kind, int ranks, int v, int m) {
  const pipeline::Schedule schedule = pipeline::build_schedule(kind, ranks, v, m);
  const Toy toy(schedule.stages(), m);
  const Reference ref = chained(toy);
  std::mutex mutex;
  std::vector<at::Tensor> grads(ref.grads.size());
  std::vector<double> losses;
  comm::run_on_threads(ranks, [&](comm::Communicator& group) {
    const RankStages mine(toy, group.rank(), ranks);
    const auto& stages = mine.modules;
    pipeline_exec::Executor executor(schedule, group, stages, toy_activation());
    const std::vector<double> step_losses = executor.run_step();
    for (const auto& stage : mine.owned)
      if (!toy.has_side(stage->stage())) CHECK(stage->held_after_send == 0);
    CHECK(executor.times().compute_ms > 0);
    CHECK(executor.times().schedule_ms >= executor.times().compute_ms);
    std::lock_guard<std::mutex> lock(mutex);
    if (!step_losses.empty()) losses = step_losses;
    for (const auto& [s, stage] : stages) {
      const auto params = stage->parameters();
      grads[2 * s] = params[0].grad().clone(), grads[2 * s + 1] = params[1].grad().clone();
    }
  });
  INFO(pipeline::schedule_name(kind) << " P=" << ranks << " v=" << v << " m=" << m);
  CHECK(losses == ref.losses);  // each micro-batch's forward is the same arithmetic
  for (size_t i = 0; i < grads.size(); ++i) {
    REQUIRE(grads[i].defined());
    CHECK(at::allclose(grads[i], ref.grads[i], 1e-13, 1e-15));
  }
}

}  // namespace

TEST_CASE("every schedule executed over send/recv matches the stages chained in one process", "[pipeline_exec]") {
  for (int p = 2; p <= 4; ++p)
    for (int m : {p, p + 1, 2 * p + 1}) {
      check_schedule(pipeline::ScheduleKind::kGpipe, p, 1, m);
      check_schedule(pipeline::ScheduleKind::k1F1B, p, 1, m);
      check_schedule(pipeline::ScheduleKind::kInterleaved1F1B, p, 2, m);
      check_schedule(pipeline::ScheduleKind::kZbH1, p, 1, m);
    }
}

TEST_CASE("forwards only (evaluation) give the chained forwards' losses and keep nothing", "[pipeline_exec]") {
  for (int p = 2; p <= 4; ++p)
    for (int v : {1, 2})
      for (int m : {1, p, 2 * p + 1}) {
        const pipeline::Schedule schedule = pipeline::forward_only_schedule(p, v, m);
        const Toy toy(schedule.stages(), m);
        const Reference ref = chained(toy);
        std::vector<double> losses;
        std::mutex mutex;
        comm::run_on_threads(p, [&](comm::Communicator& group) {
          c10::NoGradGuard no_grad;
          const RankStages mine(toy, group.rank(), p);
          pipeline_exec::Executor executor(schedule, group, mine.modules, toy_activation());
          const std::vector<double> step_losses = executor.run_step();  // throws if anything is left over
          std::lock_guard<std::mutex> lock(mutex);
          if (!step_losses.empty()) losses = step_losses;
        });
        INFO("forwards only P=" << p << " v=" << v << " m=" << m);
        CHECK(losses == ref.losses);
      }
}

TEST_CASE("a rank that runs a stage it does not hold names itself", "[pipeline_exec]") {
  const pipeline::Schedule schedule = pipeline::build_schedule(pipeline::ScheduleKind::k1F1B, 2, 1, 2);
  const Toy toy(2, 2);
  ToyStage first(toy, 0);
  comm::run_on_threads(1, [&](comm::Communicator& group) {
    CHECK_THROWS_WITH(pipeline_exec::Executor(schedule, group, {{0, &first}}, toy_activation()),
                      Catch::Contains("a schedule for 2 pipeline ranks run by a group of 1"));
  });
}

TEST_CASE("an error in a stage names the stage, the pass and the micro-batch", "[pipeline_exec]") {
  class Failing : public ToyStage {
   public:
    using ToyStage::ToyStage;
    pipeline_exec::StageOutput forward(int mb, const at::Tensor& input) override {
      if (mb == 1) throw Error(ErrorCode::kData, "row 7 has no tokens", "check the data");
      return ToyStage::forward(mb, input);
    }
  };
  const pipeline::Schedule schedule = pipeline::build_schedule(pipeline::ScheduleKind::k1F1B, 2, 1, 2);
  const Toy toy(2, 2);
  auto run = [&] {
    comm::run_on_threads(2, [&](comm::Communicator& group) {
      ToyStage first(toy, 0);
      Failing second(toy, 1);
      std::map<int, pipeline_exec::StageModule*> stages;
      if (group.rank() == 0)
        stages[0] = &first;
      else
        stages[1] = &second;
      pipeline_exec::Executor(schedule, group, stages, toy_activation()).run_step();
    });
  };
  try {
    run();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kData);
    CHECK(std::string(e.what()) == "pipeline stage 1, forward of micro-batch 1: row 7 has no tokens");
    CHECK(e.hint() == "check the data");
  }
}
