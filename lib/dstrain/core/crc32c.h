#pragma once
// CRC-32C (Castagnoli), the checksum of every checkpoint file. Software table version: fast
// enough for checkpoints on CPU (hundreds of MB/s); SSE4.2 can come later if it shows up in profiles.
#include <cstddef>
#include <cstdint>

namespace dstrain {

uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace dstrain
