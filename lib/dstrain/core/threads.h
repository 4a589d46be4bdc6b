#pragma once
// How many intra-op threads a worker uses. LibTorch defaults to 1 on these machines, so dstrain
// always sets the count: the recipe's value when given, else the node's cores divided evenly
// among the local workers (at least 1).

namespace dstrain {

int threads_per_worker(int requested, int local_workers, int online_cores);
int online_cores();  // in this process's CPU affinity mask
int node_cores();    // online on the machine, whatever the mask

}  // namespace dstrain
