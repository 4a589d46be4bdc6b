#pragma once
// Where train.objective dpo's and kto's reference log-probs come from (preference.reference).
namespace dstrain::config {

struct Recipe;

// preference.reference live (train/live_reference.h).
bool reads_live_reference(const Recipe& recipe);
// ... without LoRA: from a frozen copy of the starting model, which the run holds beside the policy.
bool keeps_reference_copy(const Recipe& recipe);

}  // namespace dstrain::config
