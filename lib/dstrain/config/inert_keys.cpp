#include "dstrain/config/inert_keys.h"

#include <fmt/format.h>

#include "dstrain/config/recipe.h"
#include "dstrain/config/schema.h"

namespace dstrain::config {

const std::vector<InertKey>& inert_keys() {
  static const std::vector<InertKey> keys{
      {"zero.allgather_bucket_size",
       "stages 1-3 all-gather each unit of the layout whole (one layer group, at most zero.reduce_bucket_size elements)"},
      {"zero.contiguous_gradients", "gradients are always reduced from one flat buffer per unit"},
      {"zero.reduce_scatter", "gradients are always reduce-scattered (an all-reduce would give the same sums)"},
      {"zero.stage3_max_live_parameters", "stage 3 holds at most the running layer group and the one prefetched after it gathered"},
      {"zero.stage3_max_reuse_distance", "stage 3 frees a layer group after its forward and gathers it again for its backward"},
      {"zero.stage3_gather_16bit_weights_on_model_save",
       "checkpoints hold the fp32 master weights, loadable at any world size; `dstrain export-hf` writes consolidated weights"},
      {"zero.sub_group_size", "the optimizer steps each rank's whole shard in one fused pass, with no staging copies to bound"},
  };
  return keys;
}

std::vector<std::string> inert_key_warnings(const Recipe& r) {
  std::vector<std::string> out;
  Recipe copy = r, defaults;  // value_text reads through the schema's (non-const) field targets
  for (const auto& k : inert_keys()) {
    const auto source = r.sources.find(k.key);
    const Field* field = find_field(k.key);
    if (source == r.sources.end() || source->second == "default" || !field) continue;
    // A ds_config that spells out DeepSpeed's default asks for nothing dstrain does not do.
    const std::string value = value_text(*field, copy);
    if (value == value_text(*field, defaults)) continue;
    out.push_back(fmt::format("{} = {} ({}) has no effect in dstrain: {}", k.key, value, source->second, k.why));
  }
  return out;
}

}  // namespace dstrain::config
