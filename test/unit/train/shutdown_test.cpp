// A worker's end (issue 17): a real one-rank training run in this process must leave no thread
// behind and end in the documented order (ShutdownSequence's own contract: core/).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include "catch_torch.h"

#include <filesystem>
#include <string>
#include <vector>

#include "dstrain/comm/store_server.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/shutdown_sequence.h"
#include "dstrain/device/training_device.h"
#include "dstrain/run/run_dir.h"
#include "dstrain/run/worker_env.h"
#include "dstrain/train/trainer.h"
#include "test_support.h"

using namespace dstrain;

TEST_CASE("a trainer's shutdown joins every thread it started and ends in the documented order", "[train]") {
  test::TempDir dir;
  const std::string run_path = (std::filesystem::path(dir.path()) / "run").string();
  // Every thread kind a worker starts: data prefetch, the heartbeat, an asynchronous checkpoint
  // writer (a save at step 2 and one at the end), Gloo's threads and the store's.
  const config::Recipe recipe =
      config::load_recipe(std::string(DSTRAIN_SOURCE_DIR) + "/recipes/demo.yaml",
                          {"run_dir=" + run_path, "train.steps=4", "schedule.warmup_steps=1", "checkpoint.interval_steps=2",
                           "checkpoint.async=true", "launch.nproc_per_node=1", "train.global_batch_size=8"});
  run::RunDir(recipe.run_dir).prepare_new(recipe);
  at::set_num_threads(1);
  (void)at::ones({4096}).sum();  // LibTorch's own pools exist before the count

  run::WorkerEnv env;
  env.run_dir = recipe.run_dir;
  env.run_id = "shutdown-test";
  env.env_check = false;
  comm::StoreServer store("127.0.0.1", 0, run::store_run_key(env), std::chrono::seconds(30));
  env.master_port = store.port();
  const int threads_before = thread_count();  // with the launcher's store (its thread is not the worker's)
  const device::TrainingDevice device = device::open_training_device("cpu", 0);
  train::Trainer trainer(env, device);
  CHECK(thread_count() > threads_before);  // the heartbeat and Gloo's threads are running
  CHECK(trainer.run() == 0);
  INFO("threads before " << threads_before << ", after " << thread_count());
  CHECK(thread_count() == threads_before);  // after run(), while the Trainer object still exists
  CHECK(trainer.shutdown_steps() == std::vector<std::string>{"data prefetch thread", "evaluation sets", "checkpoint writer thread",
                                                             "metrics and TensorBoard files", "heartbeat thread", "device work",
                                                             "engine, model and buffers", "expert-parallel communicators",
                                                             "pipeline communicators", "NCCL communicator",
                                                             "Gloo communicator and its threads", "device memory cache"});
  CHECK(std::filesystem::exists(std::filesystem::path(run_path) / "ckpt" / "step_00000004" / "manifest.json"));
}
