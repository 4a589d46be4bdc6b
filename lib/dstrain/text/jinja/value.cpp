#include "dstrain/text/jinja/value.h"

#include "dstrain/core/json_string.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dstrain::text::jinja {

const Value* Dict::find(const std::string& key) const {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

Value* Dict::find(const std::string& key) {
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void Dict::set(const std::string& key, Value value) {
  if (Value* v = find(key)) {
    *v = std::move(value);
    return;
  }
  index_[key] = items_.size();
  items_.emplace_back(key, std::move(value));
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b), i_(b ? 1 : 0) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double d) : kind_(Kind::kFloat), d_(d) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(List list) : kind_(Kind::kList), list_(std::make_shared<const List>(std::move(list))) {}
Value::Value(Dict dict) : kind_(Kind::kDict), dict_(std::make_shared<Dict>(std::move(dict))) {}

Value Value::namespace_of(Dict attributes) {
  Value v(std::move(attributes));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::callable(Function f, std::string name) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<const Function>(std::move(f));
  v.s_ = std::make_shared<const std::string>(std::move(name));
  return v;
}

const std::string* Value::wrong_kind(const char* wanted) const {
  throw std::invalid_argument(fmt::format("expected {}, got {}", wanted, type_name()));
}
const List* Value::wrong_kind_list() const { throw std::invalid_argument("expected list, got " + type_name()); }
Dict* Value::wrong_kind_dict() const { throw std::invalid_argument("expected dict, got " + type_name()); }

double Value::as_number() const { return kind_ == Kind::kFloat ? d_ : static_cast<double>(i_); }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return dict_->size() > 0;
    default:
      return true;
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);  // shortest round-trip digits
  const auto e = s.find('e');
  if (e != std::string::npos) {  // Python: 1e+16, 1e-05 (two exponent digits at least)
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    const char sign = exp[0] == '-' ? '-' : '+';
    if (exp[0] == '-' || exp[0] == '+') exp = exp.substr(1);
    if (exp.size() < 2) exp = "0" + exp;
    const double a = std::fabs(d);
    if (a >= 1e-4 && a < 1e16) return fmt::format("{:f}", d);  // fmt chose an exponent where Python would not
    return mant + "e" + sign + exp;
  }
  if (s.find('.') == std::string::npos) {
    if (std::fabs(d) >= 1e16) return fmt::format("{:e}", d);
    s += ".0";
  }
  return s;
}

namespace {

std::string string_repr(const std::string& s) {
  const bool single = s.find('\'') == std::string::npos || s.find('"') != std::string::npos;
  const char q = single ? '\'' : '"';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == static_cast<unsigned char>(q))
      out += std::string("\\") + q;
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  return out + q;
}

}  // namespace

std::string Value::repr() const {
  if (kind_ == Kind::kString) return string_repr(*s_);
  return str();
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return float_repr(d_);
    case Kind::kString:
      return *s_;
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items()) out += (first ? "" : ", ") + string_repr(k) + ": " + v.repr(), first = false;
      return out + "}";
    }
    case Kind::kNamespace:
      return "<Namespace>";
    case Kind::kCallable:
      return "<function " + *s_ + ">";
  }
  return "";
}

std::string Value::type_name() const {
  static const char* const kNames[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict", "Namespace", "function"};
  return kNames[static_cast<int>(kind_)];
}

Value Arguments::get(size_t index, const std::string& name, Value fallback) const {
  if (index < positional.size()) return positional[index];
  if (const Value* v = keyword.find(name)) return *v;
  return fallback;
}

bool equal(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) return a.as_number() == b.as_number();
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kList: {
      const auto &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case K::kDict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [k, v] : a.as_dict().items()) {
        const Value* o = b.as_dict().find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    }
    default:
      return &a.namespace_attributes() == &b.namespace_attributes();
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_number() < b.as_number();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 byte order is code point order
  if (a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList) {
    const auto &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  throw std::invalid_argument(fmt::format("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name()));
}

namespace {
bool starts_code_point(char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }
}  // namespace

size_t code_point_count(const std::string& s, size_t bytes) {
  const size_t end = std::min(bytes, s.size());
  size_t n = 0;
  for (size_t i = 0; i < end; ++i) n += starts_code_point(s[i]);
  return n;
}

size_t code_point_byte(const std::string& s, size_t k) {
  for (size_t i = 0; i < s.size(); ++i)
    if (starts_code_point(s[i]) && k-- == 0) return i;
  return s.size();
}

std::vector<size_t> code_point_offsets(const std::string& s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) out.push_back(i);
  out.push_back(s.size());
  return out;
}

namespace {

std::string json_string(const std::string& s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

void json_into(const Value& v, int indent, bool sort_keys, int depth, std::string& out) {
  using K = Value::Kind;
  const std::string nl = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string close = indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const std::string comma = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case K::kNone:
      out += "null";
      return;
    case K::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case K::kInt:
      out += std::to_string(v.as_int());
      return;
    case K::kFloat: {
      const double d = v.as_number();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_repr(d);
      return;
    }
    case K::kString:
      out += json_string(v.as_string());
      return;
    case K::kList: {
      if (v.as_list().empty()) return void(out += "[]");
      out += "[";
      for (size_t i = 0; i < v.as_list().size(); ++i)
        out += (i ? comma : "") + nl, json_into(v.as_list()[i], indent, sort_keys, depth + 1, out);
      out += close + "]";
      return;
    }
    case K::kDict: {
      if (v.as_dict().size() == 0) return void(out += "{}");
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.as_dict().items()) items.push_back(&kv);
      if (sort_keys) std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        out += (i ? comma : "") + nl + json_string(items[i]->first) + ": ";
        json_into(items[i]->second, indent, sort_keys, depth + 1, out);
      }
      out += close + "}";
      return;
    }
    default:
      throw std::invalid_argument(fmt::format("Object of type {} is not JSON serializable", v.type_name()));
  }
}

}  // namespace

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_into(v, indent, sort_keys, 0, out);
  return out;
}

}  // namespace dstrain::text::jinja
