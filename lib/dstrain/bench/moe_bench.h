#pragma once
// `dstrain bench moe`: one MoE layer's routed experts, forward + backward, three ways in one
// process on the same tokens and routing: the per-expert layer dstrain had before (a gather and a
// scatter per expert), the grouped layer with its expert loop, and the grouped GEMMs.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::tasks {

struct MoeBenchOptions {
  int64_t tokens = 4096, hidden = 1024, inner = 704, experts = 64, top_k = 6;
  std::string dtype = "fp32";  // fp32 or bf16
  std::string device = "cpu";  // cpu or cuda
  int iters = 5;
  int threads = 0;  // 0: ATen's default
};

struct MoeBenchRow {
  std::string name;
  double ms = 0;           // median forward + backward
  double tflops = 0;       // the experts' GEMMs: 18 * hidden * inner flops per routed token copy
  double max_abs_err = 0;  // output against the per-expert layer's
};

std::vector<MoeBenchRow> bench_moe(const MoeBenchOptions& options);

}  // namespace dstrain::tasks
