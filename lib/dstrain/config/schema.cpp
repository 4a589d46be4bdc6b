#include "dstrain/config/schema.h"

#include <limits>

namespace dstrain::config {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMaxInt = 9.0e15;  // exactly representable in a double
}  // namespace

#define DS_FIELD(member) [](Recipe& r) -> FieldTarget { return &r.member; }

const std::vector<Field>& recipe_schema() {
  static const std::vector<Field> fields = {
      {"run_dir", 0, 0, {}, "Run directory (relative to the current directory): config, logs, metrics, checkpoints.", DS_FIELD(run_dir)},
      {"seed", 0, kMaxInt, {}, "Seed for weight init and data order.", DS_FIELD(seed)},
      {"model.family", 0, 0, {"dense"}, "Model family: dense (LLaMA-style DeepSeek).", DS_FIELD(model.family)},
      {"model.vocab_size", 1, kMaxInt, {}, "Vocabulary size.", DS_FIELD(model.vocab_size)},
      {"model.hidden_size", 1, kMaxInt, {}, "Hidden size H.", DS_FIELD(model.hidden_size)},
      {"model.num_layers", 1, 1024, {}, "Number of decoder layers.", DS_FIELD(model.num_layers)},
      {"model.num_heads", 1, 1024, {}, "Attention heads; must divide hidden_size.", DS_FIELD(model.num_heads)},
      {"model.intermediate_size", 1, kMaxInt, {}, "SwiGLU MLP width.", DS_FIELD(model.intermediate_size)},
      {"model.max_seq_len", 1, kMaxInt, {}, "Longest sequence the rotary tables cover.", DS_FIELD(model.max_seq_len)},
      {"model.rope_theta", 1, kInf, {}, "RoPE base.", DS_FIELD(model.rope_theta)},
      {"model.rms_norm_eps", 0, 1, {}, "RMSNorm epsilon.", DS_FIELD(model.rms_norm_eps)},
      {"model.init_std", 0, 1, {}, "Std of the normal weight init.", DS_FIELD(model.init_std)},
      {"data.path", 0, 0, {}, "Training data file (relative to the recipe file).", DS_FIELD(data.path)},
      {"data.format", 0, 0, {"bytes"}, "bytes: one token per byte (vocab 256).", DS_FIELD(data.format)},
      {"data.seq_len", 1, kMaxInt, {}, "Tokens per sample.", DS_FIELD(data.seq_len)},
      {"train.steps", 1, kMaxInt, {}, "Optimizer steps.", DS_FIELD(train.steps)},
      {"train.micro_batch_size", 1, kMaxInt, {}, "Samples per rank per micro-step.", DS_FIELD(train.micro_batch_size)},
      {"train.global_batch_size", 1, kMaxInt, {}, "Samples per optimizer step over all ranks (= micro x ranks x accumulation).", DS_FIELD(train.global_batch_size)},
      {"train.lr", 0, kInf, {}, "Peak learning rate.", DS_FIELD(train.lr)},
      {"train.min_lr_ratio", 0, 1, {}, "Cosine decay ends at lr x min_lr_ratio.", DS_FIELD(train.min_lr_ratio)},
      {"train.warmup_steps", 0, kMaxInt, {}, "Linear warmup steps.", DS_FIELD(train.warmup_steps)},
      {"train.weight_decay", 0, kInf, {}, "AdamW decoupled weight decay.", DS_FIELD(train.weight_decay)},
      {"train.beta1", 0, 1, {}, "AdamW beta1.", DS_FIELD(train.beta1)},
      {"train.beta2", 0, 1, {}, "AdamW beta2.", DS_FIELD(train.beta2)},
      {"train.eps", 0, 1, {}, "AdamW epsilon.", DS_FIELD(train.eps)},
      {"train.grad_clip", 0, kInf, {}, "Clip the global gradient norm to this; 0 disables.", DS_FIELD(train.grad_clip)},
      {"checkpoint.interval_steps", 0, kMaxInt, {}, "Checkpoint every N steps (0: only at the end).", DS_FIELD(checkpoint.interval_steps)},
      {"checkpoint.keep_last", 0, kMaxInt, {}, "Keep the newest N checkpoints (0: keep all).", DS_FIELD(checkpoint.keep_last)},
      {"logging.steps_per_print", 1, kMaxInt, {}, "Print a metrics line every N steps.", DS_FIELD(logging.steps_per_print)},
      {"launch.nproc_per_node", 1, 1024, {}, "Worker processes on this node.", DS_FIELD(launch.nproc_per_node)},
      {"launch.threads_per_worker", 0, 1024, {}, "Intra-op threads per worker (0: cores / workers).", DS_FIELD(launch.threads_per_worker)},
      {"launch.master_addr", 0, 0, {}, "Address of the rendezvous store.", DS_FIELD(launch.master_addr)},
      {"launch.master_port", 0, 65535, {}, "Port of the rendezvous store (0: pick a free one).", DS_FIELD(launch.master_port)},
      {"launch.timeout_s", 1, 86400, {}, "Rendezvous and collective timeout in seconds.", DS_FIELD(launch.timeout_s)},
  };
  return fields;
}

#undef DS_FIELD

std::vector<std::string> recipe_sections() {
  return {"model", "data", "train", "checkpoint", "logging", "launch"};
}

}  // namespace dstrain::config
