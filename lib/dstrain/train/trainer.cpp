#include "dstrain/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <thread>

#include "dstrain/comm/communicator.h"
#include "dstrain/comm/parallel_groups.h"
#include "dstrain/config/recipe.h"
#include "dstrain/config/reference_mode.h"
#include "dstrain/core/error.h"
#include "dstrain/core/shutdown_sequence.h"
#include "dstrain/core/exit_code.h"
#include "dstrain/core/fault_injector.h"
#include "dstrain/core/log.h"
#include "dstrain/core/progress.h"
#include "dstrain/model/freeze.h"
#include "dstrain/model/lora.h"
#include "dstrain/model/quantized_base.h"
#include "dstrain/model/peft_import.h"
#include "dstrain/run/worker_env.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/model/mtp_loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/reward_loss.h"
#include "dstrain/model/z_loss.h"
#include "dstrain/sched/lr_schedule.h"
#include "dstrain/train/bad_step_policy.h"
#include "dstrain/train/checkpointer.h"
#include "dstrain/data/data_sources.h"
#include "dstrain/data/preference_pairs.h"
#include "dstrain/train/data_plan.h"
#include "dstrain/train/choice_scores.h"
#include "dstrain/train/task_scores.h"
#include "dstrain/train/eval_tracker.h"
#include "dstrain/train/samples.h"
#include "dstrain/train/evaluator.h"
#include "dstrain/train/live_reference.h"
#include "dstrain/envcheck/rank_check.h"
#include "dstrain/train/heartbeat.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/train/loss_share.h"
#include "dstrain/train/pipeline_runner.h"
#include "dstrain/train/reference_logps.h"
#include "dstrain/train/sequential_runner.h"
#include "dstrain/train/step_observers.h"
#include "dstrain/train/step_signals.h"
#include "dstrain/train/step_triggers.h"
#include "dstrain/train/step_profiler.h"
#include "dstrain/train/telemetry.h"
#include "dstrain/device/training_device.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

config::Recipe checked_recipe(const run::WorkerEnv& env) {
  config::Recipe recipe = config::read_resolved_config(run::RunDir(env.run_dir).config_path());
  if (env.world_size != recipe.world_size())
    throw Error(ErrorCode::kEnvironment,
                fmt::format("WORLD_SIZE={} but the config was resolved for {} ranks", env.world_size, recipe.world_size()),
                "start workers through `dstrain train`/`dstrain resume`, which resolve the config for the actual world size");
  return recipe;
}

// On GPUs the engine's collectives (gradients, parameters, the step's scalars and flags) go over
// NCCL; Gloo carries the rest on CPU (metrics, straggler times, expert load, checkpoint
// summaries and barriers, the environment check). The parallel groups (data, pipeline, expert)
// are split from that world once, by the recipe's layout (comm/parallel_groups.h).
struct Communicators {
  std::unique_ptr<comm::Communicator> gloo, nccl;
  comm::ParallelGroups groups;
  comm::Communicator& world() { return nccl ? *nccl : *gloo; }
  comm::Communicator& engine() { return groups.data(); }
  comm::Communicator* pipeline() const { return groups.pipeline.get(); }
  zero::ExpertGroups experts() const { return {groups.expert_parallel.get(), groups.expert_data.get()}; }
};

Communicators open_communicators(const run::WorkerEnv& env, const config::Recipe& recipe, const device::TrainingDevice& device) {
  const comm::Endpoint endpoint =
      comm::endpoint_of(env, std::chrono::seconds(recipe.launch.timeout_s),
                        std::chrono::seconds(recipe.launch.collective_timeout_s + recipe.launch.heartbeat_timeout_s));
  Communicators c;
  c.gloo = comm::make_gloo_communicator(endpoint, env.rank, env.world_size);
  if (device.device.is_cuda()) {
    comm::Endpoint client = endpoint;
    client.host_store = client.publish_run_id = false;  // done already, through the Gloo communicator
    c.nccl = comm::make_nccl_communicator(client, env.rank, env.world_size, device.device.index());
  }
  c.groups = comm::open_parallel_groups(c.world(), recipe.layout());
  if (env.rank == 0)
    log::info(device.device.is_cuda() ? fmt::format("training on GPUs: rank 0 on {} ({}, {:.1f} GiB); gradients and parameters over NCCL",
                                                    device.device.str(), device.name, device.memory_gib)
                                      : std::string("training on CPU (no GPU visible); collectives over Gloo"));
  return c;
}

// LoRA, on the base's weights and before the engine (only what trains gets optimizer state): the
// adapters, lora.init_from's values on a fresh start, and lora.base's quantized storage.
void attach_adapters(const config::Recipe& r, model::CausalLM& model, const run::WorkerEnv& env, const c10::Device& device) {
  const size_t adapted = model::attach_lora(model, model::lora_spec_of(r.lora), r.seed);
  if (env.rank == 0) log::info(model::describe_lora(model, model::lora_spec_of(r.lora), adapted));
  if (!env.resume && !r.lora.init_from.empty()) {
    model::load_peft_adapter(model, r);
    if (env.rank == 0) log::info(fmt::format("lora: adapters initialised from {}", r.lora.init_from));
  }
  if (r.lora.base != config::LoraBase::kModel) {  // the base leaves the parameters the engine takes
    const model::QuantizedBase q = model::quantize_base(model, r, device);
    if (env.rank == 0) log::info(model::describe_quantized_base(q, config::name(r.precision.dtype)));
  }
}

// preference.reference live without LoRA: a frozen copy of the starting model in an engine of its
// own (the same sharding, every parameter frozen); else null.
std::unique_ptr<LiveReference> reference_copy_for(const config::Recipe& r, Communicators& comm, const c10::Device& device) {
  if (!config::keeps_reference_copy(r)) return nullptr;
  auto copy = frozen_starting_model(r, comm.groups.expert_parallel.get(), device);
  auto engine = std::make_unique<zero::Engine>(*copy, comm.engine(), zero::options_from(r, device), comm.experts());
  if (comm.engine().rank() == 0 && comm.gloo->rank() == 0)
    log::info(fmt::format("preference.reference live: a frozen copy of the starting model ({}), {:.3f}M parameters",
                          r.model.init_from.empty() ? "model.seed" : r.model.init_from, static_cast<double>(copy->num_parameters()) / 1e6));
  return std::make_unique<LiveReference>(r, std::move(copy), std::move(engine), device);
}

// Task scoring and samples generate whole sequences on each rank (the questions and prompts are
// shared out as under data parallelism): no sequence group while they run.
class WholeSequences {
 public:
  explicit WholeSequences(model::CausalLM& model) : model_(model), group_(model.sequence_group()) { model_.set_sequence_group(nullptr); }
  ~WholeSequences() { model_.set_sequence_group(group_); }
  WholeSequences(const WholeSequences&) = delete;
  WholeSequences& operator=(const WholeSequences&) = delete;

 private:
  model::CausalLM& model_;
  comm::Communicator* group_;
};

}  // namespace

// Everything the loop uses, in construction order (destroyed in reverse: telemetry and the
// checkpointer's writer before the engine, the data prefetch before the stream, the heartbeat
// and the communicators last).
struct Trainer::Parts {
  const run::WorkerEnv& env;
  const device::TrainingDevice& device;
  const run::RunDir run_dir;
  const config::Recipe recipe;
  FaultInjector& faults = FaultInjector::get();
  Communicators comm;
  std::unique_ptr<HeartbeatSender> heartbeat;
  std::unique_ptr<model::CausalLM> model;
  std::unique_ptr<DataPlan> data;
  ShardBalancer balancer;
  const sched::LrSchedule lr_schedule;
  std::unique_ptr<zero::Engine> engine;
  std::unique_ptr<model::TensorState> buffers;
  std::unique_ptr<ReferenceIdentity> reference_identity;  // preference.reference live's copy: what it is made from
  std::unique_ptr<Checkpointer> checkpointer;
  std::unique_ptr<Telemetry> telemetry;
  std::unique_ptr<StepProfiler> profiler;
  std::unique_ptr<model::Objective> objective;
  std::unique_ptr<StepRunner> runner;  // sequential, or parallel.pipeline_parallel_size > 1's pipeline
  std::unique_ptr<FaultObserver> fault_observer;
  std::unique_ptr<ComputeTimes> compute_times;
  std::unique_ptr<Evaluator> evaluator;           // eval.paths / eval.split
  data::TaskSet eval_tasks;                       // eval.tasks
  std::unique_ptr<SampleWriter> samples;          // eval.samples
  std::unique_ptr<LiveReference> live_reference;  // preference.reference live
  EvalTracker eval_tracker;
  StepTriggers triggers;
  BadStepPolicy bad_steps;
  int64_t step = 0;    // the step being computed, 0-based
  int64_t cursor = 0;  // samples consumed: the global data position
  double save_ms = 0;  // the last step's checkpoint time (wall_clock_breakdown)
  ShutdownSequence ending;

  Parts(const run::WorkerEnv& e, const device::TrainingDevice& d)
      : env(e), device(d), run_dir(e.run_dir), recipe(checked_recipe(e)), balancer(recipe, e.rank, e.world_size),
        lr_schedule(sched::lr_schedule_from(recipe)), eval_tracker(recipe), triggers(recipe, run_dir, e.rank), bad_steps(recipe, e.rank) {}
  int64_t steps() const { return recipe.train.steps; }
  int64_t global_batch(int64_t s) const { return config::global_batch_at(recipe, s); }
};

Trainer::Trainer(const run::WorkerEnv& env, const device::TrainingDevice& device) : p_(std::make_unique<Parts>(env, device)) {
  Parts& p = *p_;
  at::set_num_threads(env.threads);
  p.comm = open_communicators(env, p.recipe, device);
  // The launcher watches these: a rank gone silent or a collective past launch.collective_timeout_s
  // is reported by rank and op. The worker's own collective timeout is the backstop.
  p.heartbeat = std::make_unique<HeartbeatSender>(env, static_cast<double>(p.recipe.launch.heartbeat_timeout_s));
  // Every rank's software, hardware, config and data files alike (check-env without its probes).
  if (p.recipe.launch.env_check && env.env_check) envcheck::preflight_env_check(*p.comm.gloo, env.group_rank, p.recipe);
  // With pipeline parallelism, this rank's stages only (their parameters under their global names).
  const model::HeldGroups held = p.comm.pipeline() ? pipeline_rank_groups(p.recipe, p.comm.pipeline()->rank()) : model::HeldGroups{};
  p.model = model::make_model(p.recipe.model, p.recipe.seed, model::scalar_type(p.recipe.precision.dtype),
                              p.comm.groups.expert_parallel.get(), model::Init::kRandom, held);
  if (!p.recipe.train.freeze.empty()) {  // before the engine: frozen parameters get no optimizer state
    const model::FrozenSet frozen = model::frozen_set(p.recipe.model, p.recipe.train.freeze);
    model::apply_frozen_set(*p.model, frozen);
    if (env.rank == 0) log::info(model::describe_frozen(p.recipe.model, frozen));
  }
  // Initialised on the CPU (the same values everywhere); the engine moves the parameters.
  p.model->move_buffers_to(device.device);
  p.model->set_activation_checkpointing(p.recipe.train.activation_checkpointing);
  data::DataSources sources = data::open_data_sources(p.recipe, p.recipe.eval.enabled(), p.comm.engine().rank());
  // A sequence group's ranks read the same rows (config/parallel_layout.h), each its share of their tokens.
  const config::ParallelLayout layout = p.recipe.layout();
  const int data_rank = p.comm.engine().rank();
  p.data = std::make_unique<DataPlan>(
      p.recipe, layout.sample_rank(data_rank), layout.samples(), std::move(sources.train),
      data::SequenceShare{layout.sequence_rank(data_rank), layout.sequence, static_cast<int>(p.recipe.model.mtp_depth)});
  p.model->set_sequence_group(p.comm.groups.sequence.get());
  // A LoRA checkpoint names its base instead of holding it: a resume reads the base again.
  if ((!env.resume || model::lora_checkpoints_name_base(p.recipe)) && !p.recipe.model.init_from.empty()) {
    model::load_hf_weights(p.recipe.model.init_from, p.recipe.model, p.model->parameters(), p.model->buffers());
    if (env.rank == 0) log::info(fmt::format("initialised from {}", p.recipe.model.init_from));
  }
  if (p.recipe.lora.enabled()) attach_adapters(p.recipe, *p.model, env, device.device);
  p.engine = std::make_unique<zero::Engine>(*p.model, p.comm.engine(), zero::options_from(p.recipe, device.device), p.comm.experts(),
                                            p.comm.pipeline() ? &p.comm.world() : nullptr);
  if (env.rank == 0) log::info(p.engine->describe()), write_memory_report(p.run_dir, *p.engine);
  p.buffers = std::make_unique<model::TensorState>(p.model->buffers());
  // The model's buffers (V3's selection bias) belong to layers: with pipeline parallelism each
  // stage's first data-parallel rank saves its own.
  std::vector<model::Stateful*> replicated{&p.balancer, &p.eval_tracker};
  p.live_reference = reference_copy_for(p.recipe, p.comm, device.device);
  if (p.live_reference && !p.recipe.preference.sync_ref_model)  // a resume makes the copy again: from the same weights
    p.reference_identity = std::make_unique<ReferenceIdentity>(p.recipe, *p.comm.gloo), replicated.push_back(p.reference_identity.get());
  if (!p.comm.pipeline()) replicated.insert(replicated.begin(), p.buffers.get());
  p.checkpointer = std::make_unique<Checkpointer>(p.recipe, p.run_dir.ckpt_dir(p.recipe), *p.comm.gloo, *p.engine, replicated, env.run_id);
  if (p.comm.pipeline()) p.checkpointer->set_stage_state({{p.buffers.get()}, p.comm.engine().rank() == 0});
  if (p.live_reference && p.recipe.preference.sync_ref_model)  // TR-DPO's copy moves: checkpoints hold it
    p.checkpointer->add_copy(*p.live_reference->copy_engine(), kReferenceCopyPrefix);
  progress::enter(progress::Phase::kCheckpoint);
  if (env.resume) {
    const auto load_start = Clock::now();
    const Checkpointer::Resumed r = p.checkpointer->resume(env.resume_from);
    p.step = r.step, p.cursor = r.samples_consumed;
    if (env.rank == 0)
      log::info(fmt::format("resumed from {} at step {} ({} samples consumed; loaded in {:.2f} s)", r.dir, p.step, p.cursor,
                            ms_since(load_start) / 1000.0));
  }
  if (env.rank == 0) {
    log::info(
        fmt::format("model: {:.3f}M parameters{}; data: {} {} of {} tokens; {} steps, first global batch {} ({} accumulation x {} "
                    "data-parallel ranks x {})",
                    static_cast<double>(p.model->num_parameters()) / 1e6, p.comm.pipeline() ? " in pipeline rank 0's stages" : "",
                    p.data->num_samples(),
                    p.recipe.train.objective == config::TrainObjective::kKto ? "KTO examples (2 rows each: the example, its KL sequence)"
                    : p.recipe.train.trains_pairs()                          ? "preference pairs (2 rows each)"
                                                                             : "samples",
                    p.recipe.data.seq_len, p.steps(), p.global_batch(p.step), config::accumulation_at(p.recipe, p.step),
                    p.recipe.data_parallel_size(), p.recipe.train.micro_batch_size));
    if (p.step >= p.steps()) log::info(fmt::format("the run is already complete ({} of {} steps); nothing to do", p.step, p.steps()));
  }
  if (p.comm.pipeline() && p.comm.engine().rank() == 0) {  // each pipeline rank's first data-parallel rank says what it holds
    std::string stages;
    for (int s : pipeline_rank_stages(p.recipe, p.comm.pipeline()->rank()))
      stages += (stages.empty() ? "" : "; ") + describe_stage(p.recipe, s);
    const zero::MemoryReport m = p.engine->memory();  // next to --dry-run's plan of the pipeline rank's states
    const double states = static_cast<double>(m.params + m.host_params + m.grads + m.master + m.optimizer);
    log::info(fmt::format("pipeline rank {} of {}: {}; {:.3f}M parameters, model states {:.1f} MiB per rank", p.comm.pipeline()->rank(),
                          p.comm.pipeline()->world_size(), stages, static_cast<double>(p.model->num_parameters()) / 1e6,
                          states / 1048576.0));
  }
  p.telemetry = std::make_unique<Telemetry>(p.recipe, p.run_dir, *p.comm.gloo, p.step, env.threads, device, env.progress_line);
  p.profiler = std::make_unique<StepProfiler>(p.recipe.logging.profile_step, p.run_dir.root() + "/profile", env.rank, device.device);
  p.objective = std::make_unique<model::Objective>(p.recipe.train.loss_chunk_tokens);
  model::add_mtp_terms(*p.objective, p.recipe.model, p.cursor * p.recipe.data.seq_len);
  model::add_z_loss_term(*p.objective, p.recipe.train.z_loss_weight);
  model::set_pair_loss(*p.objective, p.recipe.train.objective, p.recipe.preference);
  if (p.comm.pipeline()) {
    p.runner = std::make_unique<PipelineRunner>(p.recipe, *p.model, *p.objective, *p.engine, *p.comm.pipeline(), device.device);
  } else {
    auto sequential = std::make_unique<SequentialRunner>(*p.model, *p.objective, p.engine.get(), device.device);
    sequential->set_time_phases(device.device.is_cuda() && p.recipe.logging.wall_clock_breakdown);
    sequential->set_normalization(p.recipe.train.loss_normalization);
    p.runner = std::move(sequential);
  }
  if (!sources.preference.empty()) {  // before any update: the starting model is the reference
    prepare_reference_logps(p.recipe, sources.preference, *p.runner, *p.model, p.comm.engine(),
                            env.resume ? fmt::format("a resumed {} run", config::name(p.recipe.train.objective)) : "");
    p.engine->discard_wait_times();
  }
  if (!p.live_reference && config::reads_live_reference(p.recipe))  // with LoRA: the model with its adapters off
    p.live_reference = std::make_unique<LiveReference>(p.recipe, *p.runner, *p.model);
  p.fault_observer = std::make_unique<FaultObserver>(p.faults, env.rank, p.step);
  p.compute_times = std::make_unique<ComputeTimes>(*p.telemetry, p.balancer);
  p.runner->add_observer(p.fault_observer.get());
  p.runner->add_observer(p.compute_times.get());
  p.eval_tasks = read_eval_tasks(p.recipe);
  if (!p.recipe.eval.samples.empty()) p.samples = std::make_unique<SampleWriter>(p.recipe);
  if (!sources.eval.empty()) {
    if (env.rank == 0)
      for (const data::EvalSet& set : sources.eval) log::info(set.describe());
    p.evaluator = std::make_unique<Evaluator>(std::move(sources.eval), eval_options_from(p.recipe), *p.model, p.engine.get(), *p.runner,
                                              p.comm.engine(), *p.comm.gloo);
    p.evaluator->set_pair_objective(p.objective.get());
    p.evaluator->set_live_reference(p.live_reference.get());
    if (p.recipe.checkpoint.keep_best) p.checkpointer->set_best_step(p.eval_tracker.best_step());
  }
  plan_shutdown();
}

void Trainer::plan_shutdown() {
  Parts& p = *p_;
  // Threads first (they use the communicators and the engine), then the device's queued work,
  // then the tensors, then the communicators that the tensors' collectives ran on.
  p.ending.add("data prefetch thread", [&p] { p.data.reset(); });
  p.ending.add("evaluation sets", [&p] { p.evaluator.reset(); });
  p.ending.add("checkpoint writer thread", [&p] {
    std::unique_ptr<Checkpointer> c = std::move(p.checkpointer);
    c->finish();
  });
  p.ending.add("metrics and TensorBoard files", [&p] { p.telemetry.reset(); });
  p.ending.add("heartbeat thread", [&p] { p.heartbeat.reset(); });
  p.ending.add("device work", [&p] { device::synchronize(p.device.device); });
  p.ending.add("engine, model and buffers",
               [&p] { p.live_reference.reset(), p.runner.reset(), p.engine.reset(), p.buffers.reset(), p.model.reset(); });
  p.ending.add("expert-parallel communicators", [&p] { p.comm.groups.expert_parallel.reset(), p.comm.groups.expert_data.reset(); });
  p.ending.add("pipeline communicators", [&p] { p.comm.groups.pipeline.reset(), p.comm.groups.data_parallel.reset(); });
  p.ending.add("NCCL communicator", [&p] { p.comm.nccl.reset(); });
  p.ending.add("Gloo communicator and its threads", [&p] { p.comm.gloo.reset(); });
  p.ending.add("device memory cache", [&p] { device::release_cached_memory(p.device.device); });
}

Trainer::~Trainer() {
  if (p_) p_->ending.run_quietly();  // an error unwinds: end in the same order, without new errors
}

void Trainer::shutdown() {
  p_->ending.run();
  log::debug(fmt::format("shut down ({} threads left in this process)", thread_count()));
}

const std::vector<std::string>& Trainer::shutdown_steps() const { return p_->ending.ran(); }

int Trainer::run() {
  const int status = train_to_end();
  shutdown();
  return status;
}

int Trainer::train_to_end() {
  Parts& p = *p_;
  // Batches are built one step ahead on a background thread, so a step waits for data only
  // when reading is slower than computing.
  if (p.eval_tracker.stopped()) {
    if (p.env.rank == 0)
      log::info(
          fmt::format("the run stopped early at step {} (eval.early_stopping_patience): nothing to do; the best checkpoint is "
                      "step {}",
                      p.step, p.eval_tracker.best_step()));
    return 0;
  }
  if (p.step < p.steps()) p.data->prefetch(p.step, p.cursor, p.balancer.weights());
  if (evaluates() && p.recipe.eval.at_start && p.step == 0) evaluate(0, /*candidate=*/false);
  while (p.step < p.steps()) {
    p.profiler->begin(p.step + 1);  // logging.profile_step
    const StepEnd end = step();
    p.profiler->end();
    if (end == StepEnd::kStopped) return exit_status::kStopped;
    if (end == StepEnd::kStoppedEarly) break;
  }
  p.checkpointer->finish();  // an asynchronous save must be committed before the run ends
  progress::enter(progress::Phase::kFinished);
  return 0;
}

// The host's part of a step's one scalar all-reduce, in segments every rank adds alike: save and
// stop wishes, and on the steps that need them every rank's straggler times and data rates, and
// the pipeline's compute and schedule times.
struct Trainer::StepControl {
  StepSums sums;
  bool stragglers = false, rebalance = false;
  size_t signals_part = 0, straggler_part = 0, rate_part = 0, bubble_part = 0;
};

Trainer::StepControl Trainer::control_of(const StepTotals& totals) {
  Parts& p = *p_;
  StepControl c;
  c.signals_part = c.sums.add(StepSignals{p.triggers.save_wanted(), p.triggers.stop_wanted()}.pack());
  c.stragglers = p.telemetry->stragglers_due(p.step + 1);
  if (c.stragglers) c.straggler_part = c.sums.add_row(p.env.rank, p.env.world_size, p.telemetry->straggler_sample());
  c.rebalance = p.balancer.rebalance_due(p.step + 1);
  if (c.rebalance) c.rate_part = c.sums.add_row(p.env.rank, p.env.world_size, {p.balancer.rate()});
  if (p.comm.pipeline()) c.bubble_part = c.sums.add({totals.pipeline_compute_ms, totals.pipeline_schedule_ms});
  return c;
}

Trainer::StepEnd Trainer::step() {
  Parts& p = *p_;
  StepTimes times;
  const auto t0 = Clock::now();
  progress::set_step(p.step + 1);
  progress::enter(progress::Phase::kData);
  std::vector<data::Batch> batches = p.data->take();
  if (p.live_reference) p.live_reference->fill(batches);  // the step's reference log-probs, before its forward
  times.data_wait_ms = ms_since(t0);
  if (p.step + 1 < p.steps()) p.data->prefetch(p.step + 1, p.cursor + p.global_batch(p.step), p.balancer.weights());
  // Skipped (fp16 overflow) steps do not advance the schedule or Adam's bias correction.
  const int64_t applied = p.step - p.engine->skipped_steps();
  const double lr = sched::lr_at(p.lr_schedule, applied) * sched::batch_lr_factor(p.recipe, p.step);
  const sched::Betas betas = sched::betas_at(p.lr_schedule, applied);
  if (p.faults.overflow_at(p.step + 1)) p.engine->mark_gradients_nonfinite();
  // The loss is divided by the global batch's units (train.loss_normalization: its trained
  // targets by default): one small all-reduce over the engine's communicator.
  const int64_t global_units = step_units(p.comm.engine(), batches, p.recipe);
  if (p.recipe.model.mtp_depth > 0) model::set_mtp_weights(*p.objective, p.recipe.model, p.cursor * p.recipe.data.seq_len);
  const StepTotals totals = p.runner->train(batches, global_units);
  progress::enter(progress::Phase::kOptimizer);
  const auto o0 = Clock::now();
  // The step's control data and loss sums ride the engine's one scalar all-reduce (NCCL on GPUs),
  // the only read of the step's values to the host; a NaN loss there makes every rank skip.
  StepControl control = control_of(totals);
  const zero::StepResult result = p.engine->step(lr, applied + 1, {control.sums.values(), totals.values}, betas.beta1, betas.beta2);
  const HostTotals all_totals = read_totals(result.device_sums, totals.trained_targets);
  const StepSignals all = StepSignals::unpack(control.sums.segment(result.sums, control.signals_part));
  if (p.recipe.logging.wall_clock_breakdown) device::synchronize(p.device.device);  // the update's kernels belong to its phase
  times.optimizer_ms = ms_since(o0);
  if (p.bad_steps.judge(p.step + 1, result, all_totals.loss) == BadStepPolicy::Action::kRollback) {
    roll_back();
    return StepEnd::kRolledBack;
  }
  if (result.skipped && p.recipe.precision.dtype == config::Dtype::kFp16 && p.env.rank == 0)
    log::warn(fmt::format("step {}: fp16 gradients overflowed at loss scale {}: update skipped ({} skipped so far), scale now {}",
                          p.step + 1, result.loss_scale, p.engine->skipped_steps(), p.engine->loss_scale()));
  p.cursor += p.global_batch(p.step);
  if (control.rebalance) {  // the next step's batches were built with the old shares
    p.balancer.rebalance(p.step + 1, control.sums.segment(result.sums, control.rate_part));
    p.data->discard();
    p.data->prefetch(p.step + 1, p.cursor, p.balancer.weights());
  }
  device::synchronize(p.device.device);  // the step's queued GPU work belongs to its time
  times.step_ms = ms_since(t0);
  // Metrics before the save: a committed checkpoint of step N always has step N's line, which a
  // resume keeps. The save's time is reported on the next line (checkpoint_ms).
  p.telemetry->finish_step(outcome_of(result, control, all_totals, lr, static_cast<int64_t>(batches.size()), times));
  return end_step(all);
}

StepOutcome Trainer::outcome_of(const zero::StepResult& result, const StepControl& control, const HostTotals& totals, double lr,
                                int64_t accumulation, const StepTimes& times) {
  Parts& p = *p_;
  StepOutcome o;
  o.step = p.step + 1, o.loss = totals.loss, o.lr = lr, o.grad_norm = result.grad_norm, o.loss_scale = result.loss_scale,
  o.skipped = result.skipped;
  if (p.data->fine_tuning()) o.epoch = static_cast<double>(p.cursor) / static_cast<double>(std::max<int64_t>(p.data->num_samples(), 1));
  o.bad_steps = p.bad_steps.bad_steps(), o.cursor = p.cursor, o.global_batch = p.global_batch(p.step), o.accumulation = accumulation;
  o.step_ms = times.step_ms, o.data_wait_ms = times.data_wait_ms, o.optimizer_ms = times.optimizer_ms, o.checkpoint_ms = p.save_ms;
  o.comm_wait_ms = result.comm_wait_ms, o.reduce_ms = result.reduce_wait_ms, o.gather_ms = result.gather_wait_ms;
  o.expert_load = result.expert_load;
  o.all_to_all_ms = p.model->take_all_to_all_wait_ms();
  if (control.stragglers) o.straggler_times = control.sums.segment(result.sums, control.straggler_part);
  // The objective's terms, by the metric each is logged under: its sum over its targets, all ranks.
  size_t term = 0;
  for (const model::MetricShape& metric : p.objective->metrics()) {
    metrics::ObjectiveMetric named{metric.name, {}};
    for (size_t k = 0; k < metric.values; ++k, ++term)
      named.values.push_back(totals.term_sums.at(term) / std::max(totals.term_counts.at(term), 1.0));
    o.objective.push_back(std::move(named));
  }
  if (p.comm.pipeline()) {  // idle over compute, every rank's summed: the papers' measure, (p - 1) / m for 1F1B
    const std::vector<double> pipeline = control.sums.segment(result.sums, control.bubble_part);
    if (pipeline[0] > 0) o.pipeline_bubble = (pipeline[1] - pipeline[0]) / pipeline[0];
  }
  return o;
}

void Trainer::roll_back() {
  Parts& p = *p_;
  p.checkpointer->finish();
  p.data->discard();  // the next step's batches: not needed now
  const Checkpointer::Resumed r = p.checkpointer->resume("");
  if (p.env.rank == 0)
    log::warn(fmt::format("{}: rolled back to {} (step {}); bad step {} of at most {}", p.bad_steps.describe(), r.dir, r.step,
                          p.bad_steps.bad_steps(), p.bad_steps.max_bad_steps()));
  p.step = r.step, p.cursor = r.samples_consumed;
  p.telemetry->restart_at(r.step);
  p.data->prefetch(p.step, p.cursor, p.balancer.weights());
}

void Trainer::save(int64_t steps_done) {
  Parts& p = *p_;
  progress::enter(progress::Phase::kCheckpoint);
  const auto t0 = Clock::now();
  const std::string dir = p.checkpointer->save(steps_done, p.cursor);
  const double seconds = ms_since(t0) / 1000.0;
  if (p.env.rank == 0) {
    // Young/Daly: the interval that minimises lost work plus save time is sqrt(2 x save x MTBF).
    const double mtbf_s = p.recipe.checkpoint.mtbf_hours * 3600.0;
    log::info(
        fmt::format("{}: {} (training blocked {:.2f} s); Young/Daly interval for an MTBF of {:g} h: {:.1f} min (checkpoint.mtbf_hours)",
                    p.checkpointer->async() ? "checkpoint being written in the background" : "checkpoint saved", dir, seconds,
                    p.recipe.checkpoint.mtbf_hours, std::sqrt(2.0 * std::max(seconds, 1e-3) * mtbf_s) / 60.0));
  }
  p.triggers.saved();
  p.save_ms += seconds * 1000.0;
}

EvalTracker::Verdict Trainer::evaluate(int64_t done, bool candidate) {
  Parts& p = *p_;
  progress::enter(progress::Phase::kForward);
  // ZeRO-Offload's delayed update: the weights a checkpoint of this step would hold (as a save,
  // the evaluation applies the pending update now).
  if (p.recipe.zero.delayed_update) p.engine->settle();
  score_tasks(done);
  write_samples(done);
  if (!p.evaluator) return {};
  const std::vector<EvalResult> results = p.evaluator->evaluate();
  EvalTracker::Verdict verdict;
  std::string note;
  if (candidate) {
    verdict = p.eval_tracker.record(done, results.front().loss);
    const int64_t patience = p.recipe.eval.early_stopping_patience;
    note = verdict.improved
               ? "best so far"
               : fmt::format("best {:.4f} at step {}{}", p.eval_tracker.best(), p.eval_tracker.best_step(),
                             patience > 0 ? fmt::format(", {} of {} without improvement", p.eval_tracker.since_best(), patience) : "");
    if (verdict.improved && p.recipe.checkpoint.keep_best) p.checkpointer->set_best_step(done);
  }
  std::vector<metrics::EvalMetrics> rows;
  for (const EvalResult& r : results) {
    metrics::EvalMetrics m;
    m.step = done, m.name = r.name, m.val_loss = r.loss, m.val_ppl = r.ppl, m.val_tokens = r.tokens, m.eval_ms = r.ms;
    m.pairs = r.pairs, m.metrics = r.metrics;
    rows.push_back(m);
  }
  p.telemetry->record_eval(rows, note);
  return verdict;
}

void Trainer::score_tasks(int64_t done) {
  Parts& p = *p_;
  if (p.eval_tasks.empty()) return;
  const WholeSequences whole(*p.model);
  const auto start = std::chrono::steady_clock::now();
  const TaskResults r = train::score_tasks(p.eval_tasks, *p.model, p.recipe.model.max_seq_len, p.device.device, p.comm.engine(), done);
  // What the forwards left for training's step, as the evaluator does: the expert load and the waits.
  p.model->take_expert_load();
  p.model->take_all_to_all_wait_ms();
  p.engine->discard_wait_times();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::vector<metrics::TaskMetrics> rows;
  for (const TaskScore& s : r.scores) {
    metrics::TaskMetrics m;
    m.step = done, m.name = s.name, m.acc = s.acc, m.acc_norm = s.acc_norm, m.questions = s.questions, m.eval_ms = ms;
    m.exact_match = s.exact_match, m.exact_match_flexible = s.exact_match_flexible;
    rows.push_back(m);
  }
  p.telemetry->record_tasks(rows);
}

void Trainer::write_samples(int64_t done) {
  Parts& p = *p_;
  if (!p.samples) return;
  const WholeSequences whole(*p.model);
  const std::vector<Sample> samples = p.samples->generate(*p.model, p.device.device, done);
  p.model->take_all_to_all_wait_ms();  // the next step's timing is training's own
  p.engine->discard_wait_times();
  p.telemetry->record_samples(done, samples);
}

bool Trainer::evaluates() const { return p_->evaluator || !p_->eval_tasks.empty() || p_->samples; }

bool Trainer::eval_due(int64_t done) const {
  const config::EvalConfig& e = p_->recipe.eval;
  return evaluates() && ((e.interval_steps > 0 && done % e.interval_steps == 0) || (e.at_end && done == p_->steps()));
}

Trainer::StepEnd Trainer::end_step(const StepSignals& all) {
  Parts& p = *p_;
  const int64_t done = ++p.step;
  p.save_ms = 0;
  if (p.live_reference && p.live_reference->after_step(*p.engine, done) && p.env.rank == 0)
    log::info(fmt::format("step {}: the reference moved toward the policy (preference.sync_ref_model, alpha {:g})", done,
                          p.recipe.preference.ref_model_mixup_alpha));
  const EvalTracker::Verdict verdict = eval_due(done) ? evaluate(done, /*candidate=*/true) : EvalTracker::Verdict{};
  const bool save_best = verdict.improved && p.recipe.checkpoint.keep_best;
  if (p.triggers.save_after(done, all) || save_best || verdict.stop) save(done);
  if (verdict.stop) {
    p.checkpointer->finish();
    if (p.env.rank == 0)
      log::warn(
          fmt::format("stopped early at step {} of {}: {} evaluations without an improvement of {} by more than {:g} "
                      "(eval.early_stopping_patience); the best, {:.4f}, was at step {}{}",
                      done, p.steps(), p.eval_tracker.since_best(), p.evaluator->sets().front().name(),
                      p.recipe.eval.early_stopping_min_delta, p.eval_tracker.best(), p.eval_tracker.best_step(),
                      p.recipe.checkpoint.keep_best ? fmt::format(" (ckpt/best: {})", p.run_dir.ckpt_dir(p.recipe) + "/best") : ""));
    progress::enter(progress::Phase::kFinished);
    return StepEnd::kStoppedEarly;
  }
  if (!all.stop || done >= p.steps()) return StepEnd::kNext;
  p.checkpointer->finish();  // any rank was asked: all stop at this same boundary
  if (p.env.rank == 0)
    log::warn(fmt::format("stopped as asked ({}) at step {} of {} with a checkpoint; continue with `dstrain resume {}`",
                          p.triggers.stop_reason(), done, p.steps(), p.run_dir.root()));
  progress::enter(progress::Phase::kFinished);
  return StepEnd::kStopped;
}

}  // namespace dstrain::train
