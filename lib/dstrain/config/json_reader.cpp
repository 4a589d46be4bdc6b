// A small JSON reader with the leniencies of DeepSpeed's hjson loader (comments, trailing commas)
// and the strictness it adds (duplicate keys rejected). Hand-written because nlohmann neither
// reports where a value was written nor rejects duplicates.
#include <fmt/format.h>

#include <cctype>
#include <set>

#include "dstrain/config/node.h"

namespace dstrain::config {
namespace {

class JsonReader {
 public:
  JsonReader(const std::string& text, const std::string& file, std::vector<std::string>& problems)
      : s_(text), file_(file), problems_(problems) {}

  Node document() {
    skip_space();
    Node root = value(0);
    skip_space();
    if (ok_ && pos_ < s_.size()) error("unexpected text after the end of the document");
    return root;
  }

 private:
  static constexpr int kMaxDepth = 64;

  Location here() const { return {file_, line_, col_}; }

  void error(const std::string& message) {
    if (ok_) problems_.push_back(fmt::format("{}: {}", here().str(), message));
    ok_ = false;  // one syntax error per document: what follows it is noise
  }

  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void advance() {
    if (pos_ >= s_.size()) return;
    if (s_[pos_] == '\n')
      ++line_, col_ = 1;
    else
      ++col_;
    ++pos_;
  }

  void skip_space() {
    while (ok_ && pos_ < s_.size()) {
      const char c = s_[pos_];
      if (std::isspace(static_cast<unsigned char>(c))) {
        advance();
      } else if (c == '#' || (c == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '/')) {
        while (pos_ < s_.size() && s_[pos_] != '\n') advance();
      } else if (c == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '*') {
        const Location start = here();
        advance(), advance();
        while (pos_ + 1 < s_.size() && !(s_[pos_] == '*' && s_[pos_ + 1] == '/')) advance();
        if (pos_ + 1 >= s_.size()) {
          problems_.push_back(fmt::format("{}: unterminated /* comment", start.str()));
          ok_ = false;
          return;
        }
        advance(), advance();
      } else {
        return;
      }
    }
  }

  Node value(int depth) {
    Node n;
    n.where = here();
    if (depth > kMaxDepth) {
      error("nesting is deeper than 64 levels");
      return n;
    }
    const char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      n.kind = Node::Kind::kString;
      n.text = string();
      return n;
    }
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      n.kind = Node::Kind::kNumber;
      n.text = number();
      return n;
    }
    for (const char* word : {"true", "false", "null"}) {
      if (s_.compare(pos_, std::char_traits<char>::length(word), word) == 0) {
        for (size_t i = 0; word[i]; ++i) advance();
        n.kind = word[0] == 'n' ? Node::Kind::kNull : Node::Kind::kBool;
        n.text = word;
        return n;
      }
    }
    if (pos_ >= s_.size())
      error("unexpected end of the document: a value is missing");
    else
      error(fmt::format("unexpected character '{}': expected a value", c));
    return n;
  }

  Node object(int depth) {
    Node n;
    n.kind = Node::Kind::kObject;
    n.where = here();
    advance();  // {
    std::set<std::string> seen;
    for (;;) {
      skip_space();
      if (!ok_) return n;
      if (peek() == '}') {
        advance();
        return n;
      }
      if (peek() != '"') {
        error(peek() ? fmt::format("expected a quoted key or '}}', found '{}'", peek())
                     : "unexpected end of the document inside an object");
        return n;
      }
      const Location key_at = here();
      std::string key = string();
      skip_space();
      if (peek() != ':') {
        error(fmt::format("expected ':' after key \"{}\"", key));
        return n;
      }
      advance();
      skip_space();
      Node v = value(depth + 1);
      if (!ok_) return n;
      if (!seen.insert(key).second) {
        problems_.push_back(fmt::format("{}: duplicate key \"{}\" (DeepSpeed rejects duplicates; keep one)", key_at.str(), key));
      } else {
        n.members.emplace_back(std::move(key), std::move(v));
        n.key_locations.push_back(key_at);
      }
      skip_space();
      if (peek() == ',')
        advance();  // a trailing comma before '}' is fine
      else if (peek() != '}') {
        error(peek() ? fmt::format("expected ',' or '}}', found '{}'", peek()) : "unexpected end of the document inside an object");
        return n;
      }
    }
  }

  Node array(int depth) {
    Node n;
    n.kind = Node::Kind::kArray;
    n.where = here();
    advance();  // [
    for (;;) {
      skip_space();
      if (!ok_) return n;
      if (peek() == ']') {
        advance();
        return n;
      }
      n.items.push_back(value(depth + 1));
      if (!ok_) return n;
      skip_space();
      if (peek() == ',')
        advance();
      else if (peek() != ']') {
        error(peek() ? fmt::format("expected ',' or ']', found '{}'", peek()) : "unexpected end of the document inside a list");
        return n;
      }
    }
  }

  std::string string() {
    advance();  // opening quote
    std::string out;
    while (ok_) {
      if (pos_ >= s_.size() || peek() == '\n') {
        error("unterminated string");
        break;
      }
      const char c = peek();
      advance();
      if (c == '"') break;
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = peek();
      advance();
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = peek();
            if (!std::isxdigit(static_cast<unsigned char>(h))) {
              error("bad \\u escape in string");
              return out;
            }
            code = code * 16 + static_cast<unsigned>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
            advance();
          }
          // UTF-8 encode (surrogate pairs are kept as two code points: config keys are ASCII).
          if (code < 0x80)
            out += static_cast<char>(code);
          else if (code < 0x800)
            out += static_cast<char>(0xC0 | (code >> 6)), out += static_cast<char>(0x80 | (code & 0x3F));
          else
            out += static_cast<char>(0xE0 | (code >> 12)), out += static_cast<char>(0x80 | ((code >> 6) & 0x3F)),
                out += static_cast<char>(0x80 | (code & 0x3F));
          break;
        }
        default:
          error(fmt::format("bad escape '\\{}' in string", e));
          return out;
      }
    }
    return out;
  }

  std::string number() {
    const size_t start = pos_;
    if (peek() == '-') advance();
    auto digits = [&] {
      const size_t from = pos_;
      while (std::isdigit(static_cast<unsigned char>(peek()))) advance();
      return pos_ > from;
    };
    bool ok = digits();
    if (peek() == '.') advance(), ok = digits() && ok;
    if (peek() == 'e' || peek() == 'E') {
      advance();
      if (peek() == '+' || peek() == '-') advance();
      ok = digits() && ok;
    }
    if (!ok) error(fmt::format("malformed number '{}'", s_.substr(start, pos_ - start)));
    return s_.substr(start, pos_ - start);
  }

  const std::string& s_;
  std::string file_;
  std::vector<std::string>& problems_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
  bool ok_ = true;
};

}  // namespace

Node parse_json_with_comments(const std::string& text, const std::string& file, std::vector<std::string>& problems) {
  return JsonReader(text, file, problems).document();
}

}  // namespace dstrain::config
