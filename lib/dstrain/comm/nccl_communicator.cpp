// NCCL through nccl.h. Ops run on a dedicated stream that first waits for the caller's current
// stream; wait() polls the op's event and ncclCommGetAsyncError, aborts the communicator on an
// error or timeout, and throws an Error naming the op, its sequence number and the rank.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "dstrain/comm/communicator.h"
#include "dstrain/comm/rendezvous.h"
#include "dstrain/comm/store_auth.h"
#include "dstrain/comm/store_gather.h"
#include "dstrain/core/error.h"
#include "dstrain/core/progress.h"

namespace dstrain::comm {
namespace {

void cuda_check(cudaError_t rc, const std::string& what) {
  if (rc != cudaSuccess)
    throw Error(ErrorCode::kComm, what + ": " + cudaGetErrorString(rc), "check the GPU with `dstrain check-env` and nvidia-smi");
}
void nccl_check(ncclResult_t rc, const std::string& what) {
  if (rc != ncclSuccess) throw Error(ErrorCode::kComm, what + ": " + ncclGetErrorString(rc), "set NCCL_DEBUG=INFO for NCCL's own account");
}

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kHalf:
      return ncclFloat16;
    case at::kLong:
      return ncclInt64;
    case at::kByte:
      return ncclUint8;
    default:
      throw Error(ErrorCode::kInternal, "NCCL communicator: unsupported dtype", "this is a dstrain bug; please report it");
  }
}

struct Shared {
  ncclComm_t comm = nullptr;
  bool aborted = false;
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Shared> shared, cudaEvent_t event, cudaStream_t caller, const char* op, uint64_t seq, std::string what,
           std::chrono::milliseconds timeout, std::vector<at::Tensor> tensors)
      : shared_(std::move(shared)), event_(event), caller_(caller), op_(op), seq_(seq), what_(std::move(what)), timeout_(timeout),
        tensors_(std::move(tensors)) {}
  ~NcclWork() override {
    if (!done_) {
      try {
        wait();
      } catch (...) {}
    }
    cudaEventDestroy(event_);
  }
  void wait() override {
    if (done_) return;
    done_ = true;
    const progress::CollectiveWait waiting(op_, seq_);  // the heartbeat shows where a hang is
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      const cudaError_t q = cudaEventQuery(event_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) cuda_check(q, what_);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(shared_->comm, &async);
      if (async != ncclSuccess) fail(std::string("NCCL reported ") + ncclGetErrorString(async));
      if (std::chrono::steady_clock::now() > deadline) fail("timed out after " + std::to_string(timeout_.count() / 1000) + " s");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    cuda_check(cudaStreamWaitEvent(caller_, event_, 0), what_);  // later work on the caller's stream sees the result
    // The caching allocator may now hand the memory out again: whatever the caller's stream does
    // with it next is ordered after the op (ProcessGroupNCCL's recordStream, done by waiting).
    tensors_.clear();
  }
  bool done() override { return done_ || cudaEventQuery(event_) == cudaSuccess; }

 private:
  [[noreturn]] void fail(const std::string& why) {
    if (!shared_->aborted) ncclCommAbort(shared_->comm), shared_->aborted = true;  // unblocks the GPU; the communicator is gone
    throw Error(ErrorCode::kComm, what_ + " failed: " + why, "another rank probably failed, hung or left; check every rank's log");
  }
  std::shared_ptr<Shared> shared_;
  cudaEvent_t event_;
  cudaStream_t caller_;
  const char* op_;
  uint64_t seq_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  std::vector<at::Tensor> tensors_;  // alive until the op is done: a temporary input must not be reused while NCCL reads it
  bool done_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(c10::intrusive_ptr<c10d::Store> store, std::shared_ptr<Shared> shared, int rank, int world, int device,
                   std::string run_id, std::chrono::milliseconds timeout)
      : store_(std::move(store)), shared_(std::move(shared)), rank_(rank), world_(world), device_(device), run_id_(std::move(run_id)),
        timeout_(timeout) {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~NcclCommunicator() override {
    if (!shared_->aborted) ncclCommDestroy(shared_->comm);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "nccl"; }
  at::Device device() const override { return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)); }

  WorkHandle all_reduce(at::Tensor& t) override {
    check(t, "all_reduce");
    return launch("all_reduce", {t}, [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t), ncclSum, shared_->comm, s);
    });
  }
  WorkHandle reduce_scatter(const at::Tensor& input, at::Tensor& output) override {
    check(input, "reduce_scatter");
    check(output, "reduce_scatter");
    require(input.numel() == output.numel() * world_ && input.scalar_type() == output.scalar_type(),
            "reduce_scatter: shapes or dtypes do not match");
    return launch("reduce_scatter", {input, output}, [&](cudaStream_t s) {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()), nccl_type(output), ncclSum,
                               shared_->comm, s);
    });
  }
  WorkHandle all_gather(const at::Tensor& input, at::Tensor& output) override {
    check(input, "all_gather");
    check(output, "all_gather");
    require(output.numel() == input.numel() * world_ && input.scalar_type() == output.scalar_type(),
            "all_gather: shapes or dtypes do not match");
    return launch("all_gather", {input, output}, [&](cudaStream_t s) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()), nccl_type(input), shared_->comm, s);
    });
  }
  WorkHandle broadcast(at::Tensor& t, int root) override {
    check(t, "broadcast");
    require(root >= 0 && root < world_, "broadcast: root is not a rank");
    return launch("broadcast", {t}, [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t), root, shared_->comm, s);
    });
  }
  WorkHandle send(const at::Tensor& t, int dst) override {
    check(t, "send");
    require(dst >= 0 && dst < world_ && dst != rank_, "send: dst is not another rank");
    return launch("send", {t}, [&](cudaStream_t s) {
      return ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t), dst, shared_->comm, s);
    });
  }
  WorkHandle recv(at::Tensor& t, int src) override {
    check(t, "recv");
    require(src >= 0 && src < world_ && src != rank_, "recv: src is not another rank");
    return launch("recv", {t}, [&](cudaStream_t s) {
      return ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t), src, shared_->comm, s);
    });
  }
  WorkHandle barrier() override {
    at::Tensor one = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(device()));
    auto work = all_reduce(one);
    work->wait();
    return work;
  }
  std::vector<std::string> all_gather_bytes(const std::string& mine) override {
    // Small and rare: through the store, not the GPU.
    const std::string prefix = "dstrain/" + run_id_ + "/bytes/" + std::to_string(++bytes_round_) + "/";
    const std::string signed_value = sign_store_value(prefix + std::to_string(rank_), mine);
    store_->set(prefix + std::to_string(rank_), std::vector<uint8_t>(signed_value.begin(), signed_value.end()));
    std::vector<std::string> out;
    for (int r = 0; r < world_; ++r) {
      const auto v = store_->get(prefix + std::to_string(r));
      auto value = verify_store_value(prefix + std::to_string(r), std::string(v.begin(), v.end()), size_t{1} << 30);
      if (!value)
        throw Error(ErrorCode::kComm, "rank " + std::to_string(r) + "'s all_gather_bytes value is not signed with the job's secret",
                    "another program is writing into this job's rendezvous store");
      out.push_back(std::move(*value));
    }
    return out;
  }
  std::vector<std::string> gather_bytes(const std::string& mine, int root) override {
    require(root >= 0 && root < world_, "gather_bytes: root is not a rank");
    if (world_ == 1) return {mine};
    const StoreGather g{store_.get(), "dstrain/" + run_id_ + "/nccl-gather/", rank_, world_, timeout_};
    return store_gather_bytes(g, ++gather_round_, mine, root);
  }

  WorkHandle all_to_all(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows) override {
    check(input, "all_to_all");
    check(output, "all_to_all");
    check_all_to_all(input, output, send_rows, recv_rows, world_);
    // One NCCL group of a send and a receive per peer with rows to move (what
    // ProcessGroupNCCL's alltoall_base does).
    const int64_t in_row = input.size(0) ? input.numel() / input.size(0) : 0,
                  out_row = output.size(0) ? output.numel() / output.size(0) : 0;
    const size_t elem = input.element_size();
    return launch("all_to_all", {input, output}, [&](cudaStream_t s) {
      ncclResult_t rc = ncclGroupStart();
      int64_t sent = 0, received = 0;
      for (int r = 0; r < world_ && rc == ncclSuccess; ++r) {
        const int64_t ns = send_rows[static_cast<size_t>(r)], nr = recv_rows[static_cast<size_t>(r)];
        if (ns > 0)
          rc = ncclSend(static_cast<const char*>(input.data_ptr()) + sent * in_row * elem, static_cast<size_t>(ns * in_row),
                        nccl_type(input), r, shared_->comm, s);
        if (rc == ncclSuccess && nr > 0)
          rc = ncclRecv(static_cast<char*>(output.data_ptr()) + received * out_row * elem, static_cast<size_t>(nr * out_row),
                        nccl_type(output), r, shared_->comm, s);
        sent += ns, received += nr;
      }
      const ncclResult_t end = ncclGroupEnd();
      return rc != ncclSuccess ? rc : end;
    });
  }

  std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups) override {
    const GroupPlace place = place_in_partition(groups, rank_, world_);
    const int size = static_cast<int>(groups[static_cast<size_t>(place.index)].size());
    auto sub = std::make_shared<Shared>();
    {
      const progress::CollectiveWait waiting("nccl_split", 0);  // collective over this communicator: a hang shows
      nccl_check(ncclCommSplit(shared_->comm, place.index, place.rank, &sub->comm, nullptr),
                 "rank " + std::to_string(rank_) + ": ncclCommSplit");
    }
    const std::string name = "split" + std::to_string(++splits_) + "-" + std::to_string(place.index);
    return std::make_unique<NcclCommunicator>(store_, sub, place.rank, size, device_, run_id_ + "/" + name, timeout_);
  }

 private:
  static void require(bool ok, const std::string& what) {
    if (!ok) throw Error(ErrorCode::kInternal, what, "this is a dstrain bug; please report it");
  }
  void check(const at::Tensor& t, const char* op) const {
    require(t.defined() && t.is_contiguous(), std::string(op) + ": tensors must be contiguous");
    require(t.is_cuda() && t.device().index() == device_, std::string(op) + ": tensors must be on this rank's GPU");
    if (shared_->aborted)
      throw Error(ErrorCode::kComm,
                  std::string(op) + " on rank " + std::to_string(rank_) + ": the NCCL communicator was aborted after an earlier failure",
                  "");
  }
  template <typename Launch>
  WorkHandle launch(const char* op, std::vector<at::Tensor> tensors, Launch body) {
    const uint64_t seq = ++sequence_;
    const std::string what =
        std::string(op) + " #" + std::to_string(seq) + " on rank " + std::to_string(rank_) + " of " + std::to_string(world_) + " (nccl)";
    const cudaStream_t caller = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
    cudaEvent_t ready, done;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), what);
    cuda_check(cudaEventRecord(ready, caller), what);
    cuda_check(cudaStreamWaitEvent(stream_, ready, 0), what);  // inputs are produced on the caller's stream
    cudaEventDestroy(ready);
    nccl_check(body(stream_), what);
    cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
    cuda_check(cudaEventRecord(done, stream_), what);
    return std::make_unique<NcclWork>(shared_, done, caller, op, seq, what, timeout_, std::move(tensors));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<Shared> shared_;
  int rank_, world_, device_;
  std::string run_id_;
  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  uint64_t sequence_ = 0, bytes_round_ = 0, gather_round_ = 0, splits_ = 0;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(const Endpoint& ep, int rank, int world, int device) {
  cuda_check(cudaSetDevice(device), "rank " + std::to_string(rank) + ": cannot use GPU " + std::to_string(device));
  c10::intrusive_ptr<c10d::Store> store = join_store(ep, rank, world);
  const std::string key = "dstrain/" + ep.run_id + "/nccl_unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    store->set(key, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
  } else {
    const auto v = store->get(key);
    if (v.size() != sizeof(id)) throw Error(ErrorCode::kComm, "the NCCL unique id in the store has the wrong size", "");
    std::memcpy(&id, v.data(), sizeof(id));
  }
  auto shared = std::make_shared<Shared>();
  {
    // Shown in the heartbeat as a collective: an init that hangs past launch.collective_timeout_s
    // is reported by the launcher's hang watch, naming the ranks that are not in it.
    const progress::CollectiveWait waiting("nccl_init", 0);
    nccl_check(ncclCommInitRank(&shared->comm, world, id, rank), "rank " + std::to_string(rank) + ": ncclCommInitRank");
  }
  return std::make_unique<NcclCommunicator>(store, shared, rank, world, device, ep.run_id,
                                            ep.collective_timeout.count() > 0 ? ep.collective_timeout : ep.timeout);
}

}  // namespace dstrain::comm
