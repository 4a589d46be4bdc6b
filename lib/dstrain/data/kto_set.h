#pragma once
// An unpaired set (prepare-data --preference --kto, train.objective kto) as TRL 1.16's
// KTOTrainer builds it (trainer/kto_trainer.py, _prepare_dataset; data_utils.py):
//   order     paired rows are unpaired in chunks of 1000 rows (datasets' map batch): the chunk's
//             chosen completions (desirable), then its rejected ones; labelled rows stay as they are
//   drop      an example whose prompt alone fills max_length (its completion would be cut away)
//   KL        each example's KL sequence is its prompt with the completion of the example before
//             it in its chunk of kl_batch_size (TRL's per_device_train_batch_size), the first
//             taking the chunk's last: completions rotated by one within each chunk, in set order
//   cut       each sequence, the example's and the KL one, cut to max_length from the right
// The set holds example i as documents 2i (prompt + completion) and 2i + 1 (prompt + its KL
// completion), each with a loss mask over its completion, and example i's label.
#include <cstdint>
#include <string>
#include <vector>

#include "dstrain/data/preference.h"

namespace dstrain::data {

struct KtoSetOptions {
  int64_t max_length = 0;     // tokens per sequence; 0: no limit
  int64_t kl_batch_size = 8;  // the chunks the KL completions rotate in (TRL's default per-device batch)
};

struct KtoSequence {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;  // 1 over the completion's tokens
};

struct KtoSet {
  std::vector<KtoSequence> sequences;  // 2 per example: the example, its KL sequence
  std::string labels;                  // per example: '1' desirable, '0' undesirable
  int64_t truncated = 0, prompt_too_long = 0, longest = 0;
};

// Examples per unpairing chunk of paired rows (Hugging Face datasets' default map batch).
constexpr size_t kUnpairChunkRows = 1000;

// The set from the input's rows in file order.
KtoSet assemble_kto_set(std::vector<UnpairedRow> rows, const KtoSetOptions& options);

}  // namespace dstrain::data
