// The chat-template interpreter's parts that need no Python to check: Python's str/repr of values,
// json.dumps, whitespace control, scoping, and refusals with line and column. (text.chat_template
// compares whole templates with transformers.)
#include "catch_torch.h"
#include "dstrain/core/error.h"
#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/jinja.h"

using dstrain::text::ChatTemplate;
using dstrain::text::jinja::Dict;
using dstrain::text::jinja::List;
using dstrain::text::jinja::Value;

namespace {

std::string render(const std::string& source, const std::string& context_json = "[]") {
  const dstrain::text::ChatTemplateSource src{source, "t.jinja", "<s>", "</s>"};
  return ChatTemplate(source, "t.jinja").render(dstrain::text::chat_context(context_json, src, false)).text;
}

}  // namespace

TEST_CASE("values print as Python prints them", "[text]") {
  CHECK(Value::none().str() == "None");
  CHECK(Value(true).str() == "True");
  CHECK(Value(1.0).str() == "1.0");
  CHECK(Value(0.1).str() == "0.1");
  CHECK(Value(1e16).str() == "1e+16");
  CHECK(Value(1e-5).str() == "1e-05");
  CHECK(Value(List{Value("a"), Value(int64_t{1}), Value::none()}).str() == "['a', 1, None]");
  CHECK(Value("it's").repr() == "\"it's\"");
  Dict d;
  d.set("k", Value("v"));
  d.set("n", Value(2.5));
  CHECK(Value(d).str() == "{'k': 'v', 'n': 2.5}");
  CHECK(dstrain::text::jinja::to_json(Value(d), -1, false) == "{\"k\": \"v\", \"n\": 2.5}");
  CHECK(dstrain::text::jinja::to_json(Value(d), 2, false) == "{\n  \"k\": \"v\",\n  \"n\": 2.5\n}");
  CHECK(dstrain::text::jinja::to_json(Value("é\n\"\x01"), -1, false) == "\"é\\n\\\"\\u0001\"");
}

TEST_CASE("whitespace control follows Jinja2 with trim_blocks and lstrip_blocks", "[text]") {
  CHECK(render("a\n  {% if true %}\nb\n  {% endif %}\nc") == "a\nb\nc");
  CHECK(render("a  {%- if true -%}  b  {%- endif %}") == "ab");
  CHECK(render("x\n  {%+ if true %}y{% endif +%}\nz") == "x\n  y\nz");
  CHECK(render("{{ 'v' }}\n{# c #}\nw\n") == "v\nw");  // one trailing newline dropped
  CHECK(render("a\r\nb") == "a\nb");
}

TEST_CASE("a for loop's body is its own scope; namespaces carry values out", "[text]") {
  CHECK(render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}") == "1");
  CHECK(render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}") == "4");
  CHECK(render("{% for m in messages %}{{ loop.index }}{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
               R"([{"role":"user","content":"a"},{"role":"assistant","content":"b"}])") == "1user,2assistant");
  CHECK(render("{% macro f(a, b='d') %}{{ a }}{{ b }}{% endmacro %}{{ f('x') }}{{ f('y', b='z') }}") == "xdyz");
  CHECK(render("{{ 'a b  c'.split() | join('-') }} {{ ' x '.strip() }} {{ 'abc'[::-1] }} {{ '日本語'[1:] }}") == "a-b-c x cba 本語");
}

TEST_CASE("templates outside the subset, and conversations a template refuses, are clear errors", "[text]") {
  auto code_of = [](const std::string& source, const std::string& context = "[]") {
    try {
      render(source, context);
    } catch (const dstrain::Error& e) {
      return std::pair{e.code(), std::string(e.what())};
    }
    return std::pair{dstrain::ErrorCode::kInternal, std::string("no error")};
  };
  auto [c1, m1] = code_of("ok\n{% include 'x' %}");
  CHECK(c1 == dstrain::ErrorCode::kConfig);
  CHECK(m1 == "t.jinja:2:4: '{% include %}' is not supported");
  auto [c2, m2] = code_of("{{ x | nosuchfilter }}");
  CHECK(c2 == dstrain::ErrorCode::kConfig);
  CHECK(m2.find("no filter named 'nosuchfilter'") != std::string::npos);
  auto [c3, m3] = code_of("{{ raise_exception('roles must alternate') }}");
  CHECK(c3 == dstrain::ErrorCode::kData);
  CHECK(m3.find("refused the conversation: roles must alternate (t.jinja:1:4)") != std::string::npos);
  auto [c4, m4] = code_of("{{ messages[0].content }}");
  CHECK(c4 == dstrain::ErrorCode::kData);
  CHECK(m4.find("is undefined") != std::string::npos);
  auto [c5, m5] = code_of("{{ 'a' + 1 }}");
  CHECK(m5.find("unsupported operand types for +: 'str' and 'int'") != std::string::npos);
}
