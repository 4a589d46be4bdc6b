#include "dstrain/core/fault_injector.h"

#include <fmt/format.h>

#include <cstdlib>
#include <vector>

#include "dstrain/core/error.h"

namespace dstrain {
namespace {

constexpr const char* kVariable = "DSTRAIN_TEST_FAULTS";

std::vector<std::string> split(const std::string& text, char sep, size_t max_parts = std::string::npos) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t at = parts.size() + 1 == max_parts ? std::string::npos : text.find(sep, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

[[noreturn]] void malformed(const std::string& entry, const char* form) {
  throw Error(ErrorCode::kUsage, fmt::format("{}: '{}' is not of the form {}", kVariable, entry, form),
              "this variable is for dstrain's own tests; unset it to train normally");
}

// Whole-string numbers only: "3x" is as malformed as "x".
template <typename T>
T number(const std::string& text, const std::string& entry, const char* form) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size()) return static_cast<T>(value);
  } catch (const std::exception&) {}
  malformed(entry, form);
}

}  // namespace

FaultInjector& FaultInjector::get() {
  static FaultInjector injector([] {
    const char* spec = std::getenv("DSTRAIN_TEST_FAULTS");
    return std::string(spec ? spec : "");
  }());
  return injector;
}

FaultInjector::FaultInjector(const std::string& spec) {
  for (const std::string& entry : split(spec, ';')) {
    if (entry.empty()) continue;
    const auto eq = entry.find('=');
    const std::string name = entry.substr(0, eq), value = eq == std::string::npos ? "" : entry.substr(eq + 1);
    if (name == "crash_at_save_point") {
      crash_at_ = number<long>(value, entry, "crash_at_save_point=K");
    } else if (name == "inf_step") {
      inf_step_ = number<int64_t>(value, entry, "inf_step=K");
    } else if (name == "nan_loss") {
      const auto p = split(value, ':');
      if (p.size() < 2 || p.size() > 3 || (p.size() == 3 && p[2] != "always")) malformed(entry, "nan_loss=RANK:STEP[:always]");
      nan_loss_ = {number<int>(p[0], entry, "nan_loss=RANK:STEP"), number<int64_t>(p[1], entry, "nan_loss=RANK:STEP")};
      nan_always_ = p.size() == 3;
    } else if (name == "stall") {
      const auto p = split(value, ':');
      if (p.size() != 3) malformed(entry, "stall=RANK:STEP:SECONDS");
      stall_ = {number<int>(p[0], entry, "stall=RANK:STEP:SECONDS"), number<int64_t>(p[1], entry, "stall=RANK:STEP:SECONDS")};
      stall_s_ = number<double>(p[2], entry, "stall=RANK:STEP:SECONDS");
    } else if (name == "slow_rank") {
      const auto p = split(value, ':');
      if (p.size() != 2) malformed(entry, "slow_rank=RANK:FACTOR");
      slow_rank_ = number<int>(p[0], entry, "slow_rank=RANK:FACTOR");
      slow_factor_ = std::max(1.0, number<double>(p[1], entry, "slow_rank=RANK:FACTOR"));
    } else if (name == "offload_chunk") {
      offload_chunk_ = number<int64_t>(value, entry, "offload_chunk=ELEMENTS");
    } else if (name == "fact") {
      const auto p = split(value, ':', 2);
      const auto fact_eq = p.size() == 2 ? p[1].find('=') : std::string::npos;
      if (fact_eq == std::string::npos) malformed(entry, "fact=RANK:NAME=VALUE");
      fact_rank_ = number<int>(p[0], entry, "fact=RANK:NAME=VALUE");
      fact_name_ = p[1].substr(0, fact_eq);
      fact_value_ = p[1].substr(fact_eq + 1);
    } else if (name == "crash_at_exit") {
      crash_at_exit_rank_ = number<int>(value, entry, "crash_at_exit=RANK");
    } else if (name == "data_path") {
      const auto p = split(value, ':', 2);
      if (p.size() != 2) malformed(entry, "data_path=RANK:PATH");
      data_rank_ = number<int>(p[0], entry, "data_path=RANK:PATH");
      data_path_ = p[1];
    } else {
      throw Error(ErrorCode::kUsage, fmt::format("{}: unknown fault '{}'", kVariable, name),
                  "known: crash_at_save_point, inf_step, nan_loss, stall, slow_rank, offload_chunk, fact, data_path, crash_at_exit");
    }
    any_ = true;
  }
}

void FaultInjector::save_point() {
  if (crash_at_ > 0 && ++save_points_ == crash_at_) std::_Exit(99);
}

bool FaultInjector::nan_loss_due(int rank, int64_t step) {
  if (rank != nan_loss_.rank || step != nan_loss_.step) return false;
  return nan_always_ || !nan_fired_.exchange(true);
}

double FaultInjector::stall_seconds(int rank, int64_t step) const { return rank == stall_.rank && step == stall_.step ? stall_s_ : 0.0; }

double FaultInjector::slowdown(int rank) const { return rank == slow_rank_ ? slow_factor_ : 1.0; }

std::optional<std::pair<std::string, std::string>> FaultInjector::fact_override(int rank) const {
  if (rank != fact_rank_) return std::nullopt;
  return std::make_pair(fact_name_, fact_value_);
}

std::string FaultInjector::data_path_override(int rank) const { return rank == data_rank_ ? data_path_ : ""; }

}  // namespace dstrain
