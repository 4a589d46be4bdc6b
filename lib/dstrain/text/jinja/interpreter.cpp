// Runs a parsed chat template (jinja/parser.h) over a JSON context, with Jinja2's semantics for
// what chat templates use: scoping (a for loop's body is its own scope; namespaces carry state
// out), Python's operators and truthiness, undefined values that print as nothing and fail when
// used, macros and call blocks.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <map>
#include <optional>
#include <stdexcept>
#include <unordered_set>

#include "dstrain/core/error.h"
#include "dstrain/text/jinja.h"
#include "dstrain/text/jinja/builtins.h"
#include "dstrain/text/jinja/integers.h"
#include "dstrain/text/jinja/limits.h"
#include "dstrain/text/jinja/parser.h"
#include "dstrain/text/jinja/prefix_tracker.h"

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

// Where a render can be resumed as the render of the first k messages (jinja/prefix_tracker.h).
struct ResumePoint {
  size_t statement = 0;  // the top-level loop; what follows it is rendered again
  size_t output = 0;     // bytes of the whole render written before that loop's iteration k
  int64_t steps = 0;
  std::shared_ptr<Dict> top;              // the top-level scope then, its namespaces copied (null: no resume point)
  bool generation_prompt_unseen = false;  // add_generation_prompt had not been read yet
};

struct Recording {
  Recording(size_t messages, std::vector<bool> want) : tracker(messages), wanted(std::move(want)), at(wanted.size()) {}
  PrefixTracker tracker;
  std::vector<bool> wanted;  // by k: the prefixes that will be asked for
  std::vector<ResumePoint> at;
  std::unordered_set<const void*> kept;  // values the resume points keep alive, and their bytes
  size_t kept_bytes = 0;
};

// A top-level loop over (a slice of) the messages: its statement, and the message of its item 0.
struct RootLoop {
  size_t statement, offset;
};

class Interpreter {
 public:
  Interpreter(const std::string& name, ChatRender& out, int64_t max_steps) : name_(name), out_(&out), max_steps_(max_steps) {}

  void run(const Body& body, const Dict& context) {
    globals_ = std::make_shared<Dict>(template_globals());
    for (const auto& [k, v] : context.items()) globals_->set(k, v);
    chain_ = {globals_, std::make_shared<Dict>()};
    exec_top(body, 0);
  }

  // Renders with `recording`: the resume points of the prefixes it wants.
  void record(Recording* recording) {
    recording_ = recording;
    tracker_ = &recording->tracker;
  }

  // The render of `context` with its first `count` messages and add_generation_prompt as given,
  // from a resume point of the recorded render of `context`.
  std::string resume(const Body& body, const ResumePoint& at, const Dict& context, size_t count, bool generation_prompt) {
    ChatRender out;
    out_ = &out;
    capturing_ = depth_ = 0;
    steps_ = at.steps;
    loop_ = nullptr;
    lazy_source_ = &context.find("messages")->as_list();
    lazy_count_ = count;
    globals_ = std::make_shared<Dict>(template_globals());
    for (const auto& [k, v] : context.items()) globals_->set(k, k == "messages" ? Value() : v);
    globals_->set("add_generation_prompt", Value(generation_prompt));
    lazy_ = {{globals_.get(), "messages", 0}};
    const auto top = copy_scope(*at.top);
    for (const auto& [k, v] : top->items()) {
      const int64_t offset = tracker_->offset_of(v);  // messages[o:] of the whole: of the prefix now
      if (offset >= 0) lazy_.push_back({top.get(), k, static_cast<size_t>(offset)});
    }
    chain_ = {globals_, top};
    // Not recording while resuming, and ready for the next prefix even when this one is refused.
    struct Restore {
      Interpreter& in;
      PrefixTracker* tracker;
      ~Restore() { in.tracker_ = tracker, in.lazy_.clear(); }
    } restore{*this, tracker_};
    tracker_ = nullptr;
    exec_top(body, at.statement + 1);
    return std::move(out.text);
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
    if (!lazy_.empty()) materialize(n);
    for (auto it = chain_.rbegin(); it != chain_.rend(); ++it)
      if (const Value* v = (*it)->find(n)) return *v;
    return Value();
  }
  void assign(const std::string& n, Value v) {
    if (!lazy_.empty())
      lazy_.erase(std::remove_if(lazy_.begin(), lazy_.end(), [&](const Lazy& l) { return l.scope == chain_.back().get() && l.name == n; }),
                  lazy_.end());
    chain_.back()->set(n, std::move(v));
  }

  // A resumed render's messages[o:k] lists, made when first looked up: copying them for every
  // prefix would make a conversation quadratic in its turns again.
  struct Lazy {
    Dict* scope;
    std::string name;
    size_t from;
  };
  void materialize(const std::string& n) const {
    for (auto it = lazy_.begin(); it != lazy_.end();) {
      if (it->name != n) {
        ++it;
        continue;
      }
      const List& all = *lazy_source_;
      const auto end = all.begin() + static_cast<std::ptrdiff_t>(lazy_count_);
      it->scope->set(n, Value(List(all.begin() + static_cast<std::ptrdiff_t>(std::min(it->from, lazy_count_)), end)));
      it = lazy_.erase(it);
    }
  }

  // ---- statements ----
  // The template's top-level statements from `first` on; while recording, a top-level loop over
  // the messages is where prefixes can be resumed.
  void exec_top(const Body& body, size_t first) {
    for (size_t r = first; r < body.size(); ++r) {
      const Stmt& s = *body[r];
      if (tracker_ && s.kind == Stmt::Kind::kFor && !s.recursive) {
        exec_top_for(s, r);
      } else if (exec(s) != Flow::kNormal) {
        return;
      }
    }
  }

  void exec_top_for(const Stmt& s, size_t statement) {
    const Level level(*this, s.where);
    try {
      const Value items = eval_quiet(*s.exprs[0]);
      const int64_t offset = tracker_->offset_of(items);
      const RootLoop loop{statement, static_cast<size_t>(std::max<int64_t>(offset, 0))};
      exec_for(s, &items, 1, offset < 0 ? nullptr : &loop);
    } catch (const std::logic_error& e) {
      fail(s.where, e.what());
    }
  }

  // The top-level scope with its namespaces copied (one copy for names that share one).
  static std::shared_ptr<Dict> copy_scope(const Dict& scope) {
    auto copy = std::make_shared<Dict>();
    std::map<const Dict*, Value> copies;
    for (const auto& [k, v] : scope.items()) {
      if (v.kind() != Kind::kNamespace) {
        copy->set(k, v);
        continue;
      }
      auto [it, fresh] = copies.try_emplace(&v.as_dict());
      if (fresh) it->second = Value::namespace_of(v.as_dict());
      copy->set(k, it->second);
    }
    return copy;
  }

  // What a unit of a tracked loop changed: output written, namespaces written, a break.
  struct UnitStart {
    size_t output = 0;
    int64_t writes = 0;
  };
  UnitStart begin_unit(const RootLoop* root, size_t message) {
    if (!root) return {};
    tracker_->begin_unit(message);
    return {out_->text.size(), namespace_writes_};
  }
  void end_unit(const RootLoop* root, const UnitStart& start, bool broke) {
    if (root) tracker_->end_unit(broke || out_->text.size() != start.output || namespace_writes_ != start.writes);
  }

  void resume_point(size_t k, size_t statement) {
    if (k >= recording_->at.size() || !recording_->wanted[k] || !tracker_->resumable(k)) return;
    if ((recording_->kept_bytes += newly_kept_bytes(*chain_[1])) > kMaxResumeBytes) return;
    recording_->at[k] = {statement, out_->text.size(), steps_, copy_scope(*chain_[1]), !tracker_->generation_prompt_seen()};
  }
  // The strings and lists the namespaces of `scope` hold that no earlier resume point holds.
  size_t newly_kept_bytes(const Dict& scope) {
    size_t bytes = 0;
    for (const auto& [name, ns] : scope.items()) {
      if (ns.kind() != Kind::kNamespace) continue;
      for (const auto& [key, v] : ns.as_dict().items()) {
        if (v.is_string() && recording_->kept.insert(&v.as_string()).second) bytes += v.as_string().size();
        if (v.kind() == Kind::kList && recording_->kept.insert(&v.as_list()).second) bytes += v.as_list().size() * sizeof(Value);
      }
    }
    return bytes;
  }

  Flow exec(const Body& body) {
    for (const auto& s : body) {
      const Flow f = exec(*s);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  std::string capture(const Body& body) {
    std::string saved;
    std::swap(saved, out_->text);
    ++capturing_;
    exec(body);
    --capturing_;
    std::swap(saved, out_->text);
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
        check_size(s.where, out_->text.size() + s.text.size());
        out_->text += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        const Value v = eval(*s.exprs[0]);
        if (v.is_string()) {  // written as it is: a long message is not copied once more
          check_size(s.where, out_->text.size() + v.as_string().size());
          out_->text += v.as_string();
          return Flow::kNormal;
        }
        const std::string text = v.str();
        check_size(s.where, out_->text.size() + text.size());
        out_->text += text;
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
        const size_t start = out_->text.size();
        const Flow f = exec(s.bodies[0]);
        if (capturing_ == 0) out_->generation_spans.emplace_back(start, out_->text.size());
        return f;
      }
      case Stmt::Kind::kFilterBlock: {
        Arguments none;
        Value r;
        if (!apply_filter(s.text, Value(capture(s.bodies[0])), none, r))
          fail(s.where, "no filter named '" + s.text + "'", ErrorCode::kConfig);
        out_->text += r.str();
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
        out_->text += eval(*s.call).str();
        chain_.pop_back();
        return Flow::kNormal;
      }
    }
    return Flow::kNormal;
  }

  void exec_set(const Stmt& s) {
    // `set name = messages` (or a slice) names the list without looking into it.
    Value v = s.attribute.empty() && s.targets.empty() ? eval_quiet(*s.exprs[0]) : eval(*s.exprs[0]);
    if (!s.attribute.empty()) {
      const Value ns = lookup(s.text);
      if (ns.kind() != Kind::kNamespace)
        fail(s.where, fmt::format("'set {}.{}' needs '{}' to be a namespace()", s.text, s.attribute, s.text));
      if (tracker_) noted_write(ns, v);
      ns.namespace_attributes().set(s.attribute, std::move(v));
      return;
    }
    if (s.targets.empty()) return assign(s.text, std::move(v));
    const List items = iterate(v, s.where);
    if (items.size() != s.targets.size())
      fail(s.where, fmt::format("cannot unpack {} values into {} names", items.size(), s.targets.size()));
    for (size_t i = 0; i < items.size(); ++i) assign(s.targets[i], items[i]);
  }

  // Resuming copies the namespaces the top-level scope holds; a write elsewhere, or a namespace
  // stored in one, would not be copied.
  void noted_write(const Value& ns, const Value& v) {
    ++namespace_writes_;
    bool held = false;
    for (const auto& item : chain_[1]->items())
      held = held || (item.second.kind() == Kind::kNamespace && &item.second.as_dict() == &ns.as_dict());
    if (!held || v.kind() == Kind::kNamespace) tracker_->untracked_change();
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

  // `root`: a top-level loop over the messages, whose iterations (and filter tests) are units,
  // and whose iteration k is where the prefix of k messages can be resumed.
  void exec_for(const Stmt& s, const Value* given = nullptr, int depth = 1, const RootLoop* root = nullptr) {
    List items = iterate(given ? *given : eval(*s.exprs[0]), s.where);
    std::vector<size_t> message_of;  // root: the message of each item kept
    for (size_t i = 0; root && i < items.size(); ++i) message_of.push_back(root->offset + i);
    if (s.has_filter) {
      List kept;
      std::vector<size_t> kept_messages;
      for (size_t i = 0; i < items.size(); ++i) {
        const UnitStart unit = begin_unit(root, root ? message_of[i] : 0);
        chain_.push_back(std::make_shared<Dict>());
        bind_targets(s, items[i]);
        const bool keep = eval(*s.exprs[1]).truthy();
        chain_.pop_back();
        end_unit(root, unit, false);
        if (keep) kept.push_back(items[i]);
        if (keep && root) kept_messages.push_back(message_of[i]);
      }
      items = std::move(kept);
      message_of = std::move(kept_messages);
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
    const Dict* const outer_loop = loop_;
    if (root) loop_ = &loop;
    for (int64_t i = 0; i < n; ++i) {
      const size_t message = root ? message_of[static_cast<size_t>(i)] : 0;
      if (root && i > 0) resume_point(message, root->statement);
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
      const UnitStart unit = begin_unit(root, message);
      if (root) loop_next_message_ = i + 1 < n ? message_of[static_cast<size_t>(i + 1)] : message;
      const Flow f = exec(s.bodies[0]);
      chain_.pop_back();
      end_unit(root, unit, f == Flow::kBreak);
      if (f == Flow::kBreak) break;
    }
    loop_ = outer_loop;
  }
  std::string capture_for(const Stmt& s, const Value& items, int depth) {
    std::string saved;
    std::swap(saved, out_->text);
    ++capturing_;
    exec_for(s, &items, depth);
    --capturing_;
    std::swap(saved, out_->text);
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

  // ---- what a recorded render looks at (jinja/prefix_tracker.h) ----
  // A value used as a whole: the messages list (or a slice), or a tracked loop's object, tells the
  // count of the messages.
  Value eval(const Expr& e) {
    Value v = evaluate(e);
    if (tracker_ && (tracker_->offset_of(v) >= 0 || is_tracked_loop(v))) tracker_->observe_all();
    return v;
  }
  bool is_tracked_loop(const Value& v) const { return loop_ && v.kind() == Kind::kDict && &v.as_dict() == loop_; }

  // Where a list or a loop object is only named or looked into, not used as a whole: the operand
  // of an item or an attribute, of a slice, a loop's list, `set name = ...`.
  Value eval_quiet(const Expr& e) {
    if (!tracker_) return eval(e);
    if (e.kind == Expr::Kind::kName) {
      const Level level(*this, e.where);
      if (e.name == "add_generation_prompt") tracker_->observe_generation_prompt();
      return lookup(e.name);
    }
    if (e.kind != Expr::Kind::kSlice) return eval(e);
    const Level level(*this, e.where);
    const Value list = eval_quiet(*e.operands[0]);
    const int64_t offset = tracker_->offset_of(list);
    const Expr* start = e.operands[1].get();
    const bool tail_slice = start && start->kind == Expr::Kind::kLiteral && start->literal.kind() == Kind::kInt &&
                            start->literal.as_int() >= 0 && !e.operands[2] && !e.operands[3];
    if (offset >= 0 && !tail_slice) tracker_->observe_all();
    Value v = charged(slice(e, list), e.where);
    if (offset >= 0 && tail_slice)
      tracker_->track_list(v, static_cast<size_t>(offset + std::min<int64_t>(start->literal.as_int(), INT32_MAX)));
    return v;
  }

  // messages[i] looks at message i; loop.index does not look ahead, loop.last does.
  void observe_item(const Value& object, const Value& key) {
    const int64_t offset = tracker_->offset_of(object);
    if (offset >= 0) {
      if (key.kind() == Kind::kInt && key.as_int() >= 0)
        tracker_->observe(static_cast<size_t>(offset + std::min<int64_t>(key.as_int(), INT32_MAX)));
      else
        tracker_->observe_all();
    } else if (is_tracked_loop(object)) {
      static const char* const kBehind[] = {"index", "index0", "first", "previtem", "depth", "depth0", "cycle"};
      const bool behind =
          key.is_string() && std::any_of(std::begin(kBehind), std::end(kBehind), [&](const char* k) { return key.as_string() == k; });
      const bool next = key.is_string() && (key.as_string() == "last" || key.as_string() == "nextitem");
      if (next)  // whether a next item exists, and which: the next message the loop would take
        tracker_->observe(loop_next_message_);
      else if (!behind)
        tracker_->observe_all();
    }
  }

  Value evaluate(const Expr& e) {
    const Level level(*this, e.where);
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        if (tracker_ && e.name == "add_generation_prompt") tracker_->observe_generation_prompt();
        return lookup(e.name);
      case Expr::Kind::kAttr: {
        if (!tracker_) return attribute(e, eval(*e.operands[0]), e.name);
        const Value object = eval_quiet(*e.operands[0]);
        observe_item(object, Value(e.name));
        return attribute(e, object, e.name);
      }
      case Expr::Kind::kItem: {
        if (!tracker_) return item(e, eval(*e.operands[0]), eval(*e.operands[1]));
        const Value object = eval_quiet(*e.operands[0]);
        const Value key = eval(*e.operands[1]);
        observe_item(object, key);
        return item(e, object, key);
      }
      case Expr::Kind::kSlice:
        if (tracker_) return eval_quiet(e);
        return charged(slice(e, eval(*e.operands[0])), e.where);
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter:
        return call_filter(e);
      case Expr::Kind::kTest:
        // `add_generation_prompt is defined` does not read its value.
        if (tracker_ && (e.name == "defined" || e.name == "undefined") && e.operands.size() == 1 &&
            e.operands[0]->kind == Expr::Kind::kName) {
          const bool defined = !lookup(e.operands[0]->name).is_undefined();
          return Value((e.name == "defined" ? defined : !defined) != e.negated);
        }
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
  ChatRender* out_;
  std::shared_ptr<Dict> globals_;
  std::vector<std::shared_ptr<Dict>> chain_;
  int capturing_ = 0;
  int depth_ = 0;
  int64_t steps_ = 0;
  const int64_t max_steps_;
  // Recording (ChatTemplate::prefixes): null otherwise.
  Recording* recording_ = nullptr;
  PrefixTracker* tracker_ = nullptr;
  const Dict* loop_ = nullptr;    // the object of the tracked loop running now
  size_t loop_next_message_ = 0;  // the message of its next item (its own on the last)
  // Resuming: lists made on first use (see materialize).
  mutable std::vector<Lazy> lazy_;
  const List* lazy_source_ = nullptr;
  size_t lazy_count_ = 0;
  int64_t namespace_writes_ = 0;
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

namespace {
// The context with only the first `count` messages, and add_generation_prompt as given.
Dict with_messages(const Dict& context, size_t count, bool generation_prompt) {
  Dict d;
  for (const auto& [key, value] : context.items()) {
    if (key == "messages" && value.kind() == Kind::kList) {
      const List& all = value.as_list();
      d.set(key, Value(List(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(std::min(count, all.size())))));
    } else {
      d.set(key, value);
    }
  }
  d.set("add_generation_prompt", Value(generation_prompt));
  return d;
}
}  // namespace

struct ChatTemplate::PrefixRenders::Impl {
  const ChatTemplate::Impl* owner = nullptr;
  Dict context;
  std::unique_ptr<Recording> recording;
  ChatRender full;
  std::unique_ptr<Interpreter> interpreter;
  size_t resumed = 0, rendered = 0;
};

ChatTemplate::PrefixRenders::PrefixRenders() : impl_(std::make_unique<Impl>()) {}
ChatTemplate::PrefixRenders::~PrefixRenders() = default;
const ChatRender& ChatTemplate::PrefixRenders::full() const { return impl_->full; }
size_t ChatTemplate::PrefixRenders::resumed() const { return impl_->resumed; }
size_t ChatTemplate::PrefixRenders::rendered() const { return impl_->rendered; }

ChatTemplate::PrefixText ChatTemplate::PrefixRenders::prefix(size_t k, bool generation_prompt) {
  Impl& m = *impl_;
  if (k < m.recording->at.size()) {
    const ResumePoint& at = m.recording->at[k];
    if (at.top && (!generation_prompt || at.generation_prompt_unseen)) {
      ++m.resumed;
      return {at.output, m.interpreter->resume(m.owner->body, at, m.context, k, generation_prompt)};
    }
  }
  ++m.rendered;
  ChatRender out;
  Interpreter(m.owner->name, out, m.owner->max_steps).run(m.owner->body, with_messages(m.context, k, generation_prompt));
  size_t shared = 0;
  while (shared < out.text.size() && shared < m.full.text.size() && out.text[shared] == m.full.text[shared]) ++shared;
  return {shared, out.text.substr(shared)};
}

std::unique_ptr<ChatTemplate::PrefixRenders> ChatTemplate::prefixes(const Value& context, const std::vector<bool>& wanted) const {
  std::unique_ptr<PrefixRenders> p(new PrefixRenders());
  Impl& owner = *impl_;
  PrefixRenders::Impl& m = *p->impl_;
  m.owner = &owner;
  m.context = context.kind() == Value::Kind::kDict ? context.as_dict() : Dict();
  const Value* messages = m.context.find("messages");
  const size_t n = messages && messages->kind() == Value::Kind::kList ? messages->as_list().size() : 0;
  m.recording = std::make_unique<Recording>(n, wanted);
  if (n > 0) m.recording->tracker.track_list(*messages, 0);
  m.interpreter = std::make_unique<Interpreter>(owner.name, m.full, owner.max_steps);
  m.interpreter->record(m.recording.get());
  m.interpreter->run(owner.body, m.context);
  return p;
}

}  // namespace dstrain::text
