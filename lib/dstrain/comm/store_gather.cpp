#include "dstrain/comm/store_gather.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>

#include "dstrain/comm/store_auth.h"
#include "dstrain/core/error.h"
#include "dstrain/core/progress.h"

namespace dstrain::comm {
namespace {

constexpr size_t kKeysPerRequest = 1024;  // one multiGet's keys: bounded replies, few round trips
constexpr size_t kMaxValueBytes = size_t{1} << 30;

// A rank's value, signed with the job's secret: the store is open to every local user, who
// could otherwise hand rank 0 forged checkpoint summaries or environment facts.
std::string verified(const std::string& key, const std::vector<uint8_t>& stored, int rank) {
  auto value = verify_store_value(key, std::string(stored.begin(), stored.end()), kMaxValueBytes);
  if (!value)
    throw Error(ErrorCode::kComm, "rank " + std::to_string(rank) + "'s value under " + key + " is not signed with the job's secret",
                "another program is writing into this job's rendezvous store, or the nodes were given different " +
                    std::string(kSecretVariable) + " values");
  return std::move(*value);
}

std::string seconds(std::chrono::milliseconds ms) { return std::to_string(ms.count() / 1000) + " s"; }

// The ranks whose key is missing (the error path only: one check per rank).
std::string missing_ranks(c10d::Store& store, const std::vector<std::string>& keys, const std::vector<int>& ranks, int* count) {
  std::string out;
  *count = 0;
  for (size_t i = 0; i < keys.size(); ++i)
    if (!store.check({keys[i]}) && ++*count <= 32) out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
  return out + (*count > 32 ? ", ..." : "");
}

std::vector<std::string> read_all(const StoreGather& g, const std::string& round_prefix, int root) {
  std::vector<std::string> keys;
  std::vector<int> ranks;
  for (int r = 0; r < g.world; ++r)
    if (r != root) keys.push_back(round_prefix + std::to_string(r)), ranks.push_back(r);
  try {
    g.store->wait(keys, g.timeout);
  } catch (const std::exception&) {
    int count = 0;
    const std::string missing = missing_ranks(*g.store, keys, ranks, &count);
    throw Error(ErrorCode::kComm,
                "rank " + std::to_string(root) + " gathered from " + std::to_string(g.world - count) + " of " + std::to_string(g.world) +
                    " ranks within " + seconds(g.timeout) + ": rank" + (count == 1 ? " " : "s ") + missing + " never sent theirs",
                "another rank probably failed, hung or left; check every rank's log in run_dir/logs/");
  }
  std::vector<std::string> out(static_cast<size_t>(g.world));
  for (size_t first = 0; first < keys.size(); first += kKeysPerRequest) {
    const size_t last = std::min(keys.size(), first + kKeysPerRequest);
    const auto values = g.store->multiGet(std::vector<std::string>(keys.begin() + first, keys.begin() + last));
    for (size_t i = first; i < last; ++i) out[static_cast<size_t>(ranks[i])] = verified(keys[i], values[i - first], ranks[i]);
  }
  return out;
}

}  // namespace

std::vector<std::string> store_gather_bytes(const StoreGather& g, uint64_t round, const std::string& mine, int root) {
  const progress::CollectiveWait waiting("gather_bytes", round);  // the heartbeat shows where a hang is
  const std::string round_prefix = g.prefix + std::to_string(round) + "/";
  const std::string done = round_prefix + "done";
  std::vector<std::string> out;
  try {
    if (g.rank == root) {
      out = read_all(g, round_prefix, root);
      out[static_cast<size_t>(root)] = mine;
      // Every rank wrote this round, so every rank is past the previous one: its flag can go.
      if (round > 1) g.store->deleteKey(g.prefix + std::to_string(round - 1) + "/done");
      g.store->set(done, std::vector<uint8_t>{'1'});
      return out;
    }
    const std::string key = round_prefix + std::to_string(g.rank);
    const std::string signed_value = sign_store_value(key, mine);
    g.store->set(key, std::vector<uint8_t>(signed_value.begin(), signed_value.end()));
    g.store->wait({done}, g.timeout);
    g.store->deleteKey(key);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kComm,
                "gather_bytes #" + std::to_string(round) + " on rank " + std::to_string(g.rank) + " of " + std::to_string(g.world) +
                    " failed: " + first_line(e.what()),
                "rank " + std::to_string(root) + " probably failed or hung; check every rank's log in run_dir/logs/");
  }
  return out;
}

}  // namespace dstrain::comm
