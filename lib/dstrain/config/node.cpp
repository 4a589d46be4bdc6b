#include "dstrain/config/node.h"

#include <fmt/format.h>

namespace dstrain::config {

std::string Location::str() const {
  if (line <= 0) return file;
  return fmt::format("{}:{}:{}", file, line, column);
}

const Node* Node::find(const std::string& key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

const Location* Node::key_location(const std::string& key) const {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].first == key) return &key_locations[i];
  return nullptr;
}

const char* Node::kind_name() const {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "boolean";
    case Kind::kNumber:
      return "number";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "list";
    case Kind::kObject:
      return "mapping";
  }
  return "value";
}

}  // namespace dstrain::config
