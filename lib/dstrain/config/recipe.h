#pragma once
// The validated, immutable description of a training run. Built once by load_recipe() (launcher)
// or read_resolved_config() (workers); every module then takes only its own section.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::config {

struct ModelConfig {
  std::string family = "dense";  // LLaMA-style DeepSeek dense model
  int64_t vocab_size = 256;
  int64_t hidden_size = 64;
  int64_t num_layers = 2;
  int64_t num_heads = 4;
  int64_t intermediate_size = 172;
  int64_t max_seq_len = 64;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  double init_std = 0.02;
};

struct DataConfig {
  std::string path;              // absolute after loading (relative paths are to the recipe file)
  std::string format = "bytes";  // one token per byte of the file (vocab 256)
  int64_t seq_len = 64;
};

struct TrainConfig {
  int64_t steps = 100;
  int64_t micro_batch_size = 8;    // samples per rank per micro-step
  int64_t global_batch_size = 16;  // samples per optimizer step, over all ranks
  double lr = 3e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup_steps = 10;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // 0 disables clipping
};

struct CheckpointConfig {
  int64_t interval_steps = 0;  // 0: only at the end
  int64_t keep_last = 2;       // 0 keeps all
};

struct LoggingConfig {
  int64_t steps_per_print = 10;
};

struct LaunchConfig {
  int64_t nproc_per_node = 1;
  int64_t threads_per_worker = 0;  // 0: the node's cores divided among its workers
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 0;  // 0: pick a free port
  int64_t timeout_s = 300;  // rendezvous and collective timeout
};

struct Recipe {
  std::string source_path;  // the recipe file it came from
  std::string run_dir;      // absolute
  uint64_t seed = 1234;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  CheckpointConfig checkpoint;
  LoggingConfig logging;
  LaunchConfig launch;
};

// Reads and validates a recipe YAML file. `overrides` are "key.path=value" strings (--set),
// applied on top of the file. Every problem is collected; one Error{kConfig} lists them all.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});

// Gradient accumulation steps for a data-parallel world size; throws Error{kConfig} when the
// global batch does not split into micro-batches evenly.
int64_t accumulation_steps(const TrainConfig& train, int64_t world_size);

// Canonical JSON of the whole recipe (sorted keys) and its hash, as written to
// run_dir/config.resolved.json. Workers read only that file.
std::string to_canonical_json(const Recipe& recipe);
std::string config_hash(const Recipe& recipe);
void write_resolved_config(const Recipe& recipe, const std::string& path);
// Reads config.resolved.json and checks its recorded hash; throws Error{kConfig} on mismatch.
Recipe read_resolved_config(const std::string& path);

}  // namespace dstrain::config
