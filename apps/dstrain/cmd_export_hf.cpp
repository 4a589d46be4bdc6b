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
  CLI::App* cmd = app.add_subcommand("export-hf", "Write a run's checkpoint as a Hugging Face model directory");
  cmd->footer(
      "Writes OUT_DIR/config.json (llama, deepseek_v2 or deepseek_v3), generation_config.json and the weights\n"
      "with Hugging Face tensor names (V2/V3 RoPE rows in the interleaved layout those checkpoints use):\n"
      "model.safetensors, or past --max-shard-size model-0000k-of-0000n.safetensors with\n"
      "model.safetensors.index.json, written one tensor at a time. The tokenizer comes along when the run has\n"
      "one: the files of model.init_from, or a byte-level tokenizer.json for prepare-data datasets. transformers'\n"
      "AutoModelForCausalLM and AutoTokenizer load the directory; a recipe can start from it with model.init_from.\n\n"
      "Examples:\n"
      "  dstrain export-hf runs/demo exported/demo\n"
      "  dstrain export-hf runs/demo exported/demo-bf16 --dtype bf16 --max-shard-size 2GB\n"
      "  dstrain export-hf runs/demo exported/demo-50 --checkpoint runs/demo/ckpt/step_00000050");
  cmd->add_option("run_dir", args->run_dir, "Run directory of a `dstrain train`")->required();
  cmd->add_option("out_dir", args->out_dir, "Directory to write (created if needed)")->required();
  cmd->add_option("--checkpoint", args->options.checkpoint, "A checkpoint directory of the run (default: the newest committed one)");
  cmd->add_option("--dtype", args->options.dtype, "Weights' dtype: fp32 (default, the master weights exactly), bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--max-shard-size", args->options.max_shard_size, "Largest weight file, e.g. 5GB (default), 500MB, 2GiB");
  cmd->callback([args, &run] {
    run = [args] {
      const tasks::ExportResult r = tasks::export_run_to_hf(args->run_dir, args->out_dir, args->options);
      fmt::print("exported {} to {} ({} weight file{}, {}; tokenizer: {})\n", r.checkpoint, args->out_dir,
                 r.files.size() > 1 ? r.files.size() - 1 : 1, r.files.size() > 1 ? "s" : "", args->options.dtype,
                 r.tokenizer.empty() ? "none (the run has none)" : r.tokenizer);
      return 0;
    };
  });
}

}  // namespace dstrain::app
