#pragma once
// `dstrain export-hf`: a run's newest (or a given) checkpoint as a Hugging Face model directory.
#include <string>

namespace dstrain::tasks {

// Returns the checkpoint directory that was exported.
std::string export_run_to_hf(const std::string& run_dir, const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace dstrain::tasks
