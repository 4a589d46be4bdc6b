#pragma once
// The values a chat template computes with, as Python's Jinja2 sees them: undefined, none,
// booleans, integers, floats, strings, lists, dicts (insertion-ordered, as JSON objects are read),
// namespaces (the one mutable object a template may change), and callables (macros, built-in
// functions, bound string/dict methods). Strings are UTF-8; their length and slices count code
// points, as Python's do.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace dstrain::text::jinja {

class Value;
using List = std::vector<Value>;

// Insertion-ordered string-keyed map (JSON objects, namespaces, keyword arguments).
class Dict {
 public:
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value value);
  const std::vector<std::pair<std::string, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<std::string, Value>> items_;
  std::map<std::string, size_t> index_;
};

struct Arguments;
using Function = std::function<Value(Arguments&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };
  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(List list);
  Value(Dict dict);
  static Value namespace_of(Dict attributes);
  static Value callable(Function f, std::string name);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
  bool is_iterable() const { return kind_ == Kind::kList || kind_ == Kind::kDict || kind_ == Kind::kString; }

  // The accessors check the kind: a value of another kind throws std::invalid_argument with
  // Python's words ("expected str, got NoneType"), which the interpreter reports at the
  // template's line. as_int() reads kInt and kBool (0/1) and gives 0 for other kinds.
  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const;  // kInt, kFloat, kBool
  const std::string& as_string() const { return kind_ == Kind::kString ? *s_ : *wrong_kind("str"); }
  const List& as_list() const { return kind_ == Kind::kList ? *list_ : *wrong_kind_list(); }
  const Dict& as_dict() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace ? *dict_ : *wrong_kind_dict(); }
  Dict& namespace_attributes() const { return kind_ == Kind::kNamespace || kind_ == Kind::kDict ? *dict_ : *wrong_kind_dict(); }
  const Function& as_function() const {
    if (kind_ != Kind::kCallable) wrong_kind("callable");
    return *fn_;
  }
  const std::string& function_name() const { return kind_ == Kind::kCallable ? *s_ : *wrong_kind("callable"); }

  bool truthy() const;
  // Python's str() (what {{ }} prints: "None", "True", "[1, 'a']"; undefined prints nothing).
  std::string str() const;
  // Python's repr() ("'a'" for strings), used inside lists and dicts.
  std::string repr() const;
  std::string type_name() const;  // Python's: "str", "int", "list", "dict", "NoneType", ...

 private:
  [[noreturn]] const std::string* wrong_kind(const char* wanted) const;
  [[noreturn]] const List* wrong_kind_list() const;
  [[noreturn]] Dict* wrong_kind_dict() const;

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> fn_;
};

// A call's arguments: positional, then keyword.
struct Arguments {
  List positional;
  Dict keyword;
  // The argument at `index`, or keyword `name`, or `fallback` (undefined when absent).
  Value get(size_t index, const std::string& name, Value fallback = {}) const;
};

bool equal(const Value& a, const Value& b);
// Python's ordering for numbers and strings; throws (via the caller's error) on other kinds.
bool less(const Value& a, const Value& b);
// Python-style repr of a double: "1.0", "0.1", "1e+16".
std::string float_repr(double d);
// UTF-8 code points of s, as byte offsets (one per code point, plus s.size()).
std::vector<size_t> code_point_offsets(const std::string& s);
// Without a table (a long message's would take 8 bytes a character): the code points in the
// first `bytes` bytes of s, and the byte offset of code point k (s.size() for k = the count).
size_t code_point_count(const std::string& s, size_t bytes = std::string::npos);
size_t code_point_byte(const std::string& s, size_t k);
// Python's s.strip(): without the whitespace str.isspace() knows at either end.
std::string python_strip(const std::string& s);
std::string_view python_strip_view(std::string_view s);  // the same, without a copy
// Python's json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys) (transformers' tojson).
std::string to_json(const Value& v, int indent, bool sort_keys);

}  // namespace dstrain::text::jinja
