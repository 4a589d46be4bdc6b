#pragma once
// prepare-data's inputs: text files and folders (one document per file), JSON Lines (one
// document per line, from one or more keys), any of them gzip-compressed, stdin ("-"), and
// Apache Parquet files (.parquet: each row read as a JSON object, as a JSON line would be).
// Records come out in a fixed order (inputs as given, folders walked in sorted order, lines in
// file order), so the dataset is the same on every machine and with any number of workers.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dstrain::data {

class ParquetRows;

enum class InputFormat { kAuto, kText, kJsonl };

struct DocumentSource {
  std::string path;      // "-": stdin
  bool jsonl = false;    // one record per line (or per row of a Parquet file)
  bool parquet = false;  // an Apache Parquet file: each row a JSON object (parquet_rows.h)
};

// The files to read. Throws Error{kData} for an input that does not exist or when nothing matched.
std::vector<DocumentSource> list_sources(const std::vector<std::string>& inputs, const std::vector<std::string>& extensions,
                                         InputFormat format);

// One unit of input: a whole text file, or one line of a JSON Lines file (not yet parsed).
struct Record {
  std::string payload;
  uint32_t source = 0;  // index into the sources
  uint64_t line = 0;    // 1-based line of a JSON Lines file (row of a Parquet file); 0 for a text file
};

// Reads the sources one after another (gzip is recognized by its magic bytes, not its name).
// The longest record (a JSON line, or a whole text file) a reader holds by default, after
// decompression: far above real documents, far below what a gzip bomb with no newline expands to.
constexpr int64_t kDefaultMaxRecordBytes = int64_t{256} << 20;

class RecordReader {
 public:
  // A record longer than max_record_bytes is an Error{kData} naming the file and line, read no
  // further than that (a stream that never ends a line is not buffered without limit). A whole
  // uncompressed text file is one record of its own size, unbounded (its size is known); a
  // compressed one or stdin is bounded.
  explicit RecordReader(std::vector<DocumentSource> sources, int64_t max_record_bytes = kDefaultMaxRecordBytes);
  ~RecordReader();
  // The next record; false at the end of the last source. Throws Error{kData} for a read error.
  bool next(Record& record);
  int64_t bytes_read() const { return bytes_read_; }  // uncompressed
  const std::vector<DocumentSource>& sources() const { return sources_; }

 private:
  bool open_next();
  bool read_more();

  bool next_row(Record& record);

  std::vector<DocumentSource> sources_;
  size_t current_ = 0;
  std::unique_ptr<ParquetRows> parquet_;
  void* file_ = nullptr;  // gzFile
  std::string buffer_;    // read but not yet returned
  size_t begin_ = 0;
  bool eof_ = true;
  uint64_t line_ = 0;
  int64_t bytes_read_ = 0;
  int64_t max_record_bytes_;
};

// The text of one JSON line's `key` (a string); throws Error{kData} naming the file and line
// when the line is not a JSON object or the key is missing or not a string.
std::vector<std::string> json_line_texts(const Record& record, const std::vector<std::string>& keys, const std::string& source_path);

}  // namespace dstrain::data
