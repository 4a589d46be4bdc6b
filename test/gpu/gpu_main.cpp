// GPU tests: skipped (CTest exit code 77) with a message when no GPU is visible.
#define CATCH_CONFIG_RUNNER
#include "catch_torch.h"

#include <cstdio>

#include "dstrain_cuda.h"

int main(int argc, char** argv) {
  if (!dstrain_cuda_built()) {
    std::printf("SKIPPED: dstrain was built without CUDA (DSTRAIN_CUDA=OFF or no nvcc/CUDA LibTorch)\n");
    return 77;
  }
  if (dstrain_cuda_device_count() == 0) {
    std::printf("SKIPPED: no GPU visible (driver CUDA version %d); run scripts/gpu-check.sh on a GPU machine\n",
                dstrain_cuda_driver_version());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
