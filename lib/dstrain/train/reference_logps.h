#pragma once
// The reference model's log-probs for train.objective dpo and kto (TRL's precompute_ref_log_probs): one
// forward pass over every pair by the model as the run starts, before its first update, made once
// and kept beside the dataset as PREFIX.ref.<key>, where key hashes what they depend on (the
// model section, seed, dtype, lora section, preference.ld_alpha when it weighs the sums, the
// init_from folder's weight files and PREFIX.json, which holds the set's CRCs). A later run or a resume from the same model and data reads
// them (a resume must: its model has moved); anything else makes another file.
//   file  "DSTRREF1\n", one line of JSON {"version", "key", "pairs", "crc32c", "data"}, then
//         2 x pairs float64 (little-endian): pair i's chosen and rejected completion sums (LD-DPO's
//         weighted sums with preference.ld_alpha); of an unpaired set (kto), example i's and its KL sequence's
// The pass runs through the training runner's forward (ZeRO-3 gathers, expert parallelism):
// micro-batch g of train.micro_batch_size pairs on data-parallel rank g % world, every rank the
// same number of forwards, the table summed in rank order (each entry comes from one rank: exact).
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "dstrain/model/objective.h"

namespace dstrain::config {
struct Recipe;
}
namespace dstrain::comm {
class Communicator;
}
namespace dstrain::data {
class PreferencePairs;
}
namespace dstrain::train {

class StepRunner;

// Fills each set's reference table (every pair of its file), in order: read from PREFIX.ref.<key>
// beside the set when it is there, else computed and written by rank 0, atomically. The key hashes
// the model section, seed, dtype, LoRA block, the init_from folders' files (checksummed once for
// all the sets) and the set's PREFIX.json. `moved`: why the model is no longer the reference (a
// resume; dstrain eval of a checkpoint), so that a missing file is Error{kData} with that reason;
// empty: the model is the reference. Collective over `data_parallel`.
void prepare_reference_logps(const config::Recipe& recipe, const std::vector<const data::PreferencePairs*>& sets, StepRunner& runner,
                             model::CausalLM& model, comm::Communicator& data_parallel, const std::string& moved);

// An objective that scores nothing and appends each batch's completion log-prob sums (float64
// [rows], LD-DPO's weighted sums with preference.ld_alpha) to `captured`: the reference's pass.
model::Objective reference_capture(const config::Recipe& recipe, std::vector<at::Tensor>& captured);

// What the reference's log-probs depend on besides the data (JSON): the model section, seed, dtype,
// LoRA block, LD-DPO's alpha, and the init_from folders' files, checksummed (cached per file version).
std::string reference_model_identity(const config::Recipe& recipe);

}  // namespace dstrain::train
