#pragma once
// What `dstrain prepare-data` wrote about a Megatron dataset, in PREFIX.json beside PREFIX.bin:
// the vocabulary it was tokenized for, its end-of-document token and the tokenizer's hash. The
// config checks the recipe against it (model.vocab_size, data.eos_token, one tokenizer for all
// blended sources); export-hf finds the tokenizer through it.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::config {

struct DatasetSidecar {
  std::string file;  // PREFIX.json
  int64_t vocab_size = -1, eos = -1;
  std::string tokenizer;         // "bytes+eos" or "huggingface"
  std::string tokenizer_sha256;  // huggingface only
  std::string tokenizer_dir;     // huggingface only: the copied tokenizer files (absolute)
  // prepare-data --chat: PREFIX.lossmask's size and CRC-32C (-1 and 0 without one), trained tokens.
  int64_t lossmask_bytes = -1, trained_tokens = -1, longest_conversation = -1;
  uint32_t lossmask_crc32c = 0;
  std::string end_of_turn;        // the token that ends assistant turns (prepare-data --chat)
  int64_t preference_pairs = -1;  // prepare-data --preference: its pairs (documents 2i chosen, 2i + 1 rejected); -1: not such a set
  std::vector<double> preference_margins;  // ... each pair's "margin" (a reward model's), when the rows had them
  // prepare-data --preference --kto: its examples (documents 2i the example, 2i + 1 its KL sequence), and
  // each one's label, '1' desirable and '0' undesirable; -1: not such a set.
  int64_t kto_examples = -1;
  std::string kto_labels;
};

// The PREFIX of a Megatron data path given as PREFIX, PREFIX.bin or PREFIX.idx.
std::string megatron_prefix(const std::string& path);

// PREFIX.json of `data_path`; nullopt when there is none or it is not prepare-data's. `read`
// returns a file's text (nullopt when missing).
std::optional<DatasetSidecar> read_dataset_sidecar(const std::string& data_path,
                                                   const std::function<std::optional<std::string>(const std::string&)>& read);

// The same, read from the disk.
std::optional<DatasetSidecar> read_dataset_sidecar(const std::string& data_path);

// "'DATA' was prepared with another tokenizer (sha256 ..., PREFIX.json) than the weights' own
// MODEL_DIR/tokenizer.json (sha256 ...)" when the two differ; "" when they agree or either is unknown.
std::string other_tokenizer_than(const std::string& model_dir, const std::string& data_path);

// What in the recipe contradicts its datasets' sidecars, one message each.
std::vector<std::string> sidecar_problems(const Recipe& r, const std::function<std::optional<std::string>(const std::string&)>& read);

}  // namespace dstrain::config
