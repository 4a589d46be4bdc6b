#include "dstrain/config/reference_mode.h"

#include "dstrain/config/recipe.h"

namespace dstrain::config {

bool reads_live_reference(const Recipe& r) {
  return (r.train.objective == TrainObjective::kDpo || r.train.objective == TrainObjective::kKto) && r.preference.reference == "live";
}

bool keeps_reference_copy(const Recipe& r) { return reads_live_reference(r) && !r.lora.enabled(); }

}  // namespace dstrain::config
