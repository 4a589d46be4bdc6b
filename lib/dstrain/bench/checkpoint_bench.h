#pragma once
// The checkpoint's metadata at scale, for `dstrain bench control-plane` (issue 26): rank 0's
// commit and one rank's manifest load for a dense model sharded by zero::Layout over `ranks`
// ranks, with the shard table (format 3) and, up to `pieces_up_to` ranks, the way format 2 did
// it: every rank's pieces sent to rank 0 and listed in the manifest. No tensor data is written:
// the metadata alone is timed.
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::zero {

struct CheckpointMetadataPhase {
  std::string name;
  double seconds = 0;
  int64_t bytes = 0;  // the manifest's
};

// The dense model: DeepSeek LLM 7B's sizes (hidden 4096, 30 layers, 11008, vocab 102400).
std::vector<CheckpointMetadataPhase> bench_checkpoint_metadata(int ranks, int pieces_up_to, const std::string& scratch_dir);

}  // namespace dstrain::zero
