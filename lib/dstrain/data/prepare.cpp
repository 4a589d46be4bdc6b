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
#include "dstrain/data/megatron_writer.h"
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

// PREFIX.json: what the dataset holds and how it was made (train and export-hf read it).
void write_sidecar(const PrepareOutput& o, const PrepareSummary& s, const text::Tokenizer* tokenizer, const std::string& tokenizer_dir) {
  std::string tok = "\"tokenizer\": \"bytes+eos\"";
  if (tokenizer)
    tok = fmt::format("\"tokenizer\": \"huggingface\", \"tokenizer_sha256\": \"{}\", \"tokenizer_dir\": \"{}\"", tokenizer->sha256(),
                      json_escape(tokenizer_dir));
  write_file_atomic(
      o.prefix + ".json",
      fmt::format("{{\"format\": \"megatron\", \"version\": 2, {}, \"vocab_size\": {}, \"eos\": {}, \"json_key\": \"{}\", "
                  "\"documents\": {}, \"tokens\": {}, \"crc32c_bin\": \"{:08x}\", \"crc32c_idx\": \"{:08x}\"}}\n",
                  tok, s.vocab_size, s.end_of_document, json_escape(o.key), o.documents, o.tokens, o.bin_crc32c, o.idx_crc32c));
}

// The tokenizer's files, copied next to the dataset (PREFIX.tokenizer/), for inspect-data and
// export-hf. Returns the folder's name relative to the dataset.
std::string copy_tokenizer(const text::Tokenizer& tokenizer, const std::string& prefix) {
  const fs::path dir = prefix + ".tokenizer";
  fs::create_directories(dir);
  for (const auto& file : tokenizer.files()) {
    const std::string name = file == tokenizer.json_path() ? "tokenizer.json" : fs::path(file).filename().string();
    write_file_atomic((dir / name).string(), read_file(file));
  }
  return dir.filename().string();
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

}  // namespace

PrepareSummary prepare_dataset(const PrepareOptions& o, const std::function<void(const PrepareProgress&)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::shared_ptr<const text::Tokenizer> tokenizer;
  if (!o.tokenizer.empty()) tokenizer = text::Tokenizer::load(o.tokenizer);
  if (o.json_keys.empty()) throw Error(ErrorCode::kUsage, "--json-key is empty", "name the key that holds the text, e.g. --json-key text");
  PrepareSummary summary;
  summary.end_of_document = choose_end_of_document(o, tokenizer.get());
  summary.vocab_size = tokenizer ? tokenizer->vocab_size() : kByteVocab;
  summary.tokenizer = tokenizer ? tokenizer->describe() : "bytes+eos";
  summary.workers = o.workers > 0 ? o.workers : std::max(1, online_cores());
  const auto sources = list_sources(o.inputs, o.extensions, o.input_format);
  const bool any_jsonl = std::any_of(sources.begin(), sources.end(), [](const DocumentSource& s) { return s.jsonl; });
  const std::vector<std::string> keys = any_jsonl ? o.json_keys : std::vector<std::string>{""};
  // Megatron's rule: uint16 below 65500 ids, int32 above.
  const int dtype = summary.vocab_size < 65500 ? 8 : 4;
  std::vector<std::unique_ptr<MegatronStreamWriter>> writers;
  for (const auto& key : keys)
    writers.push_back(std::make_unique<MegatronStreamWriter>(keys.size() > 1 ? o.output_prefix + "_" + key : o.output_prefix, dtype));

  RecordReader reader(sources);
  Pipeline pipeline(reader, summary.workers, o.max_bytes);
  std::atomic<int64_t> dropped{0};
  pipeline.start([&sources, &keys, &tokenizer, &dropped, eod = summary.end_of_document](Batch& batch, Encoded& out) {
    thread_local std::unique_ptr<DocumentEncoder> encoder;  // one per worker thread (its caches)
    if (!encoder) encoder = std::make_unique<DocumentEncoder>(tokenizer, eod);
    const size_t before = encoder->dropped();
    encode_batch(batch, sources, keys, *encoder, out);
    dropped += static_cast<int64_t>(encoder->dropped() - before);
  });
  Encoded encoded;
  PrepareProgress p;
  double last_report = -1;
  while (pipeline.next(encoded)) {
    if (encoded.error) std::rethrow_exception(encoded.error);
    for (size_t k = 0; k < writers.size(); ++k) {
      const uint32_t* tokens = encoded.tokens[k].data();
      for (size_t d = 0; d < encoded.lengths[k].size(); ++d) {
        writers[k]->add_document(tokens, encoded.lengths[k][d], origin_of(encoded, k, d, sources));
        tokens += encoded.lengths[k][d];
        p.tokens += encoded.lengths[k][d];
      }
      p.documents += static_cast<int64_t>(encoded.lengths[k].size());
    }
    p.bytes += encoded.bytes;
    summary.empty_documents += encoded.empty;
    summary.repaired_utf8 += encoded.repaired;
    if (progress && seconds() - last_report >= 0.25) p.seconds = last_report = seconds(), progress(p);
  }
  pipeline.stop();
  for (auto& w : writers) w->finish();
  const std::string tokenizer_dir = tokenizer ? copy_tokenizer(*tokenizer, o.output_prefix) : "";
  for (size_t k = 0; k < writers.size(); ++k) {
    PrepareOutput out{writers[k]->prefix(),    keys[k], writers[k]->documents(), writers[k]->tokens(), writers[k]->bin_crc32c(),
                      writers[k]->idx_crc32c()};
    write_sidecar(out, summary, tokenizer.get(), tokenizer_dir);
    summary.outputs.push_back(out);
  }
  summary.dropped_characters = dropped.load();
  summary.input_bytes = p.bytes, summary.documents = p.documents, summary.tokens = p.tokens, summary.seconds = seconds();
  if (progress) p.seconds = summary.seconds, progress(p);
  return summary;
}

}  // namespace dstrain::data
