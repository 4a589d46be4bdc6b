// dstrain bench pipeline: a schedule replayed with given costs, without training: its bubble
// against the papers' formulas and the micro-batches each rank holds.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "commands.h"
#include "dstrain/config/enums.h"
#include "dstrain/pipeline/schedule.h"
#include "dstrain/pipeline/timeline.h"
#include "dstrain/pipeline/validate.h"

namespace dstrain::app {

namespace {

struct PipelineBenchArgs {
  int ranks = 4, micro_batches = 0, virtual_stages = 2;
  std::vector<std::string> schedules;
  pipeline::Costs costs;
  bool chart = false;
};

int run_pipeline_bench(const PipelineBenchArgs& a) {
  const int m = a.micro_batches > 0 ? a.micro_batches : 4 * a.ranks;
  const auto& c = a.costs;
  fmt::print(
      "# {} pipeline ranks, {} micro-batches per step; one micro-batch through a rank's share of the model: F {:g}, I {:g}, W {:g} "
      "(a backward not split: I + W), each transfer {:g}\n",
      a.ranks, m, c.forward, c.backward_input, c.backward_weight, c.transfer);
  fmt::print("{:<18} {:>2} {:>10} {:>8} {:>8} {:>9} {:>12}  {}\n", "schedule", "v", "step time", "bubble", "formula", "vs 1f1b",
             "held rank 0", "held max");
  double one_f_one_b = 0;
  std::vector<std::string> charts;
  const std::vector<std::string> names = a.schedules.empty() ? pipeline::schedule_names() : a.schedules;
  for (const std::string& name : names) {
    pipeline::ScheduleKind kind{};
    config::parse_enum(name, kind);  // CLI::IsMember checked the name
    const int v = kind == pipeline::ScheduleKind::kInterleaved1F1B ? a.virtual_stages : 1;
    const std::string rule = pipeline::schedule_rule_problem(kind, a.ranks, v, m);
    if (!rule.empty()) {
      fmt::print("{:<18} {:>2} {}\n", name, v, "not run: " + rule);
      continue;
    }
    const pipeline::Schedule s = pipeline::build_schedule(kind, a.ranks, v, m);
    const auto problems = pipeline::validate(s);
    if (!problems.empty()) {  // a generator bug: say so rather than print its numbers
      fmt::print("{:<18} {:>2} INVALID: {}\n", name, v, problems.front());
      continue;
    }
    const pipeline::Timeline tl = pipeline::simulate(s, c);
    if (kind == pipeline::ScheduleKind::k1F1B) one_f_one_b = tl.makespan;
    const int held_max = *std::max_element(tl.peak_held.begin(), tl.peak_held.end());
    fmt::print("{:<18} {:>2} {:>10.4g} {:>8.4f} {:>8.4f} {:>9} {:>12}  {}\n", name, v, tl.makespan, tl.bubble(),
               pipeline::bubble_formula(s, c), one_f_one_b > 0 ? fmt::format("{:.3f}x", one_f_one_b / tl.makespan) : "-",
               tl.peak_held.front(), held_max);
    if (a.chart) {
      const double unit = std::min({c.forward, c.backward_input, c.backward_weight}) / v;
      charts.push_back(fmt::format("{} (v {}), a column per {:g}:\n{}", name, v, unit, pipeline::timeline_chart(tl, unit)));
    }
  }
  fmt::print(
      "bubble: idle over compute time on all ranks; formula: (p-1)/m for gpipe and 1f1b, (p-1)/(v m) interleaved, "
      "(p-1)(F+I-W)/(m(F+I+W)) zb_h1 (no transfer time); held: stage micro-batches between their forward and their last "
      "backward pass (activations)\n");
  for (const auto& chart : charts) fmt::print("\n{}", chart);
  return 0;
}

}  // namespace

void add_bench_pipeline(CLI::App& bench, Run& run) {
  auto args = std::make_shared<PipelineBenchArgs>();
  CLI::App* cmd =
      bench.add_subcommand("pipeline", "A pipeline schedule replayed with given costs: its bubble and memory, without training");
  cmd->footer(
      "Builds each schedule (the same one training and --dry-run use), checks it (every receive has its send, every\n"
      "dependency holds, no rank waits forever), replays it with the given costs and prints the step time, the bubble\n"
      "(idle over compute time) next to the papers' formula, and the stage micro-batches each rank holds.\n\n"
      "Examples:\n  dstrain bench pipeline --ranks 4 --micro-batches 8\n"
      "  dstrain bench pipeline --ranks 8 --micro-batches 32 --forward 1 --backward-input 1.2 --backward-weight 0.8 --chart\n"
      "  dstrain bench pipeline --ranks 16 --micro-batches 120 --schedule 1f1b --schedule zb_h1 --transfer 0.05");
  cmd->add_option("--ranks", args->ranks, "Pipeline ranks p (parallel.pipeline_parallel_size)")->check(CLI::Range(2, 1024));
  cmd->add_option("--micro-batches", args->micro_batches, "Micro-batches per step m (default 4 p)")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--virtual-stages", args->virtual_stages, "Stages per rank for interleaved_1f1b")->check(CLI::Range(2, 64));
  cmd->add_option("--schedule", args->schedules, "A schedule to replay (repeatable; default all)")
      ->check(CLI::IsMember(pipeline::schedule_names()));
  cmd->add_option("--forward", args->costs.forward, "Cost F of a forward through a rank's share of the model")->check(CLI::PositiveNumber);
  cmd->add_option("--backward-input", args->costs.backward_input, "Cost I of the input-gradient half of the backward")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--backward-weight", args->costs.backward_weight, "Cost W of the weight-gradient half")->check(CLI::PositiveNumber);
  cmd->add_option("--transfer", args->costs.transfer, "Time from a send to its arrival")->check(CLI::NonNegativeNumber);
  cmd->add_flag("--chart", args->chart, "Draw each replay, a row per rank");
  cmd->callback([args, &run] { run = [args] { return run_pipeline_bench(*args); }; });
}

}  // namespace dstrain::app
