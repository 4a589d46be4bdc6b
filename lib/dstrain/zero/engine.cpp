#include "dstrain/zero/engine.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/Event.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <map>
#include <thread>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"
#include "dstrain/device/pinned_memory.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/optim/device_adam.h"
#include "dstrain/optim/fused_step.h"

namespace dstrain::zero {
namespace {

// Stage 3 frees a unit's storage between uses; the parameters stay views of it (their sizes and
// autograd state untouched), and autograd's saved references see the data again once regathered.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (s->nbytes() == bytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

bool storage_present(const at::Tensor& t) { return t.storage().nbytes() > 0; }

// The stream PyTorch orders work on for a GPU (the current one); events on it mark copies done.
c10::Stream current_stream(const at::Device& device) { return c10::impl::getDeviceGuardImpl(device.type())->getStream(device); }

// Blocks on a collective and adds the time spent blocked to `waited_ms`: communication that
// overlap_comm hid behind backward costs (almost) nothing here.
void timed_wait(comm::Work& work, double& waited_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  work.wait();
  waited_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// A reduction in flight.
struct Pending {
  comm::WorkHandle work;
  at::Tensor received;  // stage 1-3: the reduce-scatter's output
  int unit = 0;
};

}  // namespace

// One micro-batch's reduction state, from begin_micro() until its reductions are drained (at
// end_micro for stage 2/3, at step() for stage 0/1): the backward hooks its forward registered
// hold it, so nothing of it lives in the engine between micro-batches.
struct MicroState {
  bool last = true;           // the accumulation boundary: stage 0/1 reduce now
  std::vector<bool> flushed;  // by layer group: its gradients are on their way
  std::vector<Pending> pending;
};

struct Engine::Impl final : model::LayerGate {
  model::CausalLM& model;
  comm::Communicator& comm;
  EngineOptions opt;
  int rank = 0, world = 1;
  int shard_world = 1;  // 1 at stage 0 (nothing is sharded), else world
  at::ScalarType dtype = at::kFloat;
  at::Device device;        // model, gradients, collectives
  at::Device optim_device;  // master weights and Adam states: the device, or the CPU when offloaded
  bool offload = false;
  bool params_on_host = false;  // stage 3 offload_param: param_shard in (pinned) host memory
  // Expert parallelism: E ranks share one layer's routed experts; the world / E ranks with the
  // same block (the expert-data-parallel group) reduce and gather the expert units among them.
  ExpertGroups experts;
  comm::Communicator* step_world = nullptr;  // pipeline parallelism: the step's scalars over every stage
  int ep = 1, ep_rank = 0, edp_world = 1, edp_rank = 0;
  Layout layout;
  std::vector<ShardSegment> segments;
  std::vector<at::Tensor> params;           // the model's parameter handles
  std::vector<at::Tensor> unit_full;        // per unit, model dtype, padded
  std::vector<bool> resident;               // stage 3: kept gathered
  std::vector<comm::WorkHandle> gathering;  // stage 3: an all-gather in flight per unit
  std::vector<std::vector<int>> units_of_group;
  at::Tensor param_shard;                  // stage 3: this rank's chunks of every unit (model dtype)
  at::Tensor master, exp_avg, exp_avg_sq;  // fp32, this rank's shard, on optim_device
  // Offload: this rank's updated chunks in the model dtype on the device (stage 3: param_shard),
  // the pinned staging of the gradient shard (GPU only), and the chunks as segment index ranges.
  at::Tensor published, host_grads;
  std::vector<std::pair<size_t, size_t>> offload_chunks;
  // delayed_update: the CPU update of the last step runs on `updater`, from its gradients copied
  // to host_grads, into master and `staged` (model dtype, host); the next step applies it.
  std::thread updater;
  std::exception_ptr update_error;
  bool update_pending = false;
  at::Tensor staged;
  // Host copies of the optimizer shard for checkpoints when it lives on a GPU.
  mutable at::Tensor mirror[3];
  mutable bool mirrored = false;
  std::vector<at::Tensor> unit_grad;  // stage 0/1: full per-unit gradient buffers (p.grad are views);
                                      // stage 1 reduce-scatters each into its own chunk
  at::Tensor grad_shard;              // stage 2/3: this rank's gradient chunks, model dtype
  // Stage 1/2 on several ranks: this rank's updated chunks in the model dtype, all-gathered from
  // here (stage 3 uses param_shard; stage 0 and one rank write the full buffers directly).
  at::Tensor model_shard;
  std::unique_ptr<optim::FusedStep> fused;  // the norm and the update over the shard's runs
  // Stage 0 with expert parallelism: the runs whose gradients this rank counts in the global norm
  // (the dense ones on rank 0, an expert block's on its first holder); null when all or none are.
  std::unique_ptr<optim::FusedStep> norm_only;
  bool norm_counts_none = false;
  MicroBatch current;                 // the micro-batch whose forward runs (begin_micro .. end_micro)
  std::vector<MicroBatch> undrained;  // begun, with reductions still to wait for, in begin order
  bool grads_fresh = true;            // the shard accumulator holds nothing yet this step
  double waited_ms = 0;               // blocked on gradient reductions since the last step() returned
  double waited_gather_ms = 0;        // blocked on parameter all-gathers since then
  LossScaler scaler;

  Impl(model::CausalLM& m, comm::Communicator& c, const EngineOptions& o, const ExpertGroups& x)
      : model(m), comm(c), opt(o), rank(c.rank()), world(c.world_size()), shard_world(o.stage == 0 ? 1 : c.world_size()),
        dtype(model::scalar_type(o.dtype)), device(o.device), optim_device(o.offload_optimizer ? at::Device(at::kCPU) : o.device),
        offload(o.offload_optimizer), params_on_host(o.offload_param && o.stage == 3 && o.offload_optimizer), experts(checked_groups(c, x)),
        ep(experts.parallel ? experts.parallel->world_size() : 1), ep_rank(experts.parallel ? experts.parallel->rank() : 0),
        edp_world(experts.data ? experts.data->world_size() : world), edp_rank(experts.data ? experts.data->rank() : rank),
        layout(layout_params(m, ep > 1), shard_world, std::max<int64_t>(1, o.reduce_bucket_size), o.stage == 0 ? 1 : edp_world,
               m.num_groups()),
        segments(layout.segments(o.stage == 0 ? 0 : rank, o.stage == 0 ? 0 : edp_rank)),
        scaler(o.dtype == config::Dtype::kFp16 ? o.loss_scaler : LossScalerConfig{1.0}) {
    for (const comm::Communicator* group :
         {static_cast<const comm::Communicator*>(&c), static_cast<const comm::Communicator*>(experts.data)})
      if (group && group->device() != o.device)
        throw Error(ErrorCode::kInternal,
                    fmt::format("the ZeRO engine trains on {} but its {} communicator works on {}", o.device.str(), group->backend(),
                                group->device().str()),
                    "this is a dstrain bug; please report it");
  }

  // Both groups or none; E x (world / E) ranks. Without expert parallelism (E = 1) there are none.
  static ExpertGroups checked_groups(const comm::Communicator& c, const ExpertGroups& x) {
    if (!x.parallel && !x.data) return {};
    if (!x.parallel || !x.data || x.parallel->world_size() * x.data->world_size() != c.world_size())
      throw Error(ErrorCode::kInternal, "the ZeRO engine's expert groups do not partition its ranks",
                  "this is a dstrain bug; please report it");
    if (x.parallel->world_size() == 1) return {};
    return x;
  }

  at::TensorOptions on_device(at::ScalarType t) const { return at::TensorOptions().dtype(t).device(device); }
  // A piece of the parameter shard where the collectives work: itself, or (offload_param) an
  // asynchronous copy up from pinned host memory, ordered before the all-gather on the stream
  // (the communicator holds it until the op is done).
  at::Tensor on_device_copy(const at::Tensor& piece) const { return piece.to(device, /*non_blocking=*/true); }
  // fp32 optimizer state on optim_device. `copied`: offloaded from a GPU, it is the source or
  // target of the per-step copies (master weights, gradient staging), so it is pinned for DMA;
  // the Adam moments never move and stay pageable.
  at::Tensor state_buffer(int64_t n, bool copied = false) const {
    if (copied && offload) return host_buffer(n, at::kFloat, "the offloaded fp32 master weights").zero_();
    return at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(optim_device));
  }
  // A host buffer that copies go to and from a GPU: pinned (exactly its size; ATen's pinned
  // allocator would round it up to a power of two) unless pin_memory is off or there is no GPU.
  at::Tensor host_buffer(int64_t n, at::ScalarType t, const char* what) const {
    if (device.is_cuda() && opt.pin_memory) return device::pinned_empty(n, t, what);
    return at::empty({n}, at::TensorOptions().dtype(t));
  }

  // The parameters where the model placed them (model::ParamPlace); their names are only labels.
  static std::vector<Layout::Param> layout_params(const model::CausalLM& m, bool expert_parallel) {
    const std::vector<model::ParamPlace>& places = m.parameter_places();
    const model::NamedTensors& params = m.parameters();
    if (places.size() != params.size())
      throw Error(ErrorCode::kInternal,
                  fmt::format("the model declares {} parameter places for {} parameters", places.size(), params.size()),
                  "this is a dstrain bug; please report it");
    std::vector<Layout::Param> out;
    for (size_t i = 0; i < params.size(); ++i)
      out.push_back(
          {params[i].name, params[i].tensor.numel(), places[i].group, places[i].decays, expert_parallel && places[i].expert >= 0});
    return out;
  }

  // A unit's group: the world, or (expert units) the expert-data-parallel group.
  comm::Communicator& comm_of(const Unit& u) const { return u.expert ? *experts.data : comm; }
  int place_of(const Unit& u) const { return u.expert ? edp_rank : rank; }
  int ranks_of(const Unit& u) const { return u.expert ? edp_world : world; }
  int64_t my_chunk_start(const Unit& u) const { return (opt.stage == 0 ? 0 : place_of(u)) * u.chunk(); }
  // Stage 0 without expert parallelism: every rank holds every reduced gradient, its own norm is the norm.
  bool replicated_norm() const { return opt.stage == 0 && ep == 1; }
  // The name of this rank's parameter `index` in expert-parallel rank `target`'s block.
  std::string name_on(size_t index, int target) const {
    const int64_t j = model.parameter_places()[index].expert;
    if (j < 0 || target == ep_rank) return model.parameters()[index].name;
    return model.expert_parameter_name(index, j + target * model.local_experts().count);
  }
  int last_group() const { return layout.num_groups() - 1; }

  void build() {
    c10::NoGradGuard no_grad;
    for (const auto& p : model.parameters()) params.push_back(p.tensor);
    const auto& units = layout.units();
    units_of_group.assign(static_cast<size_t>(layout.num_groups()), {});
    master = state_buffer(layout.shard_numel(), /*copied=*/true);
    if (opt.stage >= 2) grad_shard = at::zeros({layout.shard_numel()}, on_device(dtype));
    if (opt.stage == 3)
      param_shard = params_on_host ? host_buffer(layout.shard_numel(), dtype, "the offloaded parameter shard (offload_param)").zero_()
                                   : at::zeros({layout.shard_numel()}, on_device(dtype));
    for (size_t ui = 0; ui < units.size(); ++ui) {
      const Unit& u = units[ui];
      units_of_group[static_cast<size_t>(u.group)].push_back(static_cast<int>(ui));
      at::Tensor full = at::zeros({u.padded}, on_device(dtype));
      for (int i = u.first_param; i < u.first_param + u.num_params; ++i) {
        const ParamSlot& slot = layout.params()[static_cast<size_t>(i)];
        at::Tensor& p = params[static_cast<size_t>(i)];
        full.narrow(0, slot.offset, slot.numel).copy_(p.reshape({-1}));
        p.set_data(full.narrow(0, slot.offset, slot.numel).view(p.sizes()));
      }
      // The fp32 master starts from the model-dtype values, as DeepSpeed's does.
      master.narrow(0, u.shard_offset, u.chunk()).copy_(full.narrow(0, my_chunk_start(u), u.chunk()));
      if (opt.stage == 3) param_shard.narrow(0, u.shard_offset, u.chunk()).copy_(full.narrow(0, my_chunk_start(u), u.chunk()));
      if (opt.stage <= 1) {
        at::Tensor grad = at::zeros({u.padded}, on_device(dtype));
        for (int i = u.first_param; i < u.first_param + u.num_params; ++i) {
          const ParamSlot& slot = layout.params()[static_cast<size_t>(i)];
          at::Tensor& p = params[static_cast<size_t>(i)];
          p.mutable_grad() = grad.narrow(0, slot.offset, slot.numel).view(p.sizes());
        }
        unit_grad.push_back(grad);
      }
      // Stage 3: a unit whose parameters are all small stays resident (persistence threshold).
      bool small = opt.stage == 3;
      for (int i = u.first_param; i < u.first_param + u.num_params; ++i)
        small = small && layout.params()[static_cast<size_t>(i)].numel < opt.persistence_threshold;
      resident.push_back(opt.stage != 3 || small);
      unit_full.push_back(full);
      gathering.emplace_back();
    }
    if (opt.stage == 3)
      for (size_t ui = 0; ui < units.size(); ++ui)
        if (!resident[ui]) free_storage(unit_full[ui]);
    // The Adam moments after the loop, which has freed the model's own parameter memory (offloaded,
    // both live in host memory: the peak is one of them lower).
    exp_avg = state_buffer(layout.shard_numel());
    exp_avg_sq = state_buffer(layout.shard_numel());
    if (offload) {
      published = opt.stage == 3 ? param_shard : master.to(device, dtype, /*non_blocking=*/false, /*copy=*/true);
      // The gradient shard comes down in the model dtype (half the bytes of fp32 in bf16), to pinned
      // memory, where the CPU update reads it (and, on a GPU, writes the updated weights over it).
      if (device.is_cuda() || opt.delayed_update)  // delayed: the gradients must outlive the step
        host_grads = host_buffer(layout.shard_numel(), dtype, "the offloaded gradient staging");
      if (opt.delayed_update) staged = host_buffer(layout.shard_numel(), dtype, "the delayed update's parameters");
      // Whole segments: the CPU kernel sees exactly the calls it would without offload
      // (bit-identical results), and the copy of chunk k+1 overlaps the update of chunk k.
      int64_t elements = 0;
      for (size_t first = 0, i = 0; i < segments.size(); ++i) {
        elements += segments[i].numel;
        if (elements >= std::max<int64_t>(1, opt.offload_chunk) || i + 1 == segments.size()) {
          offload_chunks.emplace_back(first, i + 1);
          first = i + 1;
          elements = 0;
        }
      }
    }
    if (opt.stage != 3 && !offload && world > 1 && opt.stage > 0) model_shard = at::zeros({layout.shard_numel()}, on_device(dtype));
    const std::vector<optim::StepRun> runs = step_runs();
    fused = std::make_unique<optim::FusedStep>(device, dtype, runs);
    if (ep > 1) plan_expert_norm(runs);
  }

  // Expert parallelism: checks the model holds this rank's block of routed experts; (stage 0) the runs it counts in
  // the gradient norm, so that the world's sum counts every gradient once.
  void plan_expert_norm(const std::vector<optim::StepRun>& runs) {
    const model::CausalLM::ExpertBlock block = model.local_experts();
    if (block.count <= 0 || block.first != ep_rank * block.count)
      throw Error(ErrorCode::kInternal,
                  fmt::format("expert-parallel rank {} of {} holds experts [{}, {}): the model was not built for this group", ep_rank, ep,
                              block.first, block.first + block.count),
                  "this is a dstrain bug; please report it");
    if (opt.stage != 0) return;
    std::vector<optim::StepRun> counted;
    for (size_t i = 0; i < segments.size(); ++i)
      if (layout.params()[static_cast<size_t>(segments[i].param)].expert ? edp_rank == 0 : rank == 0) counted.push_back(runs[i]);
    norm_counts_none = counted.empty();
    if (!counted.empty() && counted.size() < runs.size()) norm_only = std::make_unique<optim::FusedStep>(device, dtype, counted);
  }

  // This rank's part of the global squared gradient norm, given the squares of all it holds.
  double counted_sum_squares(double all) const {
    if (replicated_norm()) return step_world && rank == 0 ? all : 0;  // over stages: each stage's once
    if (norm_counts_none) return 0;
    return norm_only ? norm_only->grad_sum_squares() : all;
  }

  // The optimizer's runs: per shard segment, where its gradient is (the reduced full buffer at
  // stage 0/1, the gradient shard at 2/3) and where its updated model-dtype copy goes. Offloaded,
  // only the gradients are read here (for the norm): the update runs on the host.
  std::vector<optim::StepRun> step_runs() {
    std::vector<optim::StepRun> runs;
    const int64_t esz = at::elementSize(dtype);
    for (const ShardSegment& s : segments) {
      const ParamSlot& slot = layout.params()[static_cast<size_t>(s.param)];
      const auto u = static_cast<size_t>(slot.unit);
      const int64_t in_unit = slot.offset + s.param_offset;  // in the unit's full buffer
      optim::StepRun r;
      r.n = s.numel;
      r.decay = s.decay;
      r.grad = opt.stage <= 1 ? static_cast<const char*>(unit_grad[u].data_ptr()) + in_unit * esz
                              : static_cast<const char*>(grad_shard.data_ptr()) + s.shard_offset * esz;
      if (!offload) {
        r.master = master.data_ptr<float>() + s.shard_offset;
        r.exp_avg = exp_avg.data_ptr<float>() + s.shard_offset;
        r.exp_avg_sq = exp_avg_sq.data_ptr<float>() + s.shard_offset;
        const at::Tensor& shard = opt.stage == 3 ? param_shard : model_shard;
        r.param_out = shard.defined() ? static_cast<char*>(shard.data_ptr()) + s.shard_offset * esz
                                      : static_cast<char*>(unit_full[u].data_ptr()) + in_unit * esz;
      }
      runs.push_back(r);
    }
    return runs;
  }

  // The shard range [begin, end) that segments [first, last) span.
  std::pair<int64_t, int64_t> span_of(const std::pair<size_t, size_t>& chunk) const {
    const ShardSegment& a = segments[chunk.first];
    const ShardSegment& b = segments[chunk.second - 1];
    return {a.shard_offset, b.shard_offset + b.numel};
  }

  // Offloaded update: gradient chunks go down to pinned memory in the model dtype (all queued at
  // once, an event after each); the CPU updates chunk k as soon as it has arrived, while later
  // chunks are still in flight, in one pass that widens the gradients in registers (exactly:
  // bit-identical to widening on the device) and writes the updated weights in the model dtype;
  // each updated chunk goes straight back up, in the model dtype.
  void offload_update(const at::Tensor& grads, const optim::AdamHyper& h, float scale) {
    const bool gpu = device.is_cuda();
    std::vector<c10::Event> arrived;
    at::Tensor source = grads;  // model dtype, contiguous, the shard's length
    if (gpu) {
      const c10::Stream stream = current_stream(device);
      for (const auto& chunk : offload_chunks) {
        const auto [begin, end] = span_of(chunk);
        host_grads.narrow(0, begin, end - begin).copy_(grads.narrow(0, begin, end - begin), /*non_blocking=*/true);
        arrived.emplace_back(device.type());
        arrived.back().record(stream);
      }
      source = host_grads;
    }
    // Where the kernel writes the model-dtype weights: `published` itself when that is host memory
    // (CPU training; offload_param, whose shard is gathered up per layer group); on a GPU, over the
    // staged gradients it has just read (element by element, read before written), and uploaded
    // from there by DMA: half the bytes of the fp32 master, no second pass. fp32 uploads the master.
    const at::Tensor out = published.is_cpu() ? published : dtype == at::kFloat ? at::Tensor() : host_grads;
    for (size_t c = 0; c < offload_chunks.size(); ++c) {
      if (gpu) arrived[c].synchronize();
      const auto [begin, end] = update_chunk(c, source, out, h, scale);
      if (!published.is_cpu()) {
        const at::Tensor& up = out.defined() ? out : master;
        published.narrow(0, begin, end - begin).copy_(up.narrow(0, begin, end - begin), /*non_blocking=*/true);
      }
    }
    if (gpu) {  // the host must not touch master again (a checkpoint load) while a copy reads it
      c10::Event uploaded(device.type());
      uploaded.record(current_stream(device));
      uploaded.synchronize();
    }
  }

  // Adam on chunk c of the shard from `source` (the host gradient shard, model dtype), the updated
  // weights also written to `out` (host, model dtype, the shard's length; undefined: nowhere).
  // Returns the chunk's shard range.
  std::pair<int64_t, int64_t> update_chunk(size_t c, const at::Tensor& source, const at::Tensor& out, const optim::AdamHyper& h,
                                           float scale) {
    const int64_t esz = at::elementSize(dtype);
    const char* g = static_cast<const char*>(source.data_ptr());
    char* o = out.defined() ? static_cast<char*>(out.data_ptr()) : nullptr;
    float* p = master.data_ptr<float>();
    float* mm = exp_avg.data_ptr<float>();
    float* vv = exp_avg_sq.data_ptr<float>();
    for (size_t i = offload_chunks[c].first; i < offload_chunks[c].second; ++i) {
      const ShardSegment& s = segments[i];
      optim::AdamHyper seg = h;
      if (!s.decay) seg.weight_decay = 0;
      optim::fused_adam_mixed(p + s.shard_offset, g + s.shard_offset * esz, mm + s.shard_offset, vv + s.shard_offset,
                              o ? o + s.shard_offset * esz : nullptr, optim::adam_elem(dtype), s.numel, seg, scale);
    }
    return span_of(offload_chunks[c]);
  }

  // --- delayed_update (ZeRO-Offload's DPU) ----------------------------------------------------
  // This step's gradients go to host memory, and the CPU update from them starts on `updater`;
  // the model keeps the parameters it has until apply_delayed() at the end of the next step.
  void start_delayed(const at::Tensor& grads, const optim::AdamHyper& h, float scale) {
    host_grads.copy_(grads);  // blocking: the device's gradient buffers are zeroed for the next step
    update_pending = true;
    // On a GPU the main thread keeps launching the next step's kernels meanwhile: the update
    // leaves it a core, or the GPU would wait for launches.
    const int threads = device.is_cuda() ? std::max(1, at::get_num_threads() - 1) : at::get_num_threads();
    updater = std::thread([this, h, scale, threads] {
      try {
        at::set_num_threads(threads);
        for (size_t c = 0; c < offload_chunks.size(); ++c) update_chunk(c, host_grads, staged, h, scale);
      } catch (...) {
        update_error = std::current_exception();
      }
    });
  }
  // Waits for a running update (master and the moments are then complete); rethrows its error.
  void join_delayed() {
    if (updater.joinable()) updater.join();
    if (update_error) std::rethrow_exception(std::exchange(update_error, nullptr));
  }
  // The pending update into the model: `published`, then every rank's full buffers (collective).
  void apply_delayed() {
    join_delayed();
    if (!update_pending) return;
    update_pending = false;
    published.copy_(staged, /*non_blocking=*/false);
    publish_params();
  }

  // Where a test injects an overflow: the first gradient element of this rank's first parameter
  // run (never padding, which the norm does not read); undefined when the rank owns no elements.
  at::Tensor first_grad() {
    if (segments.empty()) return {};
    const ShardSegment& s = segments.front();
    if (opt.stage >= 2) return grad_shard.narrow(0, s.shard_offset, 1);
    const ParamSlot& slot = layout.params()[static_cast<size_t>(s.param)];
    return unit_grad[static_cast<size_t>(slot.unit)].narrow(0, slot.offset + s.param_offset, 1);
  }

  // The gradient shard in the model dtype, contiguous, for the offloaded update: the shard itself
  // at stage 2/3, this rank's chunks of the reduced full buffers at stage 0/1.
  at::Tensor grad_shard_contiguous() const {
    if (opt.stage >= 2) return grad_shard;
    std::vector<at::Tensor> pieces;
    for (size_t u = 0; u < unit_grad.size(); ++u) {
      const Unit& unit = layout.units()[u];
      pieces.push_back(unit_grad[u].narrow(0, my_chunk_start(unit), unit.chunk()));
    }
    return at::cat(pieces);
  }

  // --- stage 3 parameter gathering ------------------------------------------------------------
  void start_gather(int group) {
    for (int ui : units_of_group[static_cast<size_t>(group)]) {
      const auto u = static_cast<size_t>(ui);
      if (resident[u] || gathering[u] || storage_present(unit_full[u])) continue;
      const Unit& unit = layout.units()[u];
      allocate_storage(unit_full[u]);
      gathering[u] = comm_of(unit).all_gather(on_device_copy(param_shard.narrow(0, unit.shard_offset, unit.chunk())), unit_full[u]);
    }
  }
  void finish_gather(int group) {
    start_gather(group);
    for (int ui : units_of_group[static_cast<size_t>(group)]) {
      auto& work = gathering[static_cast<size_t>(ui)];
      if (work) {
        timed_wait(*work, waited_gather_ms);
        work.reset();
      }
    }
  }
  void release(int group) {
    for (int ui : units_of_group[static_cast<size_t>(group)])
      if (!resident[static_cast<size_t>(ui)] && !gathering[static_cast<size_t>(ui)]) free_storage(unit_full[static_cast<size_t>(ui)]);
  }
  int64_t group_numel(int group) const {
    int64_t n = 0;
    for (int ui : units_of_group[static_cast<size_t>(group)]) n += layout.units()[static_cast<size_t>(ui)].padded;
    return n;
  }
  void prefetch(int group) {
    if (opt.overlap_comm && group >= 0 && group < layout.num_groups() && group_numel(group) <= opt.prefetch_bucket_size)
      start_gather(group);
  }

  // --- gradient reduction ---------------------------------------------------------------------
  // Launches the reduction of a group's gradients (stage 0/1: at the boundary only; 2/3: every
  // micro-batch) and, at stage 3, frees its parameters.
  void flush(MicroState& micro, int group) {
    if (micro.flushed[static_cast<size_t>(group)]) return;
    micro.flushed[static_cast<size_t>(group)] = true;
    if (opt.stage <= 1 && !micro.last) return;
    std::vector<Pending>& pending = micro.pending;
    for (int ui : units_of_group[static_cast<size_t>(group)]) {
      const auto u = static_cast<size_t>(ui);
      const Unit& unit = layout.units()[u];
      comm::Communicator& group_comm = comm_of(unit);
      const bool shared = ranks_of(unit) > 1;
      if (opt.stage == 0) {
        if (shared) pending.push_back({group_comm.all_reduce(unit_grad[u]), {}, ui});
        continue;
      }
      if (opt.stage == 1) {  // in place: this rank's chunk of the full buffer receives the sum
        at::Tensor mine = unit_grad[u].narrow(0, my_chunk_start(unit), unit.chunk());
        if (shared) pending.push_back({group_comm.reduce_scatter(unit_grad[u], mine), {}, ui});
        continue;
      }
      at::Tensor input;
      {  // copy the micro-batch's gradients into one contiguous bucket and drop them
        input = at::zeros({unit.padded}, on_device(dtype));
        for (int i = unit.first_param; i < unit.first_param + unit.num_params; ++i) {
          const ParamSlot& slot = layout.params()[static_cast<size_t>(i)];
          at::Tensor& p = params[static_cast<size_t>(i)];
          if (p.grad().defined()) {
            input.narrow(0, slot.offset, slot.numel).copy_(p.grad().reshape({-1}));
            p.mutable_grad().reset();
          }
        }
      }
      at::Tensor received = at::empty({unit.chunk()}, on_device(dtype));
      if (shared) {
        pending.push_back({group_comm.reduce_scatter(input, received), received, ui});
      } else {
        received.copy_(input);
        pending.push_back({nullptr, received, ui});
      }
    }
    if (opt.stage == 3 && group != last_group()) release(group);
  }

  void drain(MicroState& micro) {
    std::vector<Pending>& pending = micro.pending;
    for (Pending& p : pending) {
      if (p.work) timed_wait(*p.work, waited_ms);
      if (!p.received.defined()) continue;
      const Unit& unit = layout.units()[static_cast<size_t>(p.unit)];
      at::Tensor slot = grad_shard.narrow(0, unit.shard_offset, unit.chunk());
      if (grads_fresh)
        slot.copy_(p.received);
      else
        slot.add_(p.received);
    }
    if (!pending.empty() && opt.stage >= 1) grads_fresh = false;
    pending.clear();
  }
  void drain_all() {
    for (const MicroBatch& micro : undrained) drain(*micro);
    undrained.clear();
  }

  // The updated chunks in the model dtype, already written by the step (or write_params) to the
  // full buffers, param_shard or model_shard (offloaded: to `published`), go to everyone's full
  // buffers (all-gathered; stage 3 gathers non-resident units on demand instead).
  void publish_params() {
    const auto& units = layout.units();
    const at::Tensor& source = offload ? published : opt.stage == 3 ? param_shard : model_shard;
    if (!source.defined()) return;  // stage 0 or one rank: written in place
    std::vector<Pending> pending;
    for (size_t u = 0; u < units.size(); ++u) {
      const Unit& unit = units[u];
      const at::Tensor mine = source.narrow(0, unit.shard_offset, unit.chunk());
      if (opt.stage == 3 && !resident[u]) continue;
      if (opt.stage == 0 || ranks_of(unit) == 1) {
        unit_full[u].narrow(0, my_chunk_start(unit), unit.chunk()).copy_(mine);
        continue;
      }
      pending.push_back({comm_of(unit).all_gather(on_device_copy(mine), unit_full[u]), {}, -1});
    }
    for (auto& pend : pending) timed_wait(*pend.work, waited_gather_ms);
  }

  // This rank's runs of the optimizer state (Engine::shard_runs); saved_only: those it writes.
  std::vector<ShardRun> runs(bool saved_only) const;

  // --- model::LayerGate -----------------------------------------------------------------------
  void before_group(int group) override {
    if (opt.step_boundary_comm) return;
    if (opt.stage == 3) {
      finish_gather(group);
      if (c10::GradMode::is_enabled()) prefetch(group + 1);
    }
  }

  at::Tensor after_group(int group, const at::Tensor& output) override {
    if (opt.step_boundary_comm) return output;
    const bool training = c10::GradMode::is_enabled() && output.requires_grad();
    if (!training) {
      if (opt.stage == 3) release(group);
      return output;
    }
    if (opt.stage == 3 && group != last_group()) release(group);
    if (group == last_group()) return output;
    if (!current)
      throw Error(ErrorCode::kInternal, "a training forward ran outside the engine's begin_micro() .. end_micro()",
                  "this is a dstrain bug; please report it");
    // Backward reaches this output only after the next group's backward (and its parameters'
    // gradient accumulation) is complete: reduce that group now, and bring this one back. The
    // hook holds its own micro-batch's state.
    output.register_hook([this, group, micro = current](const at::Tensor&) {
      if (opt.overlap_comm) flush(*micro, group + 1);
      if (opt.stage == 3) {
        finish_gather(group);
        prefetch(group - 1);
      }
    });
    return output;
  }
};

Engine::Engine(model::CausalLM& model, comm::Communicator& comm, const EngineOptions& options, const ExpertGroups& experts,
               comm::Communicator* step_world)
    : impl_(std::make_unique<Impl>(model, comm, options, experts)) {
  impl_->step_world = step_world;
  if (options.step_boundary_comm && options.overlap_comm)
    throw Error(ErrorCode::kInternal, "the ZeRO engine cannot overlap per-micro-batch reductions when it communicates at step boundaries",
                "this is a dstrain bug; please report it");
  if (options.stage < 0 || options.stage > 3) throw Error(ErrorCode::kConfig, fmt::format("zero.stage {} is not 0-3", options.stage));
  if (options.offload_param && options.stage == 3 && !options.offload_optimizer)
    throw Error(ErrorCode::kConfig,
                "zero.offload_param needs zero.offload_optimizer: the parameter shard is updated where the optimizer runs",
                "set zero.offload_optimizer: cpu as well");
  if (options.delayed_update && !options.offload_optimizer)
    throw Error(ErrorCode::kConfig, "zero.delayed_update needs zero.offload_optimizer: it delays the CPU optimizer's update",
                "set zero.offload_optimizer: cpu, or zero.delayed_update: false");
  impl_->build();
  model.set_layer_gate(impl_.get());
}

Engine::~Engine() {
  if (impl_->updater.joinable()) impl_->updater.join();  // an error it had is moot now
  impl_->model.set_layer_gate(nullptr);
}

void Engine::settle() {
  c10::NoGradGuard no_grad;
  if (impl_->opt.delayed_update) impl_->apply_delayed();
}

const Layout& Engine::layout() const { return impl_->layout; }

void Engine::discard_wait_times() { impl_->waited_ms = impl_->waited_gather_ms = 0; }

double Engine::loss_scale() const { return impl_->opt.dtype == config::Dtype::kFp16 ? impl_->scaler.scale() : 1.0; }

MicroBatch Engine::begin_micro(bool last) {
  Impl& m = *impl_;
  auto micro = std::make_shared<MicroState>();
  micro->last = last;
  micro->flushed.assign(static_cast<size_t>(m.layout.num_groups()), false);
  gather_for_forward();  // step_boundary_comm at stage 3: the step's parameters, all at once
  m.current = micro;
  m.undrained.push_back(micro);
  return micro;
}

void Engine::gather_for_forward() {
  Impl& m = *impl_;
  if (!m.opt.step_boundary_comm || m.opt.stage != 3) return;
  for (int g = 0; g < m.layout.num_groups(); ++g) m.start_gather(g);
  for (int g = 0; g < m.layout.num_groups(); ++g) m.finish_gather(g);
}

void Engine::release_after_forward() {
  Impl& m = *impl_;
  if (!m.opt.step_boundary_comm || m.opt.stage != 3) return;
  for (int g = 0; g < m.layout.num_groups(); ++g) m.release(g);
}

void Engine::end_micro(const MicroBatch& micro) {
  Impl& m = *impl_;
  // Whatever backward did not flush yet (everything without overlap_comm), in group order from
  // the last: the same order on every rank.
  for (int g = m.layout.num_groups() - 1; g >= 0; --g) m.flush(*micro, g);
  if (m.opt.stage >= 2) {
    m.drain(*micro);
    m.undrained.erase(std::remove(m.undrained.begin(), m.undrained.end(), micro), m.undrained.end());
  }
  if (m.opt.stage == 3) m.release(m.last_group());
  if (m.current == micro) m.current.reset();
}

StepResult Engine::step(double lr, int64_t applied_step, const std::vector<double>& sums, double beta1, double beta2) {
  Impl& m = *impl_;
  c10::NoGradGuard no_grad;
  m.drain_all();
  StepResult result;
  result.loss_scale = loss_scale();
  if (nonfinite_marked_) {
    if (const at::Tensor first = m.first_grad(); first.defined()) first.fill_(std::numeric_limits<float>::infinity());
    nonfinite_marked_ = false;
  }
  // One small all-reduce: the caller's sums, this rank's part of the squared gradient norm (its
  // shard's; unsharded, nothing: its own norm is the norm) and a count of the ranks whose
  // gradients are not finite, so that no rank updates while another skips (an fp16 overflow).
  // With expert parallelism at stage 0 the parts count each gradient once (plan_expert_norm).
  // The squares are summed in double straight from the model-dtype gradients (one pass, one
  // synchronisation): the norm decides clipping, and fp32 accumulation here would let ranks and
  // the single process drift apart.
  const double local_sq = m.fused->grad_sum_squares();
  std::vector<double> scalars(sums.begin(), sums.end());
  // MoE: the step's tokens per expert ride along, and every rank moves V3's selection bias by
  // the same global load (model -> engine -> model).
  const at::Tensor local_load = m.model.take_expert_load();
  const int64_t load_values = local_load.defined() ? local_load.numel() : 0;
  if (load_values > 0) {
    const at::Tensor flat = local_load.to(at::kCPU, at::kDouble).contiguous().view(-1);
    for (int64_t i = 0; i < load_values; ++i) scalars.push_back(flat.data_ptr<double>()[i]);
  }
  const size_t norm_at = sums.size() + static_cast<size_t>(load_values);
  scalars.push_back(m.counted_sum_squares(local_sq));
  scalars.push_back(std::isfinite(local_sq) ? 0.0 : 1.0);
  // float64 on the wire: the norm of a sharded or pipelined run then equals the single
  // process's (summed in double) but for the order of a few additions; float32 rounded it at
  // 6e-8, which clipping turned into a drift of 1e-5 in 50 steps.
  at::Tensor packed = at::tensor(scalars, at::kDouble).to(m.device);
  comm::Communicator& everyone = m.step_world ? *m.step_world : m.comm;
  if (everyone.world_size() > 1) timed_wait(*everyone.all_reduce(packed), m.waited_ms);
  const at::Tensor reduced = packed.to(at::kCPU, at::kDouble);
  const double* reduced_values = reduced.data_ptr<double>();
  for (size_t i = 0; i < sums.size(); ++i) result.sums.push_back(reduced_values[i]);
  if (load_values > 0) {
    const std::vector<double> load(reduced_values + sums.size(), reduced_values + norm_at);
    result.expert_load = at::tensor(load, at::kDouble).view(local_load.sizes()).to(at::kFloat);
    m.model.update_expert_bias(result.expert_load);
  }
  const double total_sq = !m.step_world && (m.replicated_norm() || m.world == 1) ? local_sq : reduced_values[norm_at];
  const double divisor = (m.opt.average_over_ranks ? m.world : 1) * result.loss_scale;
  result.grad_norm = std::sqrt(total_sq) / divisor;
  result.skipped = reduced_values[norm_at + 1] > 0 || !std::isfinite(total_sq);
  if (m.opt.dtype == config::Dtype::kFp16) m.scaler.update(result.skipped);
  if (m.opt.delayed_update) m.apply_delayed();  // the previous step's update, computed while this step ran
  if (result.skipped) {
    ++skipped_;
  } else {
    double scale = 1.0 / divisor;
    if (m.opt.grad_clip > 0 && result.grad_norm > m.opt.grad_clip) scale *= m.opt.grad_clip / (result.grad_norm + 1e-6);
    optim::AdamHyper h = m.opt.adam;
    h.lr = lr;
    h.step = applied_step;
    if (beta1 >= 0) h.beta1 = beta1;
    if (beta2 >= 0) h.beta2 = beta2;
    if (m.opt.delayed_update && applied_step > m.opt.delayed_update_after) {
      m.start_delayed(m.grad_shard_contiguous(), h, static_cast<float>(scale));  // applied at the end of the next step
    } else {
      if (m.offload)
        m.offload_update(m.grad_shard_contiguous(), h, static_cast<float>(scale));
      else
        m.fused->apply(h, static_cast<float>(scale));  // writes the model-dtype copy too
      m.publish_params();
    }
  }
  // Zero the gradients for the next step.
  for (auto& g : m.unit_grad) g.zero_();
  m.grads_fresh = true;
  result.reduce_wait_ms = m.waited_ms;
  result.gather_wait_ms = m.waited_gather_ms;
  result.comm_wait_ms = m.waited_ms + m.waited_gather_ms;
  m.waited_ms = m.waited_gather_ms = 0;
  return result;
}

MemoryReport Engine::memory() const {
  const Impl& m = *impl_;
  MemoryReport r;
  const int64_t elem = at::elementSize(m.dtype);
  for (size_t u = 0; u < m.unit_full.size(); ++u)
    if (m.resident[u]) r.params += m.layout.units()[u].padded * elem;
  if (m.param_shard.defined()) (m.params_on_host ? r.host_params : r.params) += m.param_shard.numel() * elem;
  for (const auto& g : m.unit_grad) r.grads += g.numel() * elem;
  if (m.grad_shard.defined()) r.grads += m.grad_shard.numel() * elem;
  r.master = m.master.numel() * 4;
  r.optimizer = (m.exp_avg.numel() + m.exp_avg_sq.numel()) * 4;
  const int64_t psi = m.layout.numel(), n = m.world;
  const int stage = m.opt.stage;
  r.formula_params = stage == 3 ? psi * elem / n : psi * elem;
  r.formula_grads = stage >= 2 ? psi * elem / n : psi * elem;
  r.formula_optimizer = stage >= 1 ? 12 * psi / n : 12 * psi;  // fp32 master + exp_avg + exp_avg_sq
  return r;
}

std::string Engine::describe() const {
  const Impl& m = *impl_;
  const MemoryReport r = memory();
  auto mb = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  const std::string where =
      m.offload
          ? fmt::format(
                "offloaded to the CPU (fused Adam, {}; {} chunks{}{}{})", optim::fused_adam_isa(), m.offload_chunks.size(),
                !m.device.is_cuda() ? ""
                : m.opt.pin_memory  ? ", pinned, copies overlapped with the update"
                                    : ", pageable host memory (zero.pin_memory false): copies block",
                m.params_on_host ? fmt::format("; parameter shards in host memory, {:.2f} MiB", mb(r.host_params)) : "",
                m.opt.delayed_update ? "; delayed update: each step's update runs during the next step and is applied at its end" : "")
          : fmt::format("on {} (fused Adam, {})", m.device.str(), optim::fused_adam_kind(m.device));
  const std::string experts = m.ep > 1
                                  ? fmt::format(" (routed experts over {} ranks, {} per rank and layer, each expert data-parallel over {})",
                                                m.ep, m.model.local_experts().count, m.edp_world)
                                  : "";
  return fmt::format(
      "ZeRO stage {} on {} rank(s){}, {} {} units on {}, overlap_comm {}, optimizer {}; per rank: params {:.2f} MiB, "
      "grads {:.2f} MiB, master + Adam states {:.2f} MiB (ZeRO formula {:.2f} / {:.2f} / {:.2f} MiB)",
      m.opt.stage, m.world, experts, m.layout.units().size(), config::name(m.opt.dtype), m.device.str(), m.opt.overlap_comm ? "on" : "off",
      where, mb(r.params), mb(r.grads), mb(r.master + r.optimizer), mb(r.formula_params), mb(r.formula_grads), mb(r.formula_optimizer));
}

// A delayed update still running writes the master weights and moments: it finishes first.
std::vector<Engine::ShardRun> Engine::shard_runs() const {
  impl_->join_delayed();
  return impl_->runs(/*saved_only=*/false);
}

std::vector<Engine::ShardRun> Engine::saved_shard_runs() const {
  impl_->join_delayed();
  return impl_->runs(/*saved_only=*/true);
}

int Engine::shard_writers() const {
  const Impl& m = *impl_;
  // Stage 0: rank 0, and with expert parallelism ranks 0..E-1 (the first of each block's holders).
  return m.opt.stage == 0 ? m.ep : m.world;
}

std::vector<Engine::ShardRun> Engine::Impl::runs(bool saved_only) const {
  const Impl& m = *this;
  std::vector<ShardRun> out;
  // The checkpointer reads and writes host memory: a shard on a GPU goes through host copies,
  // refreshed here and uploaded again by publish_loaded_shard().
  const at::Tensor* states[] = {&m.master, &m.exp_avg, &m.exp_avg_sq};
  if (!m.master.is_cpu()) {
    for (int i = 0; i < 3; ++i) m.mirror[i] = states[i]->to(at::kCPU);
    m.mirrored = true;
    for (int i = 0; i < 3; ++i) states[i] = &m.mirror[i];
  }
  const std::pair<const char*, const at::Tensor*> kinds[] = {{"", states[0]}, {"exp_avg.", states[1]}, {"exp_avg_sq.", states[2]}};
  for (const auto& [prefix, shard] : kinds)
    for (const ShardSegment& s : m.segments) {
      const ParamSlot& slot = m.layout.params()[static_cast<size_t>(s.param)];
      // Stage 0 replicates every run over its group: the group's first rank saves it.
      if (saved_only && m.opt.stage == 0 && (slot.expert ? m.edp_rank : m.rank) != 0) continue;
      out.push_back({prefix + slot.name, s.param_offset, s.numel, shard->data_ptr<float>() + s.shard_offset});
    }
  return out;
}

ckpt::ShardTable Engine::shard_table() const {
  const Layout& layout = impl_->layout;
  ckpt::ShardTable t;
  t.ranks = layout.world_size();
  t.prefixes = {"", "exp_avg.", "exp_avg_sq."};  // shard_runs()' order
  for (const Unit& u : layout.units()) {
    ckpt::ShardTable::Unit unit{u.chunk(), {}};
    for (int i = u.first_param; i < u.first_param + u.num_params; ++i) {
      const ParamSlot& p = layout.params()[static_cast<size_t>(i)];
      unit.params.push_back({p.name, p.offset, p.numel});
    }
    t.units.push_back(std::move(unit));
  }
  return t;
}

bool Engine::has_shard_table() const { return !shard_replicated() && impl_->ep == 1; }

std::vector<Engine::StateTensor> Engine::state_tensors() const {
  const Impl& m = *impl_;
  // The model's parameters in order; with expert parallelism each run of this rank's expert
  // parameters stands for every rank's block, in expert order (the unsharded model's order).
  std::vector<StateTensor> params;
  const model::NamedTensors& mine = m.model.parameters();
  auto is_expert = [&](size_t i) { return m.ep > 1 && m.model.parameter_places()[i].expert >= 0; };
  for (size_t i = 0; i < mine.size();) {
    size_t end = i + 1;
    const bool expert = is_expert(i);
    while (expert && end < mine.size() && is_expert(end)) ++end;
    for (int target = 0; target < (expert ? m.ep : 1); ++target)
      for (size_t k = i; k < end; ++k) params.push_back({m.name_on(k, target), "float32", mine[k].tensor.sizes().vec()});
    i = end;
  }
  std::vector<StateTensor> out;
  for (const std::string prefix : {"", "exp_avg.", "exp_avg_sq."})
    for (const auto& p : params) out.push_back({prefix + p.name, p.dtype, p.shape});
  return out;
}

bool Engine::shard_replicated() const { return impl_->opt.stage == 0 || impl_->world == 1; }

std::vector<double> EngineState::values() const {
  return {scaler.scale, static_cast<double>(scaler.iter), static_cast<double>(scaler.last_overflow_iter),
          static_cast<double>(scaler.hysteresis_left), static_cast<double>(skipped_steps)};
}

EngineState EngineState::from_values(const std::vector<double>& v) {
  if (static_cast<int64_t>(v.size()) != kValues)
    throw Error(ErrorCode::kCheckpoint, fmt::format("engine.state holds {} values, not {}", v.size(), kValues),
                "the checkpoint was written by another dstrain");
  EngineState s;
  s.scaler.scale = v[0];
  s.scaler.iter = static_cast<int64_t>(v[1]);
  s.scaler.last_overflow_iter = static_cast<int64_t>(v[2]);
  s.scaler.hysteresis_left = static_cast<int64_t>(v[3]);
  s.skipped_steps = static_cast<int64_t>(v[4]);
  return s;
}

model::NamedTensors Engine::state() const {
  const std::vector<double> values = EngineState{impl_->scaler.state(), skipped_}.values();
  return {{"engine.state", at::tensor(values, at::kDouble)}};
}

void Engine::load_state(const model::NamedTensors& state) {
  const at::Tensor t = state.at(0).tensor.to(at::kDouble).contiguous();
  const EngineState s = EngineState::from_values(std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel()));
  if (impl_->opt.dtype == config::Dtype::kFp16) impl_->scaler.set_state(s.scaler);
  skipped_ = s.skipped_steps;
}

void Engine::publish_loaded_shard() {
  c10::NoGradGuard no_grad;
  Impl& m = *impl_;
  m.join_delayed();
  m.update_pending = false;  // the loaded state replaces what it computed
  if (m.mirrored) {
    at::Tensor* states[] = {&m.master, &m.exp_avg, &m.exp_avg_sq};
    for (int i = 0; i < 3; ++i) states[i]->copy_(m.mirror[i]), m.mirror[i] = at::Tensor();
    m.mirrored = false;
  }
  if (m.offload)
    m.published.copy_(m.master);
  else
    m.fused->write_params();
  m.publish_params();
}

void Engine::drop_host_copies() {
  for (auto& m : impl_->mirror) m = at::Tensor();
  impl_->mirrored = false;
}

model::NamedTensors Engine::full_state() const {
  model::NamedTensors out;
  for (const StateTensor& t : state_tensors()) out.push_back({t.name, at::zeros(t.shape, at::kFloat)});
  return out;
}

void Engine::gather_full_state(const model::NamedTensors& full) {
  Impl& m = *impl_;
  c10::NoGradGuard no_grad;
  m.join_delayed();
  std::map<std::string, const at::Tensor*> by_name;
  for (const auto& t : full) by_name[t.name] = &t.tensor;
  const std::pair<const char*, const at::Tensor*> kinds[] = {{"", &m.master}, {"exp_avg.", &m.exp_avg}, {"exp_avg_sq.", &m.exp_avg_sq}};
  for (const auto& [prefix, shard] : kinds) {
    for (const Unit& unit : m.layout.units()) {
      at::Tensor whole = at::empty({unit.padded}, m.on_device(at::kFloat));
      const at::Tensor mine = shard->narrow(0, unit.shard_offset, unit.chunk()).to(m.device).contiguous();
      if (m.opt.stage == 0 || m.ranks_of(unit) == 1)
        whole.copy_(mine);
      else
        m.comm_of(unit).all_gather(mine, whole)->wait();
      // An expert unit: every expert-parallel rank's block of the same shape, in rank order.
      std::vector<at::Tensor> blocks{whole};
      if (unit.expert) {
        at::Tensor all = at::empty({m.ep * unit.padded}, m.on_device(at::kFloat));
        m.experts.parallel->all_gather(whole, all)->wait();
        blocks = all.chunk(m.ep);
      }
      if (full.empty()) continue;
      for (size_t target = 0; target < blocks.size(); ++target)
        for (int i = unit.first_param; i < unit.first_param + unit.num_params; ++i) {
          const ParamSlot& slot = m.layout.params()[static_cast<size_t>(i)];
          const std::string name = prefix + (unit.expert ? m.name_on(static_cast<size_t>(i), static_cast<int>(target)) : slot.name);
          by_name.at(name)->view({-1}).copy_(blocks[target].narrow(0, slot.offset, slot.numel));
        }
    }
  }
}

}  // namespace dstrain::zero
