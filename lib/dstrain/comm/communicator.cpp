#include "dstrain/comm/communicator.h"

#include <ATen/ATen.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "dstrain/core/error.h"

namespace dstrain::comm {

std::string Communicator::broadcast_bytes(const std::string& bytes, int root) {
  if (world_size() == 1) return bytes;
  const bool source = rank() == root;
  at::Tensor length = at::tensor({static_cast<int64_t>(source ? bytes.size() : 0)}, at::kLong).to(device());
  broadcast(length, root)->wait();
  const int64_t n = length.cpu().item<int64_t>();
  at::Tensor data = at::zeros({std::max<int64_t>(n, 1)}, at::kByte);
  if (source && n > 0) std::memcpy(data.data_ptr(), bytes.data(), bytes.size());
  data = data.to(device());
  broadcast(data, root)->wait();
  const at::Tensor host = data.cpu();
  return std::string(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(n));
}

std::vector<int64_t> exchange_counts(Communicator& comm, const std::vector<int64_t>& send_rows) {
  const int world = comm.world_size();
  if (static_cast<int>(send_rows.size()) != world)
    throw Error(ErrorCode::kInternal, fmt::format("exchange_counts: {} counts for {} ranks", send_rows.size(), world),
                "this is a dstrain bug; please report it");
  at::Tensor send = at::tensor(send_rows, at::kLong).to(comm.device());
  at::Tensor recv = at::empty({world}, send.options());
  const std::vector<int64_t> ones(static_cast<size_t>(world), 1);
  comm.all_to_all(send, recv, ones, ones)->wait();
  const at::Tensor host = recv.cpu();
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + world);
}

void all_reduce_host(Communicator& comm, at::Tensor& host) {
  if (comm.device().is_cpu()) {
    comm.all_reduce(host)->wait();
    return;
  }
  at::Tensor on_device = host.to(comm.device());
  comm.all_reduce(on_device)->wait();
  host.copy_(on_device.cpu());
}

int64_t sum_exactly(Communicator& comm, int64_t value) { return sum_exactly(comm, std::vector<int64_t>{value}).at(0); }

std::vector<int64_t> sum_exactly(Communicator& comm, const std::vector<int64_t>& values) {
  constexpr int kDigits = 6, kBits = 8;
  for (const int64_t value : values)
    if (value < 0 || value >= (int64_t{1} << (kDigits * kBits)) || comm.world_size() > 65536)
      throw Error(ErrorCode::kInternal, fmt::format("sum_exactly: {} on {} ranks is out of its range", value, comm.world_size()),
                  "this is a dstrain bug; please report it");
  if (comm.world_size() == 1) return values;
  std::vector<float> digits;
  for (const int64_t value : values)
    for (int d = 0; d < kDigits; ++d) digits.push_back(static_cast<float>((value >> (d * kBits)) & 0xff));
  at::Tensor t = at::tensor(digits, at::kFloat).to(comm.device());
  comm.all_reduce(t)->wait();
  const at::Tensor host = t.cpu();
  std::vector<int64_t> sums(values.size(), 0);
  for (size_t v = 0; v < values.size(); ++v)
    for (int d = 0; d < kDigits; ++d) sums[v] += static_cast<int64_t>(host.data_ptr<float>()[v * kDigits + d]) << (d * kBits);
  return sums;
}

std::vector<double> sum_in_rank_order(Communicator& comm, const std::vector<double>& values) {
  if (comm.world_size() == 1) return values;
  // Each double as two floats (high part, remainder): 48 bits of it travel, exact for counts below 2^48.
  std::vector<float> mine;
  for (double v : values) {
    const auto hi = static_cast<float>(v);
    mine.push_back(hi), mine.push_back(static_cast<float>(v - static_cast<double>(hi)));
  }
  const at::Tensor in = at::tensor(mine, at::kFloat).to(comm.device());
  at::Tensor all = at::empty({comm.world_size() * in.numel()}, in.options());
  comm.all_gather(in, all)->wait();
  const at::Tensor host = all.cpu();
  const float* p = host.data_ptr<float>();
  std::vector<double> sums(values.size(), 0.0);
  for (int r = 0; r < comm.world_size(); ++r)
    for (size_t i = 0; i < values.size(); ++i, p += 2) sums[i] += static_cast<double>(p[0]) + static_cast<double>(p[1]);
  return sums;
}

GroupPlace place_in_partition(const std::vector<std::vector<int>>& groups, int rank, int world) {
  std::vector<int> seen(static_cast<size_t>(world), 0);
  GroupPlace place{-1, -1};
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty())
      throw Error(ErrorCode::kInternal, fmt::format("split: group {} is empty", g), "this is a dstrain bug; please report it");
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const int r = groups[g][i];
      if (r < 0 || r >= world || seen[static_cast<size_t>(r)]++)
        throw Error(ErrorCode::kInternal, fmt::format("split: rank {} is out of range or in two groups (world size {})", r, world),
                    "this is a dstrain bug; please report it");
      if (r == rank) place = {static_cast<int>(g), static_cast<int>(i)};
    }
  }
  for (int r = 0; r < world; ++r)
    if (!seen[static_cast<size_t>(r)])
      throw Error(ErrorCode::kInternal, fmt::format("split: rank {} is in no group", r), "this is a dstrain bug; please report it");
  return place;
}

ExpertPartitions expert_partitions(int world, int expert_parallel_size) {
  const int ep = expert_parallel_size;
  if (ep < 1 || world % ep != 0)
    throw Error(ErrorCode::kInternal, fmt::format("an expert-parallel size of {} does not divide {} ranks", ep, world),
                "this is a dstrain bug (the config check refuses it); please report it");
  ExpertPartitions p;
  p.parallel.resize(static_cast<size_t>(world / ep));
  p.data.resize(static_cast<size_t>(ep));
  for (int r = 0; r < world; ++r) {
    p.parallel[static_cast<size_t>(r / ep)].push_back(r);
    p.data[static_cast<size_t>(r % ep)].push_back(r);
  }
  return p;
}

ExpertCommunicators split_expert_groups(Communicator& comm, int expert_parallel_size) {
  if (expert_parallel_size <= 1) return {};
  const ExpertPartitions p = expert_partitions(comm.world_size(), expert_parallel_size);
  ExpertCommunicators c;
  c.parallel = comm.split(p.parallel);
  c.data = comm.split(p.data);
  return c;
}

void check_all_to_all(const at::Tensor& input, const at::Tensor& output, const std::vector<int64_t>& send_rows,
                      const std::vector<int64_t>& recv_rows, int world) {
  auto bug = [](const std::string& what) {
    return Error(ErrorCode::kInternal, "all_to_all: " + what, "this is a dstrain bug; please report it");
  };
  if (static_cast<int>(send_rows.size()) != world || static_cast<int>(recv_rows.size()) != world)
    throw bug(fmt::format("{} send and {} receive counts for {} ranks", send_rows.size(), recv_rows.size(), world));
  if (!input.defined() || !output.defined() || input.dim() == 0 || output.dim() == 0)
    throw bug("input and output must be tensors of at least one dimension");
  if (input.scalar_type() != output.scalar_type() || input.sizes().slice(1) != output.sizes().slice(1))
    throw bug("input and output rows differ in shape or dtype");
  const auto negative = [](int64_t n) { return n < 0; };
  if (std::any_of(send_rows.begin(), send_rows.end(), negative) || std::any_of(recv_rows.begin(), recv_rows.end(), negative))
    throw bug("a negative count");
  const int64_t sent = std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0});
  const int64_t received = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  if (sent != input.size(0) || received != output.size(0))
    throw bug(fmt::format("counts sum to {} sent and {} received rows, the tensors hold {} and {}", sent, received, input.size(0),
                          output.size(0)));
}

}  // namespace dstrain::comm
