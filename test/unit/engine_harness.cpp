#include "engine_harness.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "dstrain/comm/communicator.h"
#include "dstrain/comm/thread_communicator.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/freeze.h"
#include "dstrain/model/lora.h"
#include "dstrain/model/objective.h"
#include "dstrain/train/loss_share.h"
#include "dstrain/train/sequential_runner.h"
#include "model/tiny_models.h"

namespace dstrain::test {
namespace {

constexpr int64_t kGlobalBatch = 8, kSeqLen = 16, kAccumulation = 2, kVocab = 64;

// Step `step`'s global batch [kGlobalBatch, kSeqLen + 1]: splitmix64 tokens, the same everywhere.
at::Tensor global_batch(int64_t step) {
  at::Tensor batch = at::empty({kGlobalBatch, kSeqLen + 1}, at::kLong);
  uint64_t x = 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(step + 1);
  auto* out = batch.data_ptr<int64_t>();
  for (int64_t i = 0; i < batch.numel(); ++i) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    out[i] = static_cast<int64_t>((z ^ (z >> 31)) % kVocab);
  }
  return batch;
}

}  // namespace

config::ModelConfig tiny_model_config() {
  config::ModelConfig m;
  m.family = config::ModelFamily::kDense;
  m.vocab_size = kVocab;
  m.hidden_size = 32;
  m.num_layers = 2;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.intermediate_size = 48;
  m.max_seq_len = kSeqLen;
  return m;
}

config::ModelConfig tiny_moe_config() { return tiny_v3(); }

std::unique_ptr<model::CausalLM> make_tiny_model(config::Dtype dtype) {
  return model::make_model(tiny_model_config(), 1234, model::scalar_type(dtype));
}

zero::EngineOptions engine_options(const EngineSpec& spec) {
  zero::EngineOptions o;
  o.stage = spec.stage;
  o.dtype = spec.dtype;
  o.overlap_comm = spec.overlap_comm;
  o.reduce_bucket_size = spec.bucket;
  o.offload_optimizer = spec.offload;
  o.offload_param = spec.offload_param;
  o.offload_chunk = spec.offload_chunk;
  o.delayed_update = spec.delayed_update;
  o.delayed_update_after = spec.delayed_after;
  o.persistence_threshold = 64;  // stage 3 really shards the tiny model's matrices
  o.prefetch_bucket_size = 4096;
  o.adam = {1e-2, 0.9, 0.95, 1e-8, 0.1, true, 1};
  o.grad_clip = 1.0;
  o.average_over_ranks = false;  // the loss is divided by the global token count, as the trainer does
  o.loss_scaler = {0, 8, 1000, 1, false, 1};
  return o;
}

void train_steps(zero::Engine& engine, model::CausalLM& model, comm::Communicator& comm, const EngineSpec& spec, int64_t first,
                 int64_t count, EngineRun& record) {
  const int64_t world = comm.world_size(), micro = kGlobalBatch / (world * kAccumulation);
  // The trainer's own runner (forward, objective, scaling, the engine's micro-batch calls, backward).
  const model::Objective objective;
  train::SequentialRunner runner(model, objective, &engine, at::kCPU);
  for (int64_t step = first; step < first + count; ++step) {
    const at::Tensor global = global_batch(step);
    if (step + 1 == spec.overflow_at_step && (spec.overflow_rank < 0 || spec.overflow_rank == comm.rank()))
      engine.mark_gradients_nonfinite();
    std::vector<data::Batch> batches;  // micro-batches dealt rank-major, as DataPlan does
    for (int64_t m = 0; m < kAccumulation; ++m)
      batches.push_back(data::pretraining_batch(global.narrow(0, (m * world + comm.rank()) * micro, micro)));
    const train::StepTotals totals = runner.train(batches, train::global_loss_units(comm, batches));
    const zero::StepResult r = engine.step(spec.lr, step + 1 - engine.skipped_steps(), zero::StepScalars{{}, totals.values});
    if (comm.rank() != 0) continue;
    record.losses.push_back(r.device_sums.at(0));
    record.grad_norms.push_back(r.grad_norm);
    record.scales.push_back(r.loss_scale);
    record.skipped.push_back(r.skipped);
  }
  if (comm.rank() == 0) record.skipped_steps = engine.skipped_steps();
}

void gather_state(zero::Engine& engine, comm::Communicator& comm, EngineRun& record) {
  const model::NamedTensors full = comm.rank() == 0 ? engine.full_state() : model::NamedTensors{};
  engine.gather_full_state(full);
  if (comm.rank() != 0) return;
  // The parameters' own entries, then exp_avg.* and exp_avg_sq.* of the trained ones.
  std::vector<at::Tensor> master, second;
  for (const auto& t : full) {
    if (t.name.rfind("exp_avg_sq.", 0) == 0) {
      second.push_back(t.tensor.reshape({-1}));
    } else if (t.name.rfind("exp_avg.", 0) != 0) {
      master.push_back(t.tensor.reshape({-1}));
      record.names.push_back(t.name), record.numels.push_back(t.tensor.numel());
    }
  }
  record.master = at::cat(master);
  record.exp_avg_sq = at::cat(second);
}

EngineRun run_engine(const EngineSpec& spec) {
  EngineRun record;
  comm::run_on_threads(spec.world, [&](comm::Communicator& comm) {
    // Expert parallelism: E consecutive ranks share the experts; every E-th rank holds the same.
    const comm::ExpertCommunicators groups = comm::split_expert_groups(comm, spec.expert_parallel);
    comm::Communicator* parallel = groups.parallel.get();
    const auto model = spec.expert_parallel > 0 ? model::make_model(tiny_moe_config(), 1234, model::scalar_type(spec.dtype), parallel)
                                                : make_tiny_model(spec.dtype);
    model->set_activation_checkpointing(spec.recompute);
    if (spec.lora_rank > 0) {
      model::LoraSpec lora;
      lora.rank = spec.lora_rank, lora.alpha = 2.0 * static_cast<double>(spec.lora_rank), lora.experts = spec.lora_experts;
      model::attach_lora(*model, lora, 77);
    }
    if (!spec.freeze.empty())
      model::apply_frozen_set(*model, model::frozen_set(spec.expert_parallel > 0 ? tiny_moe_config() : tiny_model_config(), spec.freeze));
    if (comm.rank() == 0) {
      std::vector<at::Tensor> flat;
      for (const auto& p : model->parameters()) flat.push_back(p.tensor.detach().to(at::kFloat).reshape({-1}));
      record.initial = at::cat(flat);
    }
    zero::Engine engine(*model, comm, engine_options(spec), {parallel, groups.data.get()});
    train_steps(engine, *model, comm, spec, 0, spec.steps, record);
    gather_state(engine, comm, record);
    if (comm.rank() == 0) record.memory = engine.memory(), record.parameters = model->num_parameters();
  });
  return record;
}

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) throw std::invalid_argument("worst_relative: series of different lengths");
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-12));
  return worst;
}

}  // namespace dstrain::test
