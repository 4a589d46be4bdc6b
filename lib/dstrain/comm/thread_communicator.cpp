#include "dstrain/comm/thread_communicator.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "dstrain/core/error.h"

namespace dstrain::comm {
namespace {

// What one rank brings to a collective round.
struct Part {
  const at::Tensor* input = nullptr;
  at::Tensor* output = nullptr;
  int root = 0;
  const std::string* bytes = nullptr;
  std::vector<std::string>* gathered = nullptr;
  const std::vector<int64_t>* send_rows = nullptr;  // all_to_all's counts
  const std::vector<int64_t>* recv_rows = nullptr;
};

// One collective: every rank's part, completed by the last rank to arrive.
struct Round {
  std::string op;
  std::vector<Part> parts;
  int arrived = 0, left = 0;
  bool done = false;
  std::string error;
};

struct Hub;

// What a thread group and every group split from it share: one lock, so that a failed rank
// breaks every group at once (no rank waits out a timeout in a subgroup).
struct Core {
  std::chrono::milliseconds timeout;
  std::mutex mutex;
  std::condition_variable changed;
  std::string broken;                                   // why the groups cannot go on
  std::map<std::string, std::shared_ptr<Hub>> subhubs;  // split groups, by name, made by their first rank
};

// The memory one group's ranks share.
struct Hub {
  std::shared_ptr<Core> core;
  std::string name;  // "" for the group make_thread_group made
  int world = 1;
  std::map<uint64_t, Round> rounds;                            // by sequence number
  std::map<std::pair<int, int>, std::deque<at::Tensor>> mail;  // (src, dst) -> sent tensors
};

at::Tensor accumulation_copy(const at::Tensor& t) {
  const at::ScalarType type = t.scalar_type() == at::kDouble ? at::kDouble : at::isFloatingType(t.scalar_type()) ? at::kFloat : at::kLong;
  return t.to(type, /*non_blocking=*/false, /*copy=*/true);
}

void complete(const std::string& op, std::vector<Part>& parts) {
  const int world = static_cast<int>(parts.size());
  if (op == "all_reduce") {
    at::Tensor sum = accumulation_copy(*parts[0].input);
    for (int r = 1; r < world; ++r) sum.add_(parts[static_cast<size_t>(r)].input->to(sum.scalar_type()));
    for (auto& p : parts) p.output->copy_(sum);
  } else if (op == "reduce_scatter") {
    for (int r = 0; r < world; ++r) {
      at::Tensor sum;
      for (const auto& p : parts) {
        const at::Tensor chunk = p.input->view({world, -1})[r].to(at::kFloat);
        sum = sum.defined() ? sum.add_(chunk) : chunk.clone();
      }
      at::Tensor& out = *parts[static_cast<size_t>(r)].output;
      out.copy_(sum.view_as(out));
    }
  } else if (op == "all_gather") {
    std::vector<at::Tensor> pieces;
    for (const auto& p : parts) pieces.push_back(p.input->reshape({-1}));
    const at::Tensor whole = at::cat(pieces);
    for (auto& p : parts) p.output->view({-1}).copy_(whole);
  } else if (op == "broadcast") {
    const int root = parts[0].root;
    for (const auto& p : parts)
      if (p.root != root) throw std::runtime_error(fmt::format("ranks name different roots ({} and {})", root, p.root));
    const at::Tensor source = parts[static_cast<size_t>(root)].input->clone();
    for (auto& p : parts) p.output->copy_(source);
  } else if (op == "all_to_all") {
    for (int dst = 0; dst < world; ++dst) {
      const Part& to = parts[static_cast<size_t>(dst)];
      int64_t row = 0;
      for (int src = 0; src < world; ++src) {
        const Part& from = parts[static_cast<size_t>(src)];
        const int64_t n = (*from.send_rows)[static_cast<size_t>(dst)];
        if (n != (*to.recv_rows)[static_cast<size_t>(src)])
          throw std::runtime_error(
              fmt::format("rank {} sends {} rows to rank {}, which expects {}", src, n, dst, (*to.recv_rows)[static_cast<size_t>(src)]));
        int64_t first = 0;
        for (int r = 0; r < dst; ++r) first += (*from.send_rows)[static_cast<size_t>(r)];
        to.output->narrow(0, row, n).copy_(from.input->narrow(0, first, n));
        row += n;
      }
    }
  } else if (op == "all_gather_bytes") {
    std::vector<std::string> all;
    for (const auto& p : parts) all.push_back(*p.bytes);
    for (auto& p : parts) *p.gathered = all;
  }  // barrier: arriving is all
}

class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return hub_->world; }
  std::string backend() const override { return "threads"; }
  at::Device device() const override { return at::Device(at::kCPU); }

  WorkHandle all_reduce(at::Tensor& tensor) override {
    check(tensor, "all_reduce");
    return collective("all_reduce", {&tensor, &tensor});
  }
  WorkHandle reduce_scatter(const at::Tensor& input, at::Tensor& output) override {
    check(input, "reduce_scatter");
    check(output, "reduce_scatter");
    require(input.numel() == output.numel() * world_size(), "reduce_scatter: input must hold world_size x output elements");
    return collective("reduce_scatter", {&input, &output});
  }
  WorkHandle all_gather(const at::Tensor& input, at::Tensor& output) override {
    check(input, "all_gather");
    check(output, "all_gather");
    require(output.numel() == input.numel() * world_size(), "all_gather: output must hold world_size x input elements");
    return collective("all_gather", {&input, &output});
  }
  WorkHandle broadcast(at::Tensor& tensor, int root) override {
    check(tensor, "broadcast");
    require(root >= 0 && root < world_size(), "broadcast: root is not a rank");
    return collective("broadcast", {&tensor, &tensor, root});
  }
  WorkHandle barrier() override { return collective("barrier", {}); }
  WorkHandle send(const at::Tensor& tensor, int dst) override {
    check(tensor, "send");
    require(dst >= 0 && dst < world_size() && dst != rank_, "send: dst is not another rank");
    std::lock_guard<std::mutex> lock(hub_->core->mutex);
    hub_->mail[{rank_, dst}].push_back(tensor.clone());
    hub_->core->changed.notify_all();
    return std::make_unique<CompletedWork>();
  }
  WorkHandle recv(at::Tensor& tensor, int src) override {
    check(tensor, "recv");
    require(src >= 0 && src < world_size() && src != rank_, "recv: src is not another rank");
    std::unique_lock<std::mutex> lock(hub_->core->mutex);
    auto& box = hub_->mail[{src, rank_}];
    if (!hub_->core->changed.wait_for(lock, hub_->core->timeout, [&] { return !box.empty() || !hub_->core->broken.empty(); }) ||
        box.empty())
      fail("recv", 0,
           hub_->core->broken.empty() ? fmt::format("nothing from rank {} within {} ms", src, hub_->core->timeout.count())
                                      : hub_->core->broken);
    tensor.copy_(box.front());
    box.pop_front();
    return std::make_unique<CompletedWork>();
  }
  std::vector<std::string> all_gather_bytes(const std::string& mine) override {
    std::vector<std::string> all;
    Part part;
    part.bytes = &mine;
    part.gathered = &all;
    collective("all_gather_bytes", part);
    return all;
  }

  std::vector<std::string> gather_bytes(const std::string& mine, int root) override {
    require(root >= 0 && root < world_size(), "gather_bytes: root is not a rank");
    std::vector<std::string> all = all_gather_bytes(mine);  // in memory: nothing to save
    if (rank_ != root) all.clear();
    return all;
  }

  WorkHandle all_to_all(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows) override {
    check(input, "all_to_all");
    check(output, "all_to_all");
    check_all_to_all(input, output, send_rows, recv_rows, world_size());
    Part part{&input, &output};
    part.send_rows = &send_rows;
    part.recv_rows = &recv_rows;
    return collective("all_to_all", part);
  }

  std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups) override {
    const GroupPlace place = place_in_partition(groups, rank_, world_size());
    const std::string name = fmt::format("{}/split{}-{}", hub_->name, ++splits_, place.index);
    std::shared_ptr<Hub> sub;
    {
      std::lock_guard<std::mutex> lock(hub_->core->mutex);
      std::shared_ptr<Hub>& slot = hub_->core->subhubs[name];
      if (!slot) {
        slot = std::make_shared<Hub>();
        slot->core = hub_->core;
        slot->name = name;
        slot->world = static_cast<int>(groups[static_cast<size_t>(place.index)].size());
      }
      sub = slot;
    }
    return std::make_unique<ThreadCommunicator>(std::move(sub), place.rank);
  }

  // A rank of the group failed: every pending and later op of the others fails at once.
  void abort(const std::string& why) {
    std::lock_guard<std::mutex> lock(hub_->core->mutex);
    if (hub_->core->broken.empty()) hub_->core->broken = why;
    hub_->core->changed.notify_all();
  }

 private:
  WorkHandle collective(const char* op, Part part) {
    const uint64_t seq = ++sequence_;
    std::unique_lock<std::mutex> lock(hub_->core->mutex);
    if (!hub_->core->broken.empty()) fail(op, seq, hub_->core->broken);
    Round& round = hub_->rounds[seq];
    if (round.parts.empty()) round.parts.resize(static_cast<size_t>(world_size())), round.op = op;
    if (round.op != op && round.error.empty())
      round.error = fmt::format("rank {} issued {} where another rank issued {}", rank_, op, round.op);
    round.parts[static_cast<size_t>(rank_)] = part;
    if (++round.arrived == world_size()) {
      if (round.error.empty()) {
        try {
          complete(round.op, round.parts);
        } catch (const std::exception& e) {
          round.error = first_line(e.what());
        }
      }
      round.done = true;
      hub_->core->changed.notify_all();
    } else if (!hub_->core->changed.wait_for(lock, hub_->core->timeout, [&] { return round.done || !hub_->core->broken.empty(); }) ||
               !round.done) {
      fail(op, seq,
           hub_->core->broken.empty() ? fmt::format("not every rank arrived within {} ms", hub_->core->timeout.count())
                                      : hub_->core->broken);
    }
    const std::string error = round.error;
    if (++round.left == world_size()) hub_->rounds.erase(seq);
    if (!error.empty()) fail(op, seq, error);
    return std::make_unique<CompletedWork>();
  }

  [[noreturn]] void fail(const char* op, uint64_t seq, const std::string& why) const {
    throw Error(ErrorCode::kComm,
                fmt::format("{} #{} on rank {} of {} (threads{}) failed: {}", op, seq, rank_, world_size(), hub_->name, why),
                "another rank of the thread group failed or issued other collectives");
  }
  static void require(bool ok, const std::string& what) {
    if (!ok) throw Error(ErrorCode::kInternal, what, "this is a dstrain bug; please report it");
  }
  static void check(const at::Tensor& t, const char* op) {
    require(t.defined() && t.is_contiguous(), std::string(op) + ": tensors must be contiguous");
    require(t.device().is_cpu(), std::string(op) + ": the thread group works on CPU tensors");
  }

  std::shared_ptr<Hub> hub_;
  int rank_;
  uint64_t sequence_ = 0, splits_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_group(int world_size, std::chrono::milliseconds timeout) {
  if (world_size < 1) throw Error(ErrorCode::kUsage, "a thread group needs at least one rank");
  auto hub = std::make_shared<Hub>();
  hub->core = std::make_shared<Core>();
  hub->core->timeout = timeout;
  hub->world = world_size;
  std::vector<std::unique_ptr<Communicator>> group;
  for (int r = 0; r < world_size; ++r) group.push_back(std::make_unique<ThreadCommunicator>(hub, r));
  return group;
}

void run_on_threads(int world_size, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  auto group = make_thread_group(world_size, timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      auto& comm = static_cast<ThreadCommunicator&>(*group[static_cast<size_t>(r)]);
      try {
        fn(comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        comm.abort(fmt::format("rank {} failed: {}", r, first_line(e.what())));
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        comm.abort(fmt::format("rank {} failed", r));
      }
    });
  }
  for (auto& t : threads) t.join();
  // The root cause, not the echo: a rank whose error is its own, before ranks that only saw it.
  for (int pass = 0; pass < 2; ++pass)
    for (auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const Error& err) {
        if (pass == 1 || err.code() != ErrorCode::kComm) throw;
      } catch (...) {
        throw;
      }
    }
}

}  // namespace dstrain::comm
