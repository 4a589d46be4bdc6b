#pragma once
// PREFIX.json for a fine-tuning set a test wrote by hand (data::write_megatron and a finished
// LossMaskWriter), as `prepare-data --chat` describes its sets: without it a loss mask is refused
// (data/dataset_set.h), since nothing could check it against the tokens.
#include <fmt/format.h>

#include <string>

#include "dstrain/core/atomic_file.h"
#include "dstrain/data/loss_mask.h"

namespace dstrain::test {

inline void describe_fine_tuning_set(const std::string& prefix, int64_t vocab_size, const data::LossMaskWriter& mask) {
  write_file_atomic(prefix + ".json",
                    fmt::format("{{\"format\": \"megatron\", \"version\": 2, \"tokenizer\": \"bytes+eos\", \"vocab_size\": {}, "
                                "\"loss_mask\": {{\"version\": {}, \"bytes\": {}, \"crc32c\": \"{:08x}\", "
                                "\"trained_tokens\": {}}}}}\n",
                                vocab_size, data::kLossMaskVersion, mask.tokens() + static_cast<int64_t>(data::kLossMaskHeaderBytes),
                                mask.crc32c(), mask.trained()));
}

}  // namespace dstrain::test
