#include "dstrain/text/jinja/parser.h"

#include <fmt/format.h>

#include <cstring>
#include <set>

#include "dstrain/core/error.h"
#include "dstrain/text/jinja/builtins.h"
#include "dstrain/text/jinja/limits.h"

namespace dstrain::text::jinja {
namespace {

[[noreturn]] void fail(const std::string& name, Where w, const std::string& what) {
  throw Error(ErrorCode::kConfig, fmt::format("{}:{}:{}: {}", name, w.line, w.column, what),
              "dstrain renders the Jinja subset that Hugging Face chat templates use; rewrite that construct, or pass another "
              "template with --chat-template FILE");
}

// Counts one level of nesting while it lives; past kMaxParseDepth, the template is refused (the
// parser recurses once per level: 10,000 '(' would overflow the stack).
class Nesting {
 public:
  Nesting(int& depth, const std::string& name, Where w) : depth_(depth) {
    if (++depth_ > kMaxParseDepth) {
      --depth_;
      fail(name, w, fmt::format("nested more than {} levels deep", kMaxParseDepth));
    }
  }
  ~Nesting() { --depth_; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;

 private:
  int& depth_;
};

// ---- segments: text, {{ expression }}, {% statement %}; comments dropped ----
struct Segment {
  enum class Kind { kText, kVar, kBlock } kind;
  std::string text;  // kText: the output; kVar/kBlock: the tag's content
  Where where;       // where the content starts
};

std::string normalise_newlines(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

class Scanner {
 public:
  Scanner(const std::string& src, const std::string& name, const ParseOptions& o) : s_(src), name_(name), o_(o) {}

  std::vector<Segment> run() {
    std::vector<Segment> out;
    size_t pos = 0;
    bool line_starting = true, strip_next = false;
    while (pos <= s_.size()) {
      size_t open = find_open(pos);
      std::string text = s_.substr(pos, (open == std::string::npos ? s_.size() : open) - pos);
      if (strip_next)
        text.erase(0, text.find_first_not_of(" \t\n\r\f\v") == std::string::npos ? text.size() : text.find_first_not_of(" \t\n\r\f\v"));
      if (open == std::string::npos) {
        push_text(out, text, pos);
        break;
      }
      const char type = s_[open + 1];  // '{', '%' or '#'
      const char modifier = open + 2 < s_.size() ? s_[open + 2] : 0;
      if (modifier == '-') {
        const size_t keep = text.find_last_not_of(" \t\n\r\f\v");
        text.erase(keep == std::string::npos ? 0 : keep + 1);
      } else if (type != '{' && modifier != '+' && o_.lstrip_blocks) {
        const size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l > 0 || line_starting) && text.find_first_not_of(" \t", l) == std::string::npos) text.erase(l);
      }
      push_text(out, text, pos);
      const size_t content = open + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      const Where where = where_of(content);
      size_t close = type == '#' ? s_.find("#}", content) : find_close(content, type == '{' ? '}' : '%', where);
      if (close == std::string::npos) fail(name_, where_of(open), type == '#' ? "a comment is never closed (#})" : "a tag is never closed");
      const char end_mod = close > content && (s_[close - 1] == '-' || s_[close - 1] == '+') ? s_[close - 1] : 0;
      const size_t content_end = end_mod ? close - 1 : close;
      if (type == '{') out.push_back({Segment::Kind::kVar, s_.substr(content, content_end - content), where});
      if (type == '%') out.push_back({Segment::Kind::kBlock, s_.substr(content, content_end - content), where});
      pos = close + 2;
      strip_next = end_mod == '-';
      line_starting = false;
      if (type != '{' && end_mod == 0 && o_.trim_blocks && pos < s_.size() && s_[pos] == '\n') ++pos, line_starting = true;
      if (type == '%' && is_raw(out.back().text)) fail(name_, where, "{% raw %} is not supported");
    }
    return out;
  }

 private:
  size_t find_open(size_t from) const {
    for (size_t p = s_.find('{', from); p != std::string::npos; p = s_.find('{', p + 1))
      if (p + 1 < s_.size() && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#')) return p;
    return std::string::npos;
  }
  // The closing "}}" or "%}" of a tag, outside string literals.
  size_t find_close(size_t from, char first, Where where) const {
    char quote = 0;
    for (size_t p = from; p + 1 < s_.size(); ++p) {
      const char c = s_[p];
      if (quote) {
        if (c == '\\')
          ++p;
        else if (c == quote)
          quote = 0;
      } else if (c == '\'' || c == '"') {
        quote = c;
      } else if (c == first && s_[p + 1] == '}') {
        return p;
      }
    }
    if (quote) fail(name_, where, "a string literal is never closed");
    return std::string::npos;
  }
  static bool is_raw(const std::string& content) {
    const size_t b = content.find_first_not_of(" \t\n");
    return b != std::string::npos && content.compare(b, 3, "raw") == 0 &&
           (b + 3 == content.size() || std::isspace(static_cast<unsigned char>(content[b + 3])));
  }
  void push_text(std::vector<Segment>& out, const std::string& text, size_t at) const {
    if (!text.empty()) out.push_back({Segment::Kind::kText, text, where_of(at)});
  }
  Where where_of(size_t offset) const {
    Where w;
    for (size_t i = 0; i < offset && i < s_.size(); ++i) {
      if (s_[i] == '\n')
        ++w.line, w.column = 1;
      else if ((static_cast<unsigned char>(s_[i]) & 0xC0) != 0x80)
        ++w.column;
    }
    return w;
  }
  const std::string& s_;
  const std::string& name_;
  ParseOptions o_;
};

// ---- tokens inside a tag ----
struct Token {
  enum class Kind { kName, kInt, kFloat, kString, kOp, kEnd } kind;
  std::string text;  // kName/kOp: the spelling; kString: the unescaped value
  int64_t i = 0;
  double d = 0;
  Where where;
};

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80)
    out += static_cast<char>(cp);
  else if (cp < 0x800)
    out += static_cast<char>(0xC0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3F));
  else if (cp < 0x10000)
    out += static_cast<char>(0xE0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
        out += static_cast<char>(0x80 | (cp & 0x3F));
  else
    out += static_cast<char>(0xF0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), out += static_cast<char>(0x80 | (cp & 0x3F));
}

std::vector<Token> tokenize(const std::string& src, Where start, const std::string& name) {
  std::vector<Token> out;
  Where w = start;
  auto advance = [&](size_t& i, size_t n) {
    for (size_t k = 0; k < n && i < src.size(); ++k, ++i) {
      if (src[i] == '\n')
        ++w.line, w.column = 1;
      else if ((static_cast<unsigned char>(src[i]) & 0xC0) != 0x80)
        ++w.column;
    }
  };
  static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                     ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
  for (size_t i = 0; i < src.size();) {
    const char c = src[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      advance(i, 1);
      continue;
    }
    Token t{Token::Kind::kOp, "", 0, 0, w};
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_')) ++j;
      t.kind = Token::Kind::kName, t.text = src.substr(i, j - i);
      advance(i, j - i);
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '_')) ++j;
      bool is_float = false;
      if (j + 1 < src.size() && src[j] == '.' && std::isdigit(static_cast<unsigned char>(src[j + 1]))) {
        is_float = true, ++j;
        while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
          is_float = true, j = k;
          while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
        }
      }
      std::string digits;
      for (size_t k = i; k < j; ++k)
        if (src[k] != '_') digits += src[k];
      try {
        if (is_float)
          t.kind = Token::Kind::kFloat, t.d = std::stod(digits);
        else
          t.kind = Token::Kind::kInt, t.i = std::stoll(digits);
      } catch (const std::out_of_range&) {
        fail(name, w, fmt::format("the number {} is out of range (dstrain's templates hold integers of 64 bits and doubles)", digits));
      }
      advance(i, j - i);
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      for (; j < src.size() && src[j] != c; ++j) {
        if (src[j] != '\\' || j + 1 >= src.size()) {
          value += src[j];
          continue;
        }
        const char e = src[++j];
        static const std::string kSimple = "nrtabfv0\\'\"";
        static const char kValues[] = {'\n', '\r', '\t', '\a', '\b', '\f', '\v', '\0', '\\', '\'', '"'};
        if (const size_t k = kSimple.find(e); k != std::string::npos) {
          value += kValues[k];
        } else if (e == 'x' || e == 'u' || e == 'U') {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (j + n >= src.size() + 0 && j + n > src.size() - 1) fail(name, w, "a truncated \\" + std::string(1, e) + " escape");
          const std::string hex = src.substr(j + 1, n);
          if (hex.size() != n || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
            fail(name, w, "a \\" + std::string(1, e) + " escape needs " + std::to_string(n) + " hex digits");
          const auto cp = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
          if (cp > 0x10FFFF) fail(name, w, fmt::format("\\{} escape: U+{:X} is beyond Unicode", e, cp));
          append_utf8(value, cp);
          j += n;
        } else if (e == '\n') {
          // a backslash-newline continues the line
        } else {
          value += '\\', value += e;
        }
      }
      if (j >= src.size()) fail(name, w, "a string literal is never closed");
      t.kind = Token::Kind::kString, t.text = value;
      advance(i, j + 1 - i);
    } else {
      const char* op = nullptr;
      for (const char* o : kOps)
        if (src.compare(i, std::strlen(o), o) == 0) {
          op = o;
          break;
        }
      if (!op) fail(name, w, fmt::format("unexpected character '{}'", c));
      t.text = op;
      advance(i, std::strlen(op));
    }
    out.push_back(std::move(t));
  }
  out.push_back({Token::Kind::kEnd, "", 0, 0, w});
  return out;
}

// ---- expressions ----
class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, const std::string& name) : t_(std::move(tokens)), name_(name) {}
  const Token& peek(size_t ahead = 0) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
  bool at_end() const { return peek().kind == Token::Kind::kEnd; }
  bool is_op(const char* op, size_t ahead = 0) const { return peek(ahead).kind == Token::Kind::kOp && peek(ahead).text == op; }
  bool is_name(const char* n, size_t ahead = 0) const { return peek(ahead).kind == Token::Kind::kName && peek(ahead).text == n; }
  const Token& next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(name_, peek().where, fmt::format("expected '{}'{}", op, describe_next()));
    ++pos_;
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::kName) fail(name_, peek().where, "expected a name" + describe_next());
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(name_, peek().where, "unexpected" + describe_next());
  }
  std::string describe_next() const {
    if (at_end()) return " (at the end of the tag)";
    return fmt::format(", not '{}'", peek().kind == Token::Kind::kString ? "'" + peek().text + "'"
                                     : peek().kind == Token::Kind::kInt  ? std::to_string(peek().i)
                                                                         : peek().text);
  }
  Where where() const { return peek().where; }
  const std::string& name() const { return name_; }

  // expression := or_expr ['if' or_expr ['else' expression]]
  ExprPtr expression(bool with_condition = true) {
    const Nesting level(depth_, name_, where());
    ExprPtr e = or_expr();
    if (with_condition && is_name("if")) {
      auto c = std::make_unique<Expr>(Expr::Kind::kCond, e->where);
      next();
      ExprPtr test = or_expr();
      c->operands.push_back(std::move(test));
      c->operands.push_back(std::move(e));
      if (is_name("else"))
        next(), c->operands.push_back(expression());
      else
        c->has_else = false;
      return c;
    }
    return e;
  }
  // A comma-separated list is a tuple (for `set a, b = ...` and `for` iterables).
  ExprPtr tuple_or_expression() {
    ExprPtr first = expression();
    if (!is_op(",")) return first;
    auto t = std::make_unique<Expr>(Expr::Kind::kTuple, first->where);
    t->operands.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (at_end() || is_op(")") || is_op("%")) break;
      t->operands.push_back(expression());
    }
    return t;
  }

 private:
  ExprPtr binary(ExprPtr l, const std::string& op, ExprPtr r) {
    auto b = std::make_unique<Expr>(Expr::Kind::kBinary, l->where);
    b->name = op;
    b->operands.push_back(std::move(l));
    b->operands.push_back(std::move(r));
    return b;
  }
  ExprPtr or_expr() {
    ExprPtr l = and_expr();
    while (is_name("or")) next(), l = binary(std::move(l), "or", and_expr());
    return l;
  }
  ExprPtr and_expr() {
    ExprPtr l = not_expr();
    while (is_name("and")) next(), l = binary(std::move(l), "and", not_expr());
    return l;
  }
  ExprPtr not_expr() {
    const Nesting level(depth_, name_, where());
    if (is_name("not")) {
      auto u = std::make_unique<Expr>(Expr::Kind::kUnary, where());
      next();
      u->name = "not";
      u->operands.push_back(not_expr());
      return u;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr l = concat();
    for (;;) {
      static const char* const kCmp[] = {"==", "!=", "<", ">", "<=", ">="};
      bool matched = false;
      for (const char* op : kCmp)
        if (is_op(op)) next(), l = binary(std::move(l), op, concat()), matched = true;
      if (matched) continue;
      if (is_name("in"))
        next(), l = binary(std::move(l), "in", concat());
      else if (is_name("not") && is_name("in", 1))
        next(), next(), l = binary(std::move(l), "not in", concat());
      else
        return l;
    }
  }
  ExprPtr concat() {
    ExprPtr l = additive();
    while (is_op("~")) next(), l = binary(std::move(l), "~", additive());
    return l;
  }
  ExprPtr additive() {
    ExprPtr l = multiplicative();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      l = binary(std::move(l), op, multiplicative());
    }
    return l;
  }
  ExprPtr multiplicative() {
    ExprPtr l = unary();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      l = binary(std::move(l), op, unary());
    }
    return l;
  }
  ExprPtr unary() {
    const Nesting level(depth_, name_, where());
    if (is_op("-") || is_op("+")) {
      auto u = std::make_unique<Expr>(Expr::Kind::kUnary, where());
      u->name = next().text;
      u->operands.push_back(unary());
      return u;
    }
    return power();
  }
  ExprPtr power() {
    ExprPtr l = filtered(postfix(primary()));
    while (is_op("**")) next(), l = binary(std::move(l), "**", filtered(postfix(primary())));
    return l;
  }
  void call_arguments(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == Token::Kind::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        e.keywords.emplace_back(std::move(key), expression());
      } else {
        if (!e.keywords.empty()) fail(name_, where(), "a positional argument after a keyword argument");
        e.operands.push_back(expression());
      }
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }
  // Filters and tests bind tighter than arithmetic: `a | length + 1`, `x is defined and ...`.
  ExprPtr filtered(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        next();
        auto f = std::make_unique<Expr>(Expr::Kind::kFilter, where());
        f->name = expect_name();
        if (!is_filter(f->name)) fail(name_, f->where, fmt::format("no filter named '{}' (or not one dstrain renders)", f->name));
        f->operands.push_back(std::move(e));
        if (is_op("(")) call_arguments(*f);
        e = postfix(std::move(f));
      } else if (is_name("is")) {
        next();
        auto t = std::make_unique<Expr>(Expr::Kind::kTest, where());
        if (is_name("not")) next(), t->negated = true;
        t->name = peek().kind == Token::Kind::kName                        ? next().text
                  : is_op("==") || is_op("!=") || is_op("<") || is_op(">") ? next().text
                                                                           : expect_name();
        if (!is_test(t->name)) fail(name_, t->where, fmt::format("no test named '{}' (or not one dstrain renders)", t->name));
        t->operands.push_back(std::move(e));
        if (is_op("(")) {
          call_arguments(*t);
        } else if (peek().kind == Token::Kind::kString || peek().kind == Token::Kind::kInt || peek().kind == Token::Kind::kFloat ||
                   (peek().kind == Token::Kind::kName && !is_name("and") && !is_name("or") && !is_name("else") && !is_name("if") &&
                    !is_name("in") && !is_name("not"))) {
          t->operands.push_back(postfix(primary()));  // `is divisibleby 3`, `is sameas none`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        next();
        auto a = std::make_unique<Expr>(Expr::Kind::kAttr, where());
        if (peek().kind == Token::Kind::kInt)
          a->name = std::to_string(next().i);
        else
          a->name = expect_name();
        a->operands.push_back(std::move(e));
        e = std::move(a);
      } else if (is_op("[")) {
        const Where w = where();
        next();
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = expression();
          if (k < 2 && is_op(":")) {
            next(), slice = true;
            continue;
          }
          break;
        }
        expect_op("]");
        if (!slice && !parts[0]) fail(name_, w, "a subscript needs an index: x[] is not an expression");
        auto s = std::make_unique<Expr>(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, w);
        s->operands.push_back(std::move(e));
        for (auto& p : parts) s->operands.push_back(std::move(p));  // kItem: [obj, key, null, null]
        e = std::move(s);
      } else if (is_op("(")) {
        auto c = std::make_unique<Expr>(Expr::Kind::kCall, e->where);  // errors point at the callee
        c->operands.push_back(std::move(e));
        call_arguments(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  ExprPtr primary() {
    const Token& tok = peek();
    const Where w = tok.where;
    auto literal = [&](Value v) {
      auto l = std::make_unique<Expr>(Expr::Kind::kLiteral, w);
      l->literal = std::move(v);
      return l;
    };
    switch (tok.kind) {
      case Token::Kind::kInt:
        return next(), literal(Value(tok.i));
      case Token::Kind::kFloat:
        return next(), literal(Value(tok.d));
      case Token::Kind::kString: {
        std::string s = next().text;
        while (peek().kind == Token::Kind::kString) s += next().text;  // adjacent literals concatenate
        return literal(Value(s));
      }
      case Token::Kind::kName: {
        const std::string n = next().text;
        if (n == "true" || n == "True") return literal(Value(true));
        if (n == "false" || n == "False") return literal(Value(false));
        if (n == "none" || n == "None") return literal(Value::none());
        auto e = std::make_unique<Expr>(Expr::Kind::kName, w);
        e->name = n;
        return e;
      }
      case Token::Kind::kOp:
        break;
      case Token::Kind::kEnd:
        fail(name_, w, "an expression is missing");
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) return next(), std::make_unique<Expr>(Expr::Kind::kTuple, w);
      ExprPtr e = tuple_or_expression();
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      next();
      auto l = std::make_unique<Expr>(Expr::Kind::kList, w);
      while (!is_op("]")) {
        l->operands.push_back(expression());
        if (!is_op(",")) break;
        next();
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      next();
      auto d = std::make_unique<Expr>(Expr::Kind::kDict, w);
      while (!is_op("}")) {
        d->operands.push_back(expression());
        expect_op(":");
        d->operands.push_back(expression());
        if (!is_op(",")) break;
        next();
      }
      expect_op("}");
      return d;
    }
    fail(name_, w, "unexpected '" + tok.text + "'");
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  const std::string& name_;
  int depth_ = 0;
};

// ---- statements ----
class Parser {
 public:
  Parser(std::vector<Segment> segments, const std::string& name) : seg_(std::move(segments)), name_(name) {}

  Body parse_all() {
    Body body = parse_body({});
    if (pos_ < seg_.size()) fail(name_, seg_[pos_].where, "unexpected '" + first_word(seg_[pos_]) + "'");
    return body;
  }

 private:
  static std::string first_word(const Segment& s) {
    size_t b = s.text.find_first_not_of(" \t\n");
    if (b == std::string::npos) return "";
    size_t e = b;
    while (e < s.text.size() && (std::isalnum(static_cast<unsigned char>(s.text[e])) || s.text[e] == '_')) ++e;
    return s.text.substr(b, e - b);
  }
  ExprParser tag(const Segment& s) const { return ExprParser(tokenize(s.text, s.where, name_), name_); }

  // Statements until a block tag whose first word is in `until` (left unconsumed) or the end.
  Body parse_body(const std::set<std::string>& until) {
    Body body;
    while (pos_ < seg_.size()) {
      const Segment& s = seg_[pos_];
      if (s.kind == Segment::Kind::kText) {
        auto t = std::make_unique<Stmt>(Stmt::Kind::kText, s.where);
        t->text = s.text;
        body.push_back(std::move(t));
        ++pos_;
        continue;
      }
      if (s.kind == Segment::Kind::kVar) {
        ExprParser p = tag(s);
        auto o = std::make_unique<Stmt>(Stmt::Kind::kOutput, s.where);
        o->exprs.push_back(p.expression());
        p.expect_end();
        body.push_back(std::move(o));
        ++pos_;
        continue;
      }
      const std::string word = first_word(s);
      if (until.count(word)) return body;
      ++pos_;
      body.push_back(statement(word, s));
    }
    if (!until.empty()) {
      const Where w = seg_.empty() ? Where{} : seg_.back().where;
      fail(name_, w, fmt::format("the template ends inside a block: expected {{% {} %}}", *until.begin()));
    }
    return body;
  }
  // Consumes the end tag parse_body stopped at ({% endif %}, ...): nothing may follow its keyword.
  void close_block() {
    ExprParser p = tag(seg_[pos_++]);
    p.expect_name();
    p.expect_end();
  }
  StmtPtr statement(const std::string& word, const Segment& s) {
    const Nesting level(depth_, name_, s.where);
    ExprParser p = tag(s);
    const Where at = p.where();  // the keyword's
    p.next();
    if (word == "if") return if_statement(p, s);
    if (word == "for") return for_statement(p, s);
    if (word == "set") return set_statement(p, s);
    if (word == "macro") return macro_statement(p, s);
    if (word == "break" || word == "continue") {
      p.expect_end();
      return std::make_unique<Stmt>(word == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, s.where);
    }
    if (word == "generation") {  // transformers' AssistantTracker: {% generation %}...{% endgeneration %}
      p.expect_end();
      auto g = std::make_unique<Stmt>(Stmt::Kind::kGeneration, s.where);
      g->bodies.push_back(parse_body({"endgeneration"}));
      close_block();
      return g;
    }
    if (word == "filter") {
      auto f = std::make_unique<Stmt>(Stmt::Kind::kFilterBlock, s.where);
      f->text = p.expect_name();
      if (!is_filter(f->text)) fail(name_, s.where, fmt::format("no filter named '{}' (or not one dstrain renders)", f->text));
      p.expect_end();
      f->bodies.push_back(parse_body({"endfilter"}));
      close_block();
      return f;
    }
    if (word == "call") {
      auto c = std::make_unique<Stmt>(Stmt::Kind::kCallBlock, s.where);
      c->call = p.expression();
      p.expect_end();
      c->bodies.push_back(parse_body({"endcall"}));
      close_block();
      return c;
    }
    fail(name_, at, word.empty() ? "an empty {% %} tag" : fmt::format("'{{% {} %}}' is not supported", word));
  }
  StmtPtr if_statement(ExprParser& p, const Segment& s) {
    auto st = std::make_unique<Stmt>(Stmt::Kind::kIf, s.where);
    st->exprs.push_back(p.expression());
    p.expect_end();
    for (;;) {
      st->bodies.push_back(parse_body({"elif", "else", "endif"}));
      const Segment& end = seg_[pos_++];
      ExprParser q = tag(end);
      const std::string w = q.expect_name();
      if (w == "elif") {
        st->exprs.push_back(q.expression());
        q.expect_end();
        continue;
      }
      q.expect_end();
      if (w == "else") {
        st->bodies.push_back(parse_body({"endif"}));
        close_block();
      }
      return st;
    }
  }
  StmtPtr for_statement(ExprParser& p, const Segment& s) {
    auto st = std::make_unique<Stmt>(Stmt::Kind::kFor, s.where);
    bool parens = p.is_op("(");
    if (parens) p.next();
    st->targets.push_back(p.expect_name());
    while (p.is_op(",")) p.next(), st->targets.push_back(p.expect_name());
    if (parens) p.expect_op(")");
    if (!p.is_name("in")) p.expect_op("in");
    p.next();
    st->exprs.push_back(p.expression(/*with_condition=*/false));
    if (p.is_name("if")) p.next(), st->exprs.push_back(p.expression(false)), st->has_filter = true;
    if (p.is_name("recursive")) p.next(), st->recursive = true;
    p.expect_end();
    st->bodies.push_back(parse_body({"else", "endfor"}));
    const Segment& end = seg_[pos_++];
    ExprParser q = tag(end);
    const std::string w = q.expect_name();
    q.expect_end();
    st->bodies.emplace_back();
    if (w == "else") {
      st->bodies.back() = parse_body({"endfor"});
      close_block();
    }
    return st;
  }
  StmtPtr set_statement(ExprParser& p, const Segment& s) {
    const std::string first = p.expect_name();
    if (p.is_op(".")) {
      p.next();
      auto st = std::make_unique<Stmt>(Stmt::Kind::kSet, s.where);
      st->text = first, st->attribute = p.expect_name();
      p.expect_op("=");
      st->exprs.push_back(p.tuple_or_expression());
      p.expect_end();
      return st;
    }
    std::vector<std::string> names{first};
    while (p.is_op(",")) p.next(), names.push_back(p.expect_name());
    if (p.at_end() && names.size() == 1) {  // {% set x %}...{% endset %}
      auto st = std::make_unique<Stmt>(Stmt::Kind::kSetBlock, s.where);
      st->text = first;
      st->bodies.push_back(parse_body({"endset"}));
      close_block();
      return st;
    }
    p.expect_op("=");
    auto st = std::make_unique<Stmt>(Stmt::Kind::kSet, s.where);
    st->text = first;
    if (names.size() > 1) st->targets = names;
    st->exprs.push_back(p.tuple_or_expression());
    p.expect_end();
    return st;
  }
  StmtPtr macro_statement(ExprParser& p, const Segment& s) {
    auto st = std::make_unique<Stmt>(Stmt::Kind::kMacro, s.where);
    st->text = p.expect_name();
    p.expect_op("(");
    while (!p.is_op(")")) {
      st->targets.push_back(p.expect_name());
      if (p.is_op("="))
        p.next(), st->exprs.push_back(p.expression());
      else
        st->exprs.push_back(nullptr);
      if (!p.is_op(",")) break;
      p.next();
    }
    p.expect_op(")");
    p.expect_end();
    st->bodies.push_back(parse_body({"endmacro"}));
    close_block();
    return st;
  }

  std::vector<Segment> seg_;
  size_t pos_ = 0;
  const std::string& name_;
  int depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source, const std::string& name, const ParseOptions& options) {
  const std::string normalised = normalise_newlines(source);
  return Parser(Scanner(normalised, name, options).run(), name).parse_all();
}

}  // namespace dstrain::text::jinja
