#pragma once
// safetensors, our own reader and writer (the format of Hugging Face weights). The reader maps
// the file and validates the header as the reference implementation does: header length within
// the file and at most 100,000,000 bytes, a JSON object of known dtypes, offsets that tile the
// buffer exactly (no gap, no overlap, no trailing bytes), sizes that match shapes. Tensor data
// is then read in place from the mapping. Torch-free.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dstrain {
class AtomicFileWriter;
}

namespace dstrain::io {

// Bits per element of a safetensors dtype name ("F32", "BF16", ...); 0 when unknown.
int dtype_bits(const std::string& dtype);

struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;    // byte offsets into the data buffer
  const uint8_t* data = nullptr;  // mapped bytes (reader only)
  uint64_t nbytes() const { return end - begin; }
};

class SafetensorsFile {
 public:
  // Maps and validates; throws Error{kCheckpoint} naming the file and what is wrong.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // In file order of their data (by offset).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data;
  uint64_t nbytes;
};

// Writes atomically, as the reference writer does: tensors ordered by dtype size descending, then
// name; the header padded with spaces to a multiple of 8. Throws Error on inconsistent input.
void write_safetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The same, tensor by tensor, for files larger than memory: the header is fixed up front from
// every tensor's name, dtype and shape, then each tensor's bytes follow in order(). The file
// appears under its name only at finish().
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    uint64_t nbytes() const;
  };
  SafetensorsWriter(const std::string& path, std::vector<Entry> tensors, const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // The order the tensors' bytes must come in.
  const std::vector<Entry>& order() const { return order_; }
  // The next tensor of order(), whole.
  void write(const std::string& name, const void* data, uint64_t nbytes);
  void finish();
  // What the file will hold: header and data.
  uint64_t file_bytes() const { return file_bytes_; }

 private:
  std::unique_ptr<AtomicFileWriter> file_;
  std::vector<Entry> order_;
  size_t next_ = 0;
  uint64_t file_bytes_ = 0;
};

}  // namespace dstrain::io
