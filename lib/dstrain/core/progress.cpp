#include "dstrain/core/progress.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <sstream>

namespace dstrain::progress {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::atomic<int64_t> g_step{0};
std::atomic<int> g_phase{0};
std::atomic<int64_t> g_since_ns{now_ns()};  // "starting" began when the process did, not at boot
std::atomic<const char*> g_op{nullptr};     // string literals only
std::atomic<uint64_t> g_seq{0};

constexpr const char* kNames[] = {"starting", "data", "forward", "backward", "optimizer", "collective", "checkpoint", "finished"};

}  // namespace

const char* phase_name(Phase phase) {
  const int i = static_cast<int>(phase);
  return i >= 0 && i < static_cast<int>(std::size(kNames)) ? kNames[i] : "unknown";
}

void set_step(int64_t step) { g_step.store(step, std::memory_order_relaxed); }

void enter(Phase phase) {
  g_since_ns.store(now_ns(), std::memory_order_relaxed);
  g_phase.store(static_cast<int>(phase), std::memory_order_release);
}

CollectiveWait::CollectiveWait(const char* op, uint64_t seq)
    : previous_(static_cast<Phase>(g_phase.load(std::memory_order_relaxed))),
      previous_since_ns_(g_since_ns.load(std::memory_order_relaxed)) {
  g_op.store(op, std::memory_order_relaxed);
  g_seq.store(seq, std::memory_order_relaxed);
  enter(Phase::kCollective);
}

CollectiveWait::~CollectiveWait() {
  g_since_ns.store(previous_since_ns_, std::memory_order_relaxed);
  g_phase.store(static_cast<int>(previous_), std::memory_order_release);
}

Snapshot snapshot() {
  Snapshot s;
  s.phase = static_cast<Phase>(g_phase.load(std::memory_order_acquire));
  s.step = g_step.load(std::memory_order_relaxed);
  if (s.phase == Phase::kCollective) {
    const char* op = g_op.load(std::memory_order_relaxed);
    s.op = op ? op : "?";
    s.seq = g_seq.load(std::memory_order_relaxed);
  }
  s.phase_s = static_cast<double>(now_ns() - g_since_ns.load(std::memory_order_relaxed)) / 1e9;
  return s;
}

std::string encode(const Snapshot& s, uint64_t beat, const std::string& host, double unix_time) {
  std::ostringstream out;
  out << "v1 " << beat << ' ' << s.step << ' ' << static_cast<int>(s.phase) << ' ' << (s.op.empty() ? "-" : s.op) << ' ' << s.seq << ' '
      << static_cast<int64_t>(s.phase_s * 1000) << ' ' << (host.empty() ? "-" : host) << ' ' << std::fixed << std::setprecision(3)
      << unix_time;
  return out.str();
}

bool decode(const std::string& text, Beat& out) {
  std::istringstream in(text);
  std::string version, op;
  int phase = 0;
  int64_t phase_ms = 0;
  if (!(in >> version >> out.beat >> out.where.step >> phase >> op >> out.where.seq >> phase_ms >> out.host >> out.unix_time) ||
      version != "v1")
    return false;
  if (phase < 0 || phase > static_cast<int>(Phase::kFinished)) return false;
  out.where.phase = static_cast<Phase>(phase);
  out.where.op = op == "-" ? "" : op;
  out.where.phase_s = static_cast<double>(phase_ms) / 1000.0;
  return true;
}

std::string describe(const Snapshot& s) {
  const std::string step = s.step > 0 ? " of step " + std::to_string(s.step) : "";
  if (s.phase == Phase::kCollective)
    return s.op + " #" + std::to_string(s.seq) + (s.step > 0 ? " (step " + std::to_string(s.step) + ")" : "");
  return std::string(phase_name(s.phase)) + step;
}

}  // namespace dstrain::progress
