// libFuzzer target for the checkpoint reader (issue 20): the input's length-prefixed parts are
// manifest.json, COMMITTED and the shard file rank_00000.bin of one checkpoint directory. An
// accepted checkpoint is verified and every tensor read whole. A checkpoint Error is the
// expected answer; anything else (another exception type included) is a bug.
#include <cstdint>
#include <vector>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/core/error.h"
#include "fuzz_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = fuzz::scratch();
  fuzz::write(dir + "/manifest.json", fuzz::take(data, size));
  fuzz::write(dir + "/COMMITTED", fuzz::take(data, size));
  fuzz::write(dir + "/rank_00000.bin", fuzz::take(data, size));
  try {
    const dstrain::ckpt::Reader reader(dir);
    reader.verify();
    for (const auto& t : reader.tensors()) {
      if (t.numel() > (int64_t{1} << 24)) continue;  // large but valid: not worth the memory here
      std::vector<char> buf(static_cast<size_t>(t.numel() * dstrain::ckpt::dtype_size(t.dtype)));
      reader.read(t.name, 0, t.numel(), buf.data(), t.dtype);
    }
    (void)dstrain::ckpt::inspect_checkpoint(dir);
  } catch (const dstrain::Error&) {}
  return 0;
}
