#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>

#include "commands.h"
#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/core/exit_code.h"

namespace dstrain::app {

void register_inspect_ckpt(CLI::App& app, Run& run) {
  auto path = std::make_shared<std::string>();
  auto list_tensors = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("inspect-ckpt", "Show what a checkpoint holds and verify its checksums");
  cmd->footer(
      "PATH is a checkpoint directory (ckpt/step_XXXXXXXX) or a ckpt/ directory, whose `latest` is used.\n"
      "Exit status 0 when every file checks out, 4 when one is missing or corrupt.\n\n"
      "Examples:\n"
      "  dstrain inspect-ckpt runs/demo/ckpt\n"
      "  dstrain inspect-ckpt runs/demo/ckpt/step_00000030 --tensors");
  cmd->add_option("path", *path, "Checkpoint directory, or a run's ckpt/ directory")->required();
  cmd->add_flag("--tensors", *list_tensors, "List every tensor with its shape");
  cmd->callback([path, list_tensors, &run] {
    run = [path, list_tensors] {
      std::string dir = *path;
      if (std::filesystem::exists(std::filesystem::path(dir) / "latest")) dir = *ckpt::latest_checkpoint(dir);
      const ckpt::Inspection in = ckpt::inspect_checkpoint(dir);
      int64_t elements = 0;
      for (const auto& t : in.tensors) {
        int64_t n = 1;
        for (auto d : t.shape) n *= d;
        elements += n;
      }
      fmt::print("checkpoint   {}\ncommitted    {}\nstep         {}\nsamples      {}\nworld size   {}\nconfig hash  {}\ntensors      {} ({} elements)\n",
                 in.dir, in.committed ? "yes" : "NO (incomplete save)", in.state.step, in.state.samples_consumed, in.state.world_size,
                 in.state.config_hash, in.tensors.size(), elements);
      if (*list_tensors)
        for (const auto& t : in.tensors) fmt::print("  {:<56} {:<8} [{}]\n", t.name, t.dtype, fmt::join(t.shape, ", "));
      bool ok = in.committed;
      for (const auto& f : in.files) {
        fmt::print("file         {} {} bytes: {}\n", f.name, f.bytes, f.ok ? "OK (crc32c)" : "CORRUPT: " + f.problem);
        ok &= f.ok;
      }
      return ok ? exit_status::kOk : exit_status::kCheckpoint;
    };
  });
}

}  // namespace dstrain::app
