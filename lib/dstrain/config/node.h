#pragma once
// A parsed config document (recipe YAML or ds_config JSON) as one tree type that remembers where
// every key and value was written, so that every error can say file:line:column.
#include <string>
#include <utility>
#include <vector>

namespace dstrain::config {

struct Location {
  std::string file;  // or "--set" for command-line overrides, "default" for built-ins
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;
  std::string str() const;  // "file:line:col" or "file"
};

struct Node {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  std::string text;                                   // scalars as written: "5e8", "true", the unescaped string
  std::vector<std::pair<std::string, Node>> members;  // objects, in document order
  std::vector<Location> key_locations;                // one per member
  std::vector<Node> items;                            // arrays
  Location where;

  bool is_object() const { return kind == Kind::kObject; }
  const Node* find(const std::string& key) const;
  const Location* key_location(const std::string& key) const;
  const char* kind_name() const;
};

// Parses JSON as DeepSpeed's hjson reader accepts it: // # and /* */ comments, trailing commas.
// Duplicate keys at any level, and every syntax error, are appended to `problems` (file:line:col).
Node parse_json_with_comments(const std::string& text, const std::string& file, std::vector<std::string>& problems);

// Parses a YAML document into a Node. Plain scalars are typed the YAML 1.2 core way (null, true/false,
// numbers); quoted scalars stay strings. Syntax errors are appended to `problems`.
Node parse_yaml(const std::string& text, const std::string& file, std::vector<std::string>& problems);

}  // namespace dstrain::config
