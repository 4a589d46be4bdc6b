#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>

#include "commands.h"
#include "dstrain/report/run_report.h"

namespace dstrain::app {

void register_report(CLI::App& app, Run& run) {
  auto run_dir = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("report", "Write an HTML page (inline SVG, no network) and PNG charts of a run");
  cmd->footer(
      "Reads RUN_DIR/metrics.jsonl, stragglers.jsonl and failures.jsonl and writes OUT/index.html with\n"
      "loss, learning rate, throughput, MFU, loss scale, gradient norm, the step-time breakdown, the\n"
      "straggler table and the timeline of failures and restarts, and OUT/<chart>.png for each chart.\n"
      "Works on a running job too (it reads what has been written so far).\n\n"
      "Examples:\n"
      "  dstrain report runs/demo                 (writes runs/demo/report/index.html)\n"
      "  dstrain report runs/demo --out /tmp/r");
  cmd->add_option("run_dir", *run_dir, "Run directory of a `dstrain train` run")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--out", *out, "Output directory (default: RUN_DIR/report)");
  cmd->callback([run_dir, out, &run] {
    run = [run_dir, out] {
      const std::string dir = out->empty() ? *run_dir + "/report" : *out;
      const report::ReportFiles files = report::write_run_report(std::filesystem::absolute(*run_dir).lexically_normal().string(), dir);
      fmt::print("{} ({} steps, {} charts; PNGs alongside)\n", files.html, files.steps, files.charts);
      return 0;
    };
  });
}

}  // namespace dstrain::app
