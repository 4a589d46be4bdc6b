#pragma once
// The launcher's record of worker failures: run_dir/failures.jsonl (one JSON object per failure:
// time, restart generation, rank, host, exit code or signal, the step reached, the last log
// lines) and the root-cause report printed when the run ends.
#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/launch/supervisor.h"

namespace dstrain::launch {

struct FailureRecord {
  launch::WorkerFailure failure;
  int generation = 0;
  int64_t step_reached = 0;  // the last step in metrics.jsonl
};

// The last step metrics.jsonl records (0 when there is none).
int64_t last_logged_step(const std::string& metrics_path);
void append_failure(const std::string& path, const FailureRecord& record);
// "rank 2 on host-b (node 1) was killed by signal 9 (SIGKILL)", or the description of a hang.
std::string describe_failure(const launch::WorkerFailure& failure);
// "3 worker failures in this run; the first: rank 1 on host was killed by signal 9 (SIGKILL) at step 17 (generation 0) ..."
std::string root_cause_report(const std::vector<FailureRecord>& records);

// Seconds to wait before restart number `restart` (1-based): 1, 2, 4, ... capped at 30.
int restart_backoff_s(int restart);
// Whether a failure is worth a restart: crashes, signals, communication errors, timeouts;
// not configuration, data or divergence errors, which a restart would only repeat.
bool restartable(const launch::WorkerFailure& failure);

}  // namespace dstrain::launch
