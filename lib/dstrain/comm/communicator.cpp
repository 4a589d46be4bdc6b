#include "dstrain/comm/communicator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

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

}  // namespace dstrain::comm
