#include "dstrain/metrics/jsonl_sink.h"

#include <fmt/format.h>

#include <cmath>

#include <filesystem>
#include <sstream>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"

namespace dstrain::metrics {
namespace {

// The step of a complete metrics line; -1 for anything else (a line torn by a crash mid-write).
int64_t step_of(const std::string& line) {
  if (line.size() < 9 || line.front() != '{' || line.back() != '}') return -1;
  const auto at = line.find("\"step\":");
  if (at == std::string::npos) return -1;
  int64_t step = -1;
  for (size_t i = at + 7; i < line.size() && line[i] >= '0' && line[i] <= '9' && step < (int64_t{1} << 50); ++i)
    step = (step < 0 ? 0 : step * 10) + (line[i] - '0');
  return step;
}

}  // namespace

JsonlSink::JsonlSink(const std::string& path, int64_t keep_through_step) {
  if (keep_through_step > 0 && std::filesystem::exists(path)) {
    std::istringstream in(read_file(path));
    std::string kept, line;
    int torn = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const int64_t step = step_of(line);
      if (step < 0) ++torn;
      if (step >= 0 && step <= keep_through_step) kept += line + "\n";
    }
    if (torn > 0) log::warn(fmt::format("{}: dropped {} incomplete line(s) (written when the run was stopped mid-write)", path, torn));
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
  auto listed = [&m](const std::string& field) {  // a value of a metric with several: in its list, below
    for (const ObjectiveMetric& o : m.objective)
      if (o.values.size() > 1 && field.rfind(o.name + "_", 0) == 0) return true;
    return false;
  };
  for (const auto& [name, value] : scalar_fields(m)) {
    if (listed(name)) continue;
    if (name == "skipped")
      out += fmt::format(",\"skipped\":{}", m.skipped ? "true" : "false");
    else if (name == "bad_steps" || name == "tokens" || name == "accumulation")
      out += fmt::format(",\"{}\":{}", name, static_cast<int64_t>(value));
    else
      out += fmt::format(",\"{}\":{}", name, number(value));
  }
  for (const ObjectiveMetric& o : m.objective) {
    if (o.values.size() <= 1) continue;
    out += fmt::format(",\"{}\":[", o.name);
    for (size_t k = 0; k < o.values.size(); ++k) out += (k ? "," : "") + number(o.values[k]);
    out += "]";
  }
  out += ",\"stragglers\":[";
  for (size_t i = 0; i < m.stragglers.size(); ++i) out += fmt::format("{}{}", i ? "," : "", m.stragglers[i]);
  return out + "]}";
}

namespace {
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\')
      out += '\\', out += c;
    else if (static_cast<unsigned char>(c) < 0x20)
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    else
      out += c;
  }
  return out + "\"";
}
}  // namespace

std::string jsonl_line(const EvalMetrics& m) {
  std::string pairs;  // a set of preference pairs: its count and metrics instead of tokens
  if (m.pairs > 0) {
    pairs = fmt::format(",\"pairs\":{}", m.pairs);
    for (const auto& [name, value] : m.metrics) pairs += fmt::format(",{}:{}", json_string(name), number(value));
  }
  return fmt::format("{{\"step\":{},\"time\":{:.3f},\"eval\":{},\"val_loss\":{},\"val_ppl\":{},\"val_tokens\":{}{},\"eval_ms\":{}}}",
                     m.step, m.wall_time, json_string(m.name), number(m.val_loss), number(m.val_ppl),
                     m.pairs > 0 ? std::string("null") : std::to_string(m.val_tokens), pairs, number(m.eval_ms));
}

std::string jsonl_line(const TaskMetrics& m) {
  std::string scores;  // a generative task's exact match, in place of acc and acc_norm
  if (std::isfinite(m.exact_match)) {
    scores = fmt::format("\"exact_match\":{}", number(m.exact_match));
    if (std::isfinite(m.exact_match_flexible)) scores += fmt::format(",\"exact_match_flexible\":{}", number(m.exact_match_flexible));
  } else {
    scores = fmt::format("\"acc\":{},\"acc_norm\":{}", number(m.acc), number(m.acc_norm));
  }
  return fmt::format("{{\"step\":{},\"time\":{:.3f},\"task\":{},{},\"n\":{},\"eval_ms\":{}}}", m.step, m.wall_time, json_string(m.name),
                     scores, m.questions, number(m.eval_ms));
}

void JsonlSink::write(const TaskMetrics& m) {
  out_ << jsonl_line(m) << '\n';
  out_.flush();
}

void JsonlSink::write(const StepMetrics& m) {
  out_ << jsonl_line(m) << '\n';
  out_.flush();
}

void JsonlSink::write(const EvalMetrics& m) {
  out_ << jsonl_line(m) << '\n';
  out_.flush();
}

}  // namespace dstrain::metrics
