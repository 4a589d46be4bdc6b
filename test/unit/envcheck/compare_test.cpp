#include "catch_torch.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "dstrain/envcheck/compare.h"
#include "dstrain/core/file_checksum.h"

using namespace dstrain;
using envcheck::Fact;
using envcheck::Rule;

namespace {

envcheck::RankFacts rank_with(int rank, int node, std::vector<Fact> facts) {
  facts.insert(facts.begin(), Fact{"host", "node-" + std::to_string(node), Rule::kMayDiffer, true, ""});
  return {rank, node, facts};
}

const envcheck::Row& row(const envcheck::Report& r, const std::string& name) {
  for (const auto& x : r.rows)
    if (x.name == name) return x;
  FAIL("no row " << name);
  return r.rows.front();
}

}  // namespace

TEST_CASE("equal facts are consistent; one rank apart is a mismatch with rank groups", "[envcheck]") {
  std::vector<envcheck::RankFacts> ranks;
  for (int r = 0; r < 16; ++r) ranks.push_back(rank_with(r, r / 8, {{"nccl", r < 8 ? "2.21.5" : "2.19.3", Rule::kSame, true, ""}}));
  const auto report = envcheck::compare(ranks);
  CHECK(report.world_size == 16);
  CHECK(report.nodes == 2);
  CHECK(report.hosts == std::vector<std::string>{"node-0", "node-1"});
  CHECK(report.mismatches() == std::vector<std::string>{"nccl"});
  const std::string text = envcheck::render_text(report);
  CHECK(text.find("\u2717 nccl  2.21.5: ranks 0\u20137; 2.19.3: ranks 8\u201315") != std::string::npos);
  CHECK(text.find("\u00b7 host") != std::string::npos);  // hosts may differ: shown, not checked
  CHECK(text.find("not consistent: 1 mismatch: nccl\n") != std::string::npos);
  ranks.resize(8);
  const std::string agreeing = envcheck::render_text(envcheck::compare(ranks));
  CHECK(agreeing.find("consistent: 1 facts agree on all 8 ranks (1 more shown without a check, \u00b7)") != std::string::npos);
}

TEST_CASE("same-in-node facts may differ between nodes but not within one", "[envcheck]") {
  std::vector<envcheck::RankFacts> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.push_back(rank_with(r, r / 2, {{"memory", r < 2 ? "512 GiB" : "1024 GiB", Rule::kSameInNode, true, ""}}));
  CHECK(envcheck::compare(ranks).consistent());
  ranks[3].facts[1].value = "256 GiB";
  const auto report = envcheck::compare(ranks);
  CHECK_FALSE(row(report, "memory").ok);
  CHECK(row(report, "memory").note == "differs within node 1 (node-1)");
}

TEST_CASE("a fact some ranks lack is a value of its own; limits and measurements only where taken", "[envcheck]") {
  std::vector<envcheck::RankFacts> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(rank_with(r, 0, {}));
  ranks[1].facts.push_back({"env NCCL_IB_DISABLE", "1", Rule::kSame, true, ""});
  ranks[0].facts.push_back({"checkpoint dir write speed", "800 MB/s", Rule::kNotSlow, true, ""});
  const auto report = envcheck::compare(ranks);
  const auto& env = row(report, "env NCCL_IB_DISABLE");
  CHECK_FALSE(env.ok);
  REQUIRE(env.groups.size() == 2);
  CHECK(env.groups[0].value == "(not set)");
  CHECK(env.groups[0].ranks == std::vector<int>{0, 2});
  CHECK(row(report, "checkpoint dir write speed").ok);
  CHECK(row(report, "checkpoint dir write speed").groups.size() == 1);
}

TEST_CASE("limits fail with the rank and the reason; slow measurements are flagged against the median", "[envcheck]") {
  std::vector<envcheck::RankFacts> ranks;
  for (int r = 0; r < 4; ++r) {
    const bool skewed = r == 3;
    ranks.push_back(
        rank_with(r, 0,
                  {{"clock offset from rank 0", skewed ? "+2.500 s" : "+0.001 s", Rule::kLimit, !skewed, skewed ? "clocks differ" : ""},
                   {"gemm throughput", r == 2 ? "20.0 GFLOP/s" : "100.0 GFLOP/s", Rule::kNotSlow, true, ""}}));
  }
  const auto report = envcheck::compare(ranks);
  CHECK(row(report, "clock offset from rank 0").note == "rank 3: clocks differ");
  CHECK(row(report, "gemm throughput").note == "rank 2 below half the median (0.20x at worst)");
  CHECK(report.mismatches() == std::vector<std::string>{"clock offset from rank 0", "gemm throughput"});
  // A limit a rank fails is a problem of that rank, not ranks that disagree.
  CHECK(envcheck::render_text(report).find("not consistent: 2 problems on some ranks: clock offset from rank 0, gemm throughput\n") !=
        std::string::npos);
}

TEST_CASE("a fact a rank marks as failed fails its row even when every rank agrees", "[envcheck]") {
  std::vector<envcheck::RankFacts> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(rank_with(r, 0, {{"data", "missing: /x.bin", Rule::kSame, false, "not found"}}));
  const auto report = envcheck::compare(ranks);
  CHECK(report.mismatches() == std::vector<std::string>{"data"});
  CHECK(row(report, "data").note == "ranks 0\u20131: not found");
}

TEST_CASE("facts survive the trip between ranks", "[envcheck]") {
  const envcheck::Facts in{{"a", "x\ty", Rule::kSameInNode, true, ""}, {"b", "1", Rule::kLimit, false, "too\nlow"}};
  const envcheck::Facts out = envcheck::decode_facts(envcheck::encode_facts(in));
  REQUIRE(out.size() == 2);
  CHECK(out[0].value == "x y");
  CHECK(out[0].rule == Rule::kSameInNode);
  CHECK_FALSE(out[1].ok);
  CHECK(out[1].why == "too low");
}

TEST_CASE("file checksums are CRC-32C, cached by file identity", "[envcheck]") {
  const auto dir = std::filesystem::temp_directory_path() / ("dstrain-sum-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  const std::string path = (dir / "f.bin").string();
  std::ofstream(path) << "123456789";
  const auto first = file_checksum(path);
  CHECK(first.exists);
  CHECK(first.size == 9);
  CHECK(first.crc32c == 0xE3069283u);  // the CRC-32C check value
  CHECK_FALSE(first.cached);
  CHECK(file_checksum(path).cached);
  std::ofstream(path) << "123456780";  // same size, new content and mtime
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) + std::chrono::seconds(5));
  const auto changed = file_checksum(path);
  CHECK_FALSE(changed.cached);
  CHECK(changed.crc32c != first.crc32c);
  CHECK_FALSE(file_checksum((dir / "missing").string()).exists);
  ::unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
}
