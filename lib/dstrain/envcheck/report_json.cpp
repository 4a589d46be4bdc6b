// check-env's JSON report (docs/check-env.schema.json). nlohmann stays in this file.
#include <nlohmann/json.hpp>

#include "dstrain/envcheck/compare.h"

namespace dstrain::envcheck {

std::string render_json(const Report& report) {
  nlohmann::json facts = nlohmann::json::array();
  for (const auto& r : report.rows) {
    nlohmann::json values = nlohmann::json::array();
    for (const auto& g : r.groups) values.push_back({{"value", g.value}, {"ranks", g.ranks}});
    facts.push_back({{"name", r.name}, {"rule", rule_name(r.rule)}, {"ok", r.ok}, {"values", values}, {"note", r.note}});
  }
  const nlohmann::json j{{"version", 1},
                         {"consistent", report.consistent()},
                         {"world_size", report.world_size},
                         {"nodes", report.nodes},
                         {"hosts", report.hosts},
                         {"mismatches", report.mismatches()},
                         {"facts", facts}};
  return j.dump();
}

}  // namespace dstrain::envcheck
