#include "dstrain/metrics/jsonl_sink.h"

#include <fmt/format.h>

#include <cmath>

#include <filesystem>
#include <sstream>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"

namespace dstrain::metrics {
namespace {

int64_t step_of(const std::string& line) {
  const auto at = line.find("\"step\":");
  return at == std::string::npos ? -1 : std::stoll(line.substr(at + 7));
}

}  // namespace

JsonlSink::JsonlSink(const std::string& path, int64_t keep_through_step) {
  if (keep_through_step > 0 && std::filesystem::exists(path)) {
    std::istringstream in(read_file(path));
    std::string kept, line;
    while (std::getline(in, line))
      if (!line.empty() && step_of(line) >= 0 && step_of(line) <= keep_through_step) kept += line + "\n";
    write_file_atomic(path, kept);
    out_.open(path, std::ios::app);
  } else {
    out_.open(path, std::ios::trunc);
  }
  if (!out_) throw Error(ErrorCode::kEnvironment, fmt::format("cannot write '{}'", path), "check the run directory is writable");
}

namespace {
// JSON has no inf or nan: a non-finite value (an fp16 overflow's gradient norm) is written null.
std::string number(double v) { return std::isfinite(v) ? fmt::format("{:.9g}", v) : "null"; }
}  // namespace

void JsonlSink::write(const StepMetrics& m) {
  out_ << fmt::format(
      "{{\"step\":{},\"loss\":{},\"lr\":{},\"grad_norm\":{},\"tokens\":{},\"step_ms\":{:.3f},\"tokens_per_s\":{:.1f},\"data_wait_ms\":{:.3f},"
      "\"loss_scale\":{},\"skipped\":{},\"comm_wait_ms\":{:.3f},\"bad_steps\":{}}}\n",
      m.step, number(m.loss), number(m.lr), number(m.grad_norm), m.tokens, m.step_ms, m.tokens_per_s, m.data_wait_ms, number(m.loss_scale),
      m.skipped ? "true" : "false", m.comm_wait_ms, m.bad_steps);
  out_.flush();
}

}  // namespace dstrain::metrics
