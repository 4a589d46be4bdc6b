// `dstrain worker` as a training rank: signals, the device, the Trainer, and what an
// out-of-memory error means for this recipe.
#include "dstrain/train/worker.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <csignal>
#include <optional>

#include "dstrain/comm/store_auth.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/error.h"
#include "dstrain/core/fault_injector.h"
#include "dstrain/core/log.h"
#include "dstrain/core/progress.h"
#include "dstrain/run/worker_env.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/train/startup_guard.h"
#include "dstrain/train/step_triggers.h"
#include "dstrain/train/trainer.h"
#include "dstrain/device/training_device.h"

namespace dstrain::train {

int run_worker(const run::WorkerEnv& env) {
  StepTriggers::install_signal_handlers();  // first: SIGUSR1 must never kill a worker, SIGTERM must stop it cleanly
  comm::set_store_secret(comm::store_secret_from_environment(false));  // the launcher's, through the environment
  log::set_rank(env.rank);
  const device::TrainingDevice device = device::open_training_device(env.device, env.rank);
  // Out of memory (CUDA's caching allocator, or the host's when RAM or `ulimit -v` runs out):
  // say where, what this run needs per rank and what to change, instead of an allocator trace.
  auto out_of_memory = [&](const std::string& detail) {
    const config::Recipe recipe = config::read_resolved_config(run::RunDir(env.run_dir).config_path());
    const progress::Snapshot at = progress::snapshot();
    return Error(ErrorCode::kEnvironment,
                 fmt::format("rank {}: {}", env.rank,
                             device::out_of_memory_message(recipe, device,
                                                           fmt::format("{} of step {}", progress::phase_name(at.phase), at.step), detail)),
                 device::out_of_memory_hint(recipe));
  };
  try {
    std::optional<StartupStopGuard> starting;  // SIGTERM in the rendezvous or before the first step ends the rank at once
    starting.emplace(env.rank, "startup (rendezvous, store, first collectives)", [&env] { return startup_stop_status(env.run_dir); });
    Trainer trainer(env, device);
    starting.reset();  // from here on the loop stops at a step boundary, with a checkpoint
    const int status = trainer.run();
    if (FaultInjector::get().crash_at_exit(env.rank)) {
      std::signal(SIGSEGV, SIG_DFL);
      std::raise(SIGSEGV);
    }
    return status;
  } catch (const c10::OutOfMemoryError& e) {
    throw out_of_memory(first_line(e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    const std::string what = first_line(e.what_without_backtrace());
    const auto host = what.find("DefaultCPUAllocator: ");  // LibTorch's host allocator reports ENOMEM as a plain c10::Error
    if (host == std::string::npos) throw;
    throw out_of_memory(what.substr(host));
  }
}

}  // namespace dstrain::train
