#pragma once
// Where this worker is right now: the step, the phase (forward, backward, a collective with its
// name and sequence number, optimizer, checkpoint) and since when. The training loop and the
// communicators write it; the heartbeat thread reads it and sends it to the launcher, which
// names the stuck rank and its op when a run hangs. Lock-free: writers are on the hot path.
#include <cstdint>
#include <string>

namespace dstrain::progress {

enum class Phase : int { kStarting = 0, kData, kForward, kBackward, kOptimizer, kCollective, kCheckpoint, kFinished };
const char* phase_name(Phase phase);

void set_step(int64_t step);  // the step being computed (1-based as in the logs)
void enter(Phase phase);      // also restarts the phase clock

// While alive, the worker waits in collective `op` number `seq`; the previous phase returns after.
class CollectiveWait {
 public:
  CollectiveWait(const char* op, uint64_t seq);
  ~CollectiveWait();
  CollectiveWait(const CollectiveWait&) = delete;
  CollectiveWait& operator=(const CollectiveWait&) = delete;

 private:
  Phase previous_;
  int64_t previous_since_ns_;
};

struct Snapshot {
  int64_t step = 0;
  Phase phase = Phase::kStarting;
  std::string op;      // collective name when phase == kCollective
  uint64_t seq = 0;    // its sequence number on this rank
  double phase_s = 0;  // seconds in this phase so far
};
Snapshot snapshot();

// The heartbeat value: "v1 <beat> <step> <phase> <op|-> <seq> <phase_ms> <host> <unix_time>",
// and back. The launcher judges staleness on its own clock; the sender's time is for reports.
std::string encode(const Snapshot& s, uint64_t beat, const std::string& host, double unix_time);
struct Beat {
  uint64_t beat = 0;
  Snapshot where;
  std::string host;
  double unix_time = 0;  // when the rank sent it (its clock)
};
bool decode(const std::string& text, Beat& out);

// "backward of step 12", "all_reduce #1742 (step 12)".
std::string describe(const Snapshot& s);

}  // namespace dstrain::progress
