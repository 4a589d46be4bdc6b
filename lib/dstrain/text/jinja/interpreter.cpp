// Runs a parsed chat template (jinja/parser.h) over a JSON context, with Jinja2's semantics for
// what chat templates use: scoping (a for loop's body is its own scope; namespaces carry state
// out), Python's operators and truthiness, undefined values that print as nothing and fail when
// used, macros and call blocks.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <optional>
#include <stdexcept>

#include "dstrain/core/error.h"
#include "dstrain/text/jinja.h"
#include "dstrain/text/jinja/builtins.h"
#include "dstrain/text/jinja/integers.h"
#include "dstrain/text/jinja/limits.h"
#include "dstrain/text/jinja/parser.h"

namespace dstrain::text {
using namespace jinja;

struct ChatTemplate::Impl {
  std::string name;
  Body body;
  int64_t max_steps = kMaxRenderSteps;
};

namespace {

using Kind = Value::Kind;
enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  Interpreter(const std::string& name, ChatRender& out, int64_t max_steps) : name_(name), out_(out), max_steps_(max_steps) {}

  void run(const Body& body, Dict context) {
    globals_ = std::make_shared<Dict>(template_globals());
    for (const auto& [k, v] : context.items()) globals_->set(k, v);
    chain_ = {globals_, std::make_shared<Dict>()};
    exec(body);
  }

 private:
  [[noreturn]] void fail(Where w, const std::string& what, ErrorCode code = ErrorCode::kData) const {
    throw Error(code, fmt::format("{}:{}:{}: {}", name_, w.line, w.column, what), "");
  }

  // One level of evaluation (a statement, an expression) while it lives, and one step of the
  // render: the sandbox's depth and step bounds (jinja/limits.h).
  class Level {
   public:
    Level(Interpreter& in, Where w) : in_(in) {
      if (++in_.depth_ > kMaxRenderDepth) {
        --in_.depth_;
        in_.fail(w, fmt::format("rendering nests more than {} levels deep: a macro or a recursive loop that calls itself without end?",
                                kMaxRenderDepth));
      }
      if (++in_.steps_ > in_.max_steps_) {
        --in_.depth_;
        in_.fail(w, fmt::format("rendering took more than {} steps: an endless or enormous loop?", in_.max_steps_));
      }
    }
    ~Level() { --in_.depth_; }
    Level(const Level&) = delete;
    Level& operator=(const Level&) = delete;

   private:
    Interpreter& in_;
  };

  // A value the template built costs steps by its size (4 list items, or 512 bytes of text, a
  // step), so that building large values in a loop is bounded like the loop itself.
  Value charged(Value v, Where w) {
    const size_t units = v.is_string() ? v.as_string().size() / 512 : v.kind() == Kind::kList ? v.as_list().size() / 4 : 0;
    if (units > 0 && (steps_ += static_cast<int64_t>(units)) > max_steps_)
      fail(w, fmt::format("rendering took more than {} steps: an endless or enormous loop?", max_steps_));
    return v;
  }

  void check_items(Where w, size_t items) const {
    if (items > kMaxListItems) fail(w, fmt::format("the template builds a list of {} items; the sandbox allows {}", items, kMaxListItems));
  }
  void check_size(Where w, size_t bytes) const {
    if (bytes > kMaxStringBytes)
      fail(w, fmt::format("the template builds text of {} bytes; the sandbox allows {} MiB", bytes, kMaxStringBytes >> 20));
  }

  // ---- names and scopes ----
  Value lookup(const std::string& n) const {
    for (auto it = chain_.rbegin(); it != chain_.rend(); ++it)
      if (const Value* v = (*it)->find(n)) return *v;
    return Value();
  }
  void assign(const std::string& n, Value v) { chain_.back()->set(n, std::move(v)); }

  // ---- statements ----
  Flow exec(const Body& body) {
    for (const auto& s : body) {
      const Flow f = exec(*s);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  std::string capture(const Body& body) {
    std::string saved;
    std::swap(saved, out_.text);
    ++capturing_;
    exec(body);
    --capturing_;
    std::swap(saved, out_.text);
    return saved;
  }

  // A value of the wrong kind, an integer overflow or a bad conversion inside a statement
  // (std::logic_error from jinja/value.h, integers.h, the builtins or the standard library) is
  // an error at the statement's line, never a crash or an "internal error".
  Flow exec(const Stmt& s) {
    const Level level(*this, s.where);
    try {
      return exec_statement(s);
    } catch (const std::logic_error& e) {
      fail(s.where, e.what());
    }
  }

  Flow exec_statement(const Stmt& s) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        check_size(s.where, out_.text.size() + s.text.size());
        out_.text += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        const Value v = eval(*s.exprs[0]);
        const std::string text = v.str();
        check_size(s.where, out_.text.size() + text.size());
        out_.text += text;
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.exprs.size(); ++i)
          if (eval(*s.exprs[i]).truthy()) return exec(s.bodies[i]);
        if (s.bodies.size() > s.exprs.size()) return exec(s.bodies.back());
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        return exec_for(s), Flow::kNormal;
      case Stmt::Kind::kSet:
        exec_set(s);
        return Flow::kNormal;
      case Stmt::Kind::kSetBlock:
        assign(s.text, Value(capture(s.bodies[0])));
        return Flow::kNormal;
      case Stmt::Kind::kMacro:
        assign(s.text, macro(s));
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kGeneration: {
        const size_t start = out_.text.size();
        const Flow f = exec(s.bodies[0]);
        if (capturing_ == 0) out_.generation_spans.emplace_back(start, out_.text.size());
        return f;
      }
      case Stmt::Kind::kFilterBlock: {
        Arguments none;
        Value r;
        if (!apply_filter(s.text, Value(capture(s.bodies[0])), none, r))
          fail(s.where, "no filter named '" + s.text + "'", ErrorCode::kConfig);
        out_.text += r.str();
        return Flow::kNormal;
      }
      case Stmt::Kind::kCallBlock: {
        const Body* body = &s.bodies[0];
        const auto chain = chain_;
        Value caller = Value::callable(
            [this, body, chain](Arguments&) {
              auto saved = chain_;
              chain_ = chain;
              chain_.push_back(std::make_shared<Dict>());
              std::string r = capture(*body);
              chain_ = saved;
              return Value(r);
            },
            "caller");
        chain_.push_back(std::make_shared<Dict>());
        assign("caller", caller);
        out_.text += eval(*s.call).str();
        chain_.pop_back();
        return Flow::kNormal;
      }
    }
    return Flow::kNormal;
  }

  void exec_set(const Stmt& s) {
    Value v = eval(*s.exprs[0]);
    if (!s.attribute.empty()) {
      const Value ns = lookup(s.text);
      if (ns.kind() != Kind::kNamespace)
        fail(s.where, fmt::format("'set {}.{}' needs '{}' to be a namespace()", s.text, s.attribute, s.text));
      ns.namespace_attributes().set(s.attribute, std::move(v));
      return;
    }
    if (s.targets.empty()) return assign(s.text, std::move(v));
    const List items = iterate(v, s.where);
    if (items.size() != s.targets.size())
      fail(s.where, fmt::format("cannot unpack {} values into {} names", items.size(), s.targets.size()));
    for (size_t i = 0; i < items.size(); ++i) assign(s.targets[i], items[i]);
  }

  List iterate(const Value& v, Where w) const {
    switch (v.kind()) {
      case Kind::kList:
        return v.as_list();
      case Kind::kUndefined:
        return {};
      case Kind::kDict:
      case Kind::kString: {
        Arguments none;
        Value out;
        apply_filter("list", v, none, out);
        return out.as_list();
      }
      default:
        fail(w, fmt::format("'{}' object is not iterable", v.type_name()));
    }
  }

  void bind_targets(const Stmt& s, const Value& item) {
    if (s.targets.size() == 1) return assign(s.targets[0], item);
    const List parts = iterate(item, s.where);
    if (parts.size() != s.targets.size())
      fail(s.where, fmt::format("cannot unpack {} values into {} loop variables", parts.size(), s.targets.size()));
    for (size_t i = 0; i < parts.size(); ++i) assign(s.targets[i], parts[i]);
  }

  void exec_for(const Stmt& s, const Value* given = nullptr, int depth = 1) {
    List items = iterate(given ? *given : eval(*s.exprs[0]), s.where);
    if (s.has_filter) {
      List kept;
      for (const Value& item : items) {
        chain_.push_back(std::make_shared<Dict>());
        bind_targets(s, item);
        const bool keep = eval(*s.exprs[1]).truthy();
        chain_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec(s.bodies[1]);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    // One loop object, updated in place each iteration, as Jinja2's LoopContext (a fresh dict of
    // twelve entries per iteration made an empty loop cost 2 us an iteration).
    auto position = std::make_shared<int64_t>(0);
    Dict fields;
    for (const char* key : {"index", "index0", "revindex", "revindex0", "first", "last", "previtem", "nextitem"}) fields.set(key, Value());
    fields.set("length", Value(n));
    fields.set("depth", Value(static_cast<int64_t>(depth)));
    fields.set("depth0", Value(static_cast<int64_t>(depth - 1)));
    fields.set("cycle", Value::callable(
                            [position](Arguments& a) {
                              if (a.positional.empty()) throw std::invalid_argument("no items for cycling given");
                              return a.positional[static_cast<size_t>(*position) % a.positional.size()];
                            },
                            "cycle"));
    if (s.recursive) {
      const Stmt* self = &s;
      fields.set("__call__", Value::callable(
                                 [this, self, depth](Arguments& a) {
                                   const Value inner = a.get(0, "iterable");
                                   const std::string saved = capture_for(*self, inner, depth + 1);
                                   return Value(saved);
                                 },
                                 "loop"));
    }
    const Value loop_value(std::move(fields));
    Dict& loop = loop_value.namespace_attributes();
    for (int64_t i = 0; i < n; ++i) {
      steps_ += kLoopIterationSteps - 1;  // an iteration costs as much as a few statements, even with an empty body
      const Level iteration(*this, s.where);
      chain_.push_back(std::make_shared<Dict>());
      *position = i;
      loop.set("index", Value(i + 1));
      loop.set("index0", Value(i));
      loop.set("revindex", Value(n - i));
      loop.set("revindex0", Value(n - i - 1));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == n - 1));
      loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
      loop.set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value());
      assign("loop", loop_value);
      bind_targets(s, items[static_cast<size_t>(i)]);
      const Flow f = exec(s.bodies[0]);
      chain_.pop_back();
      if (f == Flow::kBreak) break;
    }
  }
  std::string capture_for(const Stmt& s, const Value& items, int depth) {
    std::string saved;
    std::swap(saved, out_.text);
    ++capturing_;
    exec_for(s, &items, depth);
    --capturing_;
    std::swap(saved, out_.text);
    return saved;
  }

  Value macro(const Stmt& s) {
    const Stmt* def = &s;
    return Value::callable(
        [this, def](Arguments& a) {
          auto saved = chain_;
          const Value caller = lookup("caller");
          chain_ = {globals_, saved.size() > 1 ? saved[1] : std::make_shared<Dict>(), std::make_shared<Dict>()};
          for (size_t i = 0; i < def->targets.size(); ++i) {
            Value v = a.get(i, def->targets[i]);
            if (v.is_undefined() && def->exprs[i]) v = eval(*def->exprs[i]);
            assign(def->targets[i], v);
          }
          if (a.positional.size() > def->targets.size())
            fail(def->where, fmt::format("macro '{}' takes {} arguments, {} given", def->text, def->targets.size(), a.positional.size()));
          if (!caller.is_undefined()) assign("caller", caller);
          std::string r = capture(def->bodies[0]);
          chain_ = saved;
          return Value(r);
        },
        s.text);
  }

  // ---- expressions ----
  Arguments arguments(const Expr& e) {
    Arguments a;
    for (size_t i = e.first_argument; i < e.operands.size(); ++i) a.positional.push_back(eval(*e.operands[i]));
    for (const auto& [k, x] : e.keywords) a.keyword.set(k, eval(*x));
    return a;
  }

  [[noreturn]] void undefined_use(const Expr& e, const std::string& what) const { fail(e.where, what + " is undefined"); }
  std::string describe(const Expr& e) const {
    if (e.kind == Expr::Kind::kName) return "'" + e.name + "'";
    if (e.kind == Expr::Kind::kAttr) return describe(*e.operands[0]) + "." + e.name;
    if (e.kind == Expr::Kind::kItem) return describe(*e.operands[0]) + "[...]";
    return "a value";
  }

  Value attribute(const Expr& e, const Value& obj, const std::string& name) const {
    if (obj.is_undefined()) undefined_use(*e.operands[0], describe(*e.operands[0]));
    if (obj.kind() == Kind::kNamespace) {
      const Value* v = obj.namespace_attributes().find(name);
      return v ? *v : Value();
    }
    if (obj.kind() == Kind::kDict && name == "__call__") return Value();
    const Value m = method_of(obj, name);  // Python's getattr first: message.items is the method
    if (!m.is_undefined()) return m;
    if (obj.kind() == Kind::kDict) {
      const Value* v = obj.as_dict().find(name);
      return v ? *v : Value();
    }
    if (obj.kind() == Kind::kList && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0])))
      return item(e, obj, Value(static_cast<int64_t>(std::stoll(name))));
    return Value();
  }

  Value item(const Expr& e, const Value& obj, const Value& key) const {
    if (obj.is_undefined()) undefined_use(*e.operands[0], describe(*e.operands[0]));
    if (obj.kind() == Kind::kDict || obj.kind() == Kind::kNamespace) {
      const Value* v = key.is_string() ? (obj.kind() == Kind::kNamespace ? obj.namespace_attributes().find(key.as_string())
                                                                         : obj.as_dict().find(key.as_string()))
                                       : nullptr;
      if (v) return *v;
      return key.is_string() ? method_of(obj, key.as_string()) : Value();
    }
    if ((obj.kind() == Kind::kList || obj.is_string()) && (key.kind() == Kind::kInt || key.kind() == Kind::kBool)) {
      // A string is walked, not tabled: message.content[0] of a long message costs no memory.
      const int64_t n =
          obj.is_string() ? static_cast<int64_t>(code_point_count(obj.as_string())) : static_cast<int64_t>(obj.as_list().size());
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      if (obj.is_string()) {
        const std::string& str = obj.as_string();
        const size_t begin = code_point_byte(str, static_cast<size_t>(i));
        size_t end = begin + 1;
        while (end < str.size() && (static_cast<unsigned char>(str[end]) & 0xC0) == 0x80) ++end;
        return Value(str.substr(begin, end - begin));
      }
      return obj.as_list()[static_cast<size_t>(i)];
    }
    if (key.is_string()) return method_of(obj, key.as_string());
    return Value();
  }

  Value slice(const Expr& e, const Value& obj) {
    if (obj.is_undefined()) undefined_use(*e.operands[0], describe(*e.operands[0]));
    const bool str = obj.is_string();
    if (!str && obj.kind() != Kind::kList) fail(e.where, fmt::format("'{}' object is not subscriptable", obj.type_name()));
    const int64_t n = str ? static_cast<int64_t>(code_point_count(obj.as_string())) : static_cast<int64_t>(obj.as_list().size());
    auto get = [&](size_t k) -> std::optional<int64_t> {
      if (!e.operands[k]) return std::nullopt;
      const Value v = eval(*e.operands[k]);
      if (v.is_none()) return std::nullopt;
      return v.as_int();
    };
    const int64_t step = get(3).value_or(1);
    if (step == 0) fail(e.where, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + n : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(get(1), step > 0 ? 0 : n - 1), stop = clamp(get(2), step > 0 ? n : -1);
    if (str && step == 1) {  // s[1:], s[:-1]: one substring, no table of the code points
      if (start >= stop) return Value(std::string());
      const std::string& s = obj.as_string();
      const size_t from = code_point_byte(s, static_cast<size_t>(start)), to = code_point_byte(s, static_cast<size_t>(stop));
      return Value(s.substr(from, to - from));
    }
    const std::vector<size_t> cps = str ? code_point_offsets(obj.as_string()) : std::vector<size_t>{};
    List picked;
    std::string s;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (str)
        s += obj.as_string().substr(cps[static_cast<size_t>(i)], cps[static_cast<size_t>(i) + 1] - cps[static_cast<size_t>(i)]);
      else
        picked.push_back(obj.as_list()[static_cast<size_t>(i)]);
    }
    return str ? Value(s) : Value(picked);
  }

  Value arithmetic(const Expr& e, const std::string& op, const Value& a, const Value& b) const {
    if (a.is_undefined() || b.is_undefined()) undefined_use(e, describe(*e.operands[a.is_undefined() ? 0 : 1]));
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        check_size(e.where, a.as_string().size() + b.as_string().size());
        return Value(a.as_string() + b.as_string());
      }
      if (a.kind() == Kind::kList && b.kind() == Kind::kList) {
        check_items(e.where, a.as_list().size() + b.as_list().size());
        List out = a.as_list();
        out.insert(out.end(), b.as_list().begin(), b.as_list().end());
        return Value(out);
      }
    }
    if (op == "*" && a.kind() == Kind::kInt && (b.is_string() || b.kind() == Kind::kList)) return arithmetic(e, op, b, a);
    if (op == "*" && (a.is_string() || a.kind() == Kind::kList) && b.kind() == Kind::kInt) {
      const auto times = static_cast<size_t>(std::max<int64_t>(0, b.as_int()));
      const size_t unit = a.is_string() ? a.as_string().size() : a.as_list().size();
      size_t total = 0;
      if (__builtin_mul_overflow(unit, times, &total)) total = SIZE_MAX;
      if (a.is_string()) {
        check_size(e.where, total);
        std::string out;
        out.reserve(total);
        for (size_t i = 0; i < times && unit > 0; ++i) out += a.as_string();
        return Value(out);
      }
      check_items(e.where, total);
      List out;
      for (size_t i = 0; i < times && unit > 0; ++i) out.insert(out.end(), a.as_list().begin(), a.as_list().end());
      return Value(out);
    }
    if (!a.is_number() || !b.is_number())
      fail(e.where, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, a.type_name(), b.type_name()));
    const bool ints = a.kind() != Kind::kFloat && b.kind() != Kind::kFloat;
    const double x = a.as_number(), y = b.as_number();
    if (op == "+") return ints ? Value(py_add(a.as_int(), b.as_int())) : Value(x + y);
    if (op == "-") return ints ? Value(py_sub(a.as_int(), b.as_int())) : Value(x - y);
    if (op == "*") return ints ? Value(py_mul(a.as_int(), b.as_int())) : Value(x * y);
    if ((op == "/" || op == "//" || op == "%") && y == 0) fail(e.where, "division by zero");
    if (op == "/") return Value(x / y);
    if (op == "//") return ints ? Value(py_floordiv(a.as_int(), b.as_int())) : Value(std::floor(x / y));
    if (op == "%") return ints ? Value(py_mod(a.as_int(), b.as_int())) : Value(x - std::floor(x / y) * y);
    if (op == "**") return ints && b.as_int() >= 0 ? Value(py_pow(a.as_int(), b.as_int())) : Value(std::pow(x, y));
    fail(e.where, "unknown operator " + op, ErrorCode::kConfig);
  }

  bool contains(const Expr& e, const Value& container, const Value& x) const {
    Arguments a;
    a.positional.push_back(container);
    bool out = false;
    try {
      apply_test("in", x, a, out);
    } catch (const std::invalid_argument& err) {
      fail(e.where, err.what());
    }
    return out;
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.operands[0]);
      return a.truthy() ? eval(*e.operands[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.operands[0]);
      return a.truthy() ? a : eval(*e.operands[1]);
    }
    const Value a = eval(*e.operands[0]), b = eval(*e.operands[1]);
    if (op == "==") return Value(equal(a, b));
    if (op == "!=") return Value(!equal(a, b));
    if (op == "in") return Value(contains(e, b, a));
    if (op == "not in") return Value(!contains(e, b, a));
    if (op == "~") {
      std::string left = a.str(), right = b.str();
      check_size(e.where, left.size() + right.size());
      return Value(left + right);
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      try {
        if (op == "<") return Value(less(a, b));
        if (op == ">") return Value(less(b, a));
        if (op == "<=") return Value(!less(b, a));
        return Value(!less(a, b));
      } catch (const std::invalid_argument& err) {
        fail(e.where, err.what());
      }
    }
    return arithmetic(e, op, a, b);
  }

  Value call_filter(const Expr& e) {
    const Value v = eval(*e.operands[0]);
    Arguments a = arguments(e);
    Value out;
    try {
      if (!apply_filter(e.name, v, a, out)) fail(e.where, fmt::format("no filter named '{}'", e.name), ErrorCode::kConfig);
    } catch (const std::invalid_argument& err) {
      fail(e.where, fmt::format("filter '{}': {}", e.name, err.what()));
    }
    return charged(out, e.where);
  }

  Value call_test(const Expr& e) {
    const Value v = eval(*e.operands[0]);
    Arguments a = arguments(e);
    bool out = false;
    try {
      if (!apply_test(e.name, v, a, out)) fail(e.where, fmt::format("no test named '{}'", e.name), ErrorCode::kConfig);
    } catch (const std::invalid_argument& err) {
      fail(e.where, fmt::format("test '{}': {}", e.name, err.what()));
    }
    return Value(out != e.negated);
  }

  Value call(const Expr& e) {
    Value f = eval(*e.operands[0]);
    if (f.kind() == Kind::kDict) {  // loop(...) in a recursive for
      if (const Value* c = f.as_dict().find("__call__")) f = *c;
    }
    if (f.kind() != Kind::kCallable) {
      if (f.is_undefined()) undefined_use(*e.operands[0], describe(*e.operands[0]));
      fail(e.where, fmt::format("'{}' object is not callable", f.type_name()));
    }
    Arguments a = arguments(e);
    try {
      return charged(f.as_function()(a), e.where);
    } catch (const std::invalid_argument& err) {
      fail(e.where, fmt::format("{}(): {}", f.function_name(), err.what()));
    } catch (const std::runtime_error& err) {
      const std::string what = err.what();
      if (what.rfind("raise_exception: ", 0) == 0)
        throw Error(
            ErrorCode::kData,
            fmt::format("the chat template refused the conversation: {} ({}:{}:{})", what.substr(17), name_, e.where.line, e.where.column),
            "fix the conversation, or skip such lines with --on-error skip");
      throw;
    }
  }

  Value eval(const Expr& e) {
    const Level level(*this, e.where);
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kAttr:
        return attribute(e, eval(*e.operands[0]), e.name);
      case Expr::Kind::kItem:
        return item(e, eval(*e.operands[0]), eval(*e.operands[1]));
      case Expr::Kind::kSlice:
        return charged(slice(e, eval(*e.operands[0])), e.where);
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter:
        return call_filter(e);
      case Expr::Kind::kTest:
        return call_test(e);
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.operands[0]);
        if (e.name == "not") return Value(!v.truthy());
        if (!v.is_number()) fail(e.where, fmt::format("bad operand type for unary {}: '{}'", e.name, v.type_name()));
        if (e.name == "+") return v;
        return v.kind() == Kind::kFloat ? Value(-v.as_number()) : Value(py_neg(v.as_int()));
      }
      case Expr::Kind::kBinary:
        return charged(binary(e), e.where);
      case Expr::Kind::kCond:
        if (eval(*e.operands[0]).truthy()) return eval(*e.operands[1]);
        return e.has_else ? eval(*e.operands[2]) : Value();
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List l;
        for (const auto& x : e.operands) l.push_back(eval(*x));
        return Value(l);
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2) d.set(eval(*e.operands[i]).str(), eval(*e.operands[i + 1]));
        return Value(d);
      }
    }
    return Value();
  }

  const std::string& name_;
  ChatRender& out_;
  std::shared_ptr<Dict> globals_;
  std::vector<std::shared_ptr<Dict>> chain_;
  int capturing_ = 0;
  int depth_ = 0;
  int64_t steps_ = 0;
  const int64_t max_steps_;
};

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, const std::string& name) : impl_(std::make_unique<Impl>()) {
  impl_->name = name;
  impl_->body = parse_template(source, name, ParseOptions{});
}
ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
const std::string& ChatTemplate::name() const { return impl_->name; }
void ChatTemplate::set_step_limit(int64_t steps) { impl_->max_steps = steps; }

ChatRender ChatTemplate::render(const Value& context) const {
  ChatRender out;
  Interpreter(impl_->name, out, impl_->max_steps).run(impl_->body, context.kind() == Value::Kind::kDict ? context.as_dict() : Dict());
  return out;
}

}  // namespace dstrain::text
