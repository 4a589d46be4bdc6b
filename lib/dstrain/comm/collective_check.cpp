#include "dstrain/comm/collective_check.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <vector>

#include "dstrain/core/open_files.h"

namespace dstrain::comm {
namespace {

at::Tensor seeded(int64_t n, uint64_t seed, int rank, at::ScalarType dtype) {
  at::Generator gen = at::detail::createCPUGenerator(seed * 7919 + static_cast<uint64_t>(rank) * 104729 + static_cast<uint64_t>(n));
  return at::randn({n}, gen, at::kFloat).to(dtype);
}

struct Checker {
  Communicator& comm;
  uint64_t seed;
  int failures = 0, total = 0;

  void report(bool ok, const std::string& what, const std::string& detail) {
    ++total;
    if (!ok) ++failures;
    if (comm.rank() == 0 || !ok) fmt::print("{} {}{}\n", ok ? "ok  " : "FAIL", what, ok ? "" : " -- " + detail);
    std::fflush(stdout);  // a check that hangs shows after the last one that passed
  }

  static bool close(const at::Tensor& got, const at::Tensor& want, double rtol, std::string& detail) {
    const at::Tensor g = got.to(at::kFloat), w = want.to(at::kFloat);
    const at::Tensor err = (g - w).abs() - (w.abs() * rtol + rtol);
    if (err.numel() == 0 || err.max().item<double>() <= 0) return true;
    const int64_t i = err.argmax().item<int64_t>();
    detail = fmt::format("element {}: got {} want {}", i, g[i].item<double>(), w[i].item<double>());
    return false;
  }

  void run(at::ScalarType dtype, int64_t n) {
    const int world = comm.world_size(), rank = comm.rank();
    const at::Device dev = comm.device();  // inputs are made on the CPU, moved there, results compared on the CPU
    const double rtol = dtype == at::kFloat ? 1e-5 : 1e-2;
    const std::string type = dtype == at::kFloat ? "float32" : dtype == at::kHalf ? "float16" : "bfloat16";
    std::string detail;
    // all_reduce: the sum of every rank's input
    {
      at::Tensor mine = seeded(n, seed, rank, dtype).to(dev), want = at::zeros({n}, at::kFloat);
      for (int r = 0; r < world; ++r) want += seeded(n, seed, r, dtype).to(at::kFloat);
      comm.all_reduce(mine)->wait();
      report(close(mine.cpu(), want.to(dtype), rtol, detail), fmt::format("all_reduce     {:<8} n={}", type, n), detail);
    }
    // reduce_scatter: chunk `rank` of the sum
    {
      at::Tensor input = seeded(n * world, seed + 1, rank, dtype).to(dev),
                 out = at::empty({n}, at::TensorOptions().dtype(dtype).device(dev));
      at::Tensor want = at::zeros({n}, at::kFloat);
      for (int r = 0; r < world; ++r) want += seeded(n * world, seed + 1, r, dtype).to(at::kFloat).narrow(0, rank * n, n);
      comm.reduce_scatter(input, out)->wait();
      report(close(out.cpu(), want.to(dtype), rtol, detail), fmt::format("reduce_scatter {:<8} n={}", type, n), detail);
    }
    // all_gather: every rank's input in rank order, bit for bit
    {
      at::Tensor mine = seeded(n, seed + 2, rank, dtype).to(dev),
                 out = at::empty({n * world}, at::TensorOptions().dtype(dtype).device(dev));
      std::vector<at::Tensor> all;
      for (int r = 0; r < world; ++r) all.push_back(seeded(n, seed + 2, r, dtype));
      comm.all_gather(mine, out)->wait();
      report(at::equal(out.cpu(), at::cat(all)), fmt::format("all_gather     {:<8} n={}", type, n), "not bit-identical");
    }
    // broadcast from the last rank, bit for bit
    {
      at::Tensor t = seeded(n, seed + 3, rank, dtype).to(dev);
      comm.broadcast(t, world - 1)->wait();
      report(at::equal(t.cpu(), seeded(n, seed + 3, world - 1, dtype)), fmt::format("broadcast      {:<8} n={}", type, n),
             "not bit-identical");
    }
  }
};

// Rows rank `src` sends to rank `dst` in the uneven all-to-all checks: 0-4, zeros included.
int64_t rows_between(int src, int dst, uint64_t seed) {
  return static_cast<int64_t>((static_cast<uint64_t>(src) * 7 + static_cast<uint64_t>(dst) * 3 + seed) % 5);
}

// Uneven all-to-all among `members` (global ranks; comm is their group, ranked in that order),
// rows of 3 elements, bit for bit against every member's seeded rows; the counts through
// exchange_counts. Returns "" or what went wrong.
std::string check_uneven_all_to_all(Communicator& comm, const std::vector<int>& members, uint64_t seed, at::ScalarType dtype) {
  const int n = static_cast<int>(members.size()), me = comm.rank();
  auto sends = [&](int src) {  // rows src sends to each member, and src's whole input
    std::vector<int64_t> rows;
    for (int d = 0; d < n; ++d) rows.push_back(rows_between(members[static_cast<size_t>(src)], members[static_cast<size_t>(d)], seed));
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    return std::make_pair(rows, seeded(total * 3, seed + 9, members[static_cast<size_t>(src)], dtype).view({total, 3}));
  };
  const auto [send_rows, input] = sends(me);
  const std::vector<int64_t> recv_rows = exchange_counts(comm, send_rows);
  std::vector<at::Tensor> want;
  for (int src = 0; src < n; ++src) {
    const auto [rows, theirs] = sends(src);
    int64_t first = 0;
    for (int d = 0; d < me; ++d) first += rows[static_cast<size_t>(d)];
    if (recv_rows[static_cast<size_t>(src)] != rows[static_cast<size_t>(me)])
      return fmt::format("exchange_counts: {} rows from rank {}, expected {}", recv_rows[static_cast<size_t>(src)], src,
                         rows[static_cast<size_t>(me)]);
    want.push_back(theirs.narrow(0, first, rows[static_cast<size_t>(me)]));
  }
  const at::Tensor expected = at::cat(want);
  at::Tensor output = at::full({expected.size(0), 3}, 7.0, at::TensorOptions().dtype(dtype).device(comm.device()));
  comm.all_to_all(input.to(comm.device()), output, send_rows, recv_rows)->wait();
  return at::equal(output.cpu(), expected) ? "" : "rows differ from the senders' rows";
}

}  // namespace

int check_collectives(Communicator& comm, uint64_t seed) {
  Checker c{comm, seed};
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf})
    for (int64_t n : {1, 7, 1001, 4097, 65537, (1 << 20) + 3}) c.run(dtype, n);
  // Non-contiguous tensors are refused (Gloo would silently give wrong results).
  {
    at::Tensor strided = at::zeros({8, 2}, at::TensorOptions().dtype(at::kFloat).device(comm.device())).t();
    bool refused = false;
    try {
      comm.all_reduce(strided)->wait();
    } catch (const std::exception&) {
      refused = true;
    }
    c.report(refused, "non-contiguous input is refused", "it was accepted");
  }
  // Two reduce-scatters in flight at once must not share a buffer.
  {
    const int world = comm.world_size(), rank = comm.rank();
    const auto opts = at::TensorOptions().dtype(at::kFloat).device(comm.device());
    at::Tensor in1 = seeded(64 * world, seed + 5, rank, at::kFloat).to(comm.device()),
               in2 = seeded(64 * world, seed + 6, rank, at::kFloat).to(comm.device());
    at::Tensor out1 = at::empty({64}, opts), out2 = at::empty({64}, opts), want1 = at::zeros({64}), want2 = at::zeros({64});
    for (int r = 0; r < world; ++r) {
      want1 += seeded(64 * world, seed + 5, r, at::kFloat).narrow(0, rank * 64, 64);
      want2 += seeded(64 * world, seed + 6, r, at::kFloat).narrow(0, rank * 64, 64);
    }
    auto w1 = comm.reduce_scatter(in1, out1);
    auto w2 = comm.reduce_scatter(in2, out2);
    w2->wait();
    w1->wait();
    std::string detail;
    const bool ok = Checker::close(out1.cpu(), want1, 1e-5, detail) && Checker::close(out2.cpu(), want2, 1e-5, detail);
    c.report(ok, "two reduce_scatters in flight", detail);
  }
  // Uneven all-to-all (MoE's dispatch), and the same inside the groups of a split.
  {
    std::vector<int> everyone;
    for (int r = 0; r < comm.world_size(); ++r) everyone.push_back(r);
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const std::string why = check_uneven_all_to_all(comm, everyone, seed, dtype);
      c.report(why.empty(), fmt::format("all_to_all     {:<8} uneven rows, some zero", dtype == at::kFloat ? "float32" : "bfloat16"), why);
    }
    std::vector<std::vector<int>> parity(comm.world_size() > 1 ? 2 : 1);  // even ranks, odd ranks
    for (int r = 0; r < comm.world_size(); ++r) parity[static_cast<size_t>(r % 2)].push_back(r);
    const std::vector<int>& mine = parity[static_cast<size_t>(comm.rank() % 2)];
    std::unique_ptr<Communicator> sub = comm.split(parity);
    at::Tensor t = seeded(1001, seed + 10, comm.rank(), at::kFloat).to(comm.device()), want = at::zeros({1001});
    for (int r : mine) want += seeded(1001, seed + 10, r, at::kFloat);
    sub->all_reduce(t)->wait();
    std::string detail;
    c.report(sub->world_size() == static_cast<int>(mine.size()) && Checker::close(t.cpu(), want, 1e-5, detail),
             "split into even and odd ranks: all_reduce within each", detail);
    const std::string why = check_uneven_all_to_all(*sub, mine, seed + 1, at::kFloat);
    c.report(why.empty(), "split into even and odd ranks: uneven all_to_all within each", why);
  }
  comm.barrier()->wait();
  c.report(true, "barrier", "");
  std::string mine(static_cast<size_t>(comm.rank() * 3 + 1), static_cast<char>('a' + comm.rank() % 26));
  const auto all = comm.all_gather_bytes(mine);
  bool bytes_ok = static_cast<int>(all.size()) == comm.world_size();
  for (int r = 0; bytes_ok && r < comm.world_size(); ++r)
    bytes_ok = all[r] == std::string(static_cast<size_t>(r * 3 + 1), static_cast<char>('a' + r % 26));
  c.report(bytes_ok, "all_gather_bytes (varying lengths)", "wrong bytes");
  // gather_bytes to the last rank (through the store), then broadcast_bytes from it.
  const int last = comm.world_size() - 1;
  const auto gathered = comm.gather_bytes(mine, last);
  bool gather_ok = comm.rank() == last ? static_cast<int>(gathered.size()) == comm.world_size() : gathered.empty();
  for (size_t r = 0; gather_ok && comm.rank() == last && r < gathered.size(); ++r) gather_ok = gathered[r] == all[r];
  c.report(gather_ok, "gather_bytes to the last rank", "wrong bytes");
  const std::string sent = comm.broadcast_bytes(comm.rank() == last ? std::string(70001, 'q') + mine : std::string(), last);
  c.report(sent == std::string(70001, 'q') + all[static_cast<size_t>(last)], "broadcast_bytes from the last rank", "wrong bytes");
  // Every rank must agree that every rank passed.
  at::Tensor failures = at::tensor({static_cast<float>(c.failures)}, at::kFloat).to(comm.device());
  comm.all_reduce(failures)->wait();
  const int total_failures = static_cast<int>(failures.cpu().item<float>());
  if (comm.rank() == 0)
    fmt::print("collective check on {} ranks ({}): {} passed, {} failed\n", comm.world_size(), comm.backend(), c.total - c.failures,
               total_failures);
  std::fflush(stdout);
  return total_failures;
}

// The control ops alone (what Gloo carries beside NCCL on GPUs), then this process's sockets:
// with lazy pairs they reach the ring and tree neighbours, not all N-1 peers (issue 26).
void report_control_sockets(Communicator& comm) {
  at::Tensor flag = at::ones({1}, at::TensorOptions().dtype(at::kFloat).device(comm.device()));
  comm.barrier()->wait();
  comm.broadcast(flag, 0)->wait();
  comm.all_reduce(flag)->wait();
  comm.all_gather_bytes(std::to_string(comm.rank()));
  const auto counts = comm.all_gather_bytes(std::to_string(open_socket_count()));
  if (comm.rank() != 0) return;
  int64_t most = -1, fewest = std::numeric_limits<int64_t>::max();
  for (const auto& c : counts) most = std::max<int64_t>(most, std::stoll(c)), fewest = std::min<int64_t>(fewest, std::stoll(c));
  fmt::print("sockets per rank after the control ops (barrier, broadcast, all_reduce, all_gather_bytes): {}-{} ({} peers; {})\n", fewest,
             most, comm.world_size() - 1,
             comm.backend() != "gloo" ? comm.backend()
             : gloo_connects_lazily() ? "gloo pairs connect on first use"
                                      : "gloo full mesh");
}

}  // namespace dstrain::comm
