#pragma once
// The recipe's enum-like settings as enums. Each enum's names are its recipe spellings, in
// declaration order: the schema takes its choices from enum_names<E>(), so the YAML reader,
// --set, the resolved JSON, --dry-run and the docs all use these and only these.
#include <string>
#include <vector>

#include "dstrain/pipeline/schedule.h"

namespace dstrain::config {

// dense: LLaMA-style (deepseek-llm, deepseek-coder); mla_moe: DeepSeek-V2/V3.
enum class ModelFamily { kDense, kMlaMoe };
enum class ScoringFunc { kSoftmax, kSigmoid };                     // router scores: V2, V3
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };  // expert selection
enum class DataFormat { kBytes, kMegatron, kLlmc, kRawU16 };       // token file formats
enum class OptimizerType { kAdamW, kAdam };                        // decoupled or L2 decay
enum class ScheduleType { kWarmupCosine, kWsd, kDsWarmupCosine, kDsWarmup, kDsWarmupDecay, kDsOneCycle, kConstant };
enum class WarmupType { kLinear, kLog };                                       // ds_* schedules' warmup shape
enum class BatchScaling { kNone, kLinear, kSqrt };                             // LR vs a changing global batch
enum class BadStepAction { kStop, kSkip, kRollback };                          // train.on_bad_step
enum class Dtype { kFp32, kBf16, kFp16 };                                      // training precision
enum class OffloadDevice { kNone, kCpu };                                      // zero.offload_optimizer/param
enum class Sink { kConsole, kJsonl, kCsv, kTensorboard, kWandb, kMlflow };     // logging.sinks
enum class RopeScaling { kNone, kLinear, kYarn };                              // model.rope_scaling: HF's default, linear, yarn
enum class Recompute { kNone, kFull, kSelective };                             // train.activation_checkpointing
enum class Packing { kNone, kGreedy, kBestFit };                               // data.packing: conversations into rows
enum class LossNormalization { kGlobalTokens, kMicroBatchMean, kPerSample };   // train.loss_normalization
enum class LoraBase { kModel, kNf4, kFp8 };                                    // lora.base: the frozen base's storage
enum class TrainObjective { kSft, kDpo, kReward, kCpo, kSimpo, kOrpo, kKto };  // train.objective
enum class TaskFormat { kDstrain, kHellaswag, kArc, kMmlu, kGsm8k };           // eval.task_format, eval --task-format
using PipelineSchedule = pipeline::ScheduleKind;                               // pipeline.schedule

template <typename E>
const std::vector<std::string>& enum_names();
template <>
const std::vector<std::string>& enum_names<ModelFamily>();
template <>
const std::vector<std::string>& enum_names<ScoringFunc>();
template <>
const std::vector<std::string>& enum_names<TopkMethod>();
template <>
const std::vector<std::string>& enum_names<DataFormat>();
template <>
const std::vector<std::string>& enum_names<OptimizerType>();
template <>
const std::vector<std::string>& enum_names<ScheduleType>();
template <>
const std::vector<std::string>& enum_names<WarmupType>();
template <>
const std::vector<std::string>& enum_names<BatchScaling>();
template <>
const std::vector<std::string>& enum_names<BadStepAction>();
template <>
const std::vector<std::string>& enum_names<Dtype>();
template <>
const std::vector<std::string>& enum_names<OffloadDevice>();
template <>
const std::vector<std::string>& enum_names<Sink>();
template <>
const std::vector<std::string>& enum_names<RopeScaling>();
template <>
const std::vector<std::string>& enum_names<Recompute>();
template <>
const std::vector<std::string>& enum_names<Packing>();
template <>
const std::vector<std::string>& enum_names<LossNormalization>();
template <>
const std::vector<std::string>& enum_names<LoraBase>();
template <>
const std::vector<std::string>& enum_names<TrainObjective>();
template <>
const std::vector<std::string>& enum_names<PipelineSchedule>();
template <>
const std::vector<std::string>& enum_names<TaskFormat>();

// The recipe spelling of a value: name(Dtype::kBf16) == "bf16".
template <typename E>
const std::string& name(E value) {
  return enum_names<E>().at(static_cast<size_t>(value));
}

// The value of a spelling; false when it names none.
template <typename E>
bool parse_enum(const std::string& text, E& out) {
  const auto& names = enum_names<E>();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == text) return out = static_cast<E>(i), true;
  return false;
}

}  // namespace dstrain::config
