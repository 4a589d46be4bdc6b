#include "dstrain/config/enums.h"

namespace dstrain::config {

#define DSTRAIN_ENUM_NAMES(E, ...)                               \
  template <>                                                    \
  const std::vector<std::string>& enum_names<E>() {              \
    static const std::vector<std::string> names = {__VA_ARGS__}; \
    return names;                                                \
  }

DSTRAIN_ENUM_NAMES(ModelFamily, "dense", "mla_moe")
DSTRAIN_ENUM_NAMES(ScoringFunc, "softmax", "sigmoid")
DSTRAIN_ENUM_NAMES(TopkMethod, "greedy", "group_limited_greedy", "noaux_tc")
DSTRAIN_ENUM_NAMES(DataFormat, "bytes", "megatron", "llmc", "raw_u16")
DSTRAIN_ENUM_NAMES(OptimizerType, "adamw", "adam")
DSTRAIN_ENUM_NAMES(ScheduleType, "warmup_cosine", "wsd", "ds_warmup_cosine", "ds_warmup", "ds_warmup_decay", "ds_one_cycle", "constant")
DSTRAIN_ENUM_NAMES(WarmupType, "linear", "log")
DSTRAIN_ENUM_NAMES(BatchScaling, "none", "linear", "sqrt")
DSTRAIN_ENUM_NAMES(BadStepAction, "stop", "skip", "rollback")
DSTRAIN_ENUM_NAMES(Dtype, "fp32", "bf16", "fp16")
DSTRAIN_ENUM_NAMES(OffloadDevice, "none", "cpu")
DSTRAIN_ENUM_NAMES(Sink, "console", "jsonl", "csv", "tensorboard", "wandb", "mlflow")
DSTRAIN_ENUM_NAMES(RopeScaling, "none", "linear", "yarn")
DSTRAIN_ENUM_NAMES(Recompute, "none", "full", "selective")
DSTRAIN_ENUM_NAMES(Packing, "none", "greedy", "best_fit")
DSTRAIN_ENUM_NAMES(LossNormalization, "global_tokens", "micro_batch_mean", "per_sample")
DSTRAIN_ENUM_NAMES(LoraBase, "model", "nf4", "fp8")
DSTRAIN_ENUM_NAMES(TrainObjective, "sft", "dpo", "reward", "cpo", "simpo", "orpo", "kto")
DSTRAIN_ENUM_NAMES(TaskFormat, "dstrain", "hellaswag", "arc", "mmlu", "gsm8k")

#undef DSTRAIN_ENUM_NAMES

template <>
const std::vector<std::string>& enum_names<PipelineSchedule>() {
  return pipeline::schedule_names();
}

}  // namespace dstrain::config
