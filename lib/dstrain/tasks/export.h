#pragma once
// `dstrain export-hf`: a run's newest (or a given) checkpoint as a Hugging Face model directory
// that `transformers` loads as it is: config.json, generation_config.json, the weights (in the
// chosen dtype, sharded past a size, written one tensor at a time so memory stays near the
// largest tensor), the end-of-document/beginning ids, and a tokenizer when the run has one: the
// files of the model it started from (model.init_from), or for prepare-data's byte-level datasets
// a byte-level tokenizer.json whose ids are the dataset's (byte b is token b, 256 ends a document).
// A LoRA run exports its adapter in PEFT's format (peft_export.h), or with --merge the merged model.
// The source may also be a Hugging Face folder: it is converted (DeepSeek's FP8 release to bf16
// on a CPU, or a bf16 model to that FP8 format), its tokenizer copied along.
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"

namespace dstrain::tasks {

struct ExportOptions {
  std::string checkpoint;              // a checkpoint directory of the run; "": the newest committed one
  std::string dtype = "fp32";          // fp32, bf16, fp16, or fp8 (DeepSeek's block-scaled format)
  std::string scale_fmt;               // "" or "ue8m0" (fp8: power-of-two block scales)
  bool mtp = true;                     // false (--no-mtp): leave multi-token prediction's modules out
  std::string max_shard_size = "5GB";  // see model::parse_byte_size
  bool merge = false;                  // a LoRA run: the merged model (W + scale B A) rather than a PEFT adapter
};

struct ExportResult {
  std::string checkpoint;          // what was exported
  std::vector<std::string> files;  // the weight files (and index) written
  std::string tokenizer;           // where the tokenizer came from ("" when none)
  bool adapter = false;            // a PEFT LoRA adapter (files: its config and weights)
};

// The model of a Hugging Face folder, read from its config.json as model.init_from reads it.
// Throws Error{kConfig} naming the key it cannot take.
config::ModelConfig model_of_hf_folder(const std::string& dir);

// run_dir: a run directory, or a Hugging Face folder.
ExportResult export_run_to_hf(const std::string& run_dir, const std::string& out_dir, const ExportOptions& options);

}  // namespace dstrain::tasks
