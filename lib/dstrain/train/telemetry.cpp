#include "dstrain/train/telemetry.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dstrain/comm/communicator.h"
#include "dstrain/cost/dry_run.h"
#include "dstrain/cost/memory_plan.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/host.h"
#include "dstrain/core/log.h"
#include "dstrain/run/progress_line.h"
#include "dstrain/metrics/sinks.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {
namespace {

metrics::SinkOptions sink_options(const config::Recipe& r, const run::RunDir& run_dir, int64_t keep_through_step) {
  metrics::SinkOptions o;
  o.keep_through_step = keep_through_step;
  // The wandb and mlflow sinks follow metrics.jsonl (launch/tracker.h).
  if (r.logging.has_sink(config::Sink::kJsonl) || r.logging.has_tracker()) o.jsonl_path = run_dir.metrics_path();
  if (r.logging.has_sink(config::Sink::kCsv)) o.csv_dir = r.logging.csv_dir.empty() ? run_dir.root() + "/csv" : r.logging.csv_dir;
  if (r.logging.has_sink(config::Sink::kTensorboard))
    o.tensorboard_dir = r.logging.tensorboard_dir.empty() ? run_dir.root() + "/tensorboard" : r.logging.tensorboard_dir;
  return o;
}

}  // namespace

void write_memory_report(const run::RunDir& run_dir, const zero::Engine& engine) {
  const zero::MemoryReport m = engine.memory();
  const std::string json = fmt::format(
      "{{\"version\": 1, \"params_bytes\": {}, \"host_params_bytes\": {}, \"grads_bytes\": {}, \"master_bytes\": {}, "
      "\"optimizer_bytes\": {}, \"formula_params_bytes\": {}, \"formula_grads_bytes\": {}, \"formula_optimizer_bytes\": {}, "
      "\"parameters\": {}}}\n",
      m.params, m.host_params, m.grads, m.master, m.optimizer, m.formula_params, m.formula_grads, m.formula_optimizer,
      engine.layout().numel());
  write_file_atomic(run_dir.root() + "/memory.json", json);
}

double resident_mb() {
  long pages = 0, resident = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1048576.0;
}

double peak_resident_mb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

namespace {

// A resume or rollback at `step`: samples.jsonl keeps the rows of steps up to it (the steps after
// are trained again and write theirs again), as the metric sinks keep their lines.
void keep_samples_through(const run::RunDir& run_dir, int64_t step) {
  const std::string path = run_dir.root() + "/samples.jsonl";
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("step") && row["step"].is_number_integer() && row["step"].get<int64_t>() <= step)
      kept += line + "\n";
  }
  write_file_atomic(path, kept);
}

}  // namespace

Telemetry::Telemetry(const config::Recipe& recipe, const run::RunDir& run_dir, comm::Communicator& comm, int64_t start_step, int threads,
                     const device::TrainingDevice& device, bool progress_line)
    : recipe_(recipe), run_dir_(run_dir), comm_(comm), device_(device.device), first_step_(start_step),
      started_(std::chrono::steady_clock::now()) {
  console_ = recipe.logging.has_sink(config::Sink::kConsole);
  progress_ = comm.rank() == 0 && progress_line;
  flops_per_token_ = cost::flops_per_token(recipe.model, recipe.data.seq_len);
  if (comm.rank() == 0) {
    sinks_ = std::make_unique<metrics::MetricSinks>(sink_options(recipe, run_dir, start_step));
    if (start_step > 0) keep_samples_through(run_dir, start_step);
    // A GPU's datasheet peak for the training dtype (dense), else one measured on the GPU; on CPU
    // the best fp32 GEMM this rank's threads reach is the honest denominator. The log says which.
    std::string source;
    if (device.device.is_cuda()) {
      peak_tflops_ = device::datasheet_peak_tflops(device.name, recipe.precision.dtype);
      source = fmt::format("the {} datasheet's dense {} peak", device.name,
                           recipe.precision.dtype == config::Dtype::kFp32 ? "fp32" : "bf16/fp16 tensor-core");
      if (peak_tflops_ <= 0) {
        peak_tflops_ = device::measured_gpu_peak_tflops(device.device, recipe.precision.dtype);
        source = fmt::format("measured ({} 4096x4096 GEMM on {}, not in the datasheet table)", config::name(recipe.precision.dtype),
                             device.name);
      }
    } else {
      peak_tflops_ = device::measured_cpu_peak_tflops();
      source = fmt::format("measured (fp32 1024x1024 GEMM, {} thread{}: no GPU)", threads, threads == 1 ? "" : "s");
    }
    log::info(
        fmt::format("MFU: {:.3g} model FLOPs per token (6N + attention, no causal discount) against a peak of {:.3f} TFLOP/s per rank, {}",
                    flops_per_token_, peak_tflops_, source));
  }
  if (recipe.logging.straggler_interval > 0 && comm.world_size() > 1) {
    hosts_ = comm.all_gather_bytes(host_name());
  }
}

Telemetry::~Telemetry() = default;

void Telemetry::restart_at(int64_t step) {
  if (comm_.rank() == 0) {
    sinks_.reset();
    sinks_ = std::make_unique<metrics::MetricSinks>(sink_options(recipe_, run_dir_, step));
    keep_samples_through(run_dir_, step);
  }
  first_step_ = step;
  forward_ms_ = backward_ms_ = interval_compute_ms_ = interval_wait_ms_ = 0;
  interval_steps_ = interval_wait_steps_ = 0;
}

bool Telemetry::stragglers_due(int64_t step) const {
  const int64_t every = recipe_.logging.straggler_interval;
  return every > 0 && comm_.world_size() > 1 && step % every == 0;
}

std::vector<double> Telemetry::straggler_sample() const {
  const double steps = static_cast<double>(interval_steps_ + 1);  // this step's compute is in forward_ms_/backward_ms_
  // A step's wait is known once it ends, so this interval holds the waits of the steps since the
  // last sample (the last interval's final step and this one's, but for this one).
  return {(interval_compute_ms_ + forward_ms_ + backward_ms_) / steps,
          interval_wait_steps_ > 0 ? interval_wait_ms_ / static_cast<double>(interval_wait_steps_) : 0.0};
}

void Telemetry::check_stragglers(int64_t step, metrics::StepMetrics& m, const std::vector<double>& all) {
  interval_compute_ms_ = interval_wait_ms_ = 0;
  const int64_t steps = interval_steps_;
  interval_steps_ = interval_wait_steps_ = 0;
  if (comm_.rank() != 0) return;
  const int world = comm_.world_size();
  std::vector<double> compute(static_cast<size_t>(world)), wait(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    compute[static_cast<size_t>(r)] = all.at(2 * static_cast<size_t>(r)),
    wait[static_cast<size_t>(r)] = all.at(2 * static_cast<size_t>(r) + 1);
  std::vector<double> sorted = compute;
  std::sort(sorted.begin(), sorted.end());
  // The lower median: with two ranks, the faster one is the reference for the slower.
  const double median = sorted[(sorted.size() - 1) / 2];
  std::string table, slow_text;
  for (int r = 0; r < world; ++r) {
    const double c = compute[static_cast<size_t>(r)];
    const bool slow = median > 0 && c > median * (1.0 + recipe_.logging.straggler_threshold);
    if (slow) {
      m.stragglers.push_back(r);
      slow_text += fmt::format("{}rank {} on {}: compute {:.1f} ms/step vs median {:.1f} ms (+{:.0f}%), waited {:.1f} ms",
                               slow_text.empty() ? "" : "; ", r, hosts_.at(static_cast<size_t>(r)), c, median, 100.0 * (c / median - 1.0),
                               wait[static_cast<size_t>(r)]);
    }
    table += fmt::format("{}{{\"rank\":{},\"host\":\"{}\",\"compute_ms\":{:.3f},\"wait_ms\":{:.3f},\"slow\":{}}}", r ? "," : "", r,
                         hosts_.at(static_cast<size_t>(r)), c, wait[static_cast<size_t>(r)], slow ? "true" : "false");
  }
  std::ofstream(run_dir_.root() + "/stragglers.jsonl", std::ios::app)
      << fmt::format("{{\"step\":{},\"steps\":{},\"median_compute_ms\":{:.3f},\"threshold\":{:g},\"ranks\":[{}]}}\n", step, steps, median,
                     recipe_.logging.straggler_threshold, table);
  if (!m.stragglers.empty())
    log::warn(fmt::format("straggler{} over steps {}-{}: {}", m.stragglers.size() == 1 ? "" : "s", step - steps + 1, step, slow_text));
}

void Telemetry::finish_step(const StepOutcome& o) {
  metrics::StepMetrics m;
  m.step = o.step;
  m.wall_time = unix_seconds();
  m.loss = o.loss;
  m.objective = o.objective;
  m.lr = o.lr;
  m.grad_norm = o.grad_norm;
  m.loss_scale = o.loss_scale;
  m.skipped = o.skipped;
  m.bad_steps = o.bad_steps;
  m.tokens = o.cursor * recipe_.data.seq_len;
  m.epoch = o.epoch;
  m.accumulation = o.accumulation;
  m.step_ms = o.step_ms;
  const double seconds = o.step_ms / 1000.0;
  const double step_tokens = static_cast<double>(o.global_batch * recipe_.data.seq_len);
  m.tokens_per_s = step_tokens / seconds;
  m.samples_per_s = static_cast<double>(o.global_batch) / seconds;
  m.data_wait_ms = o.data_wait_ms;
  m.comm_wait_ms = o.comm_wait_ms;
  if (comm_.rank() == 0) {
    m.tflops_per_rank = m.tokens_per_s * flops_per_token_ / comm_.world_size() / 1e12;
    m.peak_tflops = peak_tflops_;
    m.mfu = peak_tflops_ > 0 ? m.tflops_per_rank / peak_tflops_ : metrics::kNone;
    m.host_rss_mb = resident_mb();
    // ru_maxrss and /proc/self/statm count at different moments: the peak is the largest of both.
    host_peak_rss_mb_ = std::max({host_peak_rss_mb_, peak_resident_mb(), m.host_rss_mb});
    m.host_peak_rss_mb = host_peak_rss_mb_;
    if (const device::DeviceMemoryPeaks peaks = device::device_memory_peaks(device_); peaks.allocated_mb >= 0) {
      m.device_alloc_peak_mb = peaks.allocated_mb;
      m.device_reserved_peak_mb = peaks.reserved_mb;
    }
  }
  if (o.expert_load.defined() && o.expert_load.numel() > 0) {
    const at::Tensor load = o.expert_load.to(at::kDouble).reshape({o.expert_load.size(0), -1});
    const at::Tensor mean = load.mean(1).clamp_min(1e-12);
    m.expert_imbalance = (std::get<0>(load.max(1)) / mean).max().item<double>();  // the worst layer
  }
  m.all_to_all_ms = o.all_to_all_ms;
  m.pipeline_bubble = o.pipeline_bubble;
  if (recipe_.logging.wall_clock_breakdown) {
    m.forward_ms = forward_ms_;
    m.backward_ms = backward_ms_;
    m.issue_ms = issue_ms_;
    m.reduce_ms = o.reduce_ms;
    m.gather_ms = o.gather_ms;
    m.optimizer_ms = o.optimizer_ms;
    m.checkpoint_ms = o.checkpoint_ms;
  }
  interval_compute_ms_ += forward_ms_ + backward_ms_;
  ++interval_steps_;
  forward_ms_ = backward_ms_ = 0;
  issue_ms_ = metrics::kNone;
  if (!o.straggler_times.empty()) check_stragglers(o.step, m, o.straggler_times);
  interval_wait_ms_ += o.comm_wait_ms;  // after the check: this step's wait belongs to the next sample
  ++interval_wait_steps_;
  if (comm_.rank() != 0) return;
  sinks_->write(m);
  const int64_t total = recipe_.train.steps, print_every = recipe_.logging.steps_per_print;
  std::string terms;
  for (const metrics::ObjectiveMetric& t : o.objective) terms += fmt::format(" | {} {:.4f}", t.name, fmt::join(t.values, "/"));
  if (console_ && print_every > 0 && (o.step == first_step_ + 1 || o.step % print_every == 0 || o.step == total))
    log::info(fmt::format(
        "step {}/{}{} | loss {:.4f}{} | lr {:.2e} | grad_norm {:.3f}{} | {:.0f} tok/s | {:.0f} ms/step | mfu {:.2f}%{}", o.step, total,
        std::isnan(o.epoch) ? "" : fmt::format(" | epoch {:.2f}", o.epoch), o.loss, terms, o.lr, o.grad_norm,
        recipe_.precision.dtype == config::Dtype::kFp16 ? fmt::format(" | loss scale {:g}", o.loss_scale) : "", m.tokens_per_s, o.step_ms,
        100.0 * m.mfu, std::isnan(o.pipeline_bubble) ? "" : fmt::format(" | bubble {:.0f}%", 100.0 * o.pipeline_bubble)));
  if (progress_) {  // the launcher draws these as a bar on its terminal (launch/supervisor.cpp)
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    std::printf("%s\n", run::encode_line({o.step, first_step_, total, o.loss, m.tokens_per_s, elapsed}).c_str());
    std::fflush(stdout);
  }
}

void Telemetry::record_eval(const std::vector<metrics::EvalMetrics>& results, const std::string& note) {
  if (comm_.rank() != 0) return;
  for (size_t i = 0; i < results.size(); ++i) {
    metrics::EvalMetrics m = results[i];
    m.wall_time = unix_seconds();
    sinks_->write(m);
    if (!console_) continue;
    std::string what = fmt::format("ppl {:.2f} | {} tokens", m.val_ppl, m.val_tokens);
    if (m.pairs > 0) {  // preference pairs: the two metrics that say whether the preferences are learnt (all in the sinks)
      what.clear();
      for (const auto& [name, value] : m.metrics)
        if (name == "rewards/accuracies" || name == "rewards/margins" || name == "kl" || name == "accuracy" || name == "margin")
          what += fmt::format("{} {:.4f} | ", name, value);
      what += fmt::format("{} {}", m.pairs, recipe_.train.objective == config::TrainObjective::kKto ? "examples" : "pairs");
    }
    log::info(fmt::format("eval step {}/{} | {} | val_loss {:.4f} | {} | {:.0f} ms{}", m.step, recipe_.train.steps, m.name, m.val_loss,
                          what, m.eval_ms, i == 0 && !note.empty() ? " | " + note : ""));
  }
}

void Telemetry::record_samples(int64_t step, const std::vector<Sample>& samples) {
  if (comm_.rank() != 0) return;
  const double now = unix_seconds();
  std::string lines;
  for (const Sample& s : samples) {
    lines +=
        nlohmann::json{{"step", step},      {"index", s.index}, {"prompt", s.prompt}, {"text", s.text}, {"finish_reason", s.finish_reason},
                       {"tokens", s.tokens}}
            .dump() +
        "\n";
    // Markdown in TensorBoard: the prompt quoted, the text as written (a code block keeps its layout).
    sinks_->write_text(step, fmt::format("samples/{}", s.index), fmt::format("> {}\n\n```\n{}\n```", s.prompt, s.text), now);
  }
  const std::string path = run_dir_.root() + "/samples.jsonl";
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) throw Error(ErrorCode::kEnvironment, fmt::format("cannot write {}: {}", path, std::strerror(errno)), "check the run directory");
  std::fwrite(lines.data(), 1, lines.size(), f);
  std::fclose(f);
  if (console_ && !samples.empty())
    log::info(fmt::format("eval step {}/{} | samples | {} written to {} (the first: {})", step, recipe_.train.steps, samples.size(), path,
                          nlohmann::json(samples.front().text.substr(0, 60)).dump()));
}

void Telemetry::record_tasks(const std::vector<metrics::TaskMetrics>& scores) {
  if (comm_.rank() != 0) return;
  for (metrics::TaskMetrics m : scores) {
    m.wall_time = unix_seconds();
    sinks_->write(m);
    if (!console_) continue;
    const std::string shown =
        std::isfinite(m.exact_match)
            ? fmt::format("exact_match {:.4f}{}", m.exact_match,
                          std::isfinite(m.exact_match_flexible) ? fmt::format(" | flexible {:.4f}", m.exact_match_flexible) : "")
            : fmt::format("acc {:.4f} | acc_norm {:.4f}", m.acc, m.acc_norm);
    log::info(fmt::format("eval step {}/{} | task {} | {} | {} questions | {:.0f} ms", m.step, recipe_.train.steps, m.name, shown,
                          m.questions, m.eval_ms));
  }
}

}  // namespace dstrain::train
