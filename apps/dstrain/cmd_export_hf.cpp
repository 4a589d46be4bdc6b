#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.h"
#include "dstrain/tasks/export.h"

namespace dstrain::app {

void register_export_hf(CLI::App& app, Run& run) {
  struct Args {
    std::string run_dir, out_dir;
    tasks::ExportOptions options;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("export-hf", "Write a run's checkpoint (or convert a Hugging Face folder) as a Hugging Face model");
  cmd->footer(
      "Writes OUT_DIR/config.json (llama, deepseek_v2 or deepseek_v3), generation_config.json and the weights\n"
      "with Hugging Face tensor names (V2/V3 RoPE rows in the interleaved layout those checkpoints use):\n"
      "model.safetensors, or past --max-shard-size model-0000k-of-0000n.safetensors with\n"
      "model.safetensors.index.json, written one tensor at a time. The tokenizer comes along when the run has\n"
      "one: the files of model.init_from, or a byte-level tokenizer.json for prepare-data datasets. transformers'\n"
      "AutoModelForCausalLM and AutoTokenizer load the directory; a recipe can start from it with model.init_from.\n\n"
      "A LoRA run (lora.rank > 0) is written as a PEFT adapter: adapter_config.json (target_modules naming exactly\n"
      "the adapted projections, base_model_name_or_path = model.init_from) and adapter_model.safetensors under PEFT's\n"
      "keys, which peft.PeftModel.from_pretrained(base, OUT_DIR) loads; --merge writes the merged model instead\n"
      "(each adapted weight W + scale B A), a plain Hugging Face model.\n\n"
      "A reward model (train.objective reward) is written as *ForSequenceClassification (score.weight, num_labels 1,\n"
      "pad_token_id), which AutoModelForSequenceClassification loads; its LoRA adapter has task_type SEQ_CLS.\n\n"
      "--dtype fp8 writes DeepSeek's release format (what vLLM and SGLang serve): every Linear weight of attention\n"
      "and the MLPs as float8_e4m3fn with a float32 weight_scale_inv per 128x128 block (amax / 448; --scale-fmt\n"
      "ue8m0: powers of two, as V3.1 does), the rest bf16, the router's bias float32, and the quantization_config.\n\n"
      "RUN_DIR may instead be a Hugging Face folder, converted on the CPU one tensor at a time: DeepSeek-V3's FP8\n"
      "release to bf16 (each block dequantized exactly as DeepSeek's weight_dequant), or a bf16 model to FP8; a\n"
      "sequence classifier's folder (a reward model) stays one.\n\n"
      "Examples:\n"
      "  dstrain export-hf runs/demo exported/demo\n"
      "  dstrain export-hf runs/demo exported/demo-bf16 --dtype bf16 --max-shard-size 2GB\n"
      "  dstrain export-hf runs/demo exported/demo-50 --checkpoint runs/demo/ckpt/step_00000050\n"
      "  dstrain export-hf runs/v3-sft exported/v3-sft-fp8 --dtype fp8\n"
      "  dstrain export-hf runs/lora exported/lora-adapter\n"
      "  dstrain export-hf runs/lora exported/lora-merged --merge --dtype bf16\n"
      "  dstrain export-hf DeepSeek-V3 DeepSeek-V3-bf16 --dtype bf16");
  cmd->add_option("run_dir", args->run_dir, "Run directory of a `dstrain train`, or a Hugging Face folder to convert")->required();
  cmd->add_option("out_dir", args->out_dir, "Directory to write (created if needed)")->required();
  cmd->add_option(
      "--checkpoint", args->options.checkpoint,
      "A checkpoint directory of the run, a step number, or best (the one checkpoint.keep_best kept); default: the newest that verifies");
  cmd->add_option("--dtype", args->options.dtype,
                  "Weights' dtype: fp32 (default, the master weights exactly), bf16, fp16, or fp8 (DeepSeek's block-scaled FP8)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16", "fp8"}));
  cmd->add_option("--scale-fmt", args->options.scale_fmt, "With --dtype fp8: ue8m0 for power-of-two block scales (default: amax / 448)")
      ->check(CLI::IsMember({"ue8m0"}));
  cmd->add_flag(
      "--no-mtp", [args](int64_t) { args->options.mtp = false; },
      "Leave out the multi-token prediction modules (model.mtp_depth); by default they are written as DeepSeek-V3\n"
      "releases them (model.layers.{L+k-1}.*, with copies of the embedding and head, and num_nextn_predict_layers)");
  cmd->add_flag("--merge", args->options.merge,
                "A LoRA run: write the merged model (W + scale B A for each adapted weight) rather than the PEFT adapter");
  cmd->add_option("--max-shard-size", args->options.max_shard_size, "Largest weight file, e.g. 5GB (default), 500MB, 2GiB");
  cmd->callback([args, &run] {
    run = [args] {
      const tasks::ExportResult r = tasks::export_run_to_hf(args->run_dir, args->out_dir, args->options);
      if (r.adapter) {
        fmt::print("exported {} to {} as a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors, {}; tokenizer: {})\n",
                   r.checkpoint, args->out_dir, args->options.dtype, r.tokenizer.empty() ? "none" : r.tokenizer);
        return 0;
      }
      fmt::print("exported {} to {} ({} weight file{}, {}; tokenizer: {})\n", r.checkpoint, args->out_dir,
                 r.files.size() > 1 ? r.files.size() - 1 : 1, r.files.size() > 1 ? "s" : "",
                 args->options.dtype + (args->options.scale_fmt.empty() ? "" : " " + args->options.scale_fmt),
                 r.tokenizer.empty() ? "none" : r.tokenizer);
      return 0;
    };
  });
}

}  // namespace dstrain::app
