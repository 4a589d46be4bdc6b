#pragma once
// A schedule replayed with costs: when each rank runs what, how long it waits, how many
// micro-batches' activations it holds. The bubble it measures is what --dry-run prints and
// `dstrain bench pipeline` compares with the papers' formulas; the executor's measured step
// timelines are compared with it too.
#include <string>
#include <vector>

#include "dstrain/pipeline/schedule.h"

namespace dstrain::pipeline {

// The time of one micro-batch through one rank's whole share of the model (its v stages
// together; one stage costs 1/v of it), in any unit. A backward that is not split costs
// backward_input + backward_weight. A transfer arrives `transfer` after it is sent; sends do not
// block the sender (they are posted and waited for later, as the executor does).
struct Costs {
  double forward = 1, backward_input = 1, backward_weight = 1, transfer = 0;
};

struct Span {
  double start, end;
  Action action;
};

struct Timeline {
  double makespan = 0;
  std::vector<double> busy;              // per rank: time computing
  std::vector<int> peak_activations;     // per rank: most stage micro-batches forwarded and not yet through B or I
  std::vector<int> peak_weight_stash;    // per rank: most stage micro-batches through I and not yet through W
  std::vector<int> peak_held;            // per rank: most of both at once (what memory must hold)
  std::vector<std::vector<Span>> spans;  // per rank: the compute actions' times
  std::string deadlock;                  // "": every rank finished; else what every stuck rank waits for
  // Idle time over compute time, over all ranks: (ranks x makespan - busy) / busy. 1F1B's
  // (p - 1) / m is this measure.
  double bubble() const;
};
Timeline simulate(const Schedule& schedule, const Costs& costs);

// The bubble the papers give for this schedule (no transfer time): (p-1)/m for gpipe and 1f1b,
// (p-1)/(v m) interleaved (Narayanan et al. 2021), (p-1)(F+I-W)/(m(F+I+W)) for zb_h1 (Qi et al.
// 2023; DualPipe's table).
double bubble_formula(const Schedule& schedule, const Costs& costs);

// The timeline as rows of characters, one per rank, a column per `unit` of time: the action's
// letter (F, B, I, W; lower case for odd micro-batches so that neighbours show) or '.' idle.
std::string timeline_chart(const Timeline& timeline, double unit, int max_columns = 160);

}  // namespace dstrain::pipeline
