#pragma once
// The checks on parallel.sequence_parallel_size against the world, the model, the sequence and
// the features that do not shard the sequence yet, for the config's validation; torch-free (the
// config fuzzer links it).
#include <functional>
#include <string>

#include "dstrain/config/recipe.h"

namespace dstrain::config {

// "" when parallel.sequence_parallel_size divides a pipeline stage's data-parallel ranks, else the
// problem. Checked before the batch math, which counts those ranks / sequence_parallel_size.
std::string sequence_world_problem(const Recipe& recipe);

// `problem` gets what must change, naming the key and what to do.
void check_sequence_parallel(const Recipe& recipe, const std::function<void(const std::string&)>& problem);

}  // namespace dstrain::config
