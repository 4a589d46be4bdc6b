#pragma once
// Files that are either absent or complete: written to a temporary name in the same directory,
// fsync'ed, renamed over the target, and the directory fsync'ed. A crash at any point leaves the
// old file (or none), never a torn one.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dstrain {

void write_file_atomic(const std::string& path, std::string_view bytes);

// The same for a file written in pieces (one larger than memory): it appears under `path` only
// at commit(); destroyed uncommitted, it leaves nothing behind.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void write(const void* data, size_t bytes);
  uint64_t written() const { return written_; }
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t written_ = 0;
};
// Renames a finished directory into place and fsyncs the parent (checkpoint commit).
void rename_atomic(const std::string& from, const std::string& to);
// Swaps two existing directories (renameat2 RENAME_EXCHANGE) and fsyncs their parent. On a
// filesystem without exchange: `to` is removed, then `from` renamed onto it.
void exchange_atomic(const std::string& from, const std::string& to);
void fsync_path(const std::string& path);
// Reads a whole file; throws Error{code} naming the path when it cannot.
std::string read_file(const std::string& path);

}  // namespace dstrain
