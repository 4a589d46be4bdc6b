#pragma once
// The worker process: `dstrain worker`, started by the launcher with the WorkerEnv variables.

namespace dstrain::run {
struct WorkerEnv;
}

namespace dstrain::train {

// Runs the training loop of one rank; returns its exit status. Throws dstrain::Error.
int run_worker(const run::WorkerEnv& env);

}  // namespace dstrain::train
