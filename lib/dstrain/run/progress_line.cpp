#include "dstrain/run/progress_line.h"

#include <fmt/format.h>

#include <cstdio>

namespace dstrain::run {
namespace {
constexpr const char* kPrefix = "@@progress ";
}

std::string encode_line(const ProgressLine& p) {
  return fmt::format("{}{} {} {} {:.6g} {:.6g} {:.3f}", kPrefix, p.step, p.first_step, p.total_steps, p.loss, p.tokens_per_s, p.elapsed_s);
}

bool is_progress_line(const std::string& line) { return line.rfind(kPrefix, 0) == 0; }

std::optional<ProgressLine> decode_line(const std::string& line) {
  if (!is_progress_line(line)) return std::nullopt;
  long long step = 0, first = 0, total = 0;
  ProgressLine p;
  int used = 0;
  if (std::sscanf(line.c_str(), "@@progress %lld %lld %lld %lf %lf %lf%n", &step, &first, &total, &p.loss, &p.tokens_per_s, &p.elapsed_s,
                  &used) != 6 ||
      static_cast<size_t>(used) != line.size() || total <= 0)
    return std::nullopt;
  p.step = step, p.first_step = first, p.total_steps = total;
  return p;
}

}  // namespace dstrain::run
