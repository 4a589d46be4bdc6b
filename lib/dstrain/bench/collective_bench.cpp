#include "dstrain/bench/collective_bench.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace dstrain::comm {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string size_text(int64_t bytes) {
  if (bytes >= (1 << 20)) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1 << 10)) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

}  // namespace

void bench_collectives(Communicator& comm, const BenchOptions& o) {
  const int world = comm.world_size();
  const bool lead = comm.rank() == 0;
  if (lead) {
    // memcpy bandwidth of this host, for scale: bytes read + written per second of a 256 MiB copy.
    const size_t bytes = 256u << 20;
    std::vector<char> a(bytes, 1), b(bytes, 0);
    std::memcpy(b.data(), a.data(), bytes);  // warm
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 4; ++i) std::memcpy(b.data(), a.data(), bytes);
    const double s = seconds_since(t0) / 4;
    fmt::print("# memcpy 256 MiB: {:.2f} GB/s (copy rate; {:.2f} GB/s read+write)\n", bytes / s / 1e9, 2 * bytes / s / 1e9);
    fmt::print(
        "# {} ranks, backend {}, float32; busbw as nccl-tests: all_reduce 2(n-1)/n, reduce_scatter, all_gather and all_to_all (n-1)/n of "
        "the total "
        "size\n",
        world, comm.backend());
    fmt::print("{:>10}  {:<15}{:>12}{:>14}{:>14}\n", "size", "op", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  }
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 4) {
    const int64_t n = std::max<int64_t>(world, bytes / 4 / world * world);  // elements, divisible by world
    const int iters = static_cast<int>(std::clamp<int64_t>((64ll << 20) / std::max<int64_t>(bytes, 1), 2, o.max_iters));
    struct Op {
      const char* name;
      double factor;
    };
    for (const Op op : {Op{"all_reduce", 2.0 * (world - 1) / world}, Op{"reduce_scatter", double(world - 1) / world},
                        Op{"all_gather", double(world - 1) / world}, Op{"all_to_all", double(world - 1) / world}}) {
      const auto opts = at::TensorOptions().dtype(at::kFloat).device(comm.device());
      at::Tensor full = at::ones({n}, opts), part = at::ones({n / world}, opts), received = at::empty({n}, opts);
      const std::vector<int64_t> even(static_cast<size_t>(world), n / world);  // MoE's dispatch, balanced
      const std::string name = op.name;
      auto once = [&] {
        if (name == "all_reduce")
          comm.all_reduce(full)->wait();
        else if (name == "reduce_scatter")
          comm.reduce_scatter(full, part)->wait();
        else if (name == "all_gather")
          comm.all_gather(part, full)->wait();
        else
          comm.all_to_all(full, received, even, even)->wait();
      };
      once();
      comm.barrier()->wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) once();
      comm.barrier()->wait();
      const double t = seconds_since(t0) / iters;
      const double algbw = static_cast<double>(n) * 4 / t / 1e9;
      if (lead) fmt::print("{:>10}  {:<15}{:>12.1f}{:>14.3f}{:>14.3f}\n", size_text(n * 4), op.name, t * 1e6, algbw, algbw * op.factor);
    }
    std::fflush(stdout);
  }
}

}  // namespace dstrain::comm
