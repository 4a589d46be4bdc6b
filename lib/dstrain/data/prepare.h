#pragma once
// `dstrain prepare-data`: text and JSON Lines (plain or gzip, files, folders or stdin) -> a
// Megatron indexed dataset, tokenized either byte-level (0-255 are bytes, 256 ends a document;
// vocab 257) or with a Hugging Face tokenizer.json. Parallel over records (files, JSON lines),
// with output identical whatever the number of workers. With --chat, each JSON example is a
// conversation: rendered with the model's chat template, tokenized, and written with its loss
// mask (PREFIX.lossmask), one document per conversation in input order.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dstrain/data/chat_encoder.h"
#include "dstrain/data/conversation.h"
#include "dstrain/data/documents.h"
#include "dstrain/data/preference.h"

namespace dstrain::data {

constexpr int64_t kByteEos = 256;
constexpr int64_t kByteVocab = 257;

enum class ChatMode { kAuto, kOn, kOff };

struct ChatPrepareOptions {
  ChatMode mode = ChatMode::kAuto;  // auto: on when the first JSON line holds a conversation and a tokenizer is given
  ChatFormat format = ChatFormat::kAuto;
  ChatFields fields;
  std::string chat_template;  // a template file or tokenizer_config.json; "": the tokenizer folder's own
  std::string template_name = "default";
  std::string builtin;  // --template NAME (builtin_chat_template)
  ChatEncodeOptions encode;
  bool skip_errors = false;  // --on-error skip: drop and count malformed or refused conversations
};

// --preference: each JSON example is a chosen/rejected pair (data/preference.h), written as two
// documents (prompt + chosen, prompt + rejected) with the completions' loss mask.
// --kto: rows for train.objective kto (data/kto_set.h): labelled completions, or pairs unpaired.
struct PreferencePrepareOptions {
  bool on = false;
  PreferenceEncodeOptions encode;
  bool kto = false;
  int64_t kl_batch_size = 8;  // --kl-batch-size
};

struct PrepareOptions {
  std::vector<std::string> inputs;                  // files, directories (walked recursively, sorted), "-" for stdin
  std::vector<std::string> extensions;              // keep files with these suffixes; empty: all files
  std::string output_prefix;                        // writes PREFIX.bin, PREFIX.idx, PREFIX.json (per key when several)
  int64_t max_bytes = 0;                            // stop after this much input (decompressed); 0: no limit
  int64_t max_line_bytes = kDefaultMaxRecordBytes;  // the longest JSON line or text file (decompressed)
  std::string tokenizer;                            // tokenizer.json or its folder; "": byte-level
  std::string end_of_document;                      // the token written after each document; "": the tokenizer's own
  InputFormat input_format = InputFormat::kAuto;
  std::vector<std::string> json_keys{"text"};
  int workers = 0;          // 0: every online core
  ChatPrepareOptions chat;  // --preference reads its template options (chat_template, template_name) and skip_errors
  PreferencePrepareOptions preference;
  // Asked between batches; true stops with Error{kInterrupted}, the staged files removed and an
  // older set at the prefix left as it was (the command wires SIGINT and SIGTERM to it).
  std::function<bool()> stop_requested;
};

struct PrepareProgress {
  int64_t bytes = 0, documents = 0, tokens = 0;
  double seconds = 0;
};

struct PrepareOutput {
  std::string prefix, key;  // key: the JSON key ("" for text)
  int64_t documents = 0, tokens = 0;
  uint32_t bin_crc32c = 0, idx_crc32c = 0;
  int64_t trained_tokens = -1, lossmask_bytes = 0;  // with --chat; -1: no loss mask
  uint32_t lossmask_crc32c = 0;
};

// What --chat did with the conversations; `first_*`: the first such conversation's file:line and why.
struct ChatCounts {
  int64_t kept = 0, truncated = 0, too_long = 0, untrained = 0, skipped = 0, rewrites_history = 0, doubled_bos = 0;
  int64_t longest = 0;  // tokens of the longest conversation kept
  std::string first_skip, first_rewrite;
};

// What --preference did with the rows; `first_*`: the first such row's file:line (and why).
// With --kto, `pairs` counts the paired rows read and `examples` the examples kept (`desirable` of them).
struct PreferenceCounts {
  int64_t pairs = 0, truncated = 0, prompt_too_long = 0, identical = 0, skipped = 0;
  int64_t examples = 0, desirable = 0, labelled_rows = 0;
  int64_t with_margin = 0;  // pairs kept with a "margin" (TRL's reward margin column)
  bool kto = false;
  int64_t longest = 0;  // tokens of the longest sequence (prompt + completion) kept
  std::string first_skip, first_identical;
};

struct PrepareSummary {
  std::vector<PrepareOutput> outputs;
  int64_t input_bytes = 0, documents = 0, tokens = 0, empty_documents = 0;
  int64_t vocab_size = 0, end_of_document = 0;
  int64_t repaired_utf8 = 0, dropped_characters = 0;
  std::string tokenizer;  // "bytes+eos" or the tokenizer's description
  bool chat = false;
  ChatCounts chat_counts;
  bool preference = false;
  PreferenceCounts preference_counts;
  std::string chat_template, end_of_turn;  // with --chat: the template's name, the end-of-turn token
  std::string kto_labels;                  // with --kto: each example's label, '1' desirable
  std::vector<double> margins;             // with --preference: each kept pair's "margin" (every pair has one, or none does)
  double seconds = 0;
  int workers = 1;
};

// `progress` is called from the calling thread a few times a second and once at the end.
PrepareSummary prepare_dataset(const PrepareOptions& options, const std::function<void(const PrepareProgress&)>& progress = {});

// One line: how many conversations were kept, truncated, dropped and skipped, and why.
std::string chat_counts_line(const ChatCounts& counts);
std::string preference_counts_line(const PreferenceCounts& counts);

}  // namespace dstrain::data
