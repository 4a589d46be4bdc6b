#pragma once
// Where a reward model reads each sequence's score (train.objective reward): as transformers'
// GenericForSequenceClassification does, at the rightmost token that is not config.pad_token_id,
// which TRL's RewardTrainer sets to the tokenizer's pad_token, else its eos_token. A sequence
// that ends in that token (a turn closed by an eos that is also the pad) is scored one token
// earlier: dstrain trains the model the way transformers will run it.
#include <cstdint>
#include <vector>

namespace dstrain::config {
struct DatasetSidecar;
}
namespace dstrain::data {

// The pad token of the tokenizer a set was prepared with (its copy beside the set:
// tokenizer_config.json's pad_token), else the set's end-of-document token. Throws Error{kData}
// naming the set's PREFIX.json when it has neither.
int64_t score_pad_token(const config::DatasetSidecar& sidecar);

// The index in `tokens` of the rightmost token that is not `pad`; 0 when every token is `pad`
// (transformers' argmax over an all-zero mask).
int64_t score_position(const std::vector<int64_t>& tokens, int64_t pad);

}  // namespace dstrain::data
