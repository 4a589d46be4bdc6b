#pragma once
// `dstrain prepare-data`: text and JSON Lines (plain or gzip, files, folders or stdin) -> a
// Megatron indexed dataset, tokenized either byte-level (0-255 are bytes, 256 ends a document;
// vocab 257) or with a Hugging Face tokenizer.json. Parallel over records (files, JSON lines),
// with output identical whatever the number of workers.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dstrain/data/documents.h"

namespace dstrain::data {

constexpr int64_t kByteEos = 256;
constexpr int64_t kByteVocab = 257;

struct PrepareOptions {
  std::vector<std::string> inputs;      // files, directories (walked recursively, sorted), "-" for stdin
  std::vector<std::string> extensions;  // keep files with these suffixes; empty: all files
  std::string output_prefix;            // writes PREFIX.bin, PREFIX.idx, PREFIX.json (per key when several)
  int64_t max_bytes = 0;                // stop after this much input; 0: no limit
  std::string tokenizer;                // tokenizer.json or its folder; "": byte-level
  std::string end_of_document;          // the token written after each document; "": the tokenizer's own
  InputFormat input_format = InputFormat::kAuto;
  std::vector<std::string> json_keys{"text"};
  int workers = 0;  // 0: every online core
};

struct PrepareProgress {
  int64_t bytes = 0, documents = 0, tokens = 0;
  double seconds = 0;
};

struct PrepareOutput {
  std::string prefix, key;  // key: the JSON key ("" for text)
  int64_t documents = 0, tokens = 0;
  uint32_t bin_crc32c = 0, idx_crc32c = 0;
};

struct PrepareSummary {
  std::vector<PrepareOutput> outputs;
  int64_t input_bytes = 0, documents = 0, tokens = 0, empty_documents = 0;
  int64_t vocab_size = 0, end_of_document = 0;
  int64_t repaired_utf8 = 0, dropped_characters = 0;
  std::string tokenizer;  // "bytes+eos" or the tokenizer's description
  double seconds = 0;
  int workers = 1;
};

// `progress` is called from the calling thread a few times a second and once at the end.
PrepareSummary prepare_dataset(const PrepareOptions& options, const std::function<void(const PrepareProgress&)>& progress = {});

}  // namespace dstrain::data
