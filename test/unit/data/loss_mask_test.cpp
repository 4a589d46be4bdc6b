// PREFIX.lossmask as file-formats.md and data/loss_mask.h give it: the header, one byte per token,
// atomic writes, and every way a mask can fail to belong to its dataset refused by name.
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "catch_torch.h"
#include "dstrain/core/error.h"
#include "dstrain/data/loss_mask.h"

namespace fs = std::filesystem;
using dstrain::data::LossMask;
using dstrain::data::LossMaskWriter;

namespace {

std::string scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("dstrain-loss-mask-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string error_of(const std::string& prefix, int64_t tokens) {
  try {
    LossMask m(prefix, tokens);
  } catch (const dstrain::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a loss mask is DSTRMASK, version 1 and a byte per token, written atomically", "[data]") {
  const std::string prefix = scratch("chat");
  {
    LossMaskWriter w(prefix);
    const uint8_t first[] = {0, 0, 1, 1}, second[] = {0, 1};
    w.add(first, 4);
    w.add(second, 2);
    CHECK(!fs::exists(prefix + ".lossmask"));  // only the temporary file until finish()
    w.finish();
    CHECK(w.tokens() == 6);
    CHECK(w.trained() == 3);
  }
  std::ifstream in(prefix + ".lossmask", std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() == 16 + 6);
  CHECK(bytes.substr(0, 8) == "DSTRMASK");
  CHECK(bytes.substr(8, 8) == std::string("\x01\0\0\0\0\0\0\0", 8));
  CHECK(bytes.substr(16) == std::string("\0\0\x01\x01\0\x01", 6));
  const LossMask m(prefix, 6);
  CHECK(!m.trained(0));
  CHECK(m.trained(2));
  CHECK(m.trained(5));
  CHECK(dstrain::data::has_loss_mask(prefix));
}

TEST_CASE("a writer that never finishes leaves no mask; a mask that does not fit its dataset is refused", "[data]") {
  const std::string prefix = scratch("broken");
  {
    LossMaskWriter w(prefix);
    const uint8_t m[] = {1};
    w.add(m, 1);
  }
  CHECK(!fs::exists(prefix + ".lossmask"));
  CHECK(!fs::exists(prefix + ".lossmask.tmp"));
  CHECK(error_of(prefix, 1).find("cannot open it") != std::string::npos);
  {
    LossMaskWriter w(prefix);
    const uint8_t m[] = {1, 0, 1};
    w.add(m, 3);
    w.finish();
  }
  CHECK(error_of(prefix, 4).find("3 mask bytes for the 4 tokens") != std::string::npos);
  std::ofstream(prefix + ".lossmask", std::ios::binary) << std::string("DSTRMASK\x02\0\0\0\0\0\0\0\x01", 17);
  CHECK(error_of(prefix, 1).find("format version 2; this dstrain reads version 1 (it was written by a newer dstrain)") !=
        std::string::npos);
  std::ofstream(prefix + ".lossmask", std::ios::binary) << "not a mask at all";
  CHECK(error_of(prefix, 1).find("not a dstrain loss mask") != std::string::npos);
  fs::remove_all(fs::path(prefix).parent_path());
}
