// Builds without CUDA: the NCCL communicator is not there, and says so.
#include "dstrain/comm/communicator.h"
#include "dstrain/core/error.h"

namespace dstrain::comm {

bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(const Endpoint&, int, int, int) {
  throw Error(ErrorCode::kEnvironment, "this dstrain was built without CUDA, so it has no NCCL backend",
              "build on a machine with nvcc and a CUDA LibTorch (DSTRAIN_CUDA=AUTO or ON), or use the gloo backend");
}

}  // namespace dstrain::comm
