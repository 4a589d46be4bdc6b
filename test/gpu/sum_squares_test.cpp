#include "catch_torch.h"

#include <cuda_runtime.h>

#include <string>

#include "cuda_kernels.h"
#include "dstrain_cuda.h"

TEST_CASE("the device reports a name and the NCCL version it was built with", "[gpu]") {
  char name[256];
  REQUIRE(dstrain_cuda_device_name(0, name, sizeof(name)) == 0);
  CHECK(std::string(name).size() > 0);
  CHECK(dstrain_nccl_version() > 20000);
}

TEST_CASE("sum of squares matches a double-precision CPU sum", "[gpu]") { dstrain::test::check_sum_squares<dstrain::test::CudaKernels>(); }
