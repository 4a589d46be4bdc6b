#include "catch_torch.h"

#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "dstrain_cuda.h"

TEST_CASE("the device reports a name and the NCCL version it was built with", "[gpu]") {
  char name[256];
  REQUIRE(dstrain_cuda_device_name(0, name, sizeof(name)) == 0);
  CHECK(std::string(name).size() > 0);
  CHECK(dstrain_nccl_version() > 20000);
}

TEST_CASE("sum of squares matches a double-precision CPU sum", "[gpu]") {
  for (size_t n : {size_t{0}, size_t{1}, size_t{255}, size_t{257}, size_t{1} << 20, (size_t{1} << 22) + 3}) {
    std::vector<float> host(n);
    std::mt19937 rng(static_cast<unsigned>(n));
    std::normal_distribution<float> dist(0.0f, 2.0f);
    double want = 0.0;
    for (auto& v : host) v = dist(rng), want += static_cast<double>(v) * v;
    float* d_x = nullptr;
    double* d_out = nullptr;
    REQUIRE(cudaMalloc(&d_x, std::max<size_t>(n, 1) * sizeof(float)) == cudaSuccess);
    REQUIRE(cudaMalloc(&d_out, sizeof(double)) == cudaSuccess);
    REQUIRE(cudaMemcpy(d_x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(dstrain_cuda_sum_squares_f32(d_x, n, d_out, nullptr) == 0);
    double got = -1.0;
    REQUIRE(cudaMemcpy(&got, d_out, sizeof(double), cudaMemcpyDeviceToHost) == cudaSuccess);
    INFO("n = " << n);
    CHECK(got == Approx(want).epsilon(1e-12).margin(1e-12));
    cudaFree(d_x);
    cudaFree(d_out);
  }
}
