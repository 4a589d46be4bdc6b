#include "dstrain/core/progress.h"

#include <algorithm>
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
std::atomic<uint64_t> g_place{0};  // PipelinePlace packed (pack_place): one store, never torn

// 12 bits stage + 1, 20 bits micro-batch + 1, 2 bits carries, 12 + 12 bits ends + 1.
uint64_t pack_place(const PipelinePlace& p) {
  auto field = [](int v, int bits) { return static_cast<uint64_t>(std::clamp(v + 1, 0, (1 << bits) - 1)); };
  return field(p.stage, 12) | field(p.micro_batch, 20) << 12 | static_cast<uint64_t>(p.carries) << 32 | field(p.from_stage, 12) << 34 |
         field(p.to_stage, 12) << 46;
}
PipelinePlace unpack_place(uint64_t v) {
  auto field = [v](int shift, int bits) { return static_cast<int>((v >> shift) & ((uint64_t{1} << bits) - 1)) - 1; };
  PipelinePlace p;
  p.stage = field(0, 12), p.micro_batch = field(12, 20), p.from_stage = field(34, 12), p.to_stage = field(46, 12);
  p.carries = static_cast<Carries>((v >> 32) & 3);
  return p;
}

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

void set_pipeline_place(const PipelinePlace& place) { g_place.store(pack_place(place), std::memory_order_relaxed); }

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
  s.pipeline = unpack_place(g_place.load(std::memory_order_relaxed));
  return s;
}

std::string encode(const Snapshot& s, uint64_t beat, const std::string& host, double unix_time) {
  std::ostringstream out;
  out << "v1 " << beat << ' ' << s.step << ' ' << static_cast<int>(s.phase) << ' ' << (s.op.empty() ? "-" : s.op) << ' ' << s.seq << ' '
      << static_cast<int64_t>(s.phase_s * 1000) << ' ' << (host.empty() ? "-" : host) << ' ' << std::fixed << std::setprecision(3)
      << unix_time;
  const PipelinePlace& p = s.pipeline;
  if (p.stage >= 0)
    out << " p" << p.stage << ',' << p.micro_batch << ',' << static_cast<int>(p.carries) << ',' << p.from_stage << ',' << p.to_stage;
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
  out.where.pipeline = PipelinePlace{};
  std::string place;
  if (in >> place) {  // the optional pipeline place
    PipelinePlace& p = out.where.pipeline;
    char c[5] = {};
    int carries = 0;
    std::istringstream fields(place);
    if (!(fields >> c[0] >> p.stage >> c[1] >> p.micro_batch >> c[2] >> carries >> c[3] >> p.from_stage >> c[4] >> p.to_stage) ||
        std::string(c, 5) != "p,,,," || carries < 0 || carries > 2 || p.stage < 0)
      return false;
    p.carries = static_cast<Carries>(carries);
  }
  return true;
}

std::string describe(const Snapshot& s) {
  const std::string step = s.step > 0 ? " of step " + std::to_string(s.step) : "";
  const PipelinePlace& p = s.pipeline;
  if (s.phase == Phase::kCollective) {
    std::string out = s.op + " #" + std::to_string(s.seq) + (s.step > 0 ? " (step " + std::to_string(s.step) + ")" : "");
    if (p.stage >= 0 && p.carries != Carries::kNothing)
      out += ": micro-batch " + std::to_string(p.micro_batch) + (p.carries == Carries::kActivations ? "'s activations" : "'s gradient") +
             " from stage " + std::to_string(p.from_stage) + " to stage " + std::to_string(p.to_stage);
    return out;
  }
  std::string out = std::string(phase_name(s.phase)) + step;
  if (p.stage >= 0 && (s.phase == Phase::kForward || s.phase == Phase::kBackward))
    out += " (stage " + std::to_string(p.stage) + ", micro-batch " + std::to_string(p.micro_batch) + ")";
  return out;
}

}  // namespace dstrain::progress
