#pragma once
// The routed experts of one DeepSeekMoE layer (dropless, as DeepSeek trains): every token's K
// chosen experts' SwiGLU outputs, weighted by the routing weights and summed. The token copies
// are sorted by expert once, each expert's GEMMs run on its contiguous rows, and the weighted
// rows are scattered back once.
//
// Expert parallelism: with a group of E ranks, each holds N_r / E experts (rank r: the r-th
// block). The sorted rows go to their experts' ranks in one uneven all-to-all (the counts are
// exchanged first), the local experts run on what arrived, and a second all-to-all brings the
// outputs back; both are differentiable (backward is the reverse exchange). Every rank of the
// group must call this for the same layer at the same time, in forward and in backward.
#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dstrain/model/linear.h"

namespace dstrain::comm {
class Communicator;
}

namespace dstrain::model {

// LoRA on one projection of the routed experts (lora.experts): per local expert, A [r, in] and
// B [out, r]; the projection's output gains (x Aᵀ) Bᵀ · scale. Empty: no adapters.
struct ExpertLora {
  std::vector<at::Tensor> a, b;  // the model's parameters themselves (ZeRO repoints their storage; the handles follow)
  double scale = 0;
  bool empty() const { return a.empty(); }
};

// The SwiGLU weights of the experts this rank holds: experts [first, first + gate.size()), and
// their adapters. With a quantized frozen base (lora.base, model/quantized_base.h) the weights are
// shapes only (meta tensors) and *_base computes each expert's x Wᵀ from its own storage.
struct LocalExperts {
  int64_t first = 0;
  std::vector<at::Tensor> gate, up, down;
  ExpertLora gate_lora, up_lora, down_lora;
  std::vector<std::shared_ptr<const LinearBase>> gate_base, up_base, down_base;
  bool quantized() const { return !gate_base.empty(); }
};

struct RoutedOutput {
  at::Tensor out;     // [N, H]: sum over a token's experts of weight * expert(x)
  at::Tensor counts;  // [n_experts] int64: token copies routed to each expert by this rank
};

// How the local experts' GEMMs run. kLoop: one SwiGLU per expert on its rows (CPU, and any
// dtype). kGroupedMm: three grouped GEMMs over all experts (at::_grouped_mm: Hopper's grouped
// kernels for bf16 on sm_90), the experts' weights stacked, no host synchronisation without
// expert parallelism; adapters are two more grouped GEMMs per projection (x Aᵀ, then Bᵀ). kAuto: grouped on a GPU for bf16 when the sizes
// are 16-byte aligned and DSTRAIN_GROUPED_MM is not 0, else the loop.
enum class ExpertKernels { kAuto, kLoop, kGroupedMm };

// Expert parallelism's exchanges: where the time blocked on them goes, and the work that hides
// the token dispatch (DeepSeek-V3 and Megatron overlap it with the shared experts).
struct ExchangeHooks {
  std::atomic<int64_t>* wait_ns = nullptr;  // += ns blocked on the all-to-alls: counts, dispatch, combine, and their backward
  std::function<void()> while_dispatching;  // with an expert group: runs after the dispatch is issued, before it is waited for
};

// flat [N, H]; idx [N, K] chosen experts (global ids); weights [N, K] their weights.
// ep_group: nullptr (every expert here) or the ranks the experts are spread over.
// selective: SwiGLU's activation recomputed in backward.
RoutedOutput routed_experts(const at::Tensor& flat, const at::Tensor& idx, const at::Tensor& weights, int64_t n_experts,
                            const LocalExperts& experts, comm::Communicator* ep_group, bool selective,
                            ExpertKernels kernels = ExpertKernels::kAuto, const ExchangeHooks& hooks = {});

// Whether kAuto picks the grouped GEMMs for rows like `rows` and these experts.
bool grouped_mm_fits(const at::Tensor& rows, const LocalExperts& experts);

}  // namespace dstrain::model
