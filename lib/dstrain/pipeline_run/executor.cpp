#include "dstrain/pipeline_run/executor.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <tuple>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"

namespace dstrain::pipeline_run {

namespace {

using Key = std::tuple<int, int, int>;  // (what: 0 activations / 1 gradient, stage it is for, micro-batch)

// What one stage micro-batch keeps between its forward and its last backward pass.
struct InFlight {
  at::Tensor input;             // the received activations, a leaf (undefined on the first stage)
  at::Tensor output;            // the stage's output (last stage: the loss), with its graph
  at::Tensor side_loss;         // StageOutput::side_loss (undefined: none)
  at::Tensor output_grad;       // the gradient of `output`, once received (kept from I for W)
  bool weight_pending = false;  // I ran, W has not
};

}  // namespace

struct Executor::Impl {
  pipeline::Schedule schedule;
  comm::Communicator& group;
  std::map<int, StageModule*> stages;
  Activation activation;
  int rank;

  std::map<Key, at::Tensor> received;  // by what they carry, until the compute takes them
  std::map<std::pair<int, int>, InFlight> in_flight;
  std::vector<comm::WorkHandle> sends;
  std::vector<at::Tensor> sending;  // the tensors posted sends read, alive until they complete
  std::vector<double> losses;

  Impl(pipeline::Schedule s, comm::Communicator& g, std::map<int, StageModule*> st, Activation a)
      : schedule(std::move(s)), group(g), stages(std::move(st)), activation(std::move(a)), rank(g.rank()) {}

  StageModule& stage(int s) {
    const auto it = stages.find(s);
    if (it == stages.end())
      throw Error(ErrorCode::kInternal, fmt::format("pipeline rank {} runs stage {}, which it does not hold", rank, s));
    return *it->second;
  }
  bool last(int s) const { return s == schedule.stages() - 1; }
  InFlight& unit(int s, int mb) { return in_flight[{s, mb}]; }
  at::Tensor take(const Key& key) {
    const auto it = received.find(key);
    if (it == received.end())
      throw Error(ErrorCode::kInternal, fmt::format("pipeline rank {}: stage {} micro-batch {} has no received {}", rank, std::get<1>(key),
                                                    std::get<2>(key), std::get<0>(key) ? "gradient" : "activations"));
    at::Tensor t = it->second;
    received.erase(it);
    return t;
  }

  void post(const at::Tensor& t, int peer) {
    sending.push_back(t.contiguous());
    sends.push_back(group.send(sending.back(), peer));
  }
  void receive(int what, int stage_for, int mb, int peer) {
    at::Tensor t = at::empty(activation.sizes_of ? activation.sizes_of(mb) : activation.sizes,
                             at::TensorOptions().dtype(activation.dtype).device(activation.device));
    group.recv(t, peer)->wait();
    received[{what, stage_for, mb}] = t;
  }

  void forward(int s, int mb) {
    InFlight& u = unit(s, mb);
    if (s > 0) u.input = take({0, s, mb}).requires_grad_(true);
    StageOutput out = stage(s).forward(mb, u.input);
    u.output = std::move(out.output);
    if (out.side_loss.defined() && out.side_loss.requires_grad()) u.side_loss = std::move(out.side_loss);
    if (last(s)) losses[static_cast<size_t>(mb)] = u.output.item<double>();
  }
  at::Tensor gradient_of_output(int s, int mb) {
    InFlight& u = unit(s, mb);
    if (!u.output_grad.defined()) u.output_grad = last(s) ? at::ones_like(u.output) : take({1, s, mb});
    return u.output_grad;
  }
  // B: both gradients in one pass; I: the input's only, the graph kept for W; W: the weights'.
  void backward(int s, int mb, pipeline::Op op) {
    InFlight& u = unit(s, mb);
    std::vector<at::Tensor> roots{u.output}, grads{gradient_of_output(s, mb)};
    if (u.side_loss.defined()) roots.push_back(u.side_loss), grads.push_back(at::ones_like(u.side_loss));
    if (op == pipeline::Op::kBackwardInput) {
      if (u.input.defined())
        u.input.mutable_grad() = torch::autograd::grad(roots, {u.input}, grads, /*retain_graph=*/true, false, /*allow_unused=*/true).at(0);
      u.weight_pending = true;
      return;
    }
    std::vector<at::Tensor> inputs = stage(s).parameters();
    if (op == pipeline::Op::kBackward && u.input.defined()) inputs.push_back(u.input);
    torch::autograd::backward(roots, grads, /*retain_graph=*/false, /*create_graph=*/false, inputs);
    if (op == pipeline::Op::kBackwardWeight || !u.input.defined()) in_flight.erase({s, mb});
  }
  void send_gradient(int s, int mb, int peer) {
    InFlight& u = unit(s, mb);
    post(u.input.grad(), peer);
    if (!u.weight_pending) in_flight.erase({s, mb});  // B done: nothing of it is needed any more
  }

  void run(const pipeline::Action& a) {
    switch (a.op) {
      case pipeline::Op::kForward:
        return forward(a.stage, a.micro_batch);
      case pipeline::Op::kBackward:
      case pipeline::Op::kBackwardInput:
      case pipeline::Op::kBackwardWeight:
        return backward(a.stage, a.micro_batch, a.op);
      case pipeline::Op::kSendForward:
        return post(unit(a.stage, a.micro_batch).output.detach(), a.peer);
      case pipeline::Op::kSendBackward:
        return send_gradient(a.stage, a.micro_batch, a.peer);
      case pipeline::Op::kRecvForward:
        return receive(0, a.stage, a.micro_batch, a.peer);
      case pipeline::Op::kRecvBackward:
        return receive(1, a.stage, a.micro_batch, a.peer);
    }
  }
};

Executor::Executor(pipeline::Schedule schedule, comm::Communicator& group, std::map<int, StageModule*> stages, Activation activation)
    : impl_(std::make_unique<Impl>(std::move(schedule), group, std::move(stages), std::move(activation))) {
  if (impl_->schedule.ranks != group.world_size())
    throw Error(ErrorCode::kInternal,
                fmt::format("a schedule for {} pipeline ranks run by a group of {}", impl_->schedule.ranks, group.world_size()));
}

Executor::~Executor() = default;

std::vector<double> Executor::run_step() {
  Impl& m = *impl_;
  m.losses.assign(static_cast<size_t>(m.schedule.micro_batches), 0.0);
  for (const pipeline::Action& a : m.schedule.actions[static_cast<size_t>(m.rank)]) m.run(a);
  for (auto& work : m.sends) work->wait();
  m.sends.clear(), m.sending.clear();
  if (!m.received.empty() || !m.in_flight.empty())
    throw Error(ErrorCode::kInternal, fmt::format("pipeline rank {} ended the step with {} received and {} stage micro-batches unused",
                                                  m.rank, m.received.size(), m.in_flight.size()));
  const bool holds_last = m.stages.count(m.schedule.stages() - 1) > 0;
  return holds_last ? m.losses : std::vector<double>{};
}

}  // namespace dstrain::pipeline_run
