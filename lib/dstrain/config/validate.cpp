#include "dstrain/config/validate.h"

#include <filesystem>
#include <fmt/format.h>

#include "dstrain/core/error.h"

namespace dstrain::config {

std::vector<std::string> validate(const Recipe& r) {
  std::vector<std::string> out;
  const auto& m = r.model;
  if (m.hidden_size % m.num_heads != 0)
    out.push_back(fmt::format("model.num_heads: {} does not divide model.hidden_size {}", m.num_heads, m.hidden_size));
  else if ((m.hidden_size / m.num_heads) % 2 != 0)
    out.push_back(fmt::format("model: head dim hidden_size/num_heads = {} must be even for rotary embeddings", m.hidden_size / m.num_heads));
  if (r.data.seq_len > m.max_seq_len)
    out.push_back(fmt::format("data.seq_len: {} exceeds model.max_seq_len {}", r.data.seq_len, m.max_seq_len));
  if (r.data.format == "bytes" && m.vocab_size < 256)
    out.push_back(fmt::format("model.vocab_size: {} is too small for data.format 'bytes', which needs 256", m.vocab_size));
  if (!r.data.path.empty() && !std::filesystem::is_regular_file(r.data.path))
    out.push_back(fmt::format("data.path: '{}' does not exist or is not a file", r.data.path));
  if (r.train.global_batch_size % r.train.micro_batch_size != 0)
    out.push_back(fmt::format("train.global_batch_size: {} is not a multiple of train.micro_batch_size {}",
                              r.train.global_batch_size, r.train.micro_batch_size));
  if (r.train.warmup_steps > r.train.steps)
    out.push_back(fmt::format("train.warmup_steps: {} is longer than train.steps {}", r.train.warmup_steps, r.train.steps));
  return out;
}

int64_t accumulation_steps(const TrainConfig& t, int64_t world_size) {
  const int64_t per_step = t.micro_batch_size * world_size;
  if (t.global_batch_size % per_step != 0) {
    throw Error(ErrorCode::kConfig,
                fmt::format("train.global_batch_size {} is not divisible by micro_batch_size {} x {} ranks = {}",
                            t.global_batch_size, t.micro_batch_size, world_size, per_step),
                fmt::format("pick a global batch that is a multiple of {}, or change micro_batch_size or the number of ranks", per_step));
  }
  return t.global_batch_size / per_step;
}

}  // namespace dstrain::config
