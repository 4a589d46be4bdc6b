#pragma once
// Facts about this rank's node, binary, environment, config and data: what every rank of a job
// must agree on (practice 1). Each fact carries the rule it is compared by (compare.h).
// Torch-free: the LibTorch build facts come from the caller (train/env_task.cpp).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dstrain::envcheck {

enum class Rule {
  kSame,        // equal on every rank: versions, hashes, GPU model
  kSameInNode,  // equal within a node: hardware, memory, limits
  kMayDiffer,   // shown, never a mismatch: hostname
  kLimit,       // each rank checks it against a limit (`ok`, `why`): clock skew, free disk
  kNotSlow,     // a measurement: a rank under half the median is flagged
};
const char* rule_name(Rule rule);  // "same", "same-in-node", "may-differ", "limit", "not-slow"

struct Fact {
  std::string name;
  std::string value;
  Rule rule = Rule::kSame;
  bool ok = true;   // kLimit: within the limit
  std::string why;  // kLimit: what is wrong and what to do
};
using Facts = std::vector<Fact>;

struct FactOptions {
  // (fact name, path) of files all ranks must hold alike: the resolved config, the recipe, the
  // ds_config, the dataset files. Each gives "size N, crc32c X" (checksums cached by file identity).
  std::vector<std::pair<std::string, std::string>> files;
  std::string ckpt_dir;                                    // checked for writability and free space ("": not checked)
  double ckpt_bytes = 0;                                   // one checkpoint's expected size: the free space must hold it
  std::vector<std::pair<std::string, std::string>> extra;  // facts the caller knows (LibTorch build)
  int64_t world_size = 0;  // the job's ranks: the open-files limit must hold a socket per peer (0: not checked)
};

Facts collect_local_facts(const FactOptions& options = {});

// The fault injector's fact for `rank` (fact=2:libtorch=2.10.0 makes rank 2 report that value),
// as a node with other software would.
void apply_injected_fact(Facts& facts, int rank);

// One fact per line, tab-separated (values are sanitized), for the all-gather.
std::string encode_facts(const Facts& facts);
Facts decode_facts(const std::string& text);

// The NCCL_*, CUDA_*, OMP_*, DSTRAIN_* variables of this process, minus the per-worker contract
// (rank, threads, device, run id, ...) that differs by design. A credential's value (a name with
// SECRET, TOKEN, PASSWORD, ...: DSTRAIN_STORE_SECRET) reads kHiddenValue: only its presence is compared.
constexpr const char* kHiddenValue = "(set; value hidden)";
std::vector<std::pair<std::string, std::string>> relevant_environment();

}  // namespace dstrain::envcheck
