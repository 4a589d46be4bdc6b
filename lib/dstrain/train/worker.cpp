// THE loop. Everything with depth lives in the modules; this file wires them and reads top to
// bottom: environment -> config -> comm -> model/optimizer -> data -> resume -> steps -> checkpoint.
#include "dstrain/train/worker.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <future>
#include <thread>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/data/global_sampler.h"
#include "dstrain/data/sample_stream.h"
#include "dstrain/data/token_file.h"
#include "dstrain/launch/worker_env.h"
#include "dstrain/metrics/jsonl_sink.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/optim/adamw.h"
#include "dstrain/sched/lr_schedule.h"
#include "dstrain/train/run_dir.h"

namespace dstrain::train {
namespace {

using model::NamedTensors;

// [micro_batch, seq_len + 1] int64 windows for the given global positions.
at::Tensor make_batch(data::SampleStream& stream, int64_t first_position, int64_t micro_batch, int64_t seq_len) {
  at::Tensor batch = at::empty({micro_batch, seq_len + 1}, at::kLong);
  auto* out = batch.data_ptr<int64_t>();
  for (int64_t i = 0; i < micro_batch; ++i) stream.read(first_position + i, out + i * (seq_len + 1));
  return batch;
}

struct StepScalars {
  double loss;       // mean over ranks
  bool save_now;     // rank 0's clock says a time-based checkpoint is due
};

// Averages gradients over ranks in one collective. Two extra elements ride along: the loss, and
// rank 0's "checkpoint now" flag, so that every rank takes the same decision at no extra cost.
StepScalars average_gradients(comm::Communicator& comm, const NamedTensors& params, double local_loss, bool save_flag, bool mean = true) {
  std::vector<at::Tensor> pieces;
  for (const auto& p : params) pieces.push_back(p.tensor.grad().reshape({-1}));
  pieces.push_back(at::tensor({static_cast<float>(local_loss), save_flag ? 1.0f : 0.0f}, at::kFloat));
  at::Tensor flat = at::cat(pieces);
  if (comm.world_size() > 1) {
    comm.all_reduce(flat)->wait();
    // Equal shares: each rank's gradient is its own batch's mean, so average. Weighted shares:
    // each rank already divided by the global token count, so the sum is the batch's gradient.
    if (mean) flat.div_(comm.world_size());
  }
  int64_t offset = 0;
  for (const auto& p : params) {
    const int64_t n = p.tensor.numel();
    p.tensor.mutable_grad().copy_(flat.narrow(0, offset, n).view_as(p.tensor));
    offset += n;
  }
  return {flat[offset].item<double>(), flat[offset + 1].item<float>() > 0};
}

// A contiguous run of global positions one micro-batch reads.
struct Chunk {
  int64_t first;
  int64_t count;
};

// What this rank reads in a step. Equal shares: accumulation micro-batches dealt rank-major.
// Weighted shares (data.shard_weights or auto): this rank's contiguous slice of the global batch,
// cut into micro-batches.
std::vector<Chunk> plan_step(const config::Recipe& r, int64_t step, int64_t first, const std::vector<double>& weights, int64_t rank, int64_t world) {
  const int64_t micro = r.train.micro_batch_size;
  std::vector<Chunk> chunks;
  if (weights.empty()) {
    for (int64_t m = 0; m < config::accumulation_at(r, step); ++m) chunks.push_back({data::first_position(first, m, micro, rank, world), micro});
    return chunks;
  }
  const std::vector<int64_t> counts = data::weighted_shares(config::global_batch_at(r, step), weights);
  int64_t start = first;
  for (int64_t q = 0; q < rank; ++q) start += counts[static_cast<size_t>(q)];
  for (int64_t done = 0; done < counts[static_cast<size_t>(rank)]; done += micro)
    chunks.push_back({start + done, std::min(micro, counts[static_cast<size_t>(rank)] - done)});
  return chunks;
}

// DSTRAIN_BENCH_SLOW_RANK=r:f makes rank r f times slower (it sleeps after each micro-batch), to
// benchmark weighted sharding on machines whose ranks are all alike. Off unless set.
double slowdown_for(int rank) {
  const char* v = std::getenv("DSTRAIN_BENCH_SLOW_RANK");
  if (!v) return 1.0;
  const std::string s = v;
  const auto colon = s.find(':');
  if (colon == std::string::npos || std::stoi(s.substr(0, colon)) != rank) return 1.0;
  return std::max(1.0, std::stod(s.substr(colon + 1)));
}

sched::Schedule schedule_of(const config::Recipe& r) {
  const auto& s = r.schedule;
  return {sched::schedule_type_from_name(s.type), r.optimizer.lr, s.warmup_steps, r.train.steps, s.warmup_type == "log", s.warmup_min_ratio,
          s.min_lr_ratio};
}

std::vector<ckpt::TensorView> views_of(const std::vector<const NamedTensors*>& groups) {
  std::vector<ckpt::TensorView> views;
  for (const auto* group : groups)
    for (const auto& t : *group)
      views.push_back({t.name, "float32", t.tensor.sizes().vec(), t.tensor.data_ptr(), static_cast<uint64_t>(t.tensor.nbytes())});
  return views;
}

void restore(const ckpt::Checkpoint& ck, const std::vector<const NamedTensors*>& groups) {
  std::map<std::string, const ckpt::TensorData*> by_name;
  for (const auto& t : ck.tensors) by_name[t.name] = &t;
  for (const auto* group : groups) {
    for (const auto& t : *group) {
      const auto it = by_name.find(t.name);
      if (it == by_name.end())
        throw Error(ErrorCode::kCheckpoint, fmt::format("checkpoint {} has no tensor '{}'", ck.dir, t.name),
                    "it was written for another model; resume with the recipe that wrote it");
      const ckpt::TensorData& d = *it->second;
      if (d.dtype != "float32" || d.shape != t.tensor.sizes().vec() || d.bytes.size() != static_cast<size_t>(t.tensor.nbytes()))
        throw Error(ErrorCode::kCheckpoint, fmt::format("checkpoint {}: tensor '{}' has dtype {} shape [{}], the model needs float32 [{}]", ck.dir,
                                                        t.name, d.dtype, fmt::join(d.shape, ", "), fmt::join(t.tensor.sizes(), ", ")),
                    "resume with the recipe that wrote the checkpoint");
      std::memcpy(t.tensor.data_ptr(), d.bytes.data(), d.bytes.size());
    }
  }
}

}  // namespace

int run_worker(const launch::WorkerEnv& env) {
  // --- environment and config ---------------------------------------------------------------
  log::set_rank(env.rank);
  const RunDir run_dir(env.run_dir);
  const config::Recipe recipe = config::read_resolved_config(run_dir.config_path());
  const auto& tc = recipe.train;
  at::set_num_threads(env.threads);
  const int64_t world = env.world_size;
  if (world != recipe.world_size())
    throw Error(ErrorCode::kEnvironment, fmt::format("WORLD_SIZE={} but the config was resolved for {} ranks", world, recipe.world_size()),
                "start workers through `dstrain train`/`dstrain resume`, which resolve the config for the actual world size");
  const std::string ckpt_dir = run_dir.ckpt_dir(recipe);
  const bool console = std::find(recipe.logging.sinks.begin(), recipe.logging.sinks.end(), "console") != recipe.logging.sinks.end();
  const bool jsonl = std::find(recipe.logging.sinks.begin(), recipe.logging.sinks.end(), "jsonl") != recipe.logging.sinks.end();

  // --- communication -------------------------------------------------------------------------
  auto comm = comm::make_gloo_communicator(
      {env.master_addr, env.master_port, launch::store_run_key(env), std::chrono::seconds(recipe.launch.timeout_s), env.host_store}, env.rank,
      env.world_size);

  // --- model, optimizer, data ----------------------------------------------------------------
  const std::unique_ptr<model::CausalLM> model = model::make_model(recipe.model, recipe.seed);
  const NamedTensors& params = model->parameters();
  const NamedTensors& buffers = model->buffers();
  const auto& oc = recipe.optimizer;
  optim::AdamW optimizer(params, {oc.beta1, oc.beta2, oc.eps, oc.weight_decay, oc.type == "adamw"});
  const NamedTensors optimizer_state = optimizer.state();
  std::vector<std::unique_ptr<data::TokenFile>> files;
  for (const auto& path : recipe.data.paths.empty() ? std::vector<std::string>{recipe.data.path} : recipe.data.paths)
    files.push_back(data::open_token_file(path, recipe.data.format, recipe.data.seq_len));
  const uint64_t data_seed = recipe.data.seed >= 0 ? static_cast<uint64_t>(recipe.data.seed) : recipe.seed;
  data::SampleStream stream(std::move(files), recipe.data.weights, recipe.data.seq_len, data_seed);
  const sched::Schedule schedule = schedule_of(recipe);
  // Shares of each global batch: equal (empty), the recipe's weights, or (auto) equal until the
  // ranks' measured speeds set them. They are saved with checkpoints so a resume splits alike.
  const bool weighted = !recipe.data.shard_weights.empty() || recipe.data.auto_balance;
  std::vector<double> weights = recipe.data.shard_weights;
  if (recipe.data.auto_balance) weights.assign(static_cast<size_t>(world), 1.0);
  at::Tensor weights_state = at::tensor(std::vector<float>(weights.begin(), weights.end()), at::kFloat);
  const NamedTensors data_state = weighted ? NamedTensors{{"data.shard_weights", weights_state}} : NamedTensors{};

  // --- resume ----------------------------------------------------------------------------------
  int64_t start_step = 0;
  int64_t cursor = 0;  // samples consumed: the global data position
  if (!env.resume && !recipe.model.init_from.empty()) {
    model::load_hf_weights(recipe.model.init_from, recipe.model, params, buffers);
    if (env.rank == 0) log::info(fmt::format("initialised from {}", recipe.model.init_from));
  }
  if (env.resume) {
    const auto dir = ckpt::latest_checkpoint(ckpt_dir);
    if (!dir) throw Error(ErrorCode::kCheckpoint, "no committed checkpoint in " + ckpt_dir, "start the run with `dstrain train`");
    const ckpt::Checkpoint ck = ckpt::load_checkpoint(*dir);
    restore(ck, {&params, &optimizer_state, &buffers, &data_state});
    if (weighted) weights.assign(weights_state.data_ptr<float>(), weights_state.data_ptr<float>() + weights_state.numel());
    start_step = ck.state.step;
    cursor = ck.state.samples_consumed;
    optimizer.set_steps_taken(start_step);
    if (env.rank == 0) log::info(fmt::format("resumed from {} at step {} ({} samples consumed)", ck.dir, start_step, ck.state.samples_consumed));
  }
  if (env.rank == 0)
    log::info(fmt::format("model: {:.3f}M parameters; data: {} samples of {} tokens; {} steps, first global batch {} ({} accumulation x {} ranks x {})",
                          static_cast<double>(model->num_parameters()) / 1e6, stream.num_samples(), recipe.data.seq_len, tc.steps,
                          config::global_batch_at(recipe, start_step), config::accumulation_at(recipe, start_step), world, tc.micro_batch_size));
  if (start_step >= tc.steps && env.rank == 0) log::info(fmt::format("the run is already complete ({} of {} steps); nothing to do", start_step, tc.steps));
  std::unique_ptr<metrics::JsonlSink> sink;
  if (env.rank == 0 && jsonl) sink = std::make_unique<metrics::JsonlSink>(run_dir.metrics_path(), start_step);

  auto last_save = std::chrono::steady_clock::now();
  auto save = [&](int64_t steps_done) {
    if (env.rank == 0) {
      const std::string dir = ckpt::save_checkpoint(ckpt_dir, {steps_done, cursor, world, config::config_hash(recipe)},
                                                    views_of({&params, &optimizer_state, &buffers, &data_state}),
                                                    {recipe.checkpoint.keep_last, recipe.checkpoint.keep_every});
      log::info(fmt::format("checkpoint saved: {}", dir));
    }
    comm->barrier()->wait();
    last_save = std::chrono::steady_clock::now();
  };
  auto time_for_save = [&] {
    const double minutes = recipe.checkpoint.interval_minutes;
    return env.rank == 0 && minutes > 0 &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save).count() >= minutes * 60.0;
  };

  // --- the steps -------------------------------------------------------------------------------
  // Batches are built one step ahead on a background thread (the only user of the sampler), so the
  // step waits for data only when reading is slower than computing.
  auto build_step = [&stream, &recipe, rank = env.rank, world](int64_t step, int64_t first, std::vector<double> w) {
    std::vector<at::Tensor> batches;
    for (const Chunk& c : plan_step(recipe, step, first, w, rank, world)) batches.push_back(make_batch(stream, c.first, c.count, recipe.data.seq_len));
    return batches;
  };
  std::future<std::vector<at::Tensor>> prefetched;
  if (start_step < tc.steps) prefetched = std::async(std::launch::async, build_step, start_step, cursor, weights);
  const double slowdown = slowdown_for(env.rank);
  double compute_s = 0;  // this rank's forward+backward time, for auto balancing
  int64_t computed_samples = 0;
  for (int64_t step = start_step; step < tc.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<at::Tensor> step_batches = prefetched.get();
    const double data_wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step + 1 < tc.steps) prefetched = std::async(std::launch::async, build_step, step + 1, cursor + config::global_batch_at(recipe, step), weights);
    const double lr = sched::lr_at(schedule, step);
    const int64_t accum = static_cast<int64_t>(step_batches.size());
    const int64_t T = recipe.data.seq_len;
    const double global_tokens = static_cast<double>(config::global_batch_at(recipe, step) * T);
    for (const auto& p : params) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    double local_loss = 0.0;
    for (int64_t micro = 0; micro < accum; ++micro) {
      const auto c0 = std::chrono::steady_clock::now();
      const at::Tensor& batch = step_batches[static_cast<size_t>(micro)];
      at::Tensor loss;
      const at::Tensor inputs = batch.narrow(1, 0, T);
      const at::Tensor mask = recipe.data.document_mask ? model::document_causal_mask(inputs, recipe.data.eos_token) : at::Tensor();
      if (weighted) {  // token-summed, normalised by the global batch's tokens
        const model::LossParts parts = model->loss_parts(inputs, batch.narrow(1, 1, T), mask);
        loss = parts.sum / global_tokens;
        if (parts.aux.defined()) loss = loss + parts.aux * (static_cast<double>(batch.size(0) * T) / global_tokens);
      } else {
        loss = model->loss(inputs, batch.narrow(1, 1, T), mask) / static_cast<double>(accum);
      }
      loss.backward();
      local_loss += loss.item<double>();
      const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      if (slowdown > 1.0) std::this_thread::sleep_for(std::chrono::duration<double>(spent * (slowdown - 1.0)));
      compute_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      computed_samples += batch.size(0);
    }
    const StepScalars scalars = average_gradients(*comm, params, local_loss, time_for_save(), !weighted);
    const double grad_norm = optim::clip_grad_norm(params, tc.grad_clip);
    optimizer.step(lr);
    // MoE: every rank moves V3's selection bias by the same, globally summed expert load.
    if (at::Tensor load = model->take_expert_load(); load.defined() && load.numel() > 0) {
      at::Tensor global = load.to(at::kFloat).contiguous();
      if (world > 1) comm->all_reduce(global)->wait();
      model->update_expert_bias(global);
    }
    const int64_t batch = config::global_batch_at(recipe, step);
    cursor += batch;
    // Auto balancing: after balance_steps, weight each rank by its measured samples per second.
    if (recipe.data.auto_balance && step + 1 == recipe.data.balance_steps && step + 1 < tc.steps) {
      at::Tensor rates = at::zeros({world}, at::kFloat);
      rates[env.rank] = static_cast<float>(static_cast<double>(computed_samples) / std::max(compute_s, 1e-9));
      if (world > 1) comm->all_reduce(rates)->wait();
      weights.assign(rates.data_ptr<float>(), rates.data_ptr<float>() + world);
      weights_state.copy_(rates);
      prefetched.get();  // built with the old shares: rebuild with the new ones
      prefetched = std::async(std::launch::async, build_step, step + 1, cursor, weights);
      if (env.rank == 0) log::info(fmt::format("auto balance: measured {:.1f} samples/s per rank -> shares of {} samples: [{}]", fmt::join(weights, ", "),
                                               config::global_batch_at(recipe, step + 1),
                                               fmt::join(data::weighted_shares(config::global_batch_at(recipe, step + 1), weights), ", ")));
    }
    const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    const int64_t done = step + 1;
    const double loss = scalars.loss;
    if (env.rank == 0) {
      const int64_t tokens_done = cursor * recipe.data.seq_len;
      const double tps = static_cast<double>(batch * recipe.data.seq_len) / (step_ms / 1000.0);
      if (sink) sink->write({done, loss, lr, grad_norm, tokens_done, step_ms, tps, data_wait_ms});
      const int64_t every = recipe.logging.steps_per_print;
      if (console && every > 0 && (done == start_step + 1 || done % every == 0 || done == tc.steps))
        log::info(fmt::format("step {}/{} | loss {:.4f} | lr {:.2e} | grad_norm {:.3f} | {:.0f} tok/s | {:.0f} ms/step", done, tc.steps, loss, lr,
                              grad_norm, tps, step_ms));
    }
    const int64_t interval = recipe.checkpoint.interval_steps;
    if (done == tc.steps || (interval > 0 && done % interval == 0) || scalars.save_now) save(done);
  }
  return 0;
}

}  // namespace dstrain::train
