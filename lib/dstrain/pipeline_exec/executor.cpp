#include "dstrain/pipeline_exec/executor.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <tuple>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/core/progress.h"
#include "dstrain/pipeline/transfers.h"

namespace dstrain::pipeline_exec {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

using Key = std::tuple<int, int, int>;  // (what: 0 activations / 1 gradient, stage it is for, micro-batch)

// What one stage micro-batch keeps between its forward and its last backward pass.
struct InFlight {
  at::Tensor input;             // the received activations, a leaf (undefined on the first stage)
  at::Tensor output;            // the stage's output (last stage: the loss), with its graph, until sent
  torch::autograd::Edge sent;   // once sent: the node that made the output (its graph without its values)
  at::Tensor side_loss;         // StageOutput::side_loss (undefined: none)
  at::Tensor output_grad;       // the gradient of `output`, once received (kept from I for W)
  bool weight_pending = false;  // I ran, W has not
};

// What the heartbeat says of an action: its stage and micro-batch; a transfer's ends.
progress::PipelinePlace place_of(const pipeline::Action& a) {
  progress::PipelinePlace p;
  p.stage = a.stage, p.micro_batch = a.micro_batch;
  if (pipeline::is_send(a.op) || pipeline::is_receive(a.op)) {
    const bool forward = a.op == pipeline::Op::kSendForward || a.op == pipeline::Op::kRecvForward;
    p.carries = forward ? progress::Carries::kActivations : progress::Carries::kGradient;
    const pipeline::Action send = pipeline::is_send(a.op) ? a : pipeline::matching_send(a);
    p.from_stage = send.stage, p.to_stage = forward ? send.stage + 1 : send.stage - 1;
  }
  return p;
}

const char* verb(pipeline::Op op) {
  switch (op) {
    case pipeline::Op::kForward:
      return "forward";
    case pipeline::Op::kBackward:
      return "backward";
    case pipeline::Op::kBackwardInput:
      return "input-gradient backward";
    case pipeline::Op::kBackwardWeight:
      return "weight-gradient backward";
    case pipeline::Op::kSendForward:
    case pipeline::Op::kSendBackward:
      return "send";
    case pipeline::Op::kRecvForward:
    case pipeline::Op::kRecvBackward:
      return "receive";
  }
  return "action";
}

torch::autograd::Edge edge_of(const at::Tensor& t) { return torch::autograd::impl::gradient_edge(t); }

// Backward from graph nodes rather than tensors (what torch::autograd::backward and grad do
// underneath), so that a sent output need not be held: `grads` seed `roots`; with `accumulate`
// the gradients of `inputs` add into their .grad, else they are returned (undefined: unused).
std::vector<at::Tensor> run_backward(const std::vector<torch::autograd::Edge>& roots, const std::vector<at::Tensor>& grads,
                                     const std::vector<at::Tensor>& inputs, bool accumulate, bool keep_graph) {
  torch::autograd::edge_list outputs;
  for (const at::Tensor& t : inputs) outputs.push_back(edge_of(t));
  return torch::autograd::Engine::get_default_engine().execute(roots, grads, keep_graph, /*create_graph=*/false, accumulate, outputs);
}

// A posted send, until it completes.
struct Posted {
  comm::WorkHandle work;
  at::Tensor tensor;  // what it reads
  progress::PipelinePlace place;
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
  std::vector<Posted> sends;
  std::vector<double> losses;
  StepTimes times;

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

  void post(const at::Tensor& t, const pipeline::Action& a) {
    Posted p;
    p.tensor = t.contiguous();
    p.work = group.send(p.tensor, a.peer);
    p.place = place_of(a);
    sends.push_back(std::move(p));
  }
  // Completed sends give their buffers back now (NCCL tells; Gloo only once waited for).
  void release_sent() {
    auto done = std::remove_if(sends.begin(), sends.end(), [](Posted& p) {
      if (!p.work->done()) return false;
      p.work->wait();
      return true;
    });
    sends.erase(done, sends.end());
  }
  void wait_sends() {
    for (Posted& p : sends) {
      progress::set_pipeline_place(p.place);
      p.work->wait();
    }
    sends.clear();
  }
  // The next stage has the values and backward needs only the node that made them: the output
  // goes (its memory once the send is done with it, unless the stage's graph saved it).
  void release_output(InFlight& u) {
    u.sent = edge_of(u.output);
    u.output = at::Tensor();
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
    if (last(s) && !u.output.requires_grad()) in_flight.erase({s, mb});  // forwards only: nothing to keep
  }
  at::Tensor gradient_of_output(int s, int mb) {
    InFlight& u = unit(s, mb);
    if (!u.output_grad.defined()) u.output_grad = last(s) ? at::ones_like(u.output) : take({1, s, mb});
    return u.output_grad;
  }
  // B: both gradients in one pass; I: the input's only, the graph kept for W; W: the weights'.
  void backward(int s, int mb, pipeline::Op op) {
    InFlight& u = unit(s, mb);
    std::vector<torch::autograd::Edge> roots{u.output.defined() ? edge_of(u.output) : u.sent};
    std::vector<at::Tensor> grads{gradient_of_output(s, mb)};
    if (u.side_loss.defined()) roots.push_back(edge_of(u.side_loss)), grads.push_back(at::ones_like(u.side_loss));
    if (op == pipeline::Op::kBackwardInput) {
      if (u.input.defined())
        u.input.mutable_grad() = run_backward(roots, grads, {u.input}, /*accumulate=*/false, /*keep_graph=*/true).at(0);
      u.weight_pending = true;
      return;
    }
    std::vector<at::Tensor> inputs = stage(s).parameters();
    if (op == pipeline::Op::kBackward && u.input.defined()) inputs.push_back(u.input);
    run_backward(roots, grads, inputs, /*accumulate=*/true, /*keep_graph=*/false);
    if (op == pipeline::Op::kBackwardWeight || !u.input.defined()) in_flight.erase({s, mb});
  }
  void send_output(const pipeline::Action& a) {
    InFlight& u = unit(a.stage, a.micro_batch);
    post(u.output.detach(), a);
    if (!u.output.requires_grad()) return static_cast<void>(in_flight.erase({a.stage, a.micro_batch}));  // forwards only
    release_output(u);
  }
  void send_gradient(const pipeline::Action& a) {
    InFlight& u = unit(a.stage, a.micro_batch);
    post(u.input.grad(), a);
    if (!u.weight_pending) in_flight.erase({a.stage, a.micro_batch});  // B done: nothing of it is needed any more
  }

  void run(const pipeline::Action& a) {
    release_sent();
    progress::set_pipeline_place(place_of(a));
    const bool compute = pipeline::is_compute(a.op);
    if (compute) progress::enter(a.op == pipeline::Op::kForward ? progress::Phase::kForward : progress::Phase::kBackward);
    const auto t0 = Clock::now();
    try {
      dispatch(a);
    } catch (const Error& e) {  // name the stage; LibTorch's errors (out of memory) keep their type, the heartbeat's place says where
      throw Error(e.code(), fmt::format("pipeline stage {}, {} of micro-batch {}: {}", a.stage, verb(a.op), a.micro_batch, e.what()),
                  e.hint());
    }
    if (compute) times.compute_ms += ms_since(t0);
  }
  void dispatch(const pipeline::Action& a) {
    switch (a.op) {
      case pipeline::Op::kForward:
        return forward(a.stage, a.micro_batch);
      case pipeline::Op::kBackward:
      case pipeline::Op::kBackwardInput:
      case pipeline::Op::kBackwardWeight:
        return backward(a.stage, a.micro_batch, a.op);
      case pipeline::Op::kSendForward:
        return send_output(a);
      case pipeline::Op::kSendBackward:
        return send_gradient(a);
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
  const auto t0 = Clock::now();
  m.losses.assign(static_cast<size_t>(m.schedule.micro_batches), 0.0);
  m.times = StepTimes{};
  for (const pipeline::Action& a : m.schedule.actions[static_cast<size_t>(m.rank)]) m.run(a);
  m.wait_sends();
  progress::set_pipeline_place({});
  m.times.schedule_ms = ms_since(t0);
  if (!m.received.empty() || !m.in_flight.empty())
    throw Error(ErrorCode::kInternal, fmt::format("pipeline rank {} ended the step with {} received and {} stage micro-batches unused",
                                                  m.rank, m.received.size(), m.in_flight.size()));
  const bool holds_last = m.stages.count(m.schedule.stages() - 1) > 0;
  return holds_last ? m.losses : std::vector<double>{};
}

const StepTimes& Executor::times() const { return impl_->times; }

}  // namespace dstrain::pipeline_exec
