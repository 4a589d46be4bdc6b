#include "dstrain/zero/engine_impl.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/Event.h>

#include <algorithm>
#include <exception>
#include <thread>

namespace dstrain::zero {

std::pair<int64_t, int64_t> Engine::Impl::span_of(const std::pair<size_t, size_t>& chunk) const {
  const ShardSegment& a = segments[chunk.first];
  const ShardSegment& b = segments[chunk.second - 1];
  return {a.shard_offset, b.shard_offset + b.numel};
}

void Engine::Impl::offload_update(const at::Tensor& grads, const optim::AdamHyper& h, float scale) {
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

std::pair<int64_t, int64_t> Engine::Impl::update_chunk(size_t c, const at::Tensor& source, const at::Tensor& out, const optim::AdamHyper& h,
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

void Engine::Impl::start_delayed(const at::Tensor& grads, const optim::AdamHyper& h, float scale) {
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

void Engine::Impl::join_delayed() {
  if (updater.joinable()) updater.join();
  if (update_error) std::rethrow_exception(std::exchange(update_error, nullptr));
}

void Engine::Impl::apply_delayed() {
  join_delayed();
  if (!update_pending) return;
  update_pending = false;
  published.copy_(staged, /*non_blocking=*/false);
  publish_params();
}

at::Tensor Engine::Impl::first_grad() {
  if (segments.empty()) return {};
  const ShardSegment& s = segments.front();
  if (opt.stage >= 2) return grad_shard.narrow(0, s.shard_offset, 1);
  const ParamSlot& slot = layout.params()[static_cast<size_t>(s.param)];
  return unit_grad[static_cast<size_t>(slot.unit)].narrow(0, slot.offset + s.param_offset, 1);
}

at::Tensor Engine::Impl::grad_shard_contiguous() const {
  if (opt.stage >= 2) return grad_shard;
  std::vector<at::Tensor> pieces;
  for (size_t u = 0; u < unit_grad.size(); ++u) {
    const Unit& unit = layout.units()[u];
    if (!unit.trains) continue;  // frozen: no gradient
    pieces.push_back(unit_grad[u].narrow(0, my_chunk_start(unit), unit.chunk()));
  }
  return at::cat(pieces);
}

}  // namespace dstrain::zero
