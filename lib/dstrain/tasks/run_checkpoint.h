#pragma once
// The checkpoint of a run that a step names, as eval's --step and export-hf's --checkpoint take
// it: "" for the newest that verifies, "best" for the one checkpoint.keep_best kept, or a step
// number. Throws Error naming what the run does hold.
#include <string>

namespace dstrain::tasks {

// `run` is the run directory (for messages), `root` its checkpoint directory, `flag` the option
// that named the step.
std::string run_checkpoint(const std::string& run, const std::string& root, const std::string& step, const std::string& flag = "--step");

}  // namespace dstrain::tasks
