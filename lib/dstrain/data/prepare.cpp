#include "dstrain/data/prepare.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/threads.h"
#include "dstrain/data/kto_set.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/megatron_writer.h"
#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/tokenizer.h"
#include "dstrain/text/utf8.h"

namespace dstrain::data {
namespace fs = std::filesystem;

namespace {

constexpr size_t kBatchBytes = 1 << 20;  // records are handed to workers in batches of about this much
constexpr size_t kBatchRecords = 4096;

struct Batch {
  uint64_t index = 0;
  std::vector<Record> records;
};

// What a worker made of a batch: per output (JSON key), the tokens and each document's length.
struct Encoded {
  uint64_t index = 0;
  std::vector<std::vector<uint32_t>> tokens, lengths;
  struct Origin {
    uint32_t source;
    uint64_t line;
  };
  std::vector<std::vector<Origin>> origins;  // per output and document: where it came from (error messages)
  std::vector<uint8_t> mask;                 // --chat: the loss mask of the one output's tokens
  ChatCounts chat;
  PreferenceCounts preference;
  std::vector<std::optional<double>> margins;  // --preference: each kept pair's "margin"
  std::vector<UnpairedRow> unpaired;           // --kto: the rows, assembled into the set once all are read
  std::vector<Origin> unpaired_origins;
  int64_t bytes = 0, empty = 0, repaired = 0;
  std::exception_ptr error;
};

// Turns one document's text into tokens followed by the end-of-document token.
class DocumentEncoder {
 public:
  DocumentEncoder(std::shared_ptr<const text::Tokenizer> tokenizer, uint32_t eod) : tokenizer_(std::move(tokenizer)), eod_(eod) {}
  // Returns how many invalid UTF-8 sequences were replaced.
  size_t encode(std::string& text, std::vector<uint32_t>& out) {
    if (!tokenizer_) {
      for (unsigned char c : text) out.push_back(c);
      out.push_back(eod_);
      return 0;
    }
    const size_t repaired = text::repair_utf8(text);
    const size_t first = out.size();
    tokenizer_->encode(text, out, session_);
    if (out.size() == first || out.back() != eod_) out.push_back(eod_);  // unless the template already ends with it
    return repaired;
  }
  size_t dropped() const { return session_.dropped_characters(); }
  text::Tokenizer::Session& session() { return session_; }

 private:
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  uint32_t eod_;
  text::Tokenizer::Session session_;
};

bool blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; });
}

void encode_batch(Batch& batch, const std::vector<DocumentSource>& sources, const std::vector<std::string>& keys, DocumentEncoder& encoder,
                  Encoded& out) {
  out.index = batch.index;
  out.tokens.assign(keys.size(), {});
  out.lengths.assign(keys.size(), {});
  out.origins.assign(keys.size(), {});
  for (uint32_t r = 0; r < batch.records.size(); ++r) {
    Record& record = batch.records[r];
    out.bytes += static_cast<int64_t>(record.payload.size());
    std::vector<std::string> texts;
    if (sources[record.source].jsonl) {
      if (blank(record.payload)) continue;
      texts = json_line_texts(record, keys, sources[record.source].path);
    } else {
      texts.assign(keys.size(), std::string());
      texts[0].swap(record.payload);  // a text file feeds the first output
    }
    for (size_t k = 0; k < texts.size(); ++k) {
      if (texts[k].empty()) {
        out.empty += k == 0 || sources[record.source].jsonl;
        continue;
      }
      const size_t before = out.tokens[k].size();
      out.repaired += static_cast<int64_t>(encoder.encode(texts[k], out.tokens[k]));
      out.lengths[k].push_back(static_cast<uint32_t>(std::min<size_t>(out.tokens[k].size() - before, 0xffffffffu)));
      out.origins[k].push_back({record.source, record.line});
    }
  }
}

std::string where(const Record& record, const std::vector<DocumentSource>& sources, size_t element, bool array) {
  const std::string& path = sources[record.source].path;
  const std::string file = path == "-" ? "stdin" : path;
  if (record.line) return fmt::format("{}:{}", file, record.line);
  return array ? fmt::format("{}: element {}", file, element) : file;
}

// One example of a --chat input: counted, dropped or appended to `out` (tokens, mask, length).
// `json` is released once read: a long message is not held in its line as well.
void encode_conversation(std::string& json, const std::string& origin, const Record& record, const ChatEncoder& encoder,
                         const ChatPrepareOptions& o, text::Tokenizer::Session& session, Encoded& out) {
  EncodedChat chat;
  std::string problem;
  try {
    Conversation conversation = parse_conversation(json, o.format, o.fields);
    std::string().swap(json);
    encoder.encode(std::move(conversation), chat, session);
  } catch (const ConversationError& e) {
    problem = e.what();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kData) throw Error(e.code(), fmt::format("{}: {}", origin, e.what()), e.hint());
    problem = fmt::format("the chat template refused it: {}", e.what());
  }
  if (!problem.empty()) {
    if (!o.skip_errors)
      throw Error(ErrorCode::kData, fmt::format("{}: {}", origin, problem),
                  "fix or remove the conversation, or pass --on-error skip to drop such lines and count them");
    if (out.chat.skipped++ == 0) out.chat.first_skip = fmt::format("{}: {}", origin, problem);
    return;
  }
  if (chat.rewrites_history && out.chat.rewrites_history++ == 0) out.chat.first_rewrite = origin;
  out.chat.doubled_bos += chat.doubled_bos;
  if (chat.outcome == ChatOutcome::kTooLong) return void(++out.chat.too_long);
  if (chat.outcome == ChatOutcome::kNothingTrained) return void(++out.chat.untrained);
  out.chat.truncated += chat.outcome == ChatOutcome::kTruncated;
  ++out.chat.kept;
  const size_t length = chat.tokens.size();
  out.chat.longest = std::max(out.chat.longest, static_cast<int64_t>(length));
  if (out.tokens[0].empty() && out.mask.empty()) {  // moved, not copied, where it can be: a long conversation's ids are large
    out.tokens[0] = std::move(chat.tokens), out.mask = std::move(chat.mask);
  } else {
    out.tokens[0].insert(out.tokens[0].end(), chat.tokens.begin(), chat.tokens.end());
    out.mask.insert(out.mask.end(), chat.mask.begin(), chat.mask.end());
  }
  out.lengths[0].push_back(static_cast<uint32_t>(length));
  out.origins[0].push_back({record.source, record.line});
}

// --chat and --preference: each JSON line, each element of a .json file's array or a .json file's
// one object is one example, handed to `each` with where it came from.
template <class Each>
void for_each_example(Batch& batch, const std::vector<DocumentSource>& sources, const char* flag, Encoded& out, Each each) {
  out.index = batch.index;
  out.tokens.assign(1, {}), out.lengths.assign(1, {}), out.origins.assign(1, {});
  for (Record& record : batch.records) {
    out.bytes += static_cast<int64_t>(record.payload.size());
    if (blank(record.payload)) continue;
    const size_t first = record.payload.find_first_not_of(" \t\r\n");
    if (sources[record.source].jsonl || record.payload[first] != '[') {
      each(record.payload, where(record, sources, 0, false), record);
      continue;
    }
    std::vector<std::string> elements;
    try {
      elements = json_array_elements(record.payload);
    } catch (const ConversationError& e) {
      throw Error(ErrorCode::kData, fmt::format("{}: {}", where(record, sources, 0, false), e.what()),
                  fmt::format("a {} input is JSON Lines (one example per line) or a .json file holding an array of examples", flag));
    }
    for (size_t e = 0; e < elements.size(); ++e) each(elements[e], where(record, sources, e, true), record);
  }
}

void encode_chat_batch(Batch& batch, const std::vector<DocumentSource>& sources, const ChatEncoder& encoder, const ChatPrepareOptions& o,
                       text::Tokenizer::Session& session, Encoded& out) {
  for_each_example(batch, sources, "--chat", out, [&](std::string& json, const std::string& origin, const Record& record) {
    encode_conversation(json, origin, record, encoder, o, session, out);
  });
}

// Runs `encode` on a --preference row: true when it succeeded; false when the row is malformed
// or refused and --on-error skip counted it (otherwise Error{kData} naming the row).
template <class Encode>
bool encoded_row(const std::string& origin, bool skip_errors, PreferenceCounts& c, Encode encode) {
  std::string problem;
  try {
    encode();
    return true;
  } catch (const PreferenceError& e) {
    problem = e.what();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kData) throw Error(e.code(), fmt::format("{}: {}", origin, e.what()), e.hint());
    problem = fmt::format("the chat template refused it: {}", e.what());
  }
  if (!skip_errors)
    throw Error(ErrorCode::kData, fmt::format("{}: {}", origin, problem),
                "fix or remove the row, or pass --on-error skip to drop such rows and count them");
  if (c.skipped++ == 0) c.first_skip = fmt::format("{}: {}", origin, problem);
  return false;
}

// One row of a --preference input: counted, dropped or appended to `out` as two documents.
void encode_pair(const std::string& json, const std::string& origin, const Record& record, const PreferenceEncoder& encoder,
                 bool skip_errors, text::Tokenizer::Session& session, Encoded& out) {
  EncodedPair pair;
  PreferenceCounts& c = out.preference;
  if (!encoded_row(origin, skip_errors, c, [&] { pair = encoder.encode(json, session); })) return;
  if (pair.outcome == PairOutcome::kPromptTooLong) return void(++c.prompt_too_long);
  if (pair.identical && c.identical++ == 0) c.first_identical = origin;
  c.truncated += pair.outcome == PairOutcome::kTruncated;
  ++c.pairs;
  c.with_margin += pair.margin.has_value();
  out.margins.push_back(pair.margin);
  for (auto* part : {&pair.chosen, &pair.rejected}) {
    const std::vector<uint8_t>& mask = part == &pair.chosen ? pair.chosen_mask : pair.rejected_mask;
    c.longest = std::max(c.longest, static_cast<int64_t>(part->size()));
    out.tokens[0].insert(out.tokens[0].end(), part->begin(), part->end());
    out.mask.insert(out.mask.end(), mask.begin(), mask.end());
    out.lengths[0].push_back(static_cast<uint32_t>(part->size()));
    out.origins[0].push_back({record.source, record.line});
  }
}

// One row of a --kto input: counted, dropped or kept in `out.unpaired` for the set's assembly.
void encode_unpaired_row(const std::string& json, const std::string& origin, const Record& record, const PreferenceEncoder& encoder,
                         bool skip_errors, text::Tokenizer::Session& session, Encoded& out) {
  UnpairedRow row;
  if (!encoded_row(origin, skip_errors, out.preference, [&] { row = encoder.encode_unpaired(json, session); })) return;
  out.unpaired.push_back(std::move(row));
  out.unpaired_origins.push_back({record.source, record.line});
}

void encode_preference_batch(Batch& batch, const std::vector<DocumentSource>& sources, const PreferenceEncoder& encoder, bool skip_errors,
                             bool kto, text::Tokenizer::Session& session, Encoded& out) {
  for_each_example(batch, sources, "--preference", out, [&](std::string& json, const std::string& origin, const Record& record) {
    if (kto) return encode_unpaired_row(json, origin, record, encoder, skip_errors, session, out);
    encode_pair(json, origin, record, encoder, skip_errors, session, out);
  });
}

// --kto: the rows read so far, in input order; a file mixing pairs with labelled rows is refused
// (TRL decides by the first row).
void collect_unpaired(Encoded& e, const std::vector<DocumentSource>& sources, std::vector<UnpairedRow>& rows, std::string& first_origin) {
  for (size_t i = 0; i < e.unpaired.size(); ++i) {
    const Encoded::Origin& at = e.unpaired_origins[i];
    const std::string origin = at.line ? fmt::format("{}:{}", sources[at.source].path, at.line) : sources[at.source].path;
    if (!rows.empty() && rows.front().paired != e.unpaired[i].paired)
      throw Error(ErrorCode::kData,
                  fmt::format("{}: a {} row after {}'s {} row", origin, e.unpaired[i].paired ? "chosen/rejected" : "labelled", first_origin,
                              rows.front().paired ? "chosen/rejected" : "labelled"),
                  "a --kto input is either pairs (unpaired as TRL does) or {prompt, completion, label} rows; prepare them apart");
    if (rows.empty()) first_origin = origin;
    e.preference.pairs += e.unpaired[i].paired;
    e.preference.labelled_rows += !e.unpaired[i].paired;
    rows.push_back(std::move(e.unpaired[i]));
  }
  e.unpaired.clear();
}

// The reader thread, the workers and the ordered hand-over to the writer.
class Pipeline {
 public:
  Pipeline(RecordReader& reader, int workers, int64_t max_bytes) : reader_(reader), workers_(workers), max_bytes_(max_bytes) {}
  ~Pipeline() { stop(); }

  template <class Work>
  void start(Work work) {
    threads_.emplace_back([this] { read_loop(); });
    for (int w = 0; w < workers_; ++w) threads_.emplace_back([this, work] { work_loop(work); });
  }

  // The next batch in input order; false when all are done. Rethrows a reader error.
  bool next(Encoded& out) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return done_.count(next_out_) || (read_finished_ && next_out_ == read_count_) || reader_error_; });
    if (reader_error_) std::rethrow_exception(reader_error_);
    if (!done_.count(next_out_)) return false;
    out = std::move(done_.at(next_out_));
    done_.erase(next_out_++);
    changed_.notify_all();
    return true;
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void read_loop() {
    try {
      uint64_t index = 0;
      for (bool more = true; more;) {
        Batch batch;
        batch.index = index;
        size_t bytes = 0;
        Record record;
        while (bytes < kBatchBytes && batch.records.size() < kBatchRecords && (more = !limit_reached() && reader_.next(record))) {
          bytes += record.payload.size();
          batch.records.push_back(std::move(record));
        }
        if (batch.records.empty()) break;
        std::unique_lock<std::mutex> lock(mutex_);
        // Bounded memory: at most 4 batches per worker between the reader and the writer.
        changed_.wait(lock, [&] { return stopping_ || index < next_out_ + 4 * static_cast<uint64_t>(workers_); });
        if (stopping_) return;
        queue_.push_back(std::move(batch));
        read_count_ = ++index;
        changed_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      reader_error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    read_finished_ = true;
    changed_.notify_all();
  }

  bool limit_reached() const { return max_bytes_ > 0 && reader_.bytes_read() >= max_bytes_; }

  template <class Work>
  void work_loop(Work work) {
    for (;;) {
      Batch batch;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || !queue_.empty() || read_finished_; });
        if (stopping_ || queue_.empty()) return;
        batch = std::move(queue_.front());
        queue_.pop_front();
      }
      Encoded encoded;
      try {
        work(batch, encoded);
      } catch (...) {
        encoded.error = std::current_exception();
      }
      encoded.index = batch.index;
      std::lock_guard<std::mutex> lock(mutex_);
      done_.emplace(encoded.index, std::move(encoded));
      changed_.notify_all();
    }
  }

  RecordReader& reader_;
  const int workers_;
  const int64_t max_bytes_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> queue_;
  std::map<uint64_t, Encoded> done_;
  uint64_t next_out_ = 0, read_count_ = 0;
  bool read_finished_ = false, stopping_ = false;
  std::exception_ptr reader_error_;
};

std::string origin_of(const Encoded& e, size_t output, size_t doc, const std::vector<DocumentSource>& sources) {
  const Encoded::Origin& r = e.origins[output][doc];
  const std::string& path = sources[r.source].path;
  return r.line ? fmt::format("{}:{}", path == "-" ? "stdin" : path, r.line) : path;
}

// --preference: the kept pairs' margins, in input order. Every pair has one or none does: TRL's
// reward collator reads the column from every row when the first has it.
struct MarginColumn {
  std::vector<double> values;
  std::string first_origin;
  bool present = false;
  int64_t pairs = 0;

  void add(const Encoded& e, const std::vector<DocumentSource>& sources) {
    for (size_t i = 0; i < e.margins.size(); ++i, ++pairs) {
      const bool has = e.margins[i].has_value();
      const std::string origin = origin_of(e, 0, 2 * i, sources);  // the pair's chosen document
      if (pairs == 0) first_origin = origin, present = has;
      if (has != present)
        throw Error(ErrorCode::kData,
                    fmt::format("{}: a pair {} a \"margin\", after {}'s pair {} one", origin, has ? "with" : "without", first_origin,
                                present ? "with" : "without"),
                    "give every pair a \"margin\" (TRL's reward margin) or none");
      if (has) values.push_back(*e.margins[i]);
    }
  }
};

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
      continue;
    }
    out += c;
  }
  return out;
}

const char* train_on_name(TrainOn t) { return t == TrainOn::kAll ? "all" : t == TrainOn::kLastAssistant ? "last" : "assistant"; }

// PREFIX.json's loss mask entry (--chat, --preference): its file, version, size, hash and trained tokens.
std::string loss_mask_sidecar(const PrepareOutput& o) {
  return fmt::format(
      ", \"loss_mask\": {{\"file\": \"{}.lossmask\", \"version\": {}, \"bytes\": {}, \"crc32c\": \"{:08x}\", \"trained_tokens\": {}}}, ",
      json_escape(fs::path(o.prefix).filename().string()), kLossMaskVersion, o.lossmask_bytes, o.lossmask_crc32c, o.trained_tokens);
}

// The --chat part of PREFIX.json: the loss mask's file, size and hash, and what was done.
std::string chat_sidecar(const PrepareOutput& o, const PrepareSummary& s, const ChatPrepareOptions& chat) {
  const ChatCounts& c = s.chat_counts;
  return loss_mask_sidecar(o) +
         fmt::format(
             "\"chat\": {{\"template\": \"{}\", \"end_of_turn\": \"{}\", \"train_on\": \"{}\", \"max_length\": {}, \"overlength\": \"{}\", "
             "\"last_turn_verbatim\": {}, \"conversations\": {}, \"truncated\": {}, \"dropped_too_long\": {}, \"dropped_untrained\": {}, "
             "\"skipped_errors\": {}, \"rewrites_history\": {}, \"doubled_bos_removed\": {}, \"longest_conversation\": {}}}",
             json_escape(s.chat_template), json_escape(s.end_of_turn), train_on_name(chat.encode.train_on), chat.encode.max_length,
             chat.encode.overlength == Overlength::kDrop ? "drop" : "truncate", chat.encode.last_turn_verbatim ? "true" : "false", c.kept,
             c.truncated, c.too_long, c.untrained, c.skipped, c.rewrites_history, c.doubled_bos, c.longest);
}

// ", \"margins\": [...]": each pair's margin, exactly (none: "").
std::string margins_entry(const std::vector<double>& margins) {
  if (margins.empty()) return "";
  std::string out = ", \"margins\": [";
  for (size_t i = 0; i < margins.size(); ++i) out += fmt::format("{}{:.17g}", i ? ", " : "", margins[i]);
  return out + "]";
}

// The --preference part of PREFIX.json: the loss mask, and the pairs (documents 2i chosen, 2i + 1 rejected).
std::string preference_sidecar(const PrepareOutput& o, const PrepareSummary& s, const PreferencePrepareOptions& p) {
  const PreferenceCounts& c = s.preference_counts;
  return loss_mask_sidecar(o) +
         fmt::format(
             "\"preference\": {{\"format\": \"trl\", \"template\": \"{}\", \"pairs\": {}, \"max_length\": {}, \"truncation_mode\": \"{}\", "
             "\"truncated\": {}, \"dropped_prompt_too_long\": {}, \"identical\": {}, \"skipped_errors\": {}, \"longest_sequence\": {}{}}}",
             json_escape(s.chat_template), c.pairs, p.encode.max_length, p.encode.keep_end ? "keep_end" : "keep_start", c.truncated,
             c.prompt_too_long, c.identical, c.skipped, c.longest, margins_entry(s.margins));
}

// The --kto part of PREFIX.json: the loss mask, and the examples (documents 2i the example, 2i + 1
// its KL sequence) with their labels.
std::string kto_sidecar(const PrepareOutput& o, const PrepareSummary& s, const PreferencePrepareOptions& p) {
  const PreferenceCounts& c = s.preference_counts;
  return loss_mask_sidecar(o) +
         fmt::format(
             "\"kto\": {{\"format\": \"trl\", \"template\": \"{}\", \"examples\": {}, \"desirable\": {}, \"undesirable\": {}, "
             "\"kl_batch_size\": {}, \"max_length\": {}, \"paired_rows\": {}, \"labelled_rows\": {}, \"truncated\": {}, "
             "\"dropped_prompt_too_long\": {}, \"skipped_errors\": {}, \"longest_sequence\": {}, \"labels\": \"{}\"}}",
             json_escape(s.chat_template), c.examples, c.desirable, c.examples - c.desirable, p.kl_batch_size, p.encode.max_length, c.pairs,
             c.labelled_rows, c.truncated, c.prompt_too_long, c.skipped, c.longest, s.kto_labels);
}

// PREFIX.json (staged as PREFIX.json.tmp, published last): what the dataset holds and how it was
// made, with its other files' CRCs (train checks the set against them: data/dataset_set.h).
void write_sidecar(const PrepareOutput& o, const PrepareSummary& s, const text::Tokenizer* tokenizer, const std::string& tokenizer_dir,
                   const ChatPrepareOptions& chat, const PreferencePrepareOptions& preference) {
  std::string tok = "\"tokenizer\": \"bytes+eos\"";
  if (tokenizer)
    tok = fmt::format("\"tokenizer\": \"huggingface\", \"tokenizer_sha256\": \"{}\", \"tokenizer_dir\": \"{}\"", tokenizer->sha256(),
                      json_escape(tokenizer_dir));
  write_file_atomic(o.prefix + ".json.tmp",
                    fmt::format("{{\"format\": \"megatron\", \"version\": 2, {}, \"vocab_size\": {}, \"eos\": {}, \"json_key\": \"{}\", "
                                "\"documents\": {}, \"tokens\": {}, \"crc32c_bin\": \"{:08x}\", \"crc32c_idx\": \"{:08x}\"{}}}\n",
                                tok, s.vocab_size, s.end_of_document, json_escape(o.key), o.documents, o.tokens, o.bin_crc32c, o.idx_crc32c,
                                s.chat         ? chat_sidecar(o, s, chat)
                                : s.preference ? (preference.kto ? kto_sidecar(o, s, preference) : preference_sidecar(o, s, preference))
                                               : ""));
}

// The tokenizer's files, copied next to the dataset (PREFIX.tokenizer/), for inspect-data and
// export-hf: staged in PREFIX.tokenizer.tmp/ (returned), published with the rest of the set.
std::string stage_tokenizer(const text::Tokenizer& tokenizer, const std::string& prefix) {
  const fs::path dir = prefix + ".tokenizer.tmp";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& file : tokenizer.files()) {
    const std::string name = file == tokenizer.json_path() ? "tokenizer.json" : fs::path(file).filename().string();
    write_file_atomic((dir / name).string(), read_file(file));
  }
  return dir.string();
}

// The temporary names of PREFIX's files: an interrupted run (kill -9) leaves them behind.
const char* const kStagedSuffixes[] = {".bin.tmp", ".idx.tmp", ".lossmask.tmp", ".json.tmp", ".tokenizer.tmp"};

void remove_staged(const std::string& prefix) {
  std::error_code ignored;
  for (const char* suffix : kStagedSuffixes) fs::remove_all(prefix + suffix, ignored);
}

// Removes the staged files of every output unless publish() ran (an error before it leaves the
// older set as it was, and no temporaries).
struct StagedSet {
  std::vector<std::string> prefixes;
  bool published = false;
  ~StagedSet() {
    if (!published)
      for (const auto& p : prefixes) remove_staged(p);
  }
};

// Makes a staged folder visible under `to`, the older one (if any) gone.
void publish_folder(const std::string& from, const std::string& to) {
  if (!fs::exists(to)) return rename_atomic(from, to);
  exchange_atomic(from, to);
  fs::remove_all(from);  // now the older folder
}

uint32_t choose_end_of_document(const PrepareOptions& o, const text::Tokenizer* tokenizer) {
  if (!tokenizer) {
    if (!o.end_of_document.empty())
      throw Error(ErrorCode::kUsage, "--eod-token needs --tokenizer", "byte-level datasets always end documents with token 256");
    return static_cast<uint32_t>(kByteEos);
  }
  if (!o.end_of_document.empty()) {
    if (auto id = tokenizer->token_id(o.end_of_document)) return *id;
    throw Error(ErrorCode::kUsage, fmt::format("--eod-token '{}' is not a token of {}", o.end_of_document, tokenizer->json_path()),
                "pass the end-of-document token's text exactly, e.g. --eod-token '<|endoftext|>'");
  }
  if (auto id = tokenizer->default_end_of_document()) return *id;
  throw Error(ErrorCode::kUsage, fmt::format("{} names no end-of-document token", tokenizer->json_path()),
              "pass the token written after each document with --eod-token");
}

// Refuses a --chat, --preference or --kto run that kept nothing to train on.
void check_something_kept(const PrepareSummary& s, bool kto) {
  if (kto && s.preference_counts.examples == 0)
    throw Error(ErrorCode::kData, "no KTO example is left to train on", preference_counts_line(s.preference_counts));
  if (s.preference && !kto && s.preference_counts.pairs == 0)
    throw Error(ErrorCode::kData, "no preference pair is left to train on", preference_counts_line(s.preference_counts));
  if (s.chat && s.chat_counts.kept == 0)
    throw Error(ErrorCode::kData, "no conversation is left to train on", chat_counts_line(s.chat_counts));
}

// --kto: the assembled set's documents (example, then its KL sequence), and its counts.
void write_kto_set(const KtoSet& set, MegatronStreamWriter& writer, LossMaskWriter& masks, const std::string& origin, PrepareSummary& s,
                   PrepareProgress& p) {
  for (const KtoSequence& seq : set.sequences) {
    writer.add_document(seq.tokens.data(), seq.tokens.size(), origin);
    masks.add(seq.mask.data(), seq.mask.size());
    p.tokens += static_cast<int64_t>(seq.tokens.size());
  }
  p.documents += static_cast<int64_t>(set.sequences.size());
  PreferenceCounts& c = s.preference_counts;
  c.kto = true;
  c.examples = static_cast<int64_t>(set.labels.size());
  c.desirable = std::count(set.labels.begin(), set.labels.end(), '1');
  c.truncated = set.truncated, c.prompt_too_long = set.prompt_too_long, c.longest = set.longest;
  s.kto_labels = set.labels;
}

void add_counts(PreferenceCounts& into, const PreferenceCounts& c) {
  if (into.first_skip.empty()) into.first_skip = c.first_skip;
  if (into.first_identical.empty()) into.first_identical = c.first_identical;
  into.examples += c.examples, into.desirable += c.desirable, into.labelled_rows += c.labelled_rows;
  into.pairs += c.pairs, into.truncated += c.truncated, into.prompt_too_long += c.prompt_too_long, into.identical += c.identical;
  into.skipped += c.skipped, into.longest = std::max(into.longest, c.longest), into.with_margin += c.with_margin;
}

void add_counts(ChatCounts& into, const ChatCounts& c) {
  if (into.first_skip.empty()) into.first_skip = c.first_skip;
  if (into.first_rewrite.empty()) into.first_rewrite = c.first_rewrite;
  into.kept += c.kept, into.truncated += c.truncated, into.too_long += c.too_long, into.untrained += c.untrained;
  into.skipped += c.skipped, into.rewrites_history += c.rewrites_history, into.doubled_bos += c.doubled_bos;
  into.longest = std::max(into.longest, c.longest);
}

// Whether this run reads conversations: --chat, or (auto) the first JSON line holds one.
bool choose_chat(const PrepareOptions& o, const std::vector<DocumentSource>& sources, bool have_tokenizer) {
  if (o.chat.mode == ChatMode::kOff) return false;
  if (o.chat.mode == ChatMode::kOn) {
    if (!have_tokenizer)
      throw Error(ErrorCode::kUsage, "--chat needs --tokenizer", "conversations are rendered with the tokenizer's chat template");
    if (o.json_keys != std::vector<std::string>{"text"})
      throw Error(ErrorCode::kUsage, "--chat and --json-key do not go together", "name a conversation's fields with --chat-fields");
    return true;
  }
  const auto first = std::find_if(sources.begin(), sources.end(), [](const DocumentSource& s) { return s.jsonl && s.path != "-"; });
  if (!have_tokenizer || o.json_keys != std::vector<std::string>{"text"} || first == sources.end()) return false;
  RecordReader peek({*first}, o.max_line_bytes);
  Record record;
  while (peek.next(record))
    if (!blank(record.payload)) return looks_like_conversation(record.payload, o.chat.fields);
  return false;
}

// --preference's template: --chat-template, else the tokenizer folder's own; text rows need only
// its eos_token, so a tokenizer without a template is fine until a conversational row comes.
std::unique_ptr<PreferenceEncoder> make_preference_encoder(const PrepareOptions& o, std::shared_ptr<const text::Tokenizer> tokenizer) {
  if (!tokenizer)
    throw Error(ErrorCode::kUsage, "--preference needs --tokenizer", "pairs are tokenized as TRL does, with the model's tokenizer");
  if (o.chat.mode == ChatMode::kOn)
    throw Error(ErrorCode::kUsage, "--preference and --chat do not go together", "a preference row is one pair");
  if (!o.chat.builtin.empty()) throw Error(ErrorCode::kUsage, "--template does not go with --preference", "pass --chat-template FILE");
  const std::string dir = fs::is_directory(o.tokenizer) ? o.tokenizer : fs::path(o.tokenizer).parent_path().string();
  text::ChatTemplateSource source;
  try {
    source = text::read_chat_template(o.chat.chat_template.empty() ? dir : o.chat.chat_template, o.chat.template_name);
  } catch (const Error&) {
    if (!o.chat.chat_template.empty()) throw;
    source = {};
  }
  if (source.bos_token.empty() && source.eos_token.empty()) text::read_special_tokens(dir, source);
  return std::make_unique<PreferenceEncoder>(std::move(source), std::move(tokenizer), o.preference.encode);
}

std::unique_ptr<ChatEncoder> make_chat_encoder(const PrepareOptions& o, std::shared_ptr<const text::Tokenizer> tokenizer) {
  const std::string dir = fs::is_directory(o.tokenizer) ? o.tokenizer : fs::path(o.tokenizer).parent_path().string();
  text::ChatTemplateSource source;
  ChatEncodeOptions encode = o.chat.encode;
  if (!o.chat.builtin.empty()) {
    if (!o.chat.chat_template.empty()) throw Error(ErrorCode::kUsage, "--template and --chat-template do not go together", "");
    if (!builtin_chat_template(o.chat.builtin, source))
      throw Error(ErrorCode::kUsage, fmt::format("--template '{}' is not a built-in template", o.chat.builtin),
                  "the built-in templates: deepseek-coder-finetune; or pass --chat-template FILE");
    text::read_special_tokens(dir, source);
    if (encode.end_of_turn.empty()) encode.end_of_turn = "<|EOT|>";  // the script's EOT_TOKEN
  } else {
    source = text::read_chat_template(o.chat.chat_template.empty() ? dir : o.chat.chat_template, o.chat.template_name);
    if (source.bos_token.empty() && source.eos_token.empty()) text::read_special_tokens(dir, source);
  }
  return std::make_unique<ChatEncoder>(std::move(source), std::move(tokenizer), std::move(encode));
}

// What the summary knows before any input is read.
PrepareSummary start_summary(const PrepareOptions& o, const text::Tokenizer* tokenizer) {
  PrepareSummary summary;
  summary.end_of_document = choose_end_of_document(o, tokenizer);
  summary.vocab_size = tokenizer ? tokenizer->vocab_size() : kByteVocab;
  summary.tokenizer = tokenizer ? tokenizer->describe() : "bytes+eos";
  summary.workers = o.workers > 0 ? o.workers : std::max(1, online_cores());
  return summary;
}

}  // namespace

// Each output's staged files under their names, its PREFIX.json last; the first output's also the
// tokenizer folder (`staged_tokenizer`; "": none, so an older set's goes).
void publish_outputs(const std::vector<std::unique_ptr<MegatronStreamWriter>>& writers, LossMaskWriter* masks,
                     const std::string& staged_tokenizer, const std::string& output_prefix) {
  for (size_t k = 0; k < writers.size(); ++k) {
    const std::string& prefix = writers[k]->prefix();
    writers[k]->publish();
    if (masks)
      masks->publish();
    else
      fs::remove(prefix + ".lossmask");  // an older fine-tuning set's: no part of this one
    if (k == 0) {
      if (!staged_tokenizer.empty())
        publish_folder(staged_tokenizer, output_prefix + ".tokenizer");
      else
        fs::remove_all(output_prefix + ".tokenizer");
    }
    rename_atomic(prefix + ".json.tmp", prefix + ".json");
  }
}

PrepareSummary prepare_dataset(const PrepareOptions& o, const std::function<void(const PrepareProgress&)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::shared_ptr<const text::Tokenizer> tokenizer;
  if (!o.tokenizer.empty()) tokenizer = text::Tokenizer::load(o.tokenizer);
  if (o.json_keys.empty()) throw Error(ErrorCode::kUsage, "--json-key is empty", "name the key that holds the text, e.g. --json-key text");
  PrepareSummary summary = start_summary(o, tokenizer.get());
  const auto sources = list_sources(o.inputs, o.extensions, o.input_format);
  summary.preference = o.preference.on;
  summary.chat = !summary.preference && choose_chat(o, sources, tokenizer != nullptr);
  std::unique_ptr<PreferenceEncoder> preference;
  if (summary.preference) preference = make_preference_encoder(o, tokenizer), summary.chat_template = preference->source().name;
  std::unique_ptr<ChatEncoder> chat;
  if (summary.chat)
    chat = make_chat_encoder(o, tokenizer), summary.chat_template = chat->source().name, summary.end_of_turn = chat->end_of_turn();
  const bool any_jsonl = std::any_of(sources.begin(), sources.end(), [](const DocumentSource& s) { return s.jsonl; });
  const std::vector<std::string> keys = any_jsonl && !chat && !preference ? o.json_keys : std::vector<std::string>{""};
  // Megatron's rule: uint16 below 65500 ids, int32 above.
  const int dtype = summary.vocab_size < 65500 ? 8 : 4;
  StagedSet staged;  // declared before the writers: destroyed after them
  for (const auto& key : keys) staged.prefixes.push_back(keys.size() > 1 ? o.output_prefix + "_" + key : o.output_prefix);
  staged.prefixes.push_back(o.output_prefix);  // its PREFIX.tokenizer.tmp
  for (const auto& prefix : staged.prefixes) remove_staged(prefix);
  std::vector<std::unique_ptr<MegatronStreamWriter>> writers;
  for (const auto& key : keys)
    writers.push_back(std::make_unique<MegatronStreamWriter>(keys.size() > 1 ? o.output_prefix + "_" + key : o.output_prefix, dtype));
  std::unique_ptr<LossMaskWriter> masks;
  if (chat || preference) masks = std::make_unique<LossMaskWriter>(o.output_prefix);

  RecordReader reader(sources, o.max_line_bytes);
  Pipeline pipeline(reader, summary.workers, o.max_bytes);
  std::atomic<int64_t> dropped{0};
  pipeline.start([&sources, &keys, &tokenizer, &dropped, &o, chat = chat.get(), preference = preference.get(),
                  eod = summary.end_of_document](Batch& batch, Encoded& out) {
    thread_local std::unique_ptr<DocumentEncoder> encoder;  // one per worker thread (its caches)
    if (!encoder) encoder = std::make_unique<DocumentEncoder>(tokenizer, eod);
    const size_t before = encoder->dropped();
    if (preference) {
      encode_preference_batch(batch, sources, *preference, o.chat.skip_errors, o.preference.kto, encoder->session(), out);
    } else if (chat) {
      encode_chat_batch(batch, sources, *chat, o.chat, encoder->session(), out);
    } else {
      encode_batch(batch, sources, keys, *encoder, out);
    }
    dropped += static_cast<int64_t>(encoder->dropped() - before);
  });
  Encoded encoded;
  PrepareProgress p;
  double last_report = -1;
  std::vector<UnpairedRow> unpaired;
  std::string first_unpaired;
  MarginColumn margins;
  while (pipeline.next(encoded)) {
    if (o.stop_requested && o.stop_requested())
      throw Error(ErrorCode::kInterrupted, fmt::format("prepare-data stopped by a signal; nothing was written to {}", o.output_prefix),
                  "a dataset already at that prefix is as it was");
    if (encoded.error) std::rethrow_exception(encoded.error);
    collect_unpaired(encoded, sources, unpaired, first_unpaired);
    margins.add(encoded, sources);
    for (size_t k = 0; k < writers.size(); ++k) {
      const uint32_t* tokens = encoded.tokens[k].data();
      const uint8_t* mask = encoded.mask.data();
      for (size_t d = 0; d < encoded.lengths[k].size(); ++d) {
        writers[k]->add_document(tokens, encoded.lengths[k][d], origin_of(encoded, k, d, sources));
        if (masks) masks->add(mask, encoded.lengths[k][d]), mask += encoded.lengths[k][d];
        tokens += encoded.lengths[k][d];
        p.tokens += encoded.lengths[k][d];
      }
      p.documents += static_cast<int64_t>(encoded.lengths[k].size());
    }
    add_counts(summary.chat_counts, encoded.chat);
    add_counts(summary.preference_counts, encoded.preference);
    p.bytes += encoded.bytes;
    summary.empty_documents += encoded.empty;
    summary.repaired_utf8 += encoded.repaired;
    if (progress && seconds() - last_report >= 0.25) p.seconds = last_report = seconds(), progress(p);
  }
  pipeline.stop();
  summary.margins = std::move(margins.values);
  if (o.preference.kto)
    write_kto_set(assemble_kto_set(std::move(unpaired), {o.preference.encode.max_length, o.preference.kl_batch_size}), *writers.front(),
                  *masks, first_unpaired, summary, p);
  check_something_kept(summary, o.preference.kto);
  // Every file of every output is staged under its temporary name first: a full disk or an error
  // here leaves the older set whole. Then they are published, PREFIX.json last.
  for (auto& w : writers) w->stage();
  if (masks) masks->stage();
  const std::string tokenizer_dir = tokenizer ? fs::path(o.output_prefix + ".tokenizer").filename().string() : "";
  const std::string staged_tokenizer = tokenizer ? stage_tokenizer(*tokenizer, o.output_prefix) : "";
  // The template that rendered the conversations travels with the tokenizer (export-hf ships it).
  if (chat) text::write_chat_template_into(staged_tokenizer, chat->source());
  if (preference && !preference->source().source.empty()) text::write_chat_template_into(staged_tokenizer, preference->source());
  for (size_t k = 0; k < writers.size(); ++k) {
    PrepareOutput out{writers[k]->prefix(),    keys[k], writers[k]->documents(), writers[k]->tokens(), writers[k]->bin_crc32c(),
                      writers[k]->idx_crc32c()};
    if (masks)
      out.trained_tokens = masks->trained(), out.lossmask_bytes = masks->tokens() + static_cast<int64_t>(kLossMaskHeaderBytes),
      out.lossmask_crc32c = masks->crc32c();
    write_sidecar(out, summary, tokenizer.get(), tokenizer_dir, o.chat, o.preference);
    summary.outputs.push_back(out);
  }
  publish_outputs(writers, masks.get(), staged_tokenizer, o.output_prefix);
  staged.published = true;
  summary.dropped_characters = dropped.load();
  summary.input_bytes = p.bytes, summary.documents = p.documents, summary.tokens = p.tokens, summary.seconds = seconds();
  if (progress) p.seconds = summary.seconds, progress(p);
  return summary;
}

std::string chat_counts_line(const ChatCounts& c) {
  std::string out = fmt::format("{} conversations kept", c.kept);
  if (c.truncated) out += fmt::format(", {} truncated to --max-length", c.truncated);
  if (c.too_long) out += fmt::format(", {} dropped as longer than --max-length", c.too_long);
  if (c.untrained) out += fmt::format(", {} dropped with no trained token", c.untrained);
  if (c.skipped) out += fmt::format(", {} skipped as malformed or refused (--on-error skip; the first: {})", c.skipped, c.first_skip);
  return out;
}

std::string preference_counts_line(const PreferenceCounts& c) {
  std::string out = fmt::format("{} preference pairs kept", c.pairs);
  if (c.kto)
    out = fmt::format("{} KTO examples kept ({} desirable, {} undesirable) from {}", c.examples, c.desirable, c.examples - c.desirable,
                      c.labelled_rows > 0 ? fmt::format("{} labelled rows", c.labelled_rows) : fmt::format("{} pairs unpaired", c.pairs));
  if (c.truncated) out += fmt::format(", {} truncated to --max-length", c.truncated);
  if (c.prompt_too_long) out += fmt::format(", {} dropped: the prompt alone fills --max-length (keep_start)", c.prompt_too_long);
  if (c.identical)
    out += fmt::format(", {} with chosen equal to rejected (kept; they teach nothing; the first: {})", c.identical, c.first_identical);
  if (c.with_margin) out += ", each with a margin";
  if (c.skipped) out += fmt::format(", {} skipped as malformed or refused (--on-error skip; the first: {})", c.skipped, c.first_skip);
  return out;
}

}  // namespace dstrain::data
