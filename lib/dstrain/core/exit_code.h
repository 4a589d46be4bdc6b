#pragma once
// Process exit statuses, documented in README.md ("Exit codes"). Keep the two in sync:
// test/unit/core/exit_code_test.cpp checks the README table against this list.
#include "dstrain/core/error.h"

namespace dstrain {

namespace exit_status {
constexpr int kOk = 0;
constexpr int kInternal = 1;
constexpr int kUsage = 2;  // also config errors: nothing was started
constexpr int kData = 3;
constexpr int kCheckpoint = 4;
constexpr int kEnvironment = 5;
constexpr int kComm = 6;
constexpr int kWorkerFailed = 7;
constexpr int kDiverged = 8;
constexpr int kStopped = 75;       // stopped at a step boundary with a checkpoint (EX_TEMPFAIL: retry later)
constexpr int kInterrupted = 130;  // 128 + SIGINT, as shells report it
}  // namespace exit_status

int exit_status_for(ErrorCode code) noexcept;

}  // namespace dstrain
