#pragma once
// One register_<name>() per subcommand file. Each adds its CLI11 subcommand and sets `run`,
// which main() calls after parsing; run returns the process exit status.
#include <functional>
#include <string>

namespace CLI {
class App;
}
namespace dstrain::tasks {
struct GenerateRequest;
}

namespace dstrain::app {

using Run = std::function<int()>;

void register_train(CLI::App& app, Run& run);
void register_resume(CLI::App& app, Run& run);
void register_check_env(CLI::App& app, Run& run);
void register_inspect_ckpt(CLI::App& app, Run& run);
void register_eval(CLI::App& app, Run& run);
void register_generate(CLI::App& app, Run& run);
void register_chat(CLI::App& app, Run& run);
// The flags generate and chat share (cmd_generate.cpp): the target, sampling, stops, device.
void add_generation_flags(CLI::App& cmd, tasks::GenerateRequest& request);
void register_chat_template(CLI::App& app, Run& run);
void register_worker(CLI::App& app, Run& run);
void register_schema(CLI::App& app, Run& run);
void register_bench(CLI::App& app, Run& run);
void add_bench_pipeline(CLI::App& bench, Run& run);  // cmd_bench_pipeline.cpp
void register_export_hf(CLI::App& app, Run& run);
void register_prepare_data(CLI::App& app, Run& run);
void register_inspect_data(CLI::App& app, Run& run);
void register_report(CLI::App& app, Run& run);
void register_tensorboard(CLI::App& app, Run& run);

// Absolute path of this executable (workers are re-executions of it).
std::string self_executable();

}  // namespace dstrain::app
