#pragma once
// Checks a schedule before anything runs it: every stage's forward and backward of every
// micro-batch exactly once on the stage's rank, in an order that respects the data (F before its
// backward, I before W, a receive before the compute that needs it, a send after the compute that
// produces it), every receive matched by exactly one send between the right ranks, and the whole
// running to its end without a rank waiting forever (sends posted, receives blocking).
#include <string>
#include <vector>

#include "dstrain/pipeline/schedule.h"

namespace dstrain::pipeline {

// What is wrong, one sentence each (the first `max_problems`); empty: the schedule is valid.
std::vector<std::string> validate(const Schedule& schedule, size_t max_problems = 20);

}  // namespace dstrain::pipeline
