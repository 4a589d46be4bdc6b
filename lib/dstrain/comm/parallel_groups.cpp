#include "dstrain/comm/parallel_groups.h"

#include <fmt/format.h>

#include "dstrain/core/error.h"

namespace dstrain::comm {

ParallelGroups open_parallel_groups(Communicator& world, const config::ParallelLayout& layout) {
  if (world.world_size() != layout.world || layout.pipeline < 1 || layout.world % layout.pipeline != 0 || layout.sequence < 1 ||
      layout.data() % layout.sequence != 0)
    throw Error(ErrorCode::kInternal,
                fmt::format("a layout of {} ranks in {} pipeline ranks and sequence groups of {} for a group of {}", layout.world,
                            layout.pipeline, layout.sequence, world.world_size()),
                "report this as a bug");
  ParallelGroups g;
  g.layout = layout;
  g.world = &world;
  if (layout.pipeline > 1) {
    g.data_parallel = world.split(layout.data_groups());
    g.pipeline = world.split(layout.pipeline_groups());
  }
  ExpertCommunicators experts = split_expert_groups(g.data(), layout.expert);
  g.expert_parallel = std::move(experts.parallel);
  g.expert_data = std::move(experts.data);
  if (layout.sequence > 1) g.sequence = world.split(layout.sequence_groups());
  return g;
}

}  // namespace dstrain::comm
