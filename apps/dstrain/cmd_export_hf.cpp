#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "commands.h"
#include "dstrain/tasks/export.h"

namespace dstrain::app {

void register_export_hf(CLI::App& app, Run& run) {
  struct Args {
    std::string run_dir, out_dir, checkpoint;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("export-hf", "Write a run's checkpoint as a Hugging Face model directory");
  cmd->footer(
      "Writes OUT_DIR/config.json (llama, deepseek_v2 or deepseek_v3) and OUT_DIR/model.safetensors (float32),\n"
      "with Hugging Face tensor names (V2/V3 RoPE rows in the interleaved layout those checkpoints use).\n"
      "A recipe can start from such a directory with model.init_from.\n\n"
      "Examples:\n"
      "  dstrain export-hf runs/demo exported/demo\n"
      "  dstrain export-hf runs/demo exported/demo-50 --checkpoint runs/demo/ckpt/step_00000050");
  cmd->add_option("run_dir", args->run_dir, "Run directory of a `dstrain train`")->required();
  cmd->add_option("out_dir", args->out_dir, "Directory to write (created if needed)")->required();
  cmd->add_option("--checkpoint", args->checkpoint, "A checkpoint directory of the run (default: the newest committed one)");
  cmd->callback([args, &run] {
    run = [args] {
      const std::string dir = tasks::export_run_to_hf(args->run_dir, args->checkpoint, args->out_dir);
      fmt::print("exported {} to {}\n", dir, args->out_dir);
      return 0;
    };
  });
}

}  // namespace dstrain::app
