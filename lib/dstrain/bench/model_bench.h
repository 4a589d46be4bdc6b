#pragma once
// `dstrain bench model`: forward+backward throughput of a recipe's model on one process.
#include <string>

namespace dstrain::tasks {

struct ModelBenchResult {
  double ms_per_step;  // median over the timed iterations
  double tokens_per_s;
  long long parameters;
};

ModelBenchResult bench_model(const std::string& recipe_path, int iters, int threads, int micro_batch, int seq_len);

}  // namespace dstrain::tasks
