#include "dstrain/text/jinja/builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <stdexcept>

#include "dstrain/text/jinja/integers.h"
#include "dstrain/text/jinja/limits.h"

namespace dstrain::text::jinja {
namespace {

using Kind = Value::Kind;

[[noreturn]] void type_error(const std::string& what) { throw std::invalid_argument(what); }

// Before a string grows to `bytes`: the sandbox's bound (jinja/limits.h).
void check_growth(size_t bytes) {
  if (bytes > kMaxStringBytes)
    type_error(fmt::format("the result would hold more than {} MiB of text, which the sandbox refuses", kMaxStringBytes >> 20));
}

uint32_t decode_at(std::string_view s, size_t i, size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (i + len > s.size()) len = 1;
  uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

// Python's str.isspace() code points.
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    decode_at(s, i, len);
    out.push_back(s.substr(i, len));
  }
  return out;
}

// str.strip / lstrip / rstrip: whitespace, or any code point of `chars`. One pass over s, no
// table of its code points (a 100 MB message's took 3 GB).
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<std::string> set;
  if (chars.is_string()) set = code_points(chars.as_string());
  size_t first_kept = std::string::npos, kept_end = 0;
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    const uint32_t cp = decode_at(s, i, len);
    const bool strippable = chars.is_string() ? std::find(set.begin(), set.end(), s.substr(i, len)) != set.end() : is_python_space(cp);
    if (strippable) continue;
    if (first_kept == std::string::npos) first_kept = i;
    kept_end = i + len;
  }
  if (first_kept == std::string::npos) return left || right ? std::string() : s;
  const size_t b = left ? first_kept : 0, e = right ? kept_end : s.size();
  return s.substr(b, e - b);
}

Value split(const std::string& s, const Value& sep, int64_t maxsplit) {
  List out;
  if (!sep.is_string() || sep.is_none()) {  // runs of whitespace, leading/trailing dropped
    size_t word = std::string::npos;        // where the current word starts
    for (size_t i = 0, len = 0; i < s.size(); i += len) {
      const bool space = is_python_space(decode_at(s, i, len));
      if (space && word != std::string::npos && (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit)) {
        out.emplace_back(s.substr(word, i - word)), word = std::string::npos;
      } else if (!space && word == std::string::npos) {
        word = i;  // past maxsplit, the word runs to the end, spaces and all
      }
    }
    if (word != std::string::npos) out.emplace_back(s.substr(word));  // Python keeps a remainder's trailing spaces
    return Value(out);
  }
  const std::string& d = sep.as_string();
  if (d.empty()) type_error("ValueError: empty separator");
  size_t start = 0;
  for (size_t p; (p = s.find(d, start)) != std::string::npos && (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit);
       start = p + d.size())
    out.emplace_back(s.substr(start, p - start));
  out.emplace_back(s.substr(start));
  return Value(out);
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {  // Python inserts `to` between code points
    std::string out = to;
    int64_t n = 1;
    for (size_t i = 0, len = 0; i < s.size(); i += len) {
      decode_at(s, i, len);
      out.append(s, i, len);
      if (count < 0 || n++ < count) out += to;
      check_growth(out.size());
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t n = 0;
  for (size_t p; (count < 0 || n < count) && (p = s.find(from, start)) != std::string::npos; start = p + from.size(), ++n) {
    out += s.substr(start, p - start) + to;
    check_growth(out.size());
  }
  check_growth(out.size() + s.size() - start);
  return out + s.substr(start);
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string title_case(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    c = static_cast<char>(alpha ? (prev_cased ? std::tolower(static_cast<unsigned char>(c)) : std::toupper(static_cast<unsigned char>(c)))
                                : c);
    prev_cased = alpha;
  }
  return out;
}

// What iterating a value gives (dicts: their keys; strings: their code points; undefined: nothing).
List items_of(const Value& v) {
  switch (v.kind()) {
    case Kind::kList:
      return v.as_list();
    case Kind::kDict: {
      List keys;
      for (const auto& kv : v.as_dict().items()) keys.emplace_back(kv.first);
      return keys;
    }
    case Kind::kString: {
      const std::string& s = v.as_string();
      if (code_point_count(s) > kMaxListItems)
        type_error(fmt::format("a list of the {} characters of a string; the sandbox allows {} items", code_point_count(s), kMaxListItems));
      List out;
      for (size_t i = 0, len = 0; i < s.size(); i += len) decode_at(s, i, len), out.emplace_back(s.substr(i, len));
      return out;
    }
    case Kind::kUndefined:
      return {};
    default:
      type_error(fmt::format("'{}' object is not iterable", v.type_name()));
  }
}

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const std::string key = path.substr(start, dot - start);
    if (cur.is_mapping()) {
      const Value* f = cur.kind() == Kind::kNamespace ? cur.namespace_attributes().find(key) : cur.as_dict().find(key);
      cur = f ? *f : Value();
    } else if (cur.kind() == Kind::kList && !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit)) {
      const size_t i = std::stoul(key);
      cur = i < cur.as_list().size() ? cur.as_list()[i] : Value();
    } else {
      cur = Value();
    }
    start = dot + 1;
  }
  return cur;
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Kind::kString:
      return static_cast<int64_t>(code_point_count(v.as_string()));
    case Kind::kList:
      return static_cast<int64_t>(v.as_list().size());
    case Kind::kDict:
    case Kind::kNamespace:
      return static_cast<int64_t>(v.as_dict().size());
    case Kind::kUndefined:
      return 0;
    default:
      type_error(fmt::format("object of type '{}' has no len()", v.type_name()));
  }
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string indent(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string out;
  size_t start = 0;
  bool is_first = true;
  while (start <= s.size()) {
    const size_t nl = s.find('\n', start);
    const std::string line = s.substr(start, (nl == std::string::npos ? s.size() : nl) - start);
    if ((is_first && first) || (!is_first && (blank || !line.empty()))) out += pad;
    out += line;
    check_growth(out.size());
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1, is_first = false;
  }
  return out;
}

bool test(const std::string& name, const Value& v, Arguments& a);

// select / reject / selectattr / rejectattr
Value select(const Value& seq, Arguments& a, bool by_attribute, bool keep) {
  List out;
  const size_t first = by_attribute ? 1 : 0;
  const std::string attr = by_attribute ? a.get(0, "attribute").str() : "";
  const Value test_name = a.get(first, "");
  Arguments rest;
  for (size_t i = first + 1; i < a.positional.size(); ++i) rest.positional.push_back(a.positional[i]);
  for (const Value& item : items_of(seq)) {
    const Value subject = by_attribute ? attribute_of(item, attr) : item;
    const bool passed = test_name.is_undefined() ? subject.truthy() : test(test_name.str(), subject, rest);
    if (passed == keep) out.push_back(item);
  }
  return Value(out);
}

Value sorted(const Value& seq, bool reverse, const std::string& attribute, bool case_sensitive) {
  List items = items_of(seq);
  auto key = [&](const Value& v) {
    Value k = attribute.empty() ? v : attribute_of(v, attribute);
    if (!case_sensitive && k.is_string()) k = Value(ascii_case(k.as_string(), false));
    return k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) { return less(key(x), key(y)); });
  if (reverse) std::reverse(items.begin(), items.end());
  return Value(items);
}

bool test(const std::string& name, const Value& v, Arguments& a) {
  bool out = false;
  if (!apply_test(name, v, a, out)) type_error(fmt::format("no test named '{}'", name));
  return out;
}

}  // namespace

std::string python_strip(const std::string& s) { return strip(s, Value(), true, true); }

std::string_view python_strip_view(std::string_view s) {
  size_t first_kept = std::string_view::npos, kept_end = 0;
  for (size_t i = 0, len = 0; i < s.size(); i += len) {
    if (is_python_space(decode_at(s, i, len))) continue;
    if (first_kept == std::string_view::npos) first_kept = i;
    kept_end = i + len;
  }
  return first_kept == std::string_view::npos ? std::string_view() : s.substr(first_kept, kept_end - first_kept);
}

bool is_filter(const std::string& name) {
  static const char* const kNames[] = {"length", "count",      "string", "safe",    "e",      "escape",     "trim",       "upper",
                                       "lower",  "capitalize", "title",  "replace", "tojson", "join",       "first",      "last",
                                       "list",   "reverse",    "int",    "float",   "abs",    "round",      "default",    "d",
                                       "items",  "dictsort",   "map",    "select",  "reject", "selectattr", "rejectattr", "unique",
                                       "sort",   "min",        "max",    "sum",     "indent", "wordcount"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool is_test(const std::string& name) {
  static const char* const kNames[] = {"defined",     "undefined",   "none",    "boolean",  "true",     "false",    "integer", "float",
                                       "number",      "string",      "mapping", "iterable", "sequence", "callable", "sameas",  "eq",
                                       "equalto",     "==",          "ne",      "!=",       "lt",       "lessthan", "<",       "gt",
                                       "greaterthan", ">",           "le",      "<=",       "ge",       ">=",       "in",      "odd",
                                       "even",        "divisibleby", "lower",   "upper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

bool apply_test(const std::string& name, const Value& v, Arguments& a, bool& out) {
  const Value arg = a.get(0, "");
  if (name == "defined")
    out = !v.is_undefined();
  else if (name == "undefined")
    out = v.is_undefined();
  else if (name == "none")
    out = v.is_none();
  else if (name == "boolean")
    out = v.kind() == Kind::kBool;
  else if (name == "true")
    out = v.kind() == Kind::kBool && v.as_bool();
  else if (name == "false")
    out = v.kind() == Kind::kBool && !v.as_bool();
  else if (name == "integer")
    out = v.kind() == Kind::kInt;
  else if (name == "float")
    out = v.kind() == Kind::kFloat;
  else if (name == "number")
    out = v.is_number();
  else if (name == "string")
    out = v.is_string();
  else if (name == "mapping")
    out = v.kind() == Kind::kDict;
  else if (name == "iterable")
    out = v.is_iterable() || v.is_undefined();
  else if (name == "sequence")
    out = v.kind() == Kind::kList || v.is_string() || v.kind() == Kind::kDict;
  else if (name == "callable")
    out = v.kind() == Kind::kCallable;
  else if (name == "sameas")
    out = (v.is_none() && arg.is_none()) || (v.kind() == Kind::kBool && arg.kind() == Kind::kBool && v.as_bool() == arg.as_bool());
  else if (name == "eq" || name == "equalto" || name == "==")
    out = equal(v, arg);
  else if (name == "ne" || name == "!=")
    out = !equal(v, arg);
  else if (name == "lt" || name == "lessthan" || name == "<")
    out = less(v, arg);
  else if (name == "gt" || name == "greaterthan" || name == ">")
    out = less(arg, v);
  else if (name == "le" || name == "<=")
    out = !less(arg, v);
  else if (name == "ge" || name == ">=")
    out = !less(v, arg);
  else if (name == "in") {
    if (arg.is_string() && v.is_string())
      out = arg.as_string().find(v.as_string()) != std::string::npos;
    else if (arg.kind() == Kind::kDict)
      out = v.is_string() && arg.as_dict().find(v.as_string());
    else {
      out = false;
      for (const Value& x : items_of(arg)) out = out || equal(x, v);
    }
  } else if (name == "odd" || name == "even") {
    if (v.kind() != Kind::kInt) type_error("odd/even need an integer");
    out = (v.as_int() % 2 != 0) == (name == "odd");
  } else if (name == "divisibleby") {
    out = arg.as_int() != 0 && py_mod(v.as_int(), arg.as_int()) == 0;
  } else if (name == "lower" || name == "upper") {
    out = v.is_string() && ascii_case(v.as_string(), name == "upper") == v.as_string();
  } else {
    return false;
  }
  return true;
}

namespace {

// Filters of values and strings (the first half of Jinja2's list).
bool value_filter(const std::string& name, const Value& v, Arguments& a, Value& out) {
  if (name == "length" || name == "count")
    out = Value(length_of(v));
  else if (name == "string")
    out = Value(v.str());
  else if (name == "safe")
    out = v;
  else if (name == "e" || name == "escape")
    out = Value(html_escape(v.str()));
  else if (name == "trim")
    out = Value(strip(v.str(), a.get(0, "chars"), true, true));
  else if (name == "upper" || name == "lower")
    out = Value(ascii_case(v.str(), name == "upper"));
  else if (name == "capitalize") {
    std::string s = ascii_case(v.str(), false);
    if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    out = Value(s);
  } else if (name == "title")
    out = Value(title_case(v.str()));
  else if (name == "replace")
    out = Value(replace(v.str(), a.get(0, "old").str(), a.get(1, "new").str(), a.get(2, "count", Value(int64_t{-1})).as_int()));
  else if (name == "tojson") {
    const Value ind = a.get(0, "indent");
    out = Value(to_json(v, ind.kind() == Kind::kInt ? static_cast<int>(ind.as_int()) : -1, a.get(1, "sort_keys", Value(false)).truthy()));
  } else if (name == "join") {
    const std::string attr = a.get(1, "attribute").is_undefined() ? "" : a.get(1, "attribute").str();
    std::string s;
    bool first = true;
    for (const Value& x : items_of(v))
      s += (first ? "" : a.get(0, "d", Value("")).str()) + (attr.empty() ? x : attribute_of(x, attr)).str(), first = false;
    out = Value(s);
  } else if (name == "first" || name == "last") {
    const List items = items_of(v);
    out = items.empty() ? Value() : name == "first" ? items.front() : items.back();
  } else if (name == "list")
    out = Value(items_of(v));
  else if (name == "reverse") {
    if (v.is_string()) {
      const std::string& in = v.as_string();
      const std::vector<size_t> at = code_point_offsets(in);
      std::string s;
      s.reserve(in.size());
      for (size_t k = at.size() - 1; k > 0; --k) s.append(in, at[k - 1], at[k] - at[k - 1]);
      out = Value(s);
    } else {
      List items = items_of(v);
      std::reverse(items.begin(), items.end());
      out = Value(items);
    }
  } else if (name == "int") {
    if (v.kind() == Kind::kFloat) {
      if (!(std::fabs(v.as_number()) < 9.2233720368547758e18))
        type_error(fmt::format("cannot convert {} to a 64-bit integer", float_repr(v.as_number())));
      out = Value(static_cast<int64_t>(v.as_number()));
    } else if (v.is_number())
      out = Value(v.as_int());
    else {
      try {
        out = Value(static_cast<int64_t>(std::stoll(strip(v.str(), Value(), true, true))));
      } catch (const std::exception&) {
        out = a.get(0, "default", Value(int64_t{0}));
      }
    }
  } else if (name == "float") {
    try {
      out = Value(v.is_number() ? v.as_number() : std::stod(v.str()));
    } catch (const std::exception&) {
      out = a.get(0, "default", Value(0.0));
    }
  } else if (name == "abs")
    out = v.kind() == Kind::kFloat ? Value(std::fabs(v.as_number())) : Value(v.as_int() < 0 ? py_neg(v.as_int()) : v.as_int());
  else if (name == "round") {
    // Python's round(): ties to even; a precision beyond a double's digits keeps the value.
    const int64_t precision = a.get(0, "precision", Value(int64_t{0})).as_int();
    const double x = v.as_number();
    if (precision > 308 || !std::isfinite(x)) {
      out = Value(x);
    } else if (precision < -308) {
      out = Value(std::copysign(0.0, x));
    } else {
      const double f = std::pow(10.0, static_cast<double>(precision));
      const double scaled = x * f;
      out = Value(std::isfinite(scaled) && f != 0 ? std::nearbyint(scaled) / f : x);
    }
  } else if (name == "default" || name == "d") {
    const bool boolean = a.get(1, "boolean", Value(false)).truthy();
    out = (v.is_undefined() || (boolean && !v.truthy())) ? a.get(0, "default_value", Value("")) : v;
  } else {
    return false;
  }
  return true;
}

// Filters of sequences and mappings.
bool sequence_filter(const std::string& name, const Value& v, Arguments& a, Value& out) {
  if (name == "items") {
    if (v.is_undefined()) return out = Value(List{}), true;
    if (v.kind() != Kind::kDict) type_error("items needs a mapping");
    List pairs;
    for (const auto& [k, x] : v.as_dict().items()) pairs.emplace_back(List{Value(k), x});
    out = Value(pairs);
  } else if (name == "dictsort") {
    List pairs;
    for (const auto& [k, x] : v.as_dict().items()) pairs.emplace_back(List{Value(k), x});
    const bool by_value = a.get(1, "by").str() == "value";
    const bool cs = a.get(0, "case_sensitive", Value(false)).truthy();
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
      Value kx = x.as_list()[by_value ? 1 : 0], ky = y.as_list()[by_value ? 1 : 0];
      if (!cs && kx.is_string() && ky.is_string())
        kx = Value(ascii_case(kx.as_string(), false)), ky = Value(ascii_case(ky.as_string(), false));
      return less(kx, ky);
    });
    if (a.get(2, "reverse", Value(false)).truthy()) std::reverse(pairs.begin(), pairs.end());
    out = Value(pairs);
  } else if (name == "map") {
    List mapped;
    const Value attr = a.keyword.find("attribute") ? *a.keyword.find("attribute") : Value();
    for (const Value& x : items_of(v)) {
      if (!attr.is_undefined()) {
        Value got = attribute_of(x, attr.str());
        if (got.is_undefined() && a.keyword.find("default")) got = *a.keyword.find("default");
        mapped.push_back(got);
      } else {
        Arguments rest;
        for (size_t i = 1; i < a.positional.size(); ++i) rest.positional.push_back(a.positional[i]);
        Value r;
        if (!apply_filter(a.get(0, "").str(), x, rest, r)) type_error("no filter named '" + a.get(0, "").str() + "'");
        mapped.push_back(r);
      }
    }
    out = Value(mapped);
  } else if (name == "select" || name == "reject")
    out = select(v, a, false, name == "select");
  else if (name == "selectattr" || name == "rejectattr")
    out = select(v, a, true, name == "selectattr");
  else if (name == "unique") {
    List u;
    for (const Value& x : items_of(v))
      if (std::none_of(u.begin(), u.end(), [&](const Value& y) { return equal(x, y); })) u.push_back(x);
    out = Value(u);
  } else if (name == "sort") {
    out = sorted(v, a.get(0, "reverse", Value(false)).truthy(), a.get(2, "attribute").is_undefined() ? "" : a.get(2, "attribute").str(),
                 a.get(1, "case_sensitive", Value(false)).truthy());
  } else if (name == "min" || name == "max") {
    const List items = items_of(v);
    if (items.empty()) return out = Value(), true;
    Value best = items.front();
    for (const Value& x : items)
      if (name == "min" ? less(x, best) : less(best, x)) best = x;
    out = best;
  } else if (name == "sum") {
    Value total = a.get(1, "start", Value(int64_t{0}));
    const Value attr = a.get(0, "attribute");
    for (const Value& x : items_of(v)) {
      const Value y = attr.is_undefined() ? x : attribute_of(x, attr.str());
      total = total.kind() == Kind::kInt && y.kind() == Kind::kInt ? Value(py_add(total.as_int(), y.as_int()))
                                                                   : Value(total.as_number() + y.as_number());
    }
    out = total;
  } else if (name == "indent") {
    const Value w = a.get(0, "width", Value(int64_t{4}));
    // Python's " " * width: nothing for a width below 1.
    if (!w.is_string()) check_growth(static_cast<size_t>(std::max<int64_t>(0, w.as_int())));
    const std::string pad = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(std::max<int64_t>(0, w.as_int())), ' ');
    out = Value(indent(v.str(), pad, a.get(1, "first", Value(false)).truthy(), a.get(2, "blank", Value(false)).truthy()));
  } else if (name == "wordcount") {
    out = Value(static_cast<int64_t>(split(v.str(), Value(), -1).as_list().size()));
  } else {
    return false;
  }
  return true;
}

}  // namespace

bool apply_filter(const std::string& name, const Value& v, Arguments& a, Value& out) {
  return value_filter(name, v, a, out) || sequence_filter(name, v, a, out);
}

namespace {

// The methods of Python's str that chat templates call.
Value string_method(const std::string& s, const std::string& name) {
  auto bind = [&](std::function<Value(Arguments&)> f) { return Value::callable(std::move(f), name); };
  {
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return bind([s, name](Arguments& a) { return Value(strip(s, a.get(0, "chars"), name != "rstrip", name != "lstrip")); });
    if (name == "split")
      return bind([s](Arguments& a) { return split(s, a.get(0, "sep"), a.get(1, "maxsplit", Value(int64_t{-1})).as_int()); });
    if (name == "rsplit")
      return bind([s](Arguments& a) {
        const int64_t maxsplit = a.get(1, "maxsplit", Value(int64_t{-1})).as_int();
        if (maxsplit < 0 || !a.get(0, "sep").is_string()) return split(s, a.get(0, "sep"), maxsplit);
        const std::string& d = a.get(0, "sep").as_string();
        List parts;
        size_t end = s.size();
        for (int64_t n = 0; n < maxsplit; ++n) {
          const size_t p = end >= d.size() ? s.rfind(d, end - d.size()) : std::string::npos;
          if (p == std::string::npos) break;
          parts.insert(parts.begin(), Value(s.substr(p + d.size(), end - p - d.size())));
          end = p;
        }
        parts.insert(parts.begin(), Value(s.substr(0, end)));
        return Value(parts);
      });
    if (name == "startswith" || name == "endswith")
      return bind([s, name](Arguments& a) {
        const Value p = a.get(0, "prefix");
        List options = p.kind() == Kind::kList ? p.as_list() : List{p};
        for (const Value& o : options) {
          const std::string& x = o.as_string();
          if (x.size() <= s.size() &&
              (name == "startswith" ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0))
            return Value(true);
        }
        return Value(false);
      });
    if (name == "upper" || name == "lower") return bind([s, name](Arguments&) { return Value(ascii_case(s, name == "upper")); });
    if (name == "title") return bind([s](Arguments&) { return Value(title_case(s)); });
    if (name == "capitalize")
      return bind([s](Arguments&) {
        std::string c = ascii_case(s, false);
        if (!c.empty()) c[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(c[0])));
        return Value(c);
      });
    if (name == "replace")
      return bind([s](Arguments& a) {
        return Value(replace(s, a.get(0, "old").str(), a.get(1, "new").str(), a.get(2, "count", Value(int64_t{-1})).as_int()));
      });
    if (name == "find" || name == "rfind")
      return bind([s, name](Arguments& a) {
        const size_t p = name == "find" ? s.find(a.get(0, "sub").str()) : s.rfind(a.get(0, "sub").str());
        if (p == std::string::npos) return Value(int64_t{-1});
        return Value(static_cast<int64_t>(code_point_count(s, p)));
      });
    if (name == "count")
      return bind([s](Arguments& a) {
        const std::string sub = a.get(0, "sub").str();
        // Python counts an empty substring once per code point, plus one.
        if (sub.empty()) return Value(static_cast<int64_t>(code_point_count(s) + 1));
        int64_t n = 0;
        for (size_t p = 0; (p = s.find(sub, p)) != std::string::npos; p += sub.size()) ++n;
        return Value(n);
      });
    if (name == "join")
      return bind([s](Arguments& a) {
        std::string out;
        bool first = true;
        for (const Value& x : items_of(a.get(0, "iterable"))) {
          out += (first ? "" : s) + x.str(), first = false;
          check_growth(out.size());
        }
        return Value(out);
      });
    if (name == "splitlines")
      return bind([s](Arguments&) {
        List lines;
        size_t start = 0;
        while (start < s.size()) {
          const size_t nl = s.find('\n', start);
          lines.emplace_back(s.substr(start, (nl == std::string::npos ? s.size() : nl) - start));
          if (nl == std::string::npos) break;
          start = nl + 1;
        }
        return Value(lines);
      });
    if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum")
      return bind([s, name](Arguments&) {
        if (s.empty()) return Value(false);
        for (unsigned char c : s) {
          const bool ok = name == "isdigit"   ? std::isdigit(c)
                          : name == "isalpha" ? std::isalpha(c)
                          : name == "isspace" ? std::isspace(c)
                                              : std::isalnum(c);
          if (!ok) return Value(false);
        }
        return Value(true);
      });
    return Value();
  }
}

}  // namespace

Value method_of(const Value& obj, const std::string& name) {
  auto bind = [&](std::function<Value(Arguments&)> f) { return Value::callable(std::move(f), name); };
  if (obj.is_string()) return string_method(obj.as_string(), name);
  if (obj.kind() == Kind::kDict) {
    const Value self = obj;
    if (name == "items")
      return bind([self](Arguments&) {
        Arguments none;
        Value out;
        apply_filter("items", self, none, out);
        return out;
      });
    if (name == "keys") return bind([self](Arguments&) { return Value(items_of(self)); });
    if (name == "values")
      return bind([self](Arguments&) {
        List vals;
        for (const auto& kv : self.as_dict().items()) vals.push_back(kv.second);
        return Value(vals);
      });
    if (name == "get")
      return bind([self](Arguments& a) {
        const Value* f = self.as_dict().find(a.get(0, "key").str());
        return f ? *f : a.get(1, "default", Value::none());
      });
    return Value();
  }
  if (obj.kind() == Kind::kList) {
    const Value self = obj;
    if (name == "index")
      return bind([self](Arguments& a) {
        for (size_t i = 0; i < self.as_list().size(); ++i)
          if (equal(self.as_list()[i], a.get(0, "value"))) return Value(static_cast<int64_t>(i));
        type_error("ValueError: the value is not in the list");
      });
    if (name == "count")
      return bind([self](Arguments& a) {
        int64_t n = 0;
        for (const Value& x : self.as_list()) n += equal(x, a.get(0, "value"));
        return Value(n);
      });
    if (name == "append" || name == "extend" || name == "pop" || name == "insert" || name == "remove" || name == "sort" || name == "clear")
      type_error(fmt::format(
          "the template changes a list ('{}'): Hugging Face renders chat templates in an immutable sandbox, which refuses it", name));
  }
  return Value();
}

Dict template_globals() {
  Dict g;
  g.set("raise_exception",
        Value::callable([](Arguments& a) -> Value { throw std::runtime_error("raise_exception: " + a.get(0, "message").str()); },
                        "raise_exception"));
  g.set("range",
        Value::callable(
            [](Arguments& a) {
              int64_t start = 0, stop = 0, step = 1;
              if (a.positional.size() == 1)
                stop = a.positional[0].as_int();
              else if (a.positional.size() >= 2)
                start = a.positional[0].as_int(), stop = a.positional[1].as_int();
              if (a.positional.size() >= 3) step = a.positional[2].as_int();
              if (step == 0) type_error("range() arg 3 must not be zero");
              // Its length before anything is allocated, in unsigned arithmetic (no overflow).
              uint64_t length = 0;
              if (step > 0 && start < stop)
                length = (static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) - 1) / static_cast<uint64_t>(step) + 1;
              if (step < 0 && start > stop)
                length = (static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) - 1) / (static_cast<uint64_t>(-(step + 1)) + 1) + 1;
              if (length > static_cast<uint64_t>(kMaxRange))
                type_error(fmt::format("range() of {} items; the sandbox allows {} (Jinja2's MAX_RANGE)", length, kMaxRange));
              List out;
              for (int64_t k = 0, v = start; k < static_cast<int64_t>(length); ++k) {
                out.emplace_back(v);
                if (k + 1 < static_cast<int64_t>(length)) v += step;  // never past the last item: no overflow
              }
              return Value(out);
            },
            "range"));
  g.set("namespace", Value::callable(
                         [](Arguments& a) {
                           Dict attrs;
                           if (!a.positional.empty() && a.positional[0].kind() == Kind::kDict) attrs = a.positional[0].as_dict();
                           for (const auto& [k, x] : a.keyword.items()) attrs.set(k, x);
                           return Value::namespace_of(attrs);
                         },
                         "namespace"));
  g.set("dict", Value::callable([](Arguments& a) { return Value(a.keyword); }, "dict"));
  g.set("strftime_now", Value::callable(
                            [](Arguments& a) {
                              const std::time_t now = std::time(nullptr);
                              std::tm tm{};
                              localtime_r(&now, &tm);
                              char buf[256];
                              const size_t n = std::strftime(buf, sizeof buf, a.get(0, "format").str().c_str(), &tm);
                              return Value(std::string(buf, n));
                            },
                            "strftime_now"));
  return g;
}

}  // namespace dstrain::text::jinja
