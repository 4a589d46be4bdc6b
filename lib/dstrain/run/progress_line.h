#pragma once
// Rank 0's progress, for the launcher's progress bar: one line on the worker's stdout, which the
// launcher draws on its terminal and never writes to the logs. Written and read only here.
#include <cstdint>
#include <optional>
#include <string>

namespace dstrain::run {

struct ProgressLine {
  int64_t step = 0;        // steps done
  int64_t first_step = 0;  // where this launch started (the ETA counts from it)
  int64_t total_steps = 0;
  double loss = 0;
  double tokens_per_s = 0;
  double elapsed_s = 0;  // since this launch's first step
};

// "@@progress <step> <first> <total> <loss> <tokens/s> <elapsed>" (no newline).
std::string encode_line(const ProgressLine& p);
// Whether a line of output is a progress line (it may still be malformed).
bool is_progress_line(const std::string& line);
std::optional<ProgressLine> decode_line(const std::string& line);

}  // namespace dstrain::run
