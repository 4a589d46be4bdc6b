// libFuzzer target for the token-file readers (issue 20): the first byte picks the format
// (Megatron .idx + .bin as two length-prefixed parts, llm.c, raw uint16, bytes), the rest is the
// file. Every token of an accepted file is read, as a SampleStream does, against a vocabulary
// of 50,000. A data Error is the expected answer; anything else is a bug.
#include <cstdint>
#include <memory>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/data/sample_stream.h"
#include "dstrain/data/token_file.h"
#include "fuzz_files.h"

using dstrain::config::DataFormat;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int kind = data[0] % 4;
  ++data, --size;
  const std::string dir = fuzz::scratch();
  std::string path;
  DataFormat format = DataFormat::kBytes;
  if (kind == 0) {
    fuzz::write(dir + "/m.idx", fuzz::take(data, size));
    fuzz::write(dir + "/m.bin", fuzz::take(data, size));
    path = dir + "/m", format = DataFormat::kMegatron;
  } else {
    path = dir + "/f.bin";
    fuzz::write(path, std::string(reinterpret_cast<const char*>(data), size));
    format = kind == 1 ? DataFormat::kLlmc : kind == 2 ? DataFormat::kRawU16 : DataFormat::kBytes;
  }
  try {
    std::vector<std::unique_ptr<dstrain::data::TokenFile>> files;
    files.push_back(dstrain::data::open_token_file(path, format, 4));
    for (int64_t d : files[0]->document_starts())
      if (d < 0 || d > files[0]->size()) __builtin_trap();  // a document start outside the stream
    dstrain::data::SampleStream stream(std::move(files), {}, 4, 1, 50000);
    int64_t out[5];
    const int64_t n = std::min<int64_t>(stream.num_samples(), 4096);
    for (int64_t i = 0; i < n; ++i) stream.read(i, out);
  } catch (const dstrain::Error&) {}
  return 0;
}
