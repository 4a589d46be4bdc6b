#pragma once
// CRC-32C of a whole file, cached by the file's identity (device, inode, size, modification
// time) in ~/.cache/dstrain/checksums.tsv, so that a check before every job reads a large
// dataset once. Concurrent ranks on a node take turns (flock), so the file is read once. A
// process also remembers its own answers, so that a run whose cache directory cannot be written
// reads each dataset once, not at every open (data/dataset_set.h checks a set at each).
#include <cstdint>
#include <string>

namespace dstrain {

struct FileSum {
  bool exists = false;
  uint64_t size = 0;
  uint32_t crc32c = 0;
  bool cached = false;  // came from the cache
};

// Throws Error{kData} when the file exists but cannot be read.
FileSum file_checksum(const std::string& path);

}  // namespace dstrain
