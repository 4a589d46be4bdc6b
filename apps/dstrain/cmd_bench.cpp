#include <CLI/CLI.hpp>

#include "commands.h"
#include <fmt/format.h>

#include <tuple>

#include "dstrain/train/comm_task.h"
#include "dstrain/train/model_bench.h"
#include "launch_flags.h"

namespace dstrain::app {

void register_bench(CLI::App& app, Run& run) {
  struct Args {
    train::CommTask task;
    launch::LaunchFlags flags;
  };
  auto args = std::make_shared<Args>();
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks and self-tests of the machine and the cluster");
  bench->require_subcommand(1);
  CLI::App* cmd = bench->add_subcommand("comm", "Collective communication: correctness check, or an nccl-tests-style timing table");
  cmd->footer(
      "Starts the workers like `train` does (or runs as one rank under mpirun, srun or torchrun) and\n"
      "times all_reduce, reduce_scatter and all_gather from --min-bytes to --max-bytes (x4 steps):\n"
      "size, time, algbw and busbw (nccl-tests' bus bandwidth), next to this host's memcpy rate.\n"
      "--check instead verifies every collective on random data of odd sizes, float32 and bfloat16,\n"
      "against a reference each rank computes locally; the exit status is 0 only if all pass.\n\n"
      "Examples:\n"
      "  dstrain bench comm --nproc-per-node 4\n"
      "  dstrain bench comm --nproc-per-node 2 --check\n"
      "  mpirun -n 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29600 dstrain bench comm --check");
  add_launch_flags(*cmd, args->flags);
  cmd->add_flag("--check", args->task.check, "Verify correctness instead of timing");
  cmd->add_option("--backend", args->task.backend, "gloo (CPU), nccl (GPU), or auto: nccl when the ranks have GPUs")
      ->check(CLI::IsMember({"auto", "gloo", "nccl"}));
  cmd->add_option("--min-bytes", args->task.bench.min_bytes, "Smallest message (default 1 KiB)")->check(CLI::Range(int64_t{4}, int64_t{1} << 34));
  cmd->add_option("--max-bytes", args->task.bench.max_bytes, "Largest message (default 256 MiB)")->check(CLI::Range(int64_t{4}, int64_t{1} << 34));
  cmd->add_option("--iters", args->task.bench.max_iters, "Most timed iterations per size (fewer for large sizes)")->check(CLI::Range(1, 100000));
  cmd->add_option("--timeout", args->task.timeout_s, "Rendezvous and collective timeout, seconds")->check(CLI::Range(1, 86400));
  auto margs = std::make_shared<std::tuple<std::string, int, int, int, int>>("", 20, 1, 8, 128);
  CLI::App* mcmd = bench->add_subcommand("model", "Forward+backward throughput of a recipe's model in this process");
  mcmd->footer("Prints the median time of one forward+backward over random tokens and tokens/s.\n\nExample:\n  dstrain bench model recipes/demo.yaml --threads 1");
  mcmd->add_option("recipe", std::get<0>(*margs), "Recipe whose model section to build")->required()->check(CLI::ExistingFile);
  mcmd->add_option("--iters", std::get<1>(*margs), "Timed iterations (after 3 warm-ups)")->check(CLI::Range(1, 100000));
  mcmd->add_option("--threads", std::get<2>(*margs), "Intra-op threads")->check(CLI::Range(1, 1024));
  mcmd->add_option("--micro-batch", std::get<3>(*margs), "Sequences per step")->check(CLI::Range(1, 1 << 20));
  mcmd->add_option("--seq-len", std::get<4>(*margs), "Tokens per sequence")->check(CLI::Range(1, 1 << 20));
  mcmd->callback([margs, &run] {
    run = [margs] {
      const auto [recipe, iters, threads, micro, seq] = *margs;
      const auto r = train::bench_model(recipe, iters, threads, micro, seq);
      fmt::print("dstrain  {:>10} params  batch {}x{}  threads {}: {:8.2f} ms/step  {:10.0f} tokens/s\n", r.parameters, micro, seq, threads,
                 r.ms_per_step, r.tokens_per_s);
      return 0;
    };
  });
  cmd->callback([args, &run] {
    run = [args] {
      const launch::Topology topo = decide_topology(args->flags, 2, true, 1, "127.0.0.1", 0);
      if (topo.mode == launch::Topology::Mode::kRank) return train::run_comm_task_as_rank(topo, args->task);
      return train::launch_comm_task(topo, args->task, self_executable());
    };
  });
}

}  // namespace dstrain::app
