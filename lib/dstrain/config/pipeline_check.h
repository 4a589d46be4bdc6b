#pragma once
// The checks on the pipeline keys (parallel.pipeline_parallel_size, pipeline.*) against the
// model, the world and the batch, for the config's validation; torch-free and light (the
// config fuzzer links it).
#include <functional>
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::config {

// `problem` gets what must change (naming the key), `warn` what has no effect.
void check_pipeline(const Recipe& recipe, const std::function<void(const std::string&)>& problem,
                    const std::function<void(const std::string&)>& warn);

// "" when parallel.pipeline_parallel_size divides the world, else the problem. Checked before the
// batch math, which divides by the data-parallel ranks (world / pipeline_parallel_size).
std::string pipeline_world_problem(const Recipe& recipe);

// The micro-batches per step the schedule runs: every accumulation stage's steps.
std::vector<int64_t> micro_batches_per_step(const Recipe& recipe);
// pipeline.layers_per_stage as layer counts.
std::vector<int> given_split(const Recipe& recipe);

}  // namespace dstrain::config
