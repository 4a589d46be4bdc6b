// THE loop. Everything with depth lives in the modules; this file wires them and reads top to
// bottom: environment -> config -> comm -> model/optimizer -> data -> resume -> steps -> checkpoint.
#include "dstrain/train/worker.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <csignal>
#include <filesystem>
#include <chrono>
#include <cmath>
#include <limits>
#include <future>
#include <thread>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/log.h"
#include "dstrain/core/progress.h"
#include "dstrain/data/global_sampler.h"
#include "dstrain/data/sample_stream.h"
#include "dstrain/data/token_file.h"
#include "dstrain/launch/worker_env.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/zero/engine.h"
#include "dstrain/sched/lr_schedule.h"
#include "dstrain/train/checkpointer.h"
#include "dstrain/train/env_task.h"
#include "dstrain/train/heartbeat.h"
#include "dstrain/train/run_dir.h"
#include "dstrain/train/telemetry.h"
#include "dstrain/train/training_device.h"

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
  sched::Schedule out;
  out.type = sched::schedule_type_from_name(s.type);
  out.peak_lr = r.optimizer.lr;
  out.warmup_steps = s.warmup_steps;
  out.total_steps = r.train.steps;
  out.log_warmup = s.warmup_type == "log";
  out.warmup_min_ratio = s.warmup_min_ratio;
  out.min_ratio = s.min_lr_ratio;
  out.decay_ratio = s.decay_ratio;
  out.cycle = {s.cycle_min_lr,  s.cycle_max_lr > 0 ? s.cycle_max_lr : r.optimizer.lr,
               s.cycle_first_step_size, s.cycle_second_step_size > 0 ? s.cycle_second_step_size : s.cycle_first_step_size,
               s.decay_lr_rate, s.decay_step_size, s.cycle_momentum, s.cycle_min_mom, s.cycle_max_mom, s.decay_mom_rate};
  return out;
}

// schedule.batch_scaling: the LR factor for a step whose global batch differs from the first's.
double batch_lr_factor(const config::Recipe& r, int64_t step) {
  const double ratio = static_cast<double>(config::global_batch_at(r, step)) / static_cast<double>(config::global_batch_at(r, 0));
  if (r.schedule.batch_scaling == "linear") return ratio;
  if (r.schedule.batch_scaling == "sqrt") return std::sqrt(ratio);
  return 1.0;
}

c10::ScalarType precision_dtype(const std::string& name) {
  if (name == "bf16") return c10::ScalarType::BFloat16;
  if (name == "fp16") return c10::ScalarType::Half;
  return c10::ScalarType::Float;
}

zero::EngineOptions engine_options(const config::Recipe& r, const c10::Device& device) {
  zero::EngineOptions o;
  o.device = device;
  // DSTRAIN_TEST_OFFLOAD_CHUNK=n: offload's chunk size in elements (tests use many small chunks).
  if (const char* chunk = std::getenv("DSTRAIN_TEST_OFFLOAD_CHUNK")) o.offload_chunk = std::atoll(chunk);
  o.stage = static_cast<int>(r.zero.stage);
  o.reduce_bucket_size = r.zero.reduce_bucket_size;
  o.overlap_comm = r.zero.overlap_comm;
  o.offload_optimizer = r.zero.offload_optimizer == "cpu";
  o.prefetch_bucket_size = r.zero.stage3_prefetch_bucket_size;
  o.persistence_threshold = r.zero.stage3_param_persistence_threshold;
  o.dtype = r.precision.dtype;
  o.adam = {r.optimizer.lr, r.optimizer.beta1, r.optimizer.beta2, r.optimizer.eps, r.optimizer.weight_decay, r.optimizer.type == "adamw", 1};
  o.grad_clip = r.train.grad_clip;
  o.average_over_ranks = false;  // each rank's loss is already divided by the global token count
  const auto& p = r.precision;
  o.loss_scaler = {p.loss_scale, p.initial_scale_power, p.loss_scale_window, p.hysteresis, p.consecutive_hysteresis, static_cast<double>(p.min_loss_scale)};
  return o;
}

// run_dir/memory.json: per-rank bytes of model state next to the ZeRO formulas (rank 0's view).
void write_memory_report(const RunDir& run_dir, const zero::Engine& engine) {
  const zero::MemoryReport m = engine.memory();
  const std::string json = fmt::format(
      "{{\"version\": 1, \"params_bytes\": {}, \"grads_bytes\": {}, \"master_bytes\": {}, \"optimizer_bytes\": {}, "
      "\"formula_params_bytes\": {}, \"formula_grads_bytes\": {}, \"formula_optimizer_bytes\": {}, \"parameters\": {}}}\n",
      m.params, m.grads, m.master, m.optimizer, m.formula_params, m.formula_grads, m.formula_optimizer, engine.layout().numel());
  write_file_atomic(run_dir.root() + "/memory.json", json);
}

// SIGUSR1 (from the launcher, or sent to a worker directly) asks for a checkpoint after the
// current step; so does a file named SAVE_NOW in the run directory.
volatile std::sig_atomic_t g_save_requested = 0;
void on_save_request(int) { g_save_requested = 1; }
// SIGTERM/SIGINT (from the launcher, Slurm's pre-emption or a terminal) ask for a coordinated
// stop: every rank finishes the current step, all save one checkpoint, and exit 75.
volatile std::sig_atomic_t g_stop_requested = 0;
void on_stop_request(int) { g_stop_requested = 1; }
void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_save_request;
  sa.sa_flags = SA_RESTART;  // blocking calls in Gloo resume instead of failing with EINTR
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  struct sigaction stop {};
  stop.sa_handler = on_stop_request;
  stop.sa_flags = SA_RESTART;
  sigemptyset(&stop.sa_mask);
  sigaction(SIGTERM, &stop, nullptr);
  sigaction(SIGINT, &stop, nullptr);
}

// DSTRAIN_TEST_INJECT_INF_STEP=k puts an inf into step k's gradients (tests of the fp16 skip).
int64_t inject_inf_step_from_env() {
  const char* v = std::getenv("DSTRAIN_TEST_INJECT_INF_STEP");
  return v ? std::atoll(v) : -1;
}

// DSTRAIN_TEST_NAN_LOSS=r:k[:always] makes rank r's loss NaN at step k: once per process (a
// transient fault, which a rollback cures), or every time the step is computed (a bad batch).
struct NanLossInjection {
  int rank = -1;
  int64_t step = -1;
  bool always = false;
  bool fired = false;
  bool due(int my_rank, int64_t this_step) {
    if (my_rank != rank || this_step != step || (fired && !always)) return false;
    fired = true;
    return true;
  }
};
// DSTRAIN_TEST_STALL=r:k:s makes rank r sleep s seconds in the forward of step k, alive (its
// heartbeat goes on) while the other ranks wait for it in a collective (tests of hang reports).
struct StallInjection {
  int rank = -1;
  int64_t step = -1;
  double seconds = 0;
};
StallInjection stall_injection_from_env() {
  StallInjection s;
  if (const char* v = std::getenv("DSTRAIN_TEST_STALL"); v && std::sscanf(v, "%d:%ld:%lf", &s.rank, &s.step, &s.seconds) != 3) s = {};
  return s;
}

NanLossInjection nan_loss_injection_from_env() {
  NanLossInjection n;
  if (const char* v = std::getenv("DSTRAIN_TEST_NAN_LOSS")) {
    const std::string s = v;
    n.rank = std::atoi(s.c_str());
    n.step = std::atoll(s.c_str() + s.find(':') + 1);
    n.always = s.find(":always") != std::string::npos;
  }
  return n;
}

int train_on(const launch::WorkerEnv& env, const TrainingDevice& device);

}  // namespace

int run_worker(const launch::WorkerEnv& env) {
  install_signal_handlers();  // first: SIGUSR1 must never kill a worker, SIGTERM must stop it cleanly
  log::set_rank(env.rank);
  const TrainingDevice device = open_training_device(env.device, env.rank);
  // Out of memory (CUDA's caching allocator, or the host's when RAM or `ulimit -v` runs out):
  // say where, what this run needs per rank and what to change, instead of an allocator trace.
  auto out_of_memory = [&](const std::string& detail) {
    const config::Recipe recipe = config::read_resolved_config(RunDir(env.run_dir).config_path());
    const progress::Snapshot at = progress::snapshot();
    return Error(ErrorCode::kEnvironment,
                 fmt::format("rank {}: {}", env.rank,
                             out_of_memory_message(recipe, device, fmt::format("{} of step {}", progress::phase_name(at.phase), at.step), detail)),
                 out_of_memory_hint(recipe));
  };
  try {
    return train_on(env, device);
  } catch (const c10::OutOfMemoryError& e) {
    throw out_of_memory(first_line(e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    const std::string what = first_line(e.what_without_backtrace());
    const auto host = what.find("DefaultCPUAllocator: ");  // LibTorch's host allocator reports ENOMEM as a plain c10::Error
    if (host == std::string::npos) throw;
    throw out_of_memory(what.substr(host));
  }
}

namespace {

int train_on(const launch::WorkerEnv& env, const TrainingDevice& device) {
  // --- environment and config ---------------------------------------------------------------
  const RunDir run_dir(env.run_dir);
  const config::Recipe recipe = config::read_resolved_config(run_dir.config_path());
  const auto& tc = recipe.train;
  at::set_num_threads(env.threads);
  const int64_t world = env.world_size;
  if (world != recipe.world_size())
    throw Error(ErrorCode::kEnvironment, fmt::format("WORLD_SIZE={} but the config was resolved for {} ranks", world, recipe.world_size()),
                "start workers through `dstrain train`/`dstrain resume`, which resolve the config for the actual world size");
  const std::string ckpt_dir = run_dir.ckpt_dir(recipe);

  // --- communication -------------------------------------------------------------------------
  const comm::Endpoint endpoint{env.master_addr, env.master_port, launch::store_run_key(env), std::chrono::seconds(recipe.launch.timeout_s), env.host_store,
                                std::chrono::seconds(recipe.launch.collective_timeout_s + recipe.launch.heartbeat_timeout_s)};
  // On GPUs the engine's collectives (gradients, parameters, the step's scalars and flags) go
  // over NCCL; Gloo carries the rest on CPU (metrics, straggler times, expert load, checkpoint
  // summaries and barriers, the environment check).
  auto comm = comm::make_gloo_communicator(endpoint, env.rank, env.world_size);
  std::unique_ptr<comm::Communicator> nccl;
  if (device.device.is_cuda()) {
    comm::Endpoint client = endpoint;
    client.host_store = false;  // a rank that hosts the store (mpirun, srun) already does, through the Gloo communicator
    nccl = comm::make_nccl_communicator(client, env.rank, env.world_size, device.device.index());
  }
  comm::Communicator& engine_comm = nccl ? *nccl : *comm;
  if (env.rank == 0)
    log::info(device.device.is_cuda() ? fmt::format("training on GPUs: rank 0 on {} ({}, {:.1f} GiB); gradients and parameters over NCCL",
                                                    device.device.str(), device.name, device.memory_gib)
                                      : std::string("training on CPU (no GPU visible); collectives over Gloo"));
  // The launcher watches these: a rank gone silent or a collective past launch.collective_timeout_s
  // is reported by rank and op. The worker's own collective timeout above is the backstop.
  const HeartbeatSender heartbeat(env, static_cast<double>(recipe.launch.heartbeat_timeout_s));
  // Every rank's software, hardware, config and data files alike (check-env without its probes).
  if (recipe.launch.env_check && env.env_check) preflight_env_check(*comm, env.group_rank, recipe);

  // --- model, optimizer, data ----------------------------------------------------------------
  const std::unique_ptr<model::CausalLM> model = model::make_model(recipe.model, recipe.seed, precision_dtype(recipe.precision.dtype));
  model->move_buffers_to(device.device);  // initialised on the CPU (the same values everywhere); the engine moves the parameters
  const NamedTensors& params = model->parameters();
  const NamedTensors& buffers = model->buffers();
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

  // --- the ZeRO engine takes over the parameters ------------------------------------------------
  int64_t start_step = 0;
  int64_t cursor = 0;  // samples consumed: the global data position
  if (!env.resume && !recipe.model.init_from.empty()) {
    model::load_hf_weights(recipe.model.init_from, recipe.model, params, buffers);
    if (env.rank == 0) log::info(fmt::format("initialised from {}", recipe.model.init_from));
  }
  zero::Engine engine(*model, engine_comm, engine_options(recipe, device.device));
  if (env.rank == 0) log::info(engine.describe());
  if (env.rank == 0) write_memory_report(run_dir, engine);

  // --- resume ----------------------------------------------------------------------------------
  NamedTensors replicated = buffers;
  replicated.insert(replicated.end(), data_state.begin(), data_state.end());
  Checkpointer checkpointer(recipe, ckpt_dir, *comm, engine, replicated, env.run_id);
  progress::enter(progress::Phase::kCheckpoint);
  if (env.resume) {
    const auto load_start = std::chrono::steady_clock::now();
    const Checkpointer::Resumed r = checkpointer.resume(env.resume_from);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    if (weighted) weights.assign(weights_state.data_ptr<float>(), weights_state.data_ptr<float>() + weights_state.numel());
    start_step = r.step;
    cursor = r.samples_consumed;
    if (env.rank == 0) log::info(fmt::format("resumed from {} at step {} ({} samples consumed; loaded in {:.2f} s)", r.dir, start_step, cursor, load_s));
  }
  if (env.rank == 0)
    log::info(fmt::format("model: {:.3f}M parameters; data: {} samples of {} tokens; {} steps, first global batch {} ({} accumulation x {} ranks x {})",
                          static_cast<double>(model->num_parameters()) / 1e6, stream.num_samples(), recipe.data.seq_len, tc.steps,
                          config::global_batch_at(recipe, start_step), config::accumulation_at(recipe, start_step), world, tc.micro_batch_size));
  if (start_step >= tc.steps && env.rank == 0) log::info(fmt::format("the run is already complete ({} of {} steps); nothing to do", start_step, tc.steps));
  Telemetry telemetry(recipe, run_dir, *comm, start_step, env.threads, device);

  auto last_save = std::chrono::steady_clock::now();
  double save_ms = 0;  // this step's checkpoint time (wall_clock_breakdown)
  auto save = [&](int64_t steps_done) {
    progress::enter(progress::Phase::kCheckpoint);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string dir = checkpointer.save(steps_done, cursor);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (env.rank == 0) {
      // Young/Daly: the interval that minimises lost work plus save time is sqrt(2 x save x MTBF).
      const double mtbf_s = recipe.checkpoint.mtbf_hours * 3600.0;
      log::info(fmt::format("{}: {} (training blocked {:.2f} s); Young/Daly interval for an MTBF of {:g} h: {:.1f} min (checkpoint.mtbf_hours)",
                            checkpointer.async() ? "checkpoint being written in the background" : "checkpoint saved", dir, seconds,
                            recipe.checkpoint.mtbf_hours, std::sqrt(2.0 * std::max(seconds, 1e-3) * mtbf_s) / 60.0));
    }
    last_save = std::chrono::steady_clock::now();
    save_ms += seconds * 1000.0;
  };
  // A coordinated stop: SIGTERM/SIGINT on any rank, or rank 0's clock past launch.max_time_minutes.
  const auto launch_start = std::chrono::steady_clock::now();
  auto time_to_stop = [&] {
    const double budget = recipe.launch.max_time_minutes;
    return g_stop_requested ||
           (env.rank == 0 && budget > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - launch_start).count() >= budget * 60.0);
  };
  // Rank 0's clock, SIGUSR1 on any rank, or run_dir/SAVE_NOW: the flag rides in the step's
  // scalar all-reduce, so every rank takes the same decision.
  const std::string save_now_file = run_dir.root() + "/SAVE_NOW";
  auto time_for_save = [&] {
    const double minutes = recipe.checkpoint.interval_minutes;
    bool due = env.rank == 0 && minutes > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save).count() >= minutes * 60.0;
    if (g_save_requested) g_save_requested = 0, due = true;
    if (env.rank == 0 && std::filesystem::exists(save_now_file)) {
      std::filesystem::remove(save_now_file);
      due = true;
    }
    return due;
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
  const bool timed_phases = device.device.is_cuda() && recipe.logging.wall_clock_breakdown;
  const int64_t inject_inf_step = inject_inf_step_from_env();
  double compute_s = 0;  // this rank's forward+backward time, for auto balancing
  int64_t computed_samples = 0;
  NanLossInjection nan_loss = nan_loss_injection_from_env();
  const StallInjection stall = stall_injection_from_env();
  int64_t bad_steps = 0;       // NaN/Inf steps in this launch (train.on_bad_step)
  int64_t rolled_back_at = -1; // the step whose badness caused the last rollback
  for (int64_t step = start_step; step < tc.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    progress::set_step(step + 1);
    progress::enter(progress::Phase::kData);
    const std::vector<at::Tensor> step_batches = prefetched.get();
    const double data_wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (step + 1 < tc.steps) prefetched = std::async(std::launch::async, build_step, step + 1, cursor + config::global_batch_at(recipe, step), weights);
    // Skipped (fp16 overflow) steps do not advance the schedule or Adam's bias correction.
    const int64_t applied = step - engine.skipped_steps();
    const double lr = sched::lr_at(schedule, applied) * batch_lr_factor(recipe, step);
    const sched::Betas betas = sched::betas_at(schedule, applied);
    const int64_t accum = static_cast<int64_t>(step_batches.size());
    const int64_t T = recipe.data.seq_len;
    const double global_tokens = static_cast<double>(config::global_batch_at(recipe, step) * T);
    double local_loss = 0.0;
    if (inject_inf_step == step + 1) engine.inject_overflow();
    for (int64_t micro = 0; micro < accum; ++micro) {
      engine.begin_micro(micro + 1 == accum);
      const auto c0 = std::chrono::steady_clock::now();
      progress::enter(progress::Phase::kForward);
      if (stall.rank == env.rank && stall.step == step + 1 && micro == 0) std::this_thread::sleep_for(std::chrono::duration<double>(stall.seconds));
      const at::Tensor batch = step_batches[static_cast<size_t>(micro)].to(device.device);
      at::Tensor loss;
      const at::Tensor inputs = batch.narrow(1, 0, T);
      const at::Tensor mask = recipe.data.document_mask ? model::document_causal_mask(inputs, recipe.data.eos_token) : at::Tensor();
      // Token-summed and divided by the whole global batch's tokens: every micro-batch of every
      // rank then weighs by its tokens, and the summed gradients are the global batch's mean
      // gradient whatever the shares, accumulation steps or world size.
      const model::LossParts parts = model->loss_parts(inputs, batch.narrow(1, 1, T), mask);
      loss = parts.sum / global_tokens;
      if (timed_phases) synchronize(device.device);  // GPU kernels run asynchronously: the breakdown waits for them, as DeepSpeed's timers do
      const auto f1 = std::chrono::steady_clock::now();
      telemetry.add_forward(std::chrono::duration<double, std::milli>(f1 - c0).count());
      if (parts.aux.defined()) loss = loss + parts.aux * (static_cast<double>(batch.size(0) * T) / global_tokens);
      if (nan_loss.due(env.rank, step + 1) && micro == 0) loss = loss * std::numeric_limits<double>::quiet_NaN();
      local_loss += loss.item<double>();
      progress::enter(progress::Phase::kBackward);
      (engine.loss_scale() == 1.0 ? loss : loss * engine.loss_scale()).backward();
      engine.end_micro();
      if (timed_phases) synchronize(device.device);
      const double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      if (slowdown > 1.0) std::this_thread::sleep_for(std::chrono::duration<double>(spent * (slowdown - 1.0)));
      telemetry.add_backward(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - f1).count());  // a slowed rank's sleep counts as compute
      compute_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
      computed_samples += batch.size(0);
    }
    progress::enter(progress::Phase::kOptimizer);
    // A NaN/Inf loss on this rank poisons the gradient norm, so every rank sees the bad step and
    // the engine applies no update from it.
    if (!std::isfinite(local_loss)) engine.inject_overflow();
    const auto o0 = std::chrono::steady_clock::now();
    const zero::StepResult result = engine.step(lr, applied + 1, {local_loss, time_for_save() ? 1.0 : 0.0, time_to_stop() ? 1.0 : 0.0}, betas.beta1,
                                                     betas.beta2);
    const double grad_norm = result.grad_norm;
    const double optimizer_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - o0).count();
    // Bad steps (NaN/Inf outside fp16's loss scaling): train.on_bad_step.
    const bool bad = recipe.precision.dtype != "fp16" && (result.skipped || !std::isfinite(result.sums[0]));
    if (bad) {
      ++bad_steps;
      const std::string what = fmt::format("step {}: the {} is {} (train.on_bad_step = {})", step + 1,
                                           std::isfinite(result.sums[0]) ? "gradient norm" : "loss",
                                           std::isfinite(result.sums[0]) ? fmt::format("{}", result.grad_norm) : fmt::format("{}", result.sums[0]),
                                           tc.on_bad_step);
      if (tc.on_bad_step == "stop" || bad_steps > tc.max_bad_steps) {
        checkpointer.finish();
        throw Error(ErrorCode::kDiverged,
                    tc.on_bad_step == "stop" ? what + ": stopped; no update was applied and the last checkpoint is intact"
                                             : fmt::format("{}: {} bad steps in this launch, more than train.max_bad_steps = {}", what, bad_steps, tc.max_bad_steps),
                    "resume from the last checkpoint with `dstrain resume` (a transient fault will not recur), or set train.on_bad_step: skip / rollback; "
                    "lower the learning rate if the loss diverged");
      }
      if (tc.on_bad_step == "rollback") {
        if (rolled_back_at == step + 1)
          throw Error(ErrorCode::kDiverged, what + ": bad again after rolling back, so the cause is in the data or the model, not a transient fault",
                      "set train.on_bad_step: skip to pass over this step, or lower the learning rate");
        rolled_back_at = step + 1;
        checkpointer.finish();
        if (step + 1 < tc.steps) prefetched.get();  // the next step's batches: not needed now
        const Checkpointer::Resumed r = checkpointer.resume("");
        if (weighted) weights.assign(weights_state.data_ptr<float>(), weights_state.data_ptr<float>() + weights_state.numel());
        if (env.rank == 0) log::warn(fmt::format("{}: rolled back to {} (step {}); bad step {} of at most {}", what, r.dir, r.step, bad_steps, tc.max_bad_steps));
        cursor = r.samples_consumed;
        telemetry.restart_at(r.step);
        prefetched = std::async(std::launch::async, build_step, r.step, cursor, weights);
        step = r.step - 1;  // the loop's ++step continues at the checkpoint's step
        continue;
      }
      if (env.rank == 0) log::warn(fmt::format("{}: update skipped (bad step {} of at most {})", what, bad_steps, tc.max_bad_steps));
    }
    if (result.skipped && !bad && env.rank == 0)
      log::warn(fmt::format("step {}: fp16 gradients overflowed at loss scale {}: update skipped ({} skipped so far), scale now {}", step + 1,
                            result.loss_scale, engine.skipped_steps(), engine.loss_scale()));
    // MoE: every rank moves V3's selection bias by the same, globally summed expert load.
    at::Tensor expert_load;
    if (at::Tensor load = model->take_expert_load(); load.defined() && load.numel() > 0) {
      expert_load = load.to(at::kCPU, at::kFloat).contiguous();
      if (world > 1) comm->all_reduce(expert_load)->wait();
      model->update_expert_bias(expert_load);
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
    synchronize(device.device);  // the step's queued GPU work belongs to its time
    const double step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

    const int64_t done = step + 1;
    const int64_t interval = recipe.checkpoint.interval_steps;
    const bool stop = result.sums[2] > 0;  // any rank was asked: all stop at this same boundary
    // Metrics before the save: a committed checkpoint of step N always has step N's line, which a
    // resume keeps. The save's time is reported on the next line (checkpoint_ms).
    StepOutcome outcome;
    outcome.step = done;
    outcome.loss = result.sums[0];  // the ranks' parts of the global mean
    outcome.lr = lr;
    outcome.grad_norm = grad_norm;
    outcome.loss_scale = result.loss_scale;
    outcome.skipped = result.skipped;
    outcome.bad_steps = bad_steps;
    outcome.cursor = cursor;
    outcome.global_batch = batch;
    outcome.accumulation = accum;
    outcome.step_ms = step_ms;
    outcome.data_wait_ms = data_wait_ms;
    outcome.comm_wait_ms = result.comm_wait_ms;
    outcome.reduce_ms = result.reduce_wait_ms;
    outcome.gather_ms = result.gather_wait_ms;
    outcome.optimizer_ms = optimizer_ms;
    outcome.checkpoint_ms = save_ms;
    outcome.expert_load = expert_load;
    telemetry.finish_step(outcome);
    save_ms = 0;
    if (done == tc.steps || (interval > 0 && done % interval == 0) || result.sums[1] > 0 || stop) save(done);
    if (stop && done < tc.steps) {
      checkpointer.finish();
      if (env.rank == 0)
        log::warn(fmt::format("stopped as asked ({}) at step {} of {} with a checkpoint; continue with `dstrain resume {}`",
                              g_stop_requested ? "signal" : fmt::format("wall-time budget of {:g} min", recipe.launch.max_time_minutes), done, tc.steps,
                              run_dir.root()));
      progress::enter(progress::Phase::kFinished);
      return exit_status::kStopped;
    }
  }
  checkpointer.finish();  // an asynchronous save must be committed before the run ends
  progress::enter(progress::Phase::kFinished);
  return 0;
}

}  // namespace
}  // namespace dstrain::train
