#pragma once
// Hugging Face layout in and out: config.json (model_type llama for dense models, deepseek_v2 or
// deepseek_v3 for mla_moe), generation_config.json, and the weights as model.safetensors or, past
// the shard size, model-0000k-of-0000n.safetensors with model.safetensors.index.json, tensors
// under their HF names (dstrain's own names). V2/V3 checkpoints store the RoPE dims of q and k_pe
// as interleaved pairs; dstrain uses the half-split layout, so those rows are permuted on the way
// in and out. DeepSeek's block-scaled FP8 weights (hf_fp8.h) are dequantized on the way in, and
// written on request.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/config/recipe.h"
#include "dstrain/model/hf_fp8.h"
#include "dstrain/model/named_tensor.h"

namespace dstrain::model {

struct HfExportOptions {
  // The weights' safetensors dtype: F32, BF16, F16, or F8_E4M3 for DeepSeek's FP8 format (the
  // Linear weights of attention and MLPs in FP8 with block scales as `fp8` says, the rest BF16,
  // the router's selection bias F32).
  std::string dtype = "F32";
  Fp8Format fp8;
  // Multi-token prediction's modules (model.mtp_depth) in the released layout: model.layers.{L + k - 1}.*
  // with copies of the shared embedding and head, and num_nextn_predict_layers; false: left out.
  bool mtp = true;
  uint64_t max_shard_bytes = 5000000000ULL;  // Hugging Face's default shard size, 5GB
  std::optional<int64_t> bos_token_id, eos_token_id;
  // A fine-tuned model's end-of-turn token, when it is not the eos: generation_config.json's
  // eos_token_id lists both, so that generate() stops at the end of a turn.
  std::optional<int64_t> end_of_turn_id;
  // A reward model's pad token (config.json's pad_token_id): its score is read at each sequence's
  // last token that is not this one, by transformers as by dstrain.
  std::optional<int64_t> pad_token_id;
};

// The tensors to export, in model order, and a function that gives one of them whole (float32,
// dstrain's layout): the export holds one tensor at a time, so it needs about one tensor of
// memory whatever the model's size. Every file is written atomically; weight files of an earlier
// export that this one does not write are removed.
struct TensorShape {
  std::string name;
  std::vector<int64_t> shape;
};
using TensorReader = std::function<at::Tensor(const TensorShape& tensor)>;
// Returns the weight files written.
std::vector<std::string> export_hf_streaming(const config::ModelConfig& config, const std::vector<TensorShape>& tensors,
                                             const TensorReader& read, const HfExportOptions& options, const std::string& out_dir);
// "5GB" (10^9), "500MB", "2GiB" (2^30), "1234" (bytes) -> bytes; throws Error{kUsage}.
uint64_t parse_byte_size(const std::string& text);

// Writes out_dir/config.json and the weights (float32, one file up to 5GB), atomically each.
void export_hf(const config::ModelConfig& config, const NamedTensors& params, const std::string& out_dir);

// V2/V3's interleaved RoPE rows (to_interleaved) or dstrain's half-split ones; other tensors as they are.
at::Tensor permute_rope_rows(const config::ModelConfig& config, const std::string& name, const at::Tensor& w, bool to_interleaved);

// An HF directory's weights, one tensor at a time: read() gives a tensor whole in float32 and
// dstrain's layout (F32, BF16, F16 widened; FP8 dequantized with its block scales, which may
// live in another shard). The files stay mapped; nothing is read until asked for.
class HfWeights {
 public:
  HfWeights(const std::string& dir, const config::ModelConfig& config);
  ~HfWeights();
  HfWeights(const HfWeights&) = delete;
  HfWeights& operator=(const HfWeights&) = delete;
  bool has(const std::string& name) const;
  // Throws Error{kCheckpoint} naming the tensor when it is absent, or its scales are not finite.
  at::Tensor read(const std::string& name) const;
  // Whether two tensors (both present) are stored alike: dtype, shape and bytes, compared in the
  // mapped files without converting them (V3's MTP copies of the embedding and head: 1.9 GB each).
  bool stored_alike(const std::string& a, const std::string& b) const;
  // The folder's quantization_config (nullopt: none).
  const std::optional<Fp8Format>& fp8() const;
  // A weight stored in FP8 as it is (its float8 bytes and float32 block scales, rows in the model's
  // order), for a base kept in FP8; nullopt when the folder stores it otherwise, or when the
  // model's row order would move rows across blocks. read() reports what is wrong with a weight.
  std::optional<Fp8Weight> read_fp8(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Copies weights from an HF directory (model.safetensors, or shards listed in
// model.safetensors.index.json) into `params` (and `buffers`, when the files hold them), by
// name; F32, BF16 and F16 are converted, FP8 dequantized (HfWeights). Throws Error{kCheckpoint} naming a missing tensor or a
// shape mismatch.
void load_hf_weights(const std::string& dir, const config::ModelConfig& config, const NamedTensors& params,
                     const NamedTensors& buffers = {});

// What in an HF directory's weights does not fit `tensors` (model_tensor_shapes: missing tensors,
// other shapes, dtypes dstrain cannot load, FP8 weights without fitting scales), read from the
// safetensors headers alone; one
// message each. check_hf_weights throws them as one Error{kCheckpoint} with `hint` (what to
// change; empty: the folder's config.json disagrees with its own weights).
std::vector<std::string> hf_weight_problems(const std::string& dir, const std::vector<NamedShape>& tensors);
void check_hf_weights(const std::string& dir, const std::vector<NamedShape>& tensors, const std::string& hint = "");

// The *ForSequenceClassification architecture an HF directory's config.json names (a reward
// model's folder: score.weight in place of lm_head); empty for any other folder.
std::string hf_sequence_classifier(const std::string& dir);

// Writes params and buffers to HF layout (see above).
void export_hf(const config::ModelConfig& config, const NamedTensors& params, const NamedTensors& buffers, const std::string& out_dir);

}  // namespace dstrain::model
