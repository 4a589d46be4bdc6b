#include <CLI/CLI.hpp>

#include "commands.h"
#include "dstrain/bench/control_plane_bench.h"
#include "dstrain/bench/liveness_bench.h"
#include "dstrain/bench/checkpoint_bench.h"
#include <fmt/format.h>

#include <filesystem>
#include <tuple>

#include <unistd.h>

#include "dstrain/bench/adam_bench.h"
#include "dstrain/launch/plan.h"
#include "dstrain/tasks/comm_task.h"
#include "dstrain/bench/model_bench.h"
#include "dstrain/bench/moe_bench.h"
#include "launch_flags.h"

namespace dstrain::app {

namespace {

// dstrain bench comm: collectives across the ranks (a launch, like train).
void add_bench_comm(CLI::App& bench, Run& run) {
  struct Args {
    tasks::CommTask task;
    launch::LaunchFlags flags;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand("comm", "Collective communication: correctness check, or an nccl-tests-style timing table");
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
  cmd->add_option("--min-bytes", args->task.bench.min_bytes, "Smallest message (default 1 KiB)")
      ->check(CLI::Range(int64_t{4}, int64_t{1} << 34));
  cmd->add_option("--max-bytes", args->task.bench.max_bytes, "Largest message (default 256 MiB)")
      ->check(CLI::Range(int64_t{4}, int64_t{1} << 34));
  cmd->add_option("--iters", args->task.bench.max_iters, "Most timed iterations per size (fewer for large sizes)")
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--timeout", args->task.timeout_s, "Rendezvous and collective timeout, seconds")->check(CLI::Range(1, 86400));
  cmd->callback([args, &run] {
    run = [args] {
      const launch::Topology topo = launch::decide_topology(args->flags, 2, true, 1, "127.0.0.1", 0);
      if (topo.mode == launch::Topology::Mode::kRank) return tasks::run_comm_task_as_rank(topo, args->task);
      return tasks::launch_comm_task(topo, args->task, self_executable());
    };
  });
}

// dstrain bench model: one recipe model's forward + backward in this process.
void add_bench_model(CLI::App& bench, Run& run) {
  auto margs = std::make_shared<std::tuple<std::string, int, int, int, int>>("", 20, 1, 8, 128);
  CLI::App* mcmd = bench.add_subcommand("model", "Forward+backward throughput of a recipe's model in this process");
  mcmd->footer(
      "Prints the median time of one forward+backward over random tokens and tokens/s.\n\nExample:\n  dstrain bench model "
      "recipes/demo.yaml --threads 1");
  mcmd->add_option("recipe", std::get<0>(*margs), "Recipe whose model section to build")->required()->check(CLI::ExistingFile);
  mcmd->add_option("--iters", std::get<1>(*margs), "Timed iterations (after 3 warm-ups)")->check(CLI::Range(1, 100000));
  mcmd->add_option("--threads", std::get<2>(*margs), "Intra-op threads")->check(CLI::Range(1, 1024));
  mcmd->add_option("--micro-batch", std::get<3>(*margs), "Sequences per step")->check(CLI::Range(1, 1 << 20));
  mcmd->add_option("--seq-len", std::get<4>(*margs), "Tokens per sequence")->check(CLI::Range(1, 1 << 20));
  mcmd->callback([margs, &run] {
    run = [margs] {
      const auto [recipe, iters, threads, micro, seq] = *margs;
      const auto r = tasks::bench_model(recipe, iters, threads, micro, seq);
      fmt::print("dstrain  {:>10} params  batch {}x{}  threads {}: {:8.2f} ms/step  {:10.0f} tokens/s\n", r.parameters, micro, seq, threads,
                 r.ms_per_step, r.tokens_per_s);
      return 0;
    };
  });
}

// dstrain bench moe: one MoE layer's routed experts, three ways.
void add_bench_moe(CLI::App& bench, Run& run) {
  auto moe = std::make_shared<tasks::MoeBenchOptions>();
  CLI::App* moecmd = bench.add_subcommand("moe", "One MoE layer's routed experts: per-expert, grouped loop and grouped GEMMs");
  moecmd->footer(
      "Forward + backward of the routed experts of one DeepSeekMoE layer (median of --iters), three ways\n"
      "on the same tokens and routing: the per-expert layer dstrain had before (a gather and a scatter\n"
      "per expert), the grouped layer (tokens sorted by expert once) with its expert loop, and the\n"
      "grouped GEMMs (at::_grouped_mm; on a GPU Hopper's grouped kernels for bf16). TFLOP/s counts\n"
      "the experts' GEMMs (18 x hidden x inner per routed token copy); err is the largest difference\n"
      "from the per-expert output.\n\n"
      "Examples:\n  dstrain bench moe --tokens 2048 --threads 2\n"
      "  dstrain bench moe --device cuda --dtype bf16 --tokens 4096 --hidden 2048 --inner 1408 --experts 64 --top-k 6");
  moecmd->add_option("--tokens", moe->tokens, "Tokens in the layer's batch")->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  moecmd->add_option("--hidden", moe->hidden, "Hidden size")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  moecmd->add_option("--inner", moe->inner, "Each expert's SwiGLU width (moe_intermediate_size)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  moecmd->add_option("--experts", moe->experts, "Routed experts")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  moecmd->add_option("--top-k", moe->top_k, "Experts per token")->check(CLI::Range(int64_t{1}, int64_t{4096}));
  moecmd->add_option("--dtype", moe->dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  moecmd->add_option("--device", moe->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  moecmd->add_option("--iters", moe->iters, "Timed iterations (after one warm-up)")->check(CLI::Range(1, 100000));
  moecmd->add_option("--threads", moe->threads, "Intra-op threads (CPU; default ATen's)")->check(CLI::Range(1, 1024));
  moecmd->callback([moe, &run] {
    run = [moe] {
      const auto rows = tasks::bench_moe(*moe);
      fmt::print("# {} tokens x top-{} of {} experts, hidden {}, inner {}, {} on {}\n", moe->tokens, moe->top_k, moe->experts, moe->hidden,
                 moe->inner, moe->dtype, moe->device);
      fmt::print("{:<24} {:>10} {:>9} {:>10} {:>10}\n", "experts", "ms", "TFLOP/s", "vs first", "err");
      for (const auto& r : rows)
        fmt::print("{:<24} {:>10.2f} {:>9.3f} {:>9.2f}x {:>10.2e}\n", r.name, r.ms, r.tflops, rows.front().ms / r.ms, r.max_abs_err);
      return 0;
    };
  });
}

// dstrain bench control-plane: a large job's control plane, simulated.
void add_bench_control_plane(CLI::App& bench, Run& run) {
  auto cp = std::make_shared<comm::ControlPlaneOptions>();
  auto cp_timeout = std::make_shared<int>(600);
  auto cp_per_node = std::make_shared<int>(8);
  auto cp_pieces_up_to = std::make_shared<int>(16384);
  CLI::App* cpcmd =
      bench.add_subcommand("control-plane", "The control plane of a large job (thousands of ranks), simulated in this process");
  cpcmd->footer(
      "Fake ranks (threads) run dstrain's rendezvous against its store server, then Gloo's setup\n"
      "traffic (lazy pairs, and a full mesh up to --full-mesh-up-to ranks), the environment check's\n"
      "facts gathered to rank 0, node 0's liveness pass over every heartbeat (per key and batched),\n"
      "and node 0's pass over node beats that carry their ranks' heartbeats (the hierarchical\n"
      "liveness the launchers use), and a 7B checkpoint's metadata: rank 0's commit and a rank's\n"
      "manifest load, with the shard table and with every rank's pieces listed. Prints one JSON line\n"
      "per phase: seconds, store requests and bytes (read, or the manifest's). Each fake rank holds\n"
      "one open file (the limit bounds --ranks).\n\n"
      "Example:\n  dstrain bench control-plane --ranks 4096");
  cpcmd->add_option("--ranks", cp->ranks, "Fake ranks")->check(CLI::Range(1, 1 << 20));
  cpcmd->add_option("--timeout-s", *cp_timeout, "Deadline of each phase")->check(CLI::Range(1, 86400));
  cpcmd->add_option("--full-mesh-up-to", cp->full_mesh_up_to, "Simulate Gloo's full mesh (N^2 bytes) only up to this many ranks")
      ->check(CLI::Range(0, 1 << 20));
  cpcmd->add_option("--ranks-per-node", *cp_per_node, "Ranks per node for node 0's liveness pass over node beats (0: skip it)")
      ->check(CLI::Range(0, 1024));
  cpcmd
      ->add_option("--pieces-up-to", *cp_pieces_up_to,
                   "Time format 2's checkpoint metadata (every rank's pieces listed) up to this many ranks; -1 skips both formats")
      ->check(CLI::Range(-1, 1 << 20));
  cpcmd->callback([cp, cp_timeout, cp_per_node, cp_pieces_up_to, &run] {
    run = [cp, cp_timeout, cp_per_node, cp_pieces_up_to] {
      cp->timeout = std::chrono::seconds(*cp_timeout);
      std::vector<comm::ControlPlanePhase> phases = comm::bench_control_plane(*cp);
      if (*cp_per_node > 0 && cp->ranks >= *cp_per_node) {  // node 0's pass over node beats (launch/group_watch.h)
        const int nodes = cp->ranks / *cp_per_node;
        const launch::LivenessPass pass = launch::bench_liveness_pass(nodes, *cp_per_node);
        phases.push_back(
            {fmt::format("liveness pass on node 0 ({} node beats of {} ranks)", nodes, *cp_per_node), pass.seconds, 2, pass.bytes});
      }
      if (*cp_pieces_up_to >= 0) {  // rank 0's commit and a rank's manifest load (zero/checkpoint_bench.h)
        const auto scratch = std::filesystem::temp_directory_path() / fmt::format("dstrain-bench-ckpt-{}", ::getpid());
        for (const auto& c : zero::bench_checkpoint_metadata(cp->ranks, *cp_pieces_up_to, scratch.string()))
          phases.push_back({c.name, c.seconds, 0, c.bytes});
        std::filesystem::remove_all(scratch);
      }
      for (const auto& p : phases)
        fmt::print("{{\"phase\": \"{}\", \"ranks\": {}, \"seconds\": {:.4f}, \"store_requests\": {}, \"bytes\": {}}}\n", p.name, cp->ranks,
                   p.seconds, p.operations, p.bytes);
      return 0;
    };
  });
}

// dstrain bench optimizer: the fused Adam and the engine's optimizer phase.
void add_bench_optimizer(CLI::App& bench, Run& run) {
  auto oargs = std::make_shared<std::tuple<int64_t, int, int>>(50000000, 1, 10);
  auto odevice = std::make_shared<std::string>("cpu");
  CLI::App* ocmd = bench.add_subcommand("optimizer", "The fused CPU Adam against torch::optim::AdamW and a memory-bandwidth reference");
  ocmd->footer(
      "Times one optimizer step over --params fp32 parameters (median of --iters): dstrain's fused\n"
      "Adam (AVX-512/AVX2, all threads), torch::optim::AdamW, and a kernel with the same memory\n"
      "traffic (4 reads, 3 writes per parameter) as the bandwidth this machine can give.\n"
      "Then the whole optimizer phase of a bf16 model as the ZeRO engine runs it (gradient norm,\n"
      "Adam, bf16 copy of the weights: 30 bytes per parameter) against the engine's previous way\n"
      "(an fp32 copy of the gradients, a chunked norm, Adam per parameter).\n\n"
      "Example:\n  dstrain bench optimizer --params 50000000 --threads 2");
  ocmd->add_option("--params", std::get<0>(*oargs), "Parameters (fp32)")->check(CLI::Range(int64_t{1}, int64_t{1} << 34));
  ocmd->add_option("--threads", std::get<1>(*oargs), "Threads")->check(CLI::Range(1, 1024));
  ocmd->add_option("--iters", std::get<2>(*oargs), "Timed steps (after one warm-up)")->check(CLI::Range(1, 100000));
  ocmd->add_option("--device", *odevice,
                   "cpu, or cuda: the fused CUDA kernel against torch's AdamW and a device-to-device copy of the same bytes")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  ocmd->callback([oargs, odevice, &run] {
    run = [oargs, odevice] {
      const auto [params, threads, iters] = *oargs;
      const auto r = *odevice == "cuda" ? optim::bench_adam_cuda(params, iters) : optim::bench_adam(params, threads, iters);
      fmt::print("{:<24} {:>10} {:>14} {:>9}\n", "kernel", "ms/step", "params/s", "GB/s");
      fmt::print("{:<24} {:>10.2f} {:>14.3g} {:>9.1f}\n", "dstrain fused (" + r.isa + ")", r.fused_ms, r.fused_params_per_s(),
                 r.fused_gb_per_s());
      fmt::print("{:<24} {:>10.2f} {:>14.3g} {:>9.1f}\n", "torch::optim::AdamW", r.torch_ms, r.torch_params_per_s(),
                 r.bytes() / (r.torch_ms / 1e3) / 1e9);
      fmt::print("{:<24} {:>10.2f} {:>14} {:>9.1f}\n", *odevice == "cuda" ? "device-to-device copy" : "bandwidth reference", r.bandwidth_ms,
                 "-", r.bandwidth_gb_per_s());
      fmt::print("{} params, {} threads: fused is {:.2f}x torch::optim::AdamW and {:.2f}x the bandwidth reference\n", params, threads,
                 r.torch_ms / r.fused_ms, r.bandwidth_ms / r.fused_ms);
      // The whole optimizer phase of a bf16 model, as the ZeRO engine runs it, against its previous way.
      const auto s = optim::bench_optimizer_step(*odevice == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU), params, iters);
      fmt::print("{:<24} {:>10.2f} {:>14.3g} {:>9.1f}\n", "bf16 step, fused", s.fused_ms, params / (s.fused_ms / 1e3), s.fused_gb_per_s());
      fmt::print("{:<24} {:>10.2f} {:>14.3g} {:>9.1f}\n", "  of which the norm", s.norm_ms, params / (s.norm_ms / 1e3),
                 2.0 * params / (s.norm_ms / 1e3) / 1e9);
      fmt::print("{:<24} {:>10.2f} {:>14.3g} {:>9.1f}\n", "  of which the update", s.update_ms, params / (s.update_ms / 1e3),
                 28.0 * params / (s.update_ms / 1e3) / 1e9);
      fmt::print("{:<24} {:>10.2f} {:>14.3g} {:>9}\n", "bf16 step, previous", s.previous_ms, params / (s.previous_ms / 1e3), "-");
      fmt::print(
          "bf16 optimizer step (norm, Adam, bf16 copy; {} runs): fused {:.2f} ms, {:.2f}x the previous step, {:.2f}x the {} reference\n",
          s.runs, s.fused_ms, s.previous_ms / s.fused_ms, r.bandwidth_ms * 30.0 / 28.0 / s.fused_ms,
          *odevice == "cuda" ? "copy" : "bandwidth");
      if (s.reference_ms > 0)
        fmt::print(
            "bf16 update (Adam + bf16 copy, 28 bytes per parameter): {:.2f} ms, {:.2f}x the bandwidth reference timed in turns with it\n",
            s.update_ms, s.reference_ms / s.update_ms);
      return 0;
    };
  });
}

}  // namespace

void register_bench(CLI::App& app, Run& run) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks and self-tests of the machine and the cluster");
  bench->require_subcommand(1);
  add_bench_comm(*bench, run);
  add_bench_model(*bench, run);
  add_bench_moe(*bench, run);
  add_bench_control_plane(*bench, run);
  add_bench_optimizer(*bench, run);
  add_bench_pipeline(*bench, run);
}

}  // namespace dstrain::app
