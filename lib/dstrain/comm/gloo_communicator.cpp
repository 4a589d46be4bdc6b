// Gloo over LibTorch's c10d. This file (and store_server.cpp) see c10d and torch's bundled fmt;
// nothing else in dstrain does (see cmake/DstrainDependencies.cmake).
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "dstrain/comm/communicator.h"
#include "dstrain/comm/rendezvous.h"
#include "dstrain/comm/store_gather.h"
#include "dstrain/core/error.h"
#include "dstrain/core/progress.h"

namespace dstrain::comm {
namespace {

using c10d::ProcessGroupGloo;
using OptionsFactory = std::function<c10::intrusive_ptr<ProcessGroupGloo::Options>()>;

std::string fmt_split_name(uint64_t split, int group) { return "split" + std::to_string(split) + "-" + std::to_string(group); }
std::string fmt_split_failure(int rank, int size, const std::string& why) {
  return "rank " + std::to_string(rank) + " could not form its Gloo subgroup of " + std::to_string(size) + " ranks: " + first_line(why);
}

// A c10d work plus what to do once it is done (e.g. convert a bf16 result back, sum chunks).
class GlooWork final : public Work {
 public:
  GlooWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, const char* op, uint64_t seq, std::string what,
           std::chrono::milliseconds timeout)
      : work_(std::move(work)), finish_(std::move(finish)), op_(op), seq_(seq), what_(std::move(what)), timeout_(timeout) {}
  ~GlooWork() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {  // a destructor must not throw; the error was (or will be) seen elsewhere
      }
    }
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    const progress::CollectiveWait waiting(op_, seq_);  // the heartbeat shows where a hang is
    try {
      if (work_ && !work_->wait(timeout_)) throw std::runtime_error("wait returned false");
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kComm, what_ + " failed: " + first_line(e.what()),
                  "another rank probably failed, hung or left; check every rank's log in run_dir/logs/");
    }
    if (finish_) finish_();
  }
  bool done() override { return done_ || !work_ || work_->isCompleted(); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;
  const char* op_;
  uint64_t seq_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  bool done_ = false;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<ProcessGroupGloo> group, OptionsFactory options, int rank,
                   int world, std::chrono::milliseconds timeout, const std::string& run_id)
      : store_(std::move(store)), group_(std::move(group)), options_(std::move(options)), rank_(rank), world_(world), timeout_(timeout),
        run_id_(run_id), gather_{store_.get(), "dstrain/" + run_id + "/gather/", rank, world, timeout} {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "gloo"; }
  at::Device device() const override { return at::Device(at::kCPU); }

  WorkHandle all_reduce(at::Tensor& tensor) override {
    check(tensor, "all_reduce");
    // Gloo refuses bf16 reductions (and fp16 ones would sum in fp16): reduce an fp32 copy.
    // float64 (the pipeline's step scalars) reduces as it is.
    const bool as_is = tensor.scalar_type() == at::kFloat || tensor.scalar_type() == at::kDouble;
    at::Tensor buffer = as_is ? tensor : tensor.to(at::kFloat);
    std::vector<at::Tensor> tensors{buffer};
    auto work = group_->allreduce(tensors);
    std::function<void()> finish;
    if (buffer.data_ptr() != tensor.data_ptr()) finish = [tensor, buffer]() mutable { tensor.copy_(buffer); };
    return make("all_reduce", std::move(work), std::move(finish));
  }

  WorkHandle reduce_scatter(const at::Tensor& input, at::Tensor& output) override {
    check(input, "reduce_scatter");
    check(output, "reduce_scatter");
    require(input.numel() == output.numel() * world_, "reduce_scatter: input must hold world_size x output elements");
    require(input.scalar_type() == output.scalar_type(), "reduce_scatter: input and output dtypes differ");
    // All-to-all, then a local sum: each rank sends the chunks it does not own and receives the
    // N-1 contributions to its own, i.e. (N-1)/N of the input, as a ring reduce-scatter does.
    // Reuse the receive buffer unless an op still in flight holds it: a fresh 256 MiB buffer per
    // call costs more in page faults than the exchange itself (bench/RESULTS.md).
    if (!receive_buffer_.defined() || receive_buffer_.numel() < input.numel() || receive_buffer_.scalar_type() != input.scalar_type() ||
        receive_buffer_.storage().use_count() > 1)  // a view of it is still held by an op in flight
      receive_buffer_ = at::empty({input.numel()}, input.options());
    at::Tensor received = receive_buffer_.narrow(0, 0, input.numel());
    at::Tensor send = movable(input), recv = movable(received);
    std::vector<int64_t> no_splits;  // equal chunks
    auto work = group_->alltoall_base(recv, send, no_splits, no_splits);
    at::Tensor out = output;
    const int world = world_;
    return make("reduce_scatter", std::move(work), [received, out, world]() mutable {
      out.copy_(received.view({world, -1}).to(at::kFloat).sum(0).view_as(out));
    });
  }

  WorkHandle all_gather(const at::Tensor& input, at::Tensor& output) override {
    check(input, "all_gather");
    check(output, "all_gather");
    require(output.numel() == input.numel() * world_, "all_gather: output must hold world_size x input elements");
    require(input.scalar_type() == output.scalar_type(), "all_gather: input and output dtypes differ");
    at::Tensor flat_out = movable(output).view({-1});
    at::Tensor flat_in = movable(input).view({-1});
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_; ++r) outputs[0].push_back(flat_out.narrow(0, r * input.numel(), input.numel()));
    std::vector<at::Tensor> inputs{flat_in};
    return make("all_gather", group_->allgather(outputs, inputs), {});
  }

  WorkHandle broadcast(at::Tensor& tensor, int root) override {
    check(tensor, "broadcast");
    require(root >= 0 && root < world_, "broadcast: root is not a rank");
    std::vector<at::Tensor> tensors{movable(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return make("broadcast", group_->broadcast(tensors, opts), {});
  }

  WorkHandle barrier() override { return make("barrier", group_->barrier(), {}); }

  WorkHandle send(const at::Tensor& tensor, int dst) override {
    check(tensor, "send");
    require(dst >= 0 && dst < world_ && dst != rank_, "send: dst is not another rank");
    std::vector<at::Tensor> tensors{movable(tensor)};
    return make("send", group_->send(tensors, dst, /*tag=*/0), {});
  }

  WorkHandle recv(at::Tensor& tensor, int src) override {
    check(tensor, "recv");
    require(src >= 0 && src < world_ && src != rank_, "recv: src is not another rank");
    std::vector<at::Tensor> tensors{movable(tensor)};
    return make("recv", group_->recv(tensors, src, /*tag=*/0), {});
  }

  std::vector<std::string> all_gather_bytes(const std::string& mine) override {
    at::Tensor length = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
    at::Tensor lengths = at::empty({world_}, at::kLong);
    all_gather(length, lengths)->wait();
    const int64_t longest = lengths.max().item<int64_t>();
    at::Tensor padded = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
    std::memcpy(padded.data_ptr(), mine.data(), mine.size());
    at::Tensor all = at::empty({world_, padded.numel()}, at::kByte);
    all_gather(padded, all)->wait();
    std::vector<std::string> out;
    for (int r = 0; r < world_; ++r)
      out.emplace_back(static_cast<const char*>(all[r].data_ptr()), static_cast<size_t>(lengths[r].item<int64_t>()));
    return out;
  }

  std::vector<std::string> gather_bytes(const std::string& mine, int root) override {
    require(root >= 0 && root < world_, "gather_bytes: root is not a rank");
    if (world_ == 1) return {mine};
    return store_gather_bytes(gather_, ++gather_round_, mine, root);
  }

  WorkHandle all_to_all(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows) override {
    check(input, "all_to_all");
    check(output, "all_to_all");
    check_all_to_all(input, output, send_rows, recv_rows, world_);
    at::Tensor send = movable(input), recv = movable(output);
    // Gloo reads a data pointer even for no rows: give it one.
    if (send.numel() == 0) send = at::empty({1}, send.options()).narrow(0, 0, 0);
    if (recv.numel() == 0) recv = at::empty({1}, recv.options()).narrow(0, 0, 0);
    std::vector<int64_t> out_splits = recv_rows, in_splits = send_rows;
    return make("all_to_all", group_->alltoall_base(recv, send, out_splits, in_splits), {});
  }

  std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups) override {
    const GroupPlace place = place_in_partition(groups, rank_, world_);
    const int size = static_cast<int>(groups[static_cast<size_t>(place.index)].size());
    // A key space of its own in the run's store: this communicator's split count and the group.
    const std::string name = fmt_split_name(++splits_, place.index);
    try {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dstrain/" + run_id_ + "/gloo/" + name, store_);
      // A device of its own: two groups sharing one (with lazily connected pairs) hang.
      auto group = c10::make_intrusive<ProcessGroupGloo>(prefixed, place.rank, size, options_());
      return std::make_unique<GlooCommunicator>(store_, std::move(group), options_, place.rank, size, timeout_, run_id_ + "/" + name);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kComm, fmt_split_failure(rank_, size, e.what()),
                  "a rank of the group did not arrive in time; check every rank's log in run_dir/logs/");
    }
  }

 private:
  // Data movement of bf16 travels as 2-byte float16 elements: Gloo only copies the bytes.
  static at::Tensor movable(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t; }

  static void require(bool ok, const std::string& what) {
    if (!ok) throw Error(ErrorCode::kInternal, what, "this is a dstrain bug; please report it");
  }
  void check(const at::Tensor& t, const char* op) const {
    require(t.defined() && t.is_contiguous(), std::string(op) + ": tensors must be contiguous (Gloo gives wrong results otherwise)");
    require(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble || t.scalar_type() == at::kBFloat16 ||
                t.scalar_type() == at::kHalf || t.scalar_type() == at::kLong || t.scalar_type() == at::kByte,
            std::string(op) + ": dtype must be float32, float64, bfloat16, float16, int64 or uint8");
    require(t.device().is_cpu(), std::string(op) + ": the Gloo communicator works on CPU tensors");
  }

  WorkHandle make(const char* op, c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish) {
    const uint64_t seq = ++sequence_;
    const std::string what =
        std::string(op) + " #" + std::to_string(seq) + " on rank " + std::to_string(rank_) + " of " + std::to_string(world_);
    return std::make_unique<GlooWork>(std::move(work), std::move(finish), op, seq, what, timeout_);
  }

  c10::intrusive_ptr<c10d::Store> store_;  // keeps a self-hosted store alive
  c10::intrusive_ptr<ProcessGroupGloo> group_;
  OptionsFactory options_;  // a new group's options and device (split)
  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::string run_id_;  // the run's, or the run's and a split's: its keys in the store
  uint64_t sequence_ = 0, splits_ = 0;
  at::Tensor receive_buffer_;  // reduce_scatter's all-to-all target
  StoreGather gather_;
  uint64_t gather_round_ = 0;
};

}  // namespace

bool gloo_connects_lazily() {
  const char* full = std::getenv("DSTRAIN_GLOO_FULL_MESH");
  return !(full && std::string(full) == "1");
}

std::unique_ptr<Communicator> make_gloo_communicator(const Endpoint& ep, int rank, int world) {
  c10::intrusive_ptr<c10d::Store> store = join_store(ep, rank, world);
  try {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dstrain/" + ep.run_id + "/gloo", store);
    const std::chrono::milliseconds op_timeout = ep.collective_timeout.count() > 0 ? ep.collective_timeout : ep.timeout;
    // GLOO_SOCKET_IFNAME picks the interface, as in PyTorch; otherwise bind to the address that
    // routes to the master, which works on one host, across hosts and across network namespaces.
    // Pairs connect lazily, on a collective's first use of them: a rank publishes one address and
    // the ring and tree collectives reach a few peers, where Gloo's full mesh makes every rank
    // read every rank's key (N^2 store traffic) and hold N-1 sockets (issue 26).
    const bool lazy = gloo_connects_lazily();
    const char* env_ifname = std::getenv("GLOO_SOCKET_IFNAME");
    const std::string ifname = env_ifname ? env_ifname : "";
    const std::string address = ifname.empty() ? local_address_towards(ep.master_addr) : "";
    OptionsFactory make_options = [op_timeout, lazy, ifname, address] {
      auto options = ProcessGroupGloo::Options::create_default(op_timeout);
      options->devices = {!ifname.empty() ? ProcessGroupGloo::createDeviceForInterface(ifname, lazy)
                                          : ProcessGroupGloo::createDeviceForHostname(address, lazy)};
      return options;
    };
    auto group = c10::make_intrusive<ProcessGroupGloo>(prefixed, rank, world, make_options());
    return std::make_unique<GlooCommunicator>(store, std::move(group), make_options, rank, world, op_timeout, ep.run_id);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kComm,
                "rank " + std::to_string(rank) + " could not form the Gloo group of " + std::to_string(world) + " ranks: " + e.what(),
                "a rank did not arrive in time or the network between nodes is blocked; check every rank's log in run_dir/logs/");
  }
}

}  // namespace dstrain::comm
