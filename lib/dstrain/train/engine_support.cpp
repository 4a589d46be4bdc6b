#include "dstrain/train/engine_support.h"

#include <fmt/format.h>

#include <algorithm>

namespace dstrain::train {

std::vector<std::string> unsupported_by_engine(const config::Recipe& r) {
  std::vector<std::string> out;
  auto add = [&](const std::string& key, const std::string& what) { out.push_back(fmt::format("{} ({}): {}", key, r.sources.at(key), what)); };
  (void)add;
  return out;
}

}  // namespace dstrain::train
