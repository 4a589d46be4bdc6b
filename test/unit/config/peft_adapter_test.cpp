// lora.init_from's checks of a PEFT adapter folder, before anything runs.
#include "catch_torch.h"

#include <filesystem>
#include <fstream>
#include <unistd.h>
#include <string>

#include "dstrain/config/peft_adapter.h"

using namespace dstrain;

namespace {
std::string adapter_dir(const std::string& config, bool weights = true) {
  static int n = 0;
  const auto dir = std::filesystem::temp_directory_path() / ("dstrain-peft-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "adapter_config.json") << config;
  if (weights) std::ofstream(dir / "adapter_model.safetensors") << "";
  return dir.string();
}

std::string joined(const std::vector<std::string>& problems) {
  std::string out;
  for (const auto& p : problems) out += p + "\n";
  return out;
}
}  // namespace

TEST_CASE("lora.init_from: the adapter's r, alpha, patterns, rsLoRA and type must be the recipe's; both files must be there", "[config]") {
  config::LoraConfig lora;
  lora.rank = 4, lora.alpha = 8;
  lora.init_from = adapter_dir(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "use_rslora": false, "rank_pattern": {}})");
  CHECK(config::peft_adapter_problems(lora, "--set").empty());
  lora.init_from = adapter_dir(R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16.0, "use_rslora": true, "use_dora": true})");
  const std::string all = joined(config::peft_adapter_problems(lora, "recipe.yaml:3:4"));
  CHECK_THAT(all, Catch::Contains("lora.init_from (recipe.yaml:3:4): the adapter's r is 8, lora.rank is 4: set lora.rank: 8"));
  CHECK_THAT(all, Catch::Contains("the adapter's lora_alpha is 16.0, lora.alpha is 8: set lora.alpha: 16.0"));
  CHECK_THAT(all, Catch::Contains("the adapter's use_rslora is true, lora.use_rslora is false"));
  CHECK_THAT(all, Catch::Contains("the adapter's use_dora is true, lora.use_dora is false"));
  lora.init_from = adapter_dir(R"({"peft_type": "IA3", "r": 4, "lora_alpha": 8, "rank_pattern": {"q_proj": 8}})");
  const std::string other = joined(config::peft_adapter_problems(lora, "--set"));
  CHECK_THAT(other, Catch::Contains("the adapter's peft_type is \"IA3\", not LORA"));
  CHECK_THAT(other, Catch::Contains(
                        "the adapter's rank_pattern is {\"q_proj\":8}, lora.rank_pattern is {}: set lora.rank_pattern: {\"q_proj\":8}"));
  lora.rank_pattern = {{"q_proj", 8}}, lora.alpha_pattern = {{"o_proj", 4.0}};
  lora.init_from =
      adapter_dir(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "rank_pattern": {"q_proj": 8}, "alpha_pattern": {"o_proj": 4}})");
  CHECK(config::peft_adapter_problems(lora, "--set").empty());
  lora.init_from = adapter_dir(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, "rank_pattern": {"q_proj": 16}})");
  const std::string patterns = joined(config::peft_adapter_problems(lora, "--set"));
  CHECK_THAT(patterns, Catch::Contains("the adapter's rank_pattern is {\"q_proj\":16}"));
  CHECK_THAT(patterns, Catch::Contains("the adapter's alpha_pattern is {}, lora.alpha_pattern is {\"o_proj\":4.0}"));
  lora.init_from = adapter_dir("{}", /*weights=*/false);
  CHECK_THAT(joined(config::peft_adapter_problems(lora, "--set")),
             Catch::Contains("has no adapter_model.safetensors: not a PEFT adapter folder"));
  lora.init_from = adapter_dir("[1, 2]");
  CHECK_THAT(joined(config::peft_adapter_problems(lora, "--set")), Catch::Contains("adapter_config.json is not a JSON object"));
}
