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

std::string jsonl_line(const StepMetrics& m) {
  std::string out = fmt::format("{{\"step\":{},\"time\":{:.3f}", m.step, m.wall_time);
  for (const auto& [name, value] : scalar_fields(m)) {
    if (name == "skipped")
      out += fmt::format(",\"skipped\":{}", m.skipped ? "true" : "false");
    else if (name == "bad_steps" || name == "tokens" || name == "accumulation")
      out += fmt::format(",\"{}\":{}", name, static_cast<int64_t>(value));
    else
      out += fmt::format(",\"{}\":{}", name, number(value));
  }
  out += ",\"stragglers\":[";
  for (size_t i = 0; i < m.stragglers.size(); ++i) out += fmt::format("{}{}", i ? "," : "", m.stragglers[i]);
  return out + "]}";
}

void JsonlSink::write(const StepMetrics& m) {
  out_ << jsonl_line(m) << '\n';
  out_.flush();
}

}  // namespace dstrain::metrics
