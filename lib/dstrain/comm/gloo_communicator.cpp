// Gloo over LibTorch's c10d. This file (and store_server.cpp) see c10d and torch's bundled fmt;
// nothing else in dstrain does (see cmake/DstrainDependencies.cmake).
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"

namespace dstrain::comm {
namespace {

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::ProcessGroupGloo> group, int rank, int world, std::chrono::milliseconds timeout)
      : group_(std::move(group)), rank_(rank), world_(world), timeout_(timeout) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  void all_reduce_sum(at::Tensor& tensor) override {
    require_contiguous(tensor, "all_reduce");
    std::vector<at::Tensor> tensors{tensor};
    run("all_reduce", [&] { return group_->allreduce(tensors); });
  }

  void broadcast(at::Tensor& tensor, int root) override {
    require_contiguous(tensor, "broadcast");
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    run("broadcast", [&] { return group_->broadcast(tensors, opts); });
  }

  void barrier() override {
    run("barrier", [&] { return group_->barrier(); });
  }

 private:
  // Gloo silently returns wrong results for non-contiguous tensors: refuse them.
  static void require_contiguous(const at::Tensor& t, const char* op) {
    if (!t.is_contiguous())
      throw Error(ErrorCode::kInternal, std::string(op) + ": tensor is not contiguous", "this is a dstrain bug; please report it");
  }

  template <typename Launch>
  void run(const char* op, Launch launch) {
    const uint64_t seq = ++sequence_;
    try {
      auto work = launch();
      if (!work->wait(timeout_)) throw std::runtime_error("wait returned false");
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kComm,
                  std::string(op) + " #" + std::to_string(seq) + " failed on rank " + std::to_string(rank_) + " of " +
                      std::to_string(world_) + ": " + e.what(),
                  "another rank probably failed or hung: check its log in run_dir/logs/");
    }
  }

  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  uint64_t sequence_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const Endpoint& ep, int rank, int world) {
  c10::intrusive_ptr<c10d::Store> store;
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(ep.master_port);
    opts.isServer = false;
    opts.waitWorkers = false;
    opts.timeout = ep.timeout;
    store = c10::make_intrusive<c10d::TCPStore>(ep.master_addr, opts);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kComm,
                "rank " + std::to_string(rank) + " cannot reach the rendezvous store at " + ep.master_addr + ":" +
                    std::to_string(ep.master_port) + ": " + e.what(),
                "check MASTER_ADDR/MASTER_PORT and that the launcher of node 0 is running");
  }
  const std::vector<uint8_t> got = store->get("dstrain/run_id");
  const std::string run_id(got.begin(), got.end());
  if (run_id != ep.run_id)
    throw Error(ErrorCode::kComm, "rank " + std::to_string(rank) + " belongs to run '" + ep.run_id + "' but the store serves run '" + run_id + "'",
                "this worker is from another job or an old restart; stop it and start the run again");
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dstrain/" + ep.run_id + "/gloo", store);
    auto options = c10d::ProcessGroupGloo::Options::create_default(ep.timeout);
    options->devices = {c10d::ProcessGroupGloo::createDeviceForHostname(ep.master_addr == "localhost" ? "127.0.0.1" : ep.master_addr)};
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, world, options);
    return std::make_unique<GlooCommunicator>(std::move(group), rank, world, ep.timeout);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kComm, "rank " + std::to_string(rank) + " could not form the Gloo group of " + std::to_string(world) + " ranks: " + e.what(),
                "a rank did not arrive in time; check every rank's log in run_dir/logs/");
  }
}

}  // namespace dstrain::comm
