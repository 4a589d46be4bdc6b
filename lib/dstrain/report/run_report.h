#pragma once
// `dstrain report RUN_DIR`: a self-contained HTML page (inline SVG, no network) and PNG images
// of a run: loss, learning rate, throughput, MFU, loss scale, gradient norm, the step-time
// breakdown, the straggler table and the timeline of failures and restarts, read from
// metrics.jsonl, stragglers.jsonl and failures.jsonl.
#include <string>
#include <vector>

namespace dstrain::report {

struct ReportFiles {
  std::string html;
  std::vector<std::string> pngs;
  int charts = 0;
  int steps = 0;
};

// Throws Error{kUsage} when run_dir has no metrics.jsonl.
ReportFiles write_run_report(const std::string& run_dir, const std::string& out_dir);

}  // namespace dstrain::report
