#include "dstrain/core/error.h"

namespace dstrain {

Error::Error(ErrorCode code, std::string message, std::string hint)
    : std::runtime_error(std::move(message)), code_(code), hint_(std::move(hint)) {}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kUsage:
      return "usage error";
    case ErrorCode::kConfig:
      return "config error";
    case ErrorCode::kData:
      return "data error";
    case ErrorCode::kCheckpoint:
      return "checkpoint error";
    case ErrorCode::kEnvironment:
      return "environment error";
    case ErrorCode::kComm:
      return "communication error";
    case ErrorCode::kWorkerFailed:
      return "worker failed";
    case ErrorCode::kInterrupted:
      return "interrupted";
    case ErrorCode::kDiverged:
      return "training diverged";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "error";
}

}  // namespace dstrain
