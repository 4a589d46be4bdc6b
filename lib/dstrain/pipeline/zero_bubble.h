#pragma once
// The zero-bubble H1 schedule's compute order (Qi et al. 2023, "Zero Bubble Pipeline
// Parallelism"): each rank's backward split into I (input gradient, on the critical path) and W
// (weight gradient, free to move) placed later on the later ranks.
#include <vector>

#include "dstrain/pipeline/schedule.h"

namespace dstrain::pipeline {

// Per rank, the F/I/W actions of `ranks` stages (one per rank) over `micro_batches`: 1F1B's order
// with each backward's I where the B was, and rank r's W passes deferred by r micro-batches (the
// rest at the end). The deferred W's let the I's reach the first ranks sooner, and fill the
// drain; every rank then holds at most `ranks` micro-batches not yet through W, 1F1B's peak
// (rank 0's), and the bubble is the paper's (p-1)(F+I-W)/(m(F+I+W)) (tested on a grid).
std::vector<std::vector<Action>> zero_bubble_h1(int ranks, int micro_batches);

}  // namespace dstrain::pipeline
