#include "catch_torch.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/data/sample_stream.h"
#include "dstrain/data/token_file.h"
#include "test_support.h"

using namespace dstrain;

namespace {

std::vector<int64_t> stream(const data::TokenFile& f) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < f.size(); ++i) out.push_back(f.at(i));
  return out;
}

std::string data_error(const std::string& path, const std::string& format) {
  try {
    config::DataFormat parsed{};
    REQUIRE(config::parse_enum(format, parsed));
    data::open_token_file(path, parsed, 1);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kData);
    return e.what();
  }
  FAIL("accepted");
  return "";
}

}  // namespace

TEST_CASE("Megatron datasets read back exactly, every dtype, with documents", "[data]") {
  test::TempDir dir;
  const std::vector<std::vector<int64_t>> docs = {{1, 2, 3}, {4, 5, 6, 7, 8}, {9, 10}};
  data::write_megatron(dir.path() + "/ex", docs, 8);
  // The reference's worked example: 3 documents of 3, 5, 2 uint16 tokens give a 102-byte .idx.
  const std::string idx = read_file(dir.path() + "/ex.idx");
  CHECK(idx.size() == 102);
  CHECK(idx.substr(0, 9) == std::string("MMIDIDX\0\0", 9));
  CHECK(static_cast<int>(idx[17]) == 8);
  for (int code = 1; code <= 8; ++code) {
    INFO("dtype code " << code);
    data::write_megatron(dir.path() + "/c" + std::to_string(code), docs, code);
    const auto f = data::open_token_file(dir.path() + "/c" + std::to_string(code), config::DataFormat::kMegatron, 4);
    CHECK(stream(*f) == std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
    CHECK(f->document_starts() == std::vector<int64_t>{0, 3, 8});
  }
  // Large vocabularies get int32, as Megatron chooses at 65500.
  data::write_megatron(dir.path() + "/big", {{70000, 1, 102399}});
  CHECK(read_file(dir.path() + "/big.idx")[17] == 4);
  CHECK(stream(*data::open_token_file(dir.path() + "/big.bin", config::DataFormat::kMegatron, 2)) ==
        std::vector<int64_t>{70000, 1, 102399});
}

TEST_CASE("llm.c files of both versions and raw uint16 read back exactly", "[data]") {
  test::TempDir dir;
  std::vector<int64_t> t(12345);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int64_t>((i * 7919) % 50257);
  data::write_llmc(dir.path() + "/v1.bin", t, 1);
  const std::string head = read_file(dir.path() + "/v1.bin").substr(0, 12);
  CHECK(head == std::string("\x88\xd8\x34\x01\x01\x00\x00\x00\x39\x30\x00\x00", 12));  // the reference's first 12 bytes
  CHECK(stream(*data::open_token_file(dir.path() + "/v1.bin", config::DataFormat::kLlmc, 8)) == t);
  t[5] = 128000;  // Llama-3 vocabulary needs uint32
  data::write_llmc(dir.path() + "/v7.bin", t, 7);
  CHECK(stream(*data::open_token_file(dir.path() + "/v7.bin", config::DataFormat::kLlmc, 8)) == t);
  write_file_atomic(dir.path() + "/raw.bin", std::string("\x01\x00\xff\xff\x34\x12", 6));
  CHECK(stream(*data::open_token_file(dir.path() + "/raw.bin", config::DataFormat::kRawU16, 1)) == std::vector<int64_t>{1, 65535, 0x1234});
}

TEST_CASE("corrupt data files give a clear error naming the file", "[data]") {
  test::TempDir dir;
  const std::string d = dir.path();
  data::write_megatron(d + "/m", {{1, 2, 3}, {4, 5, 6, 7, 8}});
  // Truncated .bin: the index points past its end.
  const std::string bin = read_file(d + "/m.bin");
  write_file_atomic(d + "/m.bin", bin.substr(0, bin.size() - 2));
  CHECK_THAT(data_error(d + "/m", "megatron"), Catch::Contains("sequence 1 (pointer 6, 5 tokens) lies outside the 14-byte"));
  write_file_atomic(d + "/m.bin", bin);
  std::string idx = read_file(d + "/m.idx");
  std::string wrong = idx;
  wrong[0] = 'X';
  write_file_atomic(d + "/m.idx", wrong);
  CHECK_THAT(data_error(d + "/m", "megatron"), Catch::Contains("the magic MMIDIDX is missing"));
  write_file_atomic(d + "/m.idx", idx.substr(0, 40));
  CHECK_THAT(data_error(d + "/m", "megatron"), Catch::Contains("do not fit in its 40 bytes (truncated?)"));
  wrong = idx;
  wrong[17] = 9;
  write_file_atomic(d + "/m.idx", wrong);
  CHECK_THAT(data_error(d + "/m", "megatron"), Catch::Contains("dtype code 9 is not one of 1-8"));
  CHECK_THAT(data_error(d + "/absent", "megatron"), Catch::Contains("absent.idx"));

  data::write_llmc(d + "/l.bin", {1, 2, 3, 4}, 1);
  const std::string l = read_file(d + "/l.bin");
  write_file_atomic(d + "/l.bin", l.substr(0, l.size() - 1));
  CHECK_THAT(data_error(d + "/l.bin", "llmc"), Catch::Contains("is 1031 bytes but its header's 4 tokens need 1032"));
  write_file_atomic(d + "/l.bin", "tiny");
  CHECK_THAT(data_error(d + "/l.bin", "llmc"), Catch::Contains("shorter than the 1024-byte llm.c header"));
  std::string eval = l;
  eval[0] = '\x8a';  // magic 20240522 (0x0134D88A, little-endian)
  write_file_atomic(d + "/l.bin", eval);
  CHECK_THAT(data_error(d + "/l.bin", "llmc"), Catch::Contains("eval file"));
  write_file_atomic(d + "/odd.bin", "abc");
  CHECK_THAT(data_error(d + "/odd.bin", "raw_u16"), Catch::Contains("3 bytes is not a whole number of uint16 tokens"));
  write_file_atomic(d + "/one.bin", "a");
  CHECK_THAT(data_error(d + "/one.bin", "bytes"), Catch::Contains("has 1 tokens, fewer than one sample of seq_len + 1 = 2"));
}

TEST_CASE("a Megatron document index pointing past the sequences is a data error, not a crash", "[data]") {
  test::TempDir dir;
  const std::string d = dir.path();
  data::write_megatron(d + "/m", {{1, 2}, {3, 4}, {5, 6}});  // 3 sequences, document index [0, 1, 2, 3]
  std::string idx = read_file(d + "/m.idx");
  const size_t doc_index = 34 + 12 * 3;
  const int64_t far = int64_t{1} << 40, farther = far + 1;
  std::memcpy(&idx[doc_index + 8], &far, 8);  // the audit's [0, 2^40, 2^40+1, 3]
  std::memcpy(&idx[doc_index + 16], &farther, 8);
  write_file_atomic(d + "/m.idx", idx);
  CHECK_THAT(data_error(d + "/m", "megatron"), Catch::Contains("document index entry 1 (1099511627776) is outside the 3 sequences"));
}

namespace {
// The error reading every sample of PATH (Megatron) with a vocabulary of 256 gives.
std::string vocab_error(const std::string& prefix) {
  std::vector<std::unique_ptr<data::TokenFile>> files;
  files.push_back(data::open_token_file(prefix, config::DataFormat::kMegatron, 2));
  data::SampleStream s(std::move(files), {}, 2, 1, 256);
  int64_t out[3];
  try {
    for (int64_t i = 0; i < s.num_samples(); ++i) s.read(i, out);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kData);
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("tokens outside the vocabulary are a data error naming the file and offset", "[data]") {
  test::TempDir dir;
  const std::string d = dir.path();
  data::write_megatron(d + "/ok", {{1, 2, 3, 255, 0}}, 4);
  CHECK(vocab_error(d + "/ok").empty());
  data::write_megatron(d + "/big", {{1, 2, 300, 4, 5}}, 4);
  CHECK_THAT(vocab_error(d + "/big"), Catch::Contains("big.bin: the token at offset 2 is 300, outside the model's vocabulary [0, 256)"));
  data::write_megatron(d + "/neg", {{1, 2, 3, -1, 5}}, 2);  // int8
  CHECK_THAT(vocab_error(d + "/neg"), Catch::Contains("offset 3 is -1, outside"));
  data::write_megatron(d + "/nan", {{1, 2, 3, 4, 5}}, 6);  // float64
  std::string bin = read_file(d + "/nan.bin");
  const double nan = std::numeric_limits<double>::quiet_NaN(), half = 2.5;
  std::memcpy(&bin[8 * 1], &nan, 8);
  write_file_atomic(d + "/nan.bin", bin);
  CHECK_THAT(vocab_error(d + "/nan"), Catch::Contains("offset 1 is not a whole number"));
  std::memcpy(&bin[8 * 1], &half, 8);
  write_file_atomic(d + "/nan.bin", bin);
  CHECK_THAT(vocab_error(d + "/nan"), Catch::Contains("offset 1 is not a whole number"));
}
