#include "dstrain/core/exit_code.h"

namespace dstrain {

int exit_status_for(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kUsage:
    case ErrorCode::kConfig:
      return exit_status::kUsage;
    case ErrorCode::kData:
      return exit_status::kData;
    case ErrorCode::kCheckpoint:
      return exit_status::kCheckpoint;
    case ErrorCode::kEnvironment:
      return exit_status::kEnvironment;
    case ErrorCode::kComm:
      return exit_status::kComm;
    case ErrorCode::kWorkerFailed:
      return exit_status::kWorkerFailed;
    case ErrorCode::kInterrupted:
      return exit_status::kInterrupted;
    case ErrorCode::kDiverged:
      return exit_status::kDiverged;
    case ErrorCode::kInternal:
      return exit_status::kInternal;
  }
  return exit_status::kInternal;
}

}  // namespace dstrain
