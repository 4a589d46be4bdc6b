// The PEFT adapter's target_modules: a regular expression naming exactly the adapted projections.
#include "catch_torch.h"

#include <regex>
#include <string>
#include <vector>

#include "dstrain/tasks/peft_export.h"

using namespace dstrain;

TEST_CASE("PEFT export: target_modules names the adapted projections, and no routed expert or MTP layer", "[tasks]") {
  const std::vector<std::string> tensors = {
      "model.layers.0.self_attn.q_proj.lora_A.weight",
      "model.layers.0.self_attn.q_proj.lora_B.weight",
      "model.layers.0.mlp.down_proj.lora_A.weight",
      "model.layers.0.mlp.down_proj.lora_B.weight",
      "model.layers.11.self_attn.q_proj.lora_A.weight",
      "model.layers.11.mlp.shared_experts.up_proj.lora_A.weight",
      "model.embed_tokens.weight",  // a module to save: not a target
  };
  const std::string regex = tasks::peft_target_regex(tensors);
  CHECK(regex == R"(model\.layers\.(0|11)\.(mlp\.down_proj|mlp\.shared_experts\.up_proj|self_attn\.q_proj))");
  const std::regex re(regex);  // PEFT matches a string target with re.fullmatch
  for (const char* adapted :
       {"model.layers.0.self_attn.q_proj", "model.layers.11.mlp.down_proj", "model.layers.0.mlp.shared_experts.up_proj"})
    CHECK(std::regex_match(std::string(adapted), re));
  for (const char* other : {"model.layers.1.self_attn.q_proj", "model.layers.0.mlp.experts.0.down_proj", "model.layers.0.self_attn.k_proj",
                            "lm_head", "model.layers.0.self_attn.q_proj.lora_A", "model.layers.110.self_attn.q_proj"})
    CHECK_FALSE(std::regex_match(std::string(other), re));
  CHECK(tasks::is_adapter_tensor("model.layers.0.self_attn.q_proj.lora_B.weight"));
  CHECK_FALSE(tasks::is_adapter_tensor("exp_avg.model.layers.0.mlp.down_proj.weight"));
}

TEST_CASE("PEFT export: the routed experts' adapters are named by any index or none (PEFT under transformers 5 probes the fused name)",
          "[tasks]") {
  const std::vector<std::string> tensors = {"model.layers.1.mlp.experts.0.gate_proj.lora_A.weight",
                                            "model.layers.1.mlp.experts.17.gate_proj.lora_A.weight",
                                            "model.layers.1.mlp.shared_experts.gate_proj.lora_A.weight"};
  const std::string regex = tasks::peft_target_regex(tensors);
  CHECK(regex == R"(model\.layers\.(1)\.(mlp\.experts(\.[0-9]+)?\.gate_proj|mlp\.shared_experts\.gate_proj))");
  const std::regex re(regex);
  for (const char* adapted :
       {"model.layers.1.mlp.experts.3.gate_proj", "model.layers.1.mlp.experts.gate_proj", "model.layers.1.mlp.shared_experts.gate_proj"})
    CHECK(std::regex_match(std::string(adapted), re));
  for (const char* other :
       {"model.layers.1.mlp.experts.3.up_proj", "model.layers.1.mlp.experts..gate_proj", "model.layers.1.mlp.gate_proj"})
    CHECK_FALSE(std::regex_match(std::string(other), re));
}
