#pragma once
// A tiny dense model trained by the ZeRO engine on the in-process thread group: the reference
// runs of the engine and checkpointer tests. Batches are a function of the step alone, and each
// rank reads its share of the global batch as the trainer does, so every world size and stage
// computes the same global gradient. The micro-batch loop is the trainer's own
// (train::SequentialRunner): these tests check production's forward, loss, scaling, backward
// and engine calls, not a copy of them.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"
#include "dstrain/zero/engine.h"

namespace dstrain::comm {
class Communicator;
}
namespace dstrain::model {
class CausalLM;
}

namespace dstrain::test {

struct EngineSpec {
  int world = 1;
  int stage = 0;
  config::Dtype dtype = config::Dtype::kFp32;
  bool overlap_comm = false;
  int64_t bucket = 500000000;
  bool offload = false;
  bool offload_param = false;  // stage 3, with offload
  int64_t offload_chunk = int64_t{16} << 20;
  int64_t steps = 4;
  int64_t overflow_at_step = -1;  // 1-based step whose gradients get an inf
  int overflow_rank = -1;         // ... on this rank only (-1: every rank)
  config::Recompute recompute = config::Recompute::kNone;
  // > 0: the tiny V3-style MoE model (tiny_moe_config) instead of the dense one, its routed
  // experts spread over this many ranks (expert parallelism; 1: every rank holds every expert).
  int expert_parallel = 0;
  bool delayed_update = false;  // with offload
  int64_t delayed_after = 0;    // updates applied without delay first
  double lr = 1e-2;
  std::vector<std::string> freeze;  // train.freeze: these parameters do not train
  int64_t lora_rank = 0;            // > 0: LoRA adapters (rank, alpha 2 x rank) on every projection, the rest frozen
  bool lora_experts = false;        // ... and on the routed experts' (lora.experts)
};

struct EngineRun {  // rank 0's view
  std::vector<double> losses, grad_norms, scales;
  std::vector<bool> skipped;
  int64_t skipped_steps = 0;
  at::Tensor master, exp_avg_sq;   // every parameter's (exp_avg_sq: every trained one's), flattened and concatenated
  std::vector<std::string> names;  // the parameters in `master`'s order, with their element counts
  std::vector<int64_t> numels;
  at::Tensor initial;  // rank 0's model parameters before training, in the same order (all of them when one rank holds all)
  zero::MemoryReport memory;
  int64_t parameters = 0;
};

config::ModelConfig tiny_model_config();
// MLA + DeepSeekMoE (tiny_v3): 3 layers (2 MoE), 4 routed experts, sigmoid routing with the selection bias.
config::ModelConfig tiny_moe_config();
std::unique_ptr<model::CausalLM> make_tiny_model(config::Dtype dtype);
zero::EngineOptions engine_options(const EngineSpec& spec);
// Trains steps [first, first + count) on this rank through the production schedule; rank 0 appends to `record`.
void train_steps(zero::Engine& engine, model::CausalLM& model, comm::Communicator& comm, const EngineSpec& spec, int64_t first,
                 int64_t count, EngineRun& record);
// Collective: the full master weights and second moments into `record` (rank 0).
void gather_state(zero::Engine& engine, comm::Communicator& comm, EngineRun& record);
// A whole run: model, engine, spec.steps steps, the gathered state.
EngineRun run_engine(const EngineSpec& spec);
// The largest |a - b| / |b| over two equally long series (a test failure when their lengths differ).
double worst_relative(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace dstrain::test
