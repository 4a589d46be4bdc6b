#include "dstrain/bench/model_bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/data/batch.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/objective.h"

namespace dstrain::tasks {

ModelBenchResult bench_model(const std::string& recipe_path, int iters, int threads, int micro_batch, int seq_len) {
  const config::Recipe recipe = config::load_recipe(recipe_path);
  if (seq_len > recipe.model.max_seq_len)
    throw Error(ErrorCode::kUsage,
                fmt::format("--seq-len {} exceeds model.max_seq_len {} of {}", seq_len, recipe.model.max_seq_len, recipe_path),
                fmt::format("pass --seq-len {} or less, or use a recipe with a larger model.max_seq_len", recipe.model.max_seq_len));
  at::set_num_threads(threads);
  const auto model = model::make_model(recipe.model, recipe.seed);
  model->set_activation_checkpointing(recipe.train.activation_checkpointing);
  const model::Objective loss(recipe.train.loss_chunk_tokens);  // the loss and recompute as training does them
  const at::Tensor tokens =
      at::randint(0, recipe.model.vocab_size, {micro_batch, seq_len + 1}, at::detail::createCPUGenerator(1), at::kLong);
  const data::Batch batch = data::pretraining_batch(tokens);
  std::vector<double> ms;
  for (int i = 0; i < iters + 3; ++i) {
    for (const auto& p : model->parameters()) p.tensor.mutable_grad() = at::Tensor();
    const auto t0 = std::chrono::steady_clock::now();
    loss(*model, batch).mean().backward();
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 3) ms.push_back(t);  // 3 warm-up steps
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  return {median, static_cast<double>(micro_batch) * seq_len / (median / 1000.0), static_cast<long long>(model->num_parameters())};
}

}  // namespace dstrain::tasks
