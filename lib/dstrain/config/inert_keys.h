#pragma once
// Recipe keys dstrain accepts, from DeepSpeed's ds_config or the recipe, but that change nothing
// in how it trains (issue 23: no key accepted without a word). Setting one to anything but its
// default (DeepSpeed's) warns at load, so `--dry-run` and the launcher's log say why it has no
// effect; a ds_config that spells out the default stays quiet.
#include <string>
#include <vector>

namespace dstrain::config {

struct Recipe;

struct InertKey {
  std::string key;  // the recipe key, e.g. "zero.sub_group_size"
  std::string why;  // what dstrain does instead
};
const std::vector<InertKey>& inert_keys();

// "zero.sub_group_size = 100000000 (ds_config.json:7) has no effect in dstrain: ..." for each
// inert key the recipe sets away from its default.
std::vector<std::string> inert_key_warnings(const Recipe& recipe);

}  // namespace dstrain::config
