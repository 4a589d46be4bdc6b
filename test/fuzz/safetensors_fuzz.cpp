// libFuzzer target for the safetensors reader (issue 20): the input is the file. Every tensor of
// an accepted file must lie inside it, and its bytes are read.
#include <cstdint>

#include "dstrain/core/error.h"
#include "dstrain/io/safetensors.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::scratch() + "/t.safetensors";
  fuzz::write(path, std::string(reinterpret_cast<const char*>(data), size));
  try {
    const dstrain::io::SafetensorsFile file(path);
    uint64_t sum = 0;
    for (const auto& t : file.tensors()) {
      if (t.end < t.begin || t.end > size) __builtin_trap();
      for (uint64_t i = 0; i < t.nbytes(); ++i) sum += t.data[i];
    }
    (void)sum;
  } catch (const dstrain::Error&) {}
  return 0;
}
