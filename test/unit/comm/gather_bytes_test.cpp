// gather_bytes and broadcast_bytes over real Gloo groups (threads as ranks, one store server):
// the root gets every rank's bytes, the store forgets each round, a missing rank is named.
#include "catch_torch.h"

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dstrain/comm/communicator.h"
#include "dstrain/comm/store_auth.h"
#include "dstrain/comm/store_server.h"
#include "dstrain/core/error.h"
#include "gloo_ranks.h"

using namespace dstrain;
using test::on_gloo_ranks;

TEST_CASE("gather_bytes brings every rank's bytes to the root only, and the store forgets them", "[comm][gather]") {
  comm::StoreServer server("127.0.0.1", 0, "gather-test", std::chrono::seconds(30));
  const int world = 4;
  std::vector<std::vector<std::string>> got(world);
  std::vector<std::string> broadcasted(world);
  const auto errors = on_gloo_ranks(
      world, std::chrono::seconds(30),
      [&](comm::Communicator& c) {
        const int r = c.rank();
        for (int round = 0; round < 3; ++round) {  // the last round's result is kept
          const std::string mine(static_cast<size_t>(r * 1000 + round), static_cast<char>('a' + r));
          got[static_cast<size_t>(r)] = c.gather_bytes(mine, round % world);
        }
        broadcasted[static_cast<size_t>(r)] = c.broadcast_bytes(r == 3 ? std::string(5000, 'z') : "ignored", 3);
      },
      server, "gather-test");
  for (const auto& e : errors) REQUIRE(e.empty());
  // The third round (round 2) gathered to rank 2.
  for (int r = 0; r < world; ++r) {
    if (r != 2) {
      CHECK(got[static_cast<size_t>(r)].empty());
      continue;
    }
    REQUIRE(got[2].size() == static_cast<size_t>(world));
    for (int from = 0; from < world; ++from)
      CHECK(got[2][static_cast<size_t>(from)] == std::string(static_cast<size_t>(from * 1000 + 2), static_cast<char>('a' + from)));
  }
  for (const auto& b : broadcasted) CHECK(b == std::string(5000, 'z'));
  // Each rank deleted its keys once the root had them; only the last round's "done" flag stays.
  auto client = server.client();
  for (int round = 1; round <= 3; ++round)
    for (int r = 0; r < world; ++r)
      CHECK_FALSE(client.try_get("dstrain/gather-test/gather/" + std::to_string(round) + "/" + std::to_string(r)).has_value());
  CHECK_FALSE(client.try_get("dstrain/gather-test/gather/2/done").has_value());
  CHECK(client.try_get("dstrain/gather-test/gather/3/done").has_value());
}

TEST_CASE("gather_bytes names the ranks that never sent theirs", "[comm][gather]") {
  comm::StoreServer server("127.0.0.1", 0, "gather-test", std::chrono::seconds(30));
  const auto errors = on_gloo_ranks(
      3, std::chrono::seconds(2),
      [&](comm::Communicator& c) {
        if (c.rank() == 2) return;  // never gathers
        c.gather_bytes("x", 0);
      },
      server, "gather-test");
  CHECK_THAT(errors[0], Catch::Contains("gathered from 2 of 3 ranks") && Catch::Contains("rank 2 never sent theirs"));
  CHECK_THAT(errors[1], Catch::Contains("gather_bytes #1 on rank 1 of 3 failed"));
  CHECK(errors[2].empty());
}

TEST_CASE("with the job's secret, gathered values are signed and a stranger's is refused by rank", "[comm][gather]") {
  comm::set_store_secret("0123456789abcdef-the-job-secret");
  comm::StoreServer server("127.0.0.1", 0, "gather-test", std::chrono::seconds(30));
  std::vector<std::string> got;
  auto errors = on_gloo_ranks(
      2, std::chrono::seconds(30),
      [&](comm::Communicator& c) {
        auto all = c.gather_bytes(c.rank() == 1 ? "facts of rank 1" : "facts of rank 0", 0);
        if (c.rank() == 0) got = all;
      },
      server, "gather-test");
  for (const auto& e : errors) REQUIRE(e.empty());
  CHECK(got == std::vector<std::string>{"facts of rank 0", "facts of rank 1"});

  // Rank 2 never writes: a local program without the secret writes a plain value in its place.
  comm::StoreServer server2("127.0.0.1", 0, "gather-test2", std::chrono::seconds(30));
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(server2.port());
  options.isServer = false;
  c10d::TCPStore stranger("127.0.0.1", options);
  const std::string forged = "env DSTRAIN_STORE_SECRET\tforged";
  stranger.set("dstrain/gather-test2/gather/1/2", std::vector<uint8_t>(forged.begin(), forged.end()));
  errors = on_gloo_ranks(
      3, std::chrono::seconds(3),
      [&](comm::Communicator& c) {
        if (c.rank() != 2) c.gather_bytes("x", 0);
      },
      server2, "gather-test2");
  comm::set_store_secret("");
  CHECK_THAT(errors[0], Catch::Contains("rank 2's value under dstrain/gather-test2/gather/1/2 is not signed with the job's secret"));
}
