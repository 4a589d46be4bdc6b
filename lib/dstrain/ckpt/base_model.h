#pragma once
// The identity of a LoRA run's base (ckpt::BaseModel): what a checkpoint that does not hold the
// frozen weights records, and what a resume, an eval or a merge compares before reading them.
#include <string>

#include "dstrain/ckpt/checkpoint.h"

namespace dstrain::ckpt {

// The Hugging Face folder's weight files (*.safetensors, in name order) with their sizes and
// CRC-32C (core/file_checksum: read once per file version and cached, as datasets are). Throws
// Error{kCheckpoint} when the folder holds no weight file.
BaseModel identify_base(const std::string& folder);

// Empty when `now` is the base `then` names (the folder may have moved); else what differs,
// naming the first file that does: "model-00002-of-00004.safetensors: CRC-32C 1a2b3c4d, the
// checkpoint's base had 5e6f7a8b".
std::string base_difference(const BaseModel& then, const BaseModel& now);

// Throws Error{kCheckpoint} unless `now` (the base this run reads: model.init_from) is the base
// checkpoint `dir` names (`then`), saying which file differs and where the checkpoint's base was
// (or that its files changed, when the folder is the same).
void check_checkpoint_base(const std::string& dir, const BaseModel& then, const BaseModel& now);

// One line of JSON and back (a manifest's "base"; rank 0 sends its answer to the others).
std::string to_json(const BaseModel& base);
BaseModel base_model_from_json(const std::string& json);

}  // namespace dstrain::ckpt
