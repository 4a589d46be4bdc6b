#pragma once
// Where this worker is right now: the step, the phase (forward, backward, a collective with its
// name and sequence number, optimizer, checkpoint), since when, and with a pipeline the stage and
// micro-batch (and what a transfer carries between which stages). The training loop and the
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

// Where in a pipeline schedule this worker is: the stage and micro-batch of the action running
// now and, for a transfer, what it carries from which stage to which. Set by the schedule's
// executor (pipeline_exec/executor.h) for each action; a default PipelinePlace clears it.
enum class Carries : int { kNothing = 0, kActivations = 1, kGradient = 2 };
struct PipelinePlace {
  int stage = -1;  // -1: not in a pipeline action
  int micro_batch = -1;
  Carries carries = Carries::kNothing;
  int from_stage = -1, to_stage = -1;  // a transfer's ends
  bool operator==(const PipelinePlace& o) const {
    return stage == o.stage && micro_batch == o.micro_batch && carries == o.carries && from_stage == o.from_stage && to_stage == o.to_stage;
  }
};
void set_pipeline_place(const PipelinePlace& place);

struct Snapshot {
  int64_t step = 0;
  Phase phase = Phase::kStarting;
  std::string op;      // collective name when phase == kCollective
  uint64_t seq = 0;    // its sequence number on this rank
  double phase_s = 0;  // seconds in this phase so far
  PipelinePlace pipeline;
};
Snapshot snapshot();

// The heartbeat value: "v1 <beat> <step> <phase> <op|-> <seq> <phase_ms> <host> <unix_time>
// [p<stage>,<micro-batch>,<carries>,<from>,<to>]", and back (the pipeline place only in a pipeline
// action). The launcher judges staleness on its own clock; the sender's time is for reports.
std::string encode(const Snapshot& s, uint64_t beat, const std::string& host, double unix_time);
struct Beat {
  uint64_t beat = 0;
  Snapshot where;
  std::string host;
  double unix_time = 0;  // when the rank sent it (its clock)
};
bool decode(const std::string& text, Beat& out);

// "backward of step 12", "all_reduce #1742 (step 12)", "forward of step 4 (stage 2, micro-batch
// 3)", "recv #9 (step 4): micro-batch 3's activations from stage 1 to stage 2".
std::string describe(const Snapshot& s);

}  // namespace dstrain::progress
