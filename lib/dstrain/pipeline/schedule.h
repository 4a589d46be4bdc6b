#pragma once
// A pipeline schedule as data: for each pipeline rank, the ordered list of what it does in one
// optimizer step (forward, backward, or backward split into its input- and weight-gradient
// halves, and the point-to-point transfers between them). Built once from the config, checked
// by validate() (pipeline/validate.h), printed by --dry-run --show-schedule, replayed with costs by
// simulate() (pipeline/timeline.h) and, later, executed as it stands.
//
// Stages are the model's consecutive pieces, 0 .. ranks x virtual_stages - 1; stage s lives on
// rank s mod ranks ("loop" placement: with virtual stages a rank holds every ranks-th piece).
#include <string>
#include <vector>

namespace dstrain::pipeline {

// gpipe: every forward, then every backward. 1f1b: PipeDream-Flush (warm-up forwards, then a
// forward and a backward in turn). interleaved_1f1b: Megatron's, with virtual stages. zb_h1:
// zero-bubble H1 (Qi et al. 2023): backward split into an input-gradient pass on the critical path
// and a weight-gradient pass that fills the idle time, no more activations held than 1f1b.
enum class ScheduleKind { kGpipe, k1F1B, kInterleaved1F1B, kZbH1 };
const std::vector<std::string>& schedule_names();  // in ScheduleKind's order: "gpipe", "1f1b", ...
const std::string& schedule_name(ScheduleKind kind);

enum class Op : unsigned char {
  kForward,         // F
  kBackward,        // B: input and weight gradients together
  kBackwardInput,   // I: the gradient of the stage's input (what the previous stage waits for)
  kBackwardWeight,  // W: the weights' gradients (needs I's output gradient; nobody waits for it)
  kSendForward,     // SF: this stage's output to the next stage's rank
  kRecvForward,     // RF: this stage's input from the previous stage's rank
  kSendBackward,    // SB: the gradient of this stage's input to the previous stage's rank
  kRecvBackward,    // RB: the gradient of this stage's output from the next stage's rank
};
bool is_compute(Op op);

struct Action {
  Op op;
  int stage;        // the stage it is for (sends: the stage that produced it; receives: the one that consumes it)
  int micro_batch;  // 0 .. micro_batches - 1
  int peer = -1;    // sends and receives: the other rank
  bool operator==(const Action& o) const { return op == o.op && stage == o.stage && micro_batch == o.micro_batch && peer == o.peer; }
};
// "F3.12" (stage 3, micro-batch 12), "I3.12", "W3.12", "B3.12", "SF3.12>1", "RF4.12<3", ...
std::string action_text(const Action& action);

struct Schedule {
  ScheduleKind kind = ScheduleKind::k1F1B;
  int ranks = 1;                             // P: pipeline ranks
  int virtual_stages = 1;                    // v: stages per rank
  int micro_batches = 1;                     // m: micro-batches per optimizer step
  std::vector<std::vector<Action>> actions;  // per rank, in order
  int stages() const { return ranks * virtual_stages; }
  int rank_of(int stage) const { return stage % ranks; }
};

// What the schedule needs of its numbers, "" when they are fine: a sentence for the config layer
// to prefix with the key that sets each number.
std::string schedule_rule_problem(ScheduleKind kind, int ranks, int virtual_stages, int micro_batches);

// The schedule's actions for every rank. Throws Error{kConfig} when schedule_rule_problem() has
// something to say.
Schedule build_schedule(ScheduleKind kind, int ranks, int virtual_stages, int micro_batches);

// Every rank's compute order with the transfers put around it: a receive just before the compute
// that needs it, a send just after the compute that produces it; then, where a rank would receive
// a peer's messages in another order than the peer sends them (interleaved at 2 ranks: forward
// activations and backward gradients share the link), the earlier messages are received sooner,
// since NCCL delivers each pair's messages in order. The generators give compute only.
Schedule with_transfers(Schedule compute_only);

// Forwards only (evaluation): each rank runs its stages' forwards micro-batch by micro-batch
// (micro-batch-major, its stages in order within one), with their transfers. Every receive waits
// only on a forward earlier in that order, so no rank waits forever; the pipeline fills as in
// GPipe's first half. `kind` is gpipe (no backward to order).
Schedule forward_only_schedule(int ranks, int virtual_stages, int micro_batches);

// One line per rank: "rank 0: F0.0 SF0.0>1 F0.1 ...".
std::string schedule_text(const Schedule& schedule);

}  // namespace dstrain::pipeline
