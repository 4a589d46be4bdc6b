#pragma once
// The one error type of dstrain. Thrown where a problem is found, caught once in main(), which
// prints the message and the hint and exits with the code's exit status (see exit_code.h).
#include <stdexcept>
#include <string>

namespace dstrain {

// Each code maps to one documented process exit status (README, "Exit codes").
enum class ErrorCode {
  kUsage,         // bad flags or arguments
  kConfig,        // recipe / ds_config / resolved config invalid
  kData,          // dataset missing or malformed
  kCheckpoint,    // checkpoint missing, incomplete or corrupt
  kEnvironment,   // the machine or software stack is not fit to run
  kComm,          // rendezvous or collective failed or timed out
  kWorkerFailed,  // the launcher saw a worker fail
  kInterrupted,   // stopped by SIGINT / SIGTERM
  kDiverged,      // training diverged (fp16 overflow at the minimum loss scale)
  kInternal,      // a bug in dstrain
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string message, std::string hint = {});
  ErrorCode code() const noexcept { return code_; }
  // What the user can do about it; may be empty.
  const std::string& hint() const noexcept { return hint_; }

 private:
  ErrorCode code_;
  std::string hint_;
};

const char* error_code_name(ErrorCode code) noexcept;

// The first line of a library's exception text (LibTorch and c10d append backtraces and notes):
// what a message quotes.
std::string first_line(const std::string& text);

}  // namespace dstrain
