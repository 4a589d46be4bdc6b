#include "catch_torch.h"

#include <cstring>
#include <fstream>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/io/safetensors.h"
#include "test_support.h"

using namespace dstrain;

namespace {

std::string hex_bytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size();) {
    if (hex[i] == ' ' || hex[i] == '\n') {
      ++i;
      continue;
    }
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    i += 2;
  }
  return out;
}

// A file from a raw header string and a data buffer of `data_bytes` bytes.
std::string with_header(const test::TempDir& dir, const std::string& header, size_t data_bytes, const char* name = "t.safetensors") {
  std::string file;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) file += static_cast<char>((n >> (8 * i)) & 0xFF);
  file += header + std::string(data_bytes, '\0');
  const std::string path = dir.path() + "/" + name;
  write_file_atomic(path, file);
  return path;
}

std::string load_error(const std::string& path) {
  try {
    io::SafetensorsFile f(path);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCheckpoint);
    return e.what();
  }
  FAIL("the file was accepted");
  return "";
}

}  // namespace

TEST_CASE("the writer reproduces the reference implementation's bytes", "[io]") {
  test::TempDir dir;
  const float values[6] = {0, 1, 2, 3, 4, 5};
  io::write_safetensors(dir.path() + "/a.safetensors", {{"attn.0", "F32", {1, 2, 3}, values, sizeof(values)}});
  const std::string want = hex_bytes(
      "40 00 00 00 00 00 00 00 7b 22 61 74 74 6e 2e 30 22 3a 7b 22 64 74 79 70 65 22 3a 22 46 33 32 22 2c 22 73 68"
      "61 70 65 22 3a 5b 31 2c 32 2c 33 5d 2c 22 64 61 74 61 5f 6f 66 66 73 65 74 73 22 3a 5b 30 2c 32 34 5d 7d 7d"
      "00 00 00 00 00 00 80 3f 00 00 00 40 00 00 40 40 00 00 80 40 00 00 a0 40");
  CHECK(read_file(dir.path() + "/a.safetensors") == want);
  io::write_safetensors(dir.path() + "/empty.safetensors", {});
  CHECK(read_file(dir.path() + "/empty.safetensors") == hex_bytes("08 00 00 00 00 00 00 00 7b 7d 20 20 20 20 20 20"));
}

TEST_CASE("written files read back bit-identically, in the reference order", "[io]") {
  test::TempDir dir;
  std::vector<float> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.25f - 7.0f;
  const uint16_t half[3] = {0x3c00, 0x4000, 0xbc00};
  const int64_t ids[2] = {-1, 1ll << 40};
  io::write_safetensors(dir.path() + "/m.safetensors",
                        {{"z.weight", "F32", {10, 100}, big.data(), big.size() * 4},
                         {"b.half", "BF16", {3}, half, 6},
                         {"a.ids", "I64", {2}, ids, 16},
                         {"scalar", "F32", {}, big.data(), 4},
                         {"empty", "F32", {0, 4}, nullptr, 0}},
                        {{"format", "pt"}});
  io::SafetensorsFile f(dir.path() + "/m.safetensors");
  CHECK(f.metadata().at("format") == "pt");
  std::vector<std::string> order;
  for (const auto& t : f.tensors()) order.push_back(t.name);
  // dtype size descending, then name; the empty tensor has no bytes and sorts by offset.
  CHECK(order == std::vector<std::string>{"a.ids", "empty", "scalar", "z.weight", "b.half"});
  const auto* z = f.find("z.weight");
  REQUIRE(z);
  CHECK(z->shape == std::vector<int64_t>{10, 100});
  CHECK(std::memcmp(z->data, big.data(), big.size() * 4) == 0);
  CHECK(std::memcmp(f.find("b.half")->data, half, 6) == 0);
  CHECK(std::memcmp(f.find("a.ids")->data, ids, 16) == 0);
  CHECK(f.find("scalar")->shape.empty());
  CHECK(f.find("empty")->nbytes() == 0);
  CHECK(f.find("missing") == nullptr);
}

TEST_CASE("invalid files are rejected with the reason", "[io]") {
  test::TempDir dir;
  const std::string t = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  CHECK_THAT(load_error(with_header(dir, "{" + t + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)),
             Catch::Contains("tensor 'b' starts at 4 but the previous one ends at 8 (overlapping data)"));
  CHECK_THAT(load_error(with_header(dir, "{" + t + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16)),
             Catch::Contains("(a gap)"));
  CHECK_THAT(load_error(with_header(dir, "{" + t + "}", 4)), Catch::Contains("offsets out of range: truncated?"));
  CHECK_THAT(load_error(with_header(dir, "{" + t + "}", 12)), Catch::Contains("trailing bytes"));
  CHECK_THAT(load_error(with_header(dir, R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
             Catch::Contains("has offsets [0, 8] but its shape and dtype need 12 bytes"));
  CHECK_THAT(load_error(with_header(dir, R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,1]}})", 1)),
             Catch::Contains("unknown dtype 'Q4'"));
  CHECK_THAT(load_error(with_header(dir, "{" + t + "," + t + "}", 8)), Catch::Contains("the header names 'a' twice"));
  CHECK_THAT(load_error(with_header(dir, R"({"__metadata__":{"n":1}})", 0)), Catch::Contains("__metadata__ value of 'n' is not a string"));
  CHECK_THAT(load_error(with_header(dir, "{\"a\":", 0)), Catch::Contains("not valid JSON"));
  CHECK_THAT(load_error(with_header(dir, "[]", 0)), Catch::Contains("not a JSON object"));
  CHECK_THAT(load_error(with_header(dir, R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,0]}})", 0)),
             Catch::Contains("non-negative"));
  CHECK_THAT(load_error(with_header(dir, R"({"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,0]}})", 0)),
             Catch::Contains("overflows"));
  {
    const std::string huge("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10);
    write_file_atomic(dir.path() + "/huge.safetensors", huge);
    CHECK_THAT(load_error(dir.path() + "/huge.safetensors"), Catch::Contains("exceeds the limit of 100000000 bytes"));
  }
  {
    write_file_atomic(dir.path() + "/short.safetensors", std::string("\x40\x00\x00\x00\x00\x00\x00\x00{", 9));
    CHECK_THAT(load_error(dir.path() + "/short.safetensors"), Catch::Contains("runs past the end of the 9-byte file"));
    write_file_atomic(dir.path() + "/tiny.safetensors", "abc");
    CHECK_THAT(load_error(dir.path() + "/tiny.safetensors"), Catch::Contains("3 bytes is too small"));
  }
  CHECK_THROWS_WITH(io::SafetensorsFile(dir.path() + "/absent.safetensors"), Catch::Contains("cannot open"));
}
