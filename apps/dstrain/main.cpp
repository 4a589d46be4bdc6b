// dstrain: one binary for launcher and workers. Parses the command line, runs the chosen
// subcommand, and turns every error into a message with a hint and a documented exit status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fmt/ranges.h>
#include <unistd.h>

#include "commands.h"
#include "dstrain/comm/torch_logging.h"
#include "dstrain/core/open_files.h"
#include "dstrain/config/schema.h"
#include "dstrain/core/build_info.h"
#include "dstrain/core/error.h"
#include "dstrain/core/exit_code.h"
#include "dstrain_cuda.h"

namespace {

std::string version_text() {
  const auto& b = dstrain::build_info();
  auto cuda = [](int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); };
  const int nccl = dstrain_nccl_version();
  std::string text = fmt::format("dstrain {} (commit {}, {} build)\ncompiler: {}\nlibtorch: {}\n", b.version, b.git_commit, b.build_type,
                                 b.compiler, b.torch_version);
  if (dstrain_cuda_built())
    text += fmt::format("cuda: yes, runtime {}; nccl: {}.{}.{}\n", cuda(dstrain_cuda_runtime_version()), nccl / 10000, (nccl / 100) % 100,
                        nccl % 100);
  else
    text += "cuda: no (built without CUDA kernels); nccl: no\n";
  return text;
}

void print_error(const char* kind, const std::string& message, const std::string& hint) {
  const bool tty = ::isatty(STDERR_FILENO);
  std::fprintf(stderr, "%sdstrain: %s:%s %s\n", tty ? "\033[1;31m" : "", kind, tty ? "\033[0m" : "", message.c_str());
  if (!hint.empty()) std::fprintf(stderr, "  hint: %s\n", hint.c_str());
}

// The arguments CLI11 did not expect, each with the closest option of the command, if any.
std::string unexpected_arguments(CLI::App& app, int argc, char** argv) {
  CLI::App* command = &app;
  for (CLI::App* sub : app.get_subcommands()) command = sub;
  std::vector<std::string> options;
  for (const CLI::Option* o : command->get_options())
    for (const std::string& name : o->get_lnames()) options.push_back("--" + name);
  std::vector<std::string> parts;
  for (const std::string& extra : command->remaining()) {
    const std::string name = extra.substr(0, extra.find('='));
    if (name.rfind("-", 0) == 0)
      parts.push_back(fmt::format("unknown option '{}'{}", name, dstrain::config::did_you_mean(name, options)));
    else
      parts.push_back(fmt::format("unexpected argument '{}'", extra));
  }
  (void)argc, (void)argv;
  const std::string where = command == &app ? "dstrain" : "dstrain " + command->get_name();
  return fmt::format("{} for `{}`", parts.empty() ? std::string("unexpected arguments") : fmt::format("{}", fmt::join(parts, "; ")), where);
}

}  // namespace

int main(int argc, char** argv) {
  dstrain::raise_open_files_limit();  // a socket per peer rank: the soft limit (often 1,024) must not stop a large job
  dstrain::comm::quiet_torch_logging();
  CLI::App app{
      "dstrain: launcher and trainer for DeepSeek-style language models.\n"
      "One worker per GPU (or per CPU slot), ZeRO sharding, checkpoints and resume.\n\n"
      "Examples:\n"
      "  dstrain train recipes/demo.yaml          train, 2 CPU workers (see recipes/)\n"
      "  dstrain resume runs/demo                 continue a run from its last checkpoint\n"
      "  dstrain inspect-ckpt runs/demo           show and verify the newest checkpoint\n"
      "  dstrain check-env                        show this node's software and hardware\n",
      "dstrain"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text(), "Print dstrain, compiler, LibTorch, CUDA and NCCL versions and exit");
  app.footer(
      "Exit codes: 0 ok, 1 internal error, 2 usage or config error, 3 data error, 4 checkpoint error,\n"
      "5 environment error, 6 communication error, 7 a worker failed, 8 training diverged, 75 stopped with a checkpoint (resumable), 130 "
      "interrupted. See README.md.");

  dstrain::app::Run run;
  dstrain::app::register_train(app, run);
  dstrain::app::register_resume(app, run);
  dstrain::app::register_check_env(app, run);
  dstrain::app::register_inspect_ckpt(app, run);
  dstrain::app::register_eval(app, run);
  dstrain::app::register_generate(app, run);
  dstrain::app::register_chat(app, run);
  dstrain::app::register_chat_template(app, run);
  dstrain::app::register_bench(app, run);
  dstrain::app::register_export_hf(app, run);
  dstrain::app::register_prepare_data(app, run);
  dstrain::app::register_inspect_data(app, run);
  dstrain::app::register_report(app, run);
  dstrain::app::register_tensorboard(app, run);
  dstrain::app::register_worker(app, run);
  dstrain::app::register_schema(app, run);

  // CLI11 would call an unknown word "extra arguments"; name it as what the user meant.
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App* s) { return !s->get_group().empty(); })) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), argv[1]) == names.end() && std::string(argv[1]) != "worker" &&
        std::string(argv[1]) != "schema") {
      print_error("usage error",
                  fmt::format("unknown command '{}'{}; the commands are {}", argv[1], dstrain::config::did_you_mean(argv[1], names),
                              fmt::join(names, ", ")),
                  "see `dstrain --help`");
      return dstrain::exit_status::kUsage;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    print_error("usage error", unexpected_arguments(app, argc, argv), "see `dstrain --help` or `dstrain <command> --help`");
    return dstrain::exit_status::kUsage;
  } catch (const CLI::ParseError& e) {
    print_error("usage error", e.what(), "see `dstrain --help` or `dstrain <command> --help`");
    return dstrain::exit_status::kUsage;
  }

  try {
    return run();
  } catch (const dstrain::Error& e) {
    print_error(dstrain::error_code_name(e.code()), e.what(), e.hint());
    return dstrain::exit_status_for(e.code());
  } catch (const std::filesystem::filesystem_error& e) {
    // A path that cannot be made, read or written (permissions, a file where a directory should
    // be, a full disk): the machine's state, not a bug.
    print_error("environment error", e.what(), "check the path named above: that its parent exists, it is writable, and it is not a file");
    return dstrain::exit_status::kEnvironment;
  } catch (const std::exception& e) {
    print_error("internal error", e.what(), "this is a dstrain bug; please report it with the command line and run_dir/logs/");
    return dstrain::exit_status::kInternal;
  }
}
