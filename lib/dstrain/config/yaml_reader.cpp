// YAML → Node, keeping yaml-cpp's marks. yaml-cpp stays in this file.
#include <yaml-cpp/yaml.h>

#include <fmt/format.h>

#include <regex>

#include "dstrain/config/node.h"

namespace dstrain::config {
namespace {

Node convert(const YAML::Node& y, const std::string& file, int depth, std::vector<std::string>& problems) {
  Node n;
  n.where = {file, y.Mark().line + 1, y.Mark().column + 1};
  if (depth > 64) {
    problems.push_back(fmt::format("{}: nesting is deeper than 64 levels", n.where.str()));
    return n;
  }
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      n.kind = Node::Kind::kNull;
      break;
    case YAML::NodeType::Scalar: {
      n.text = y.Scalar();
      if (y.Tag() != "?") {  // quoted: a string, whatever it looks like
        n.kind = Node::Kind::kString;
        break;
      }
      static const std::regex number(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
      if (n.text == "~" || n.text == "null" || n.text == "Null" || n.text == "NULL")
        n.kind = Node::Kind::kNull;
      else if (n.text == "true" || n.text == "True" || n.text == "TRUE")
        n.kind = Node::Kind::kBool, n.text = "true";
      else if (n.text == "false" || n.text == "False" || n.text == "FALSE")
        n.kind = Node::Kind::kBool, n.text = "false";
      else if (std::regex_match(n.text, number))
        n.kind = Node::Kind::kNumber;
      else
        n.kind = Node::Kind::kString;
      break;
    }
    case YAML::NodeType::Sequence:
      n.kind = Node::Kind::kArray;
      for (const auto& item : y) n.items.push_back(convert(item, file, depth + 1, problems));
      break;
    case YAML::NodeType::Map:
      n.kind = Node::Kind::kObject;
      for (const auto& kv : y) {
        const Location key_at{file, kv.first.Mark().line + 1, kv.first.Mark().column + 1};
        if (!kv.first.IsScalar()) {
          problems.push_back(fmt::format("{}: keys must be plain names", key_at.str()));
          continue;
        }
        const std::string key = kv.first.Scalar();
        if (n.find(key)) {
          problems.push_back(fmt::format("{}: duplicate key '{}' (keep one)", key_at.str(), key));
          continue;
        }
        n.members.emplace_back(key, convert(kv.second, file, depth + 1, problems));
        n.key_locations.push_back(key_at);
      }
      break;
  }
  return n;
}

}  // namespace

Node parse_yaml(const std::string& text, const std::string& file, std::vector<std::string>& problems) {
  try {
    return convert(YAML::Load(text), file, 0, problems);
  } catch (const YAML::Exception& e) {
    problems.push_back(fmt::format("{}:{}:{}: not valid YAML: {}", file, e.mark.line + 1, e.mark.column + 1, e.msg));
    return Node{};
  }
}

}  // namespace dstrain::config
