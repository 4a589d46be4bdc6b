#pragma once
// Node 0's liveness pass at scale, for `dstrain bench control-plane` (issue 26): `nodes` node
// beats, each carrying `ranks_per_node` workers' heartbeats, in dstrain's store; node 0's real
// GroupWatch reads them in one batched request and judges every rank.
#include <string>

namespace dstrain::launch {

struct LivenessPass {
  double seconds = 0;  // the median of `passes`
  int64_t keys = 0;    // read per pass
  int64_t bytes = 0;   // of node beats read per pass
};

LivenessPass bench_liveness_pass(int nodes, int ranks_per_node, int passes = 5);

}  // namespace dstrain::launch
