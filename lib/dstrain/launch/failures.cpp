#include "dstrain/launch/failures.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "dstrain/core/exit_code.h"
#include "dstrain/core/log.h"

namespace dstrain::launch {

int64_t last_logged_step(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  std::string line;
  int64_t step = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      step = nlohmann::json::parse(line).value("step", step);
    } catch (const nlohmann::json::exception&) {
      // a line cut by the crash: the step before it stands
    }
  }
  return step;
}

void append_failure(const std::string& path, const FailureRecord& r) {
  const auto& f = r.failure;
  nlohmann::json j{{"time", f.unix_time},
                   {"generation", r.generation},
                   {"kind", launch::failure_kind_name(f.kind)},
                   {"node", f.node},
                   {"rank", f.rank},
                   {"host", f.host},
                   {"pid", f.pid},
                   {"what", f.description},
                   {"step_reached", r.step_reached},
                   {"log_tail", f.tail}};
  if (f.exit_code >= 0) j["exit_code"] = f.exit_code;
  if (f.signal) j["signal"] = f.signal;
  std::ofstream out(path, std::ios::app);
  out << j.dump() << "\n";
  out.flush();
  if (!out)  // a full disk must not hide the failure itself: it is in the log either way
    log::warn(fmt::format("could not append to {}: {}; the failure above is not recorded there", path, std::strerror(errno)));
}

std::string describe_failure(const launch::WorkerFailure& f) {
  const std::string node = f.node > 0 ? fmt::format(" (node {})", f.node) : "";
  if (f.kind == launch::FailureKind::kExit || f.kind == launch::FailureKind::kSignal)
    return fmt::format("rank {} on {}{} {}", f.rank, f.host, node, f.description);
  return f.node > 0 ? fmt::format("on node {}: {}", f.node, f.description) : f.description;
}

std::string root_cause_report(const std::vector<FailureRecord>& records) {
  if (records.empty()) return "";
  const auto first = std::min_element(records.begin(), records.end(), [](const FailureRecord& a, const FailureRecord& b) {
    return a.failure.unix_time < b.failure.unix_time;
  });
  const auto& f = first->failure;
  const std::string what = describe_failure(f);
  return fmt::format("{} failure{} in this run (run_dir/failures.jsonl); the first: {} at step {} (restart generation {})", records.size(),
                     records.size() == 1 ? "" : "s", what, first->step_reached, first->generation);
}

int restart_backoff_s(int restart) { return std::min(30, 1 << std::min(restart - 1, 5)); }

bool restartable(const launch::WorkerFailure& f) {
  if (f.kind == launch::FailureKind::kNodeLost) return false;  // the group cannot be formed again without that node
  if (f.kind == launch::FailureKind::kHang) return true;
  if (f.signal) return true;
  const int code = f.exit_code;
  return !(code == exit_status::kUsage || code == exit_status::kData || code == exit_status::kEnvironment ||
           code == exit_status::kDiverged);
}

}  // namespace dstrain::launch
