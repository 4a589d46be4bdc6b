// Hostile chat templates (issue 55: D5, D7, D12, D13, D14): no template crashes dstrain, exhausts
// its memory or runs without end. Each is an Error naming the template's line (kConfig at parse,
// kData while rendering), and integer arithmetic is Python's or refused, never wrapped.
#include "catch_torch.h"

#include <chrono>
#include <string>
#include <utility>

#include "dstrain/core/error.h"
#include "dstrain/core/json_depth.h"
#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/jinja.h"
#include "dstrain/text/jinja/limits.h"

using dstrain::ErrorCode;
using dstrain::text::ChatTemplate;

namespace {

std::string render(const std::string& source, const std::string& context_json = "[]") {
  const dstrain::text::ChatTemplateSource src{source, "t.jinja", "<s>", "</s>"};
  return ChatTemplate(source, "t.jinja").render(dstrain::text::chat_context(context_json, src, false)).text;
}

// The error a template gives: its code and message (kInternal "no error" when it renders).
std::pair<ErrorCode, std::string> error_of(const std::string& source, const std::string& context = "[]") {
  try {
    render(source, context);
  } catch (const dstrain::Error& e) {
    return {e.code(), e.what()};
  }
  return {ErrorCode::kInternal, "no error"};
}

void check_refused(const std::string& source, ErrorCode code, const std::string& words, const std::string& context = "[]") {
  INFO(source.substr(0, 200));
  const auto [got, what] = error_of(source, context);
  CHECK(got == code);
  CHECK_THAT(what, Catch::StartsWith("t.jinja:1:") && Catch::Contains(words));
}

}  // namespace

TEST_CASE("sandbox: recursion and nesting are bounded, never a stack overflow (D5)", "[text][jinja-sandbox]") {
  check_refused("{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}", ErrorCode::kData, "nests more than 1000 levels deep");
  check_refused("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}", ErrorCode::kData, "nests more than 1000 levels deep");
  check_refused("{{ " + std::string(10000, '(') + "1" + std::string(10000, ')') + " }}", ErrorCode::kConfig, "nested more than 200 levels");
  check_refused("{{ " + std::string(10000, '-') + "1 }}", ErrorCode::kConfig, "nested more than 200 levels");
  check_refused("{{ " + std::string(20000, '[') + " }}", ErrorCode::kConfig, "nested more than 200 levels");
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  check_refused(blocks, ErrorCode::kConfig, "nested more than 200 levels");
  // What real templates do still works: a macro recursing 150 levels (Jinja2 allows about 190).
  CHECK(render("{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{% endif %}x{% endmacro %}{{ f(150) }}") == std::string(151, 'x'));
}

TEST_CASE("sandbox: integer arithmetic is Python's or refused, never SIGFPE or a wrap (D5, D14)", "[text][jinja-sandbox]") {
  check_refused("{{ (-9223372036854775807-1) // -1 }}", ErrorCode::kData, "integer overflow in //");
  CHECK(render("{{ (-9223372036854775807-1) % -1 }}") == "0");
  CHECK(render("{{ (-9223372036854775807-1) is divisibleby(-1) }}") == "True");
  CHECK(render("{{ 7 // -2 }} {{ -7 // 2 }} {{ 7 % -2 }} {{ -7 % 2 }}") == "-4 -4 -1 1");
  check_refused("{{ 2**64 }}", ErrorCode::kData, "integer overflow in **");
  CHECK(render("{{ 2**62 }} {{ (-2)**63 }} {{ 2**(-1) }}") == "4611686018427387904 -9223372036854775808 0.5");
  check_refused("{{ 9223372036854775807 + 1 }}", ErrorCode::kData, "integer overflow in +");
  check_refused("{{ 4611686018427387904 * 2 }}", ErrorCode::kData, "integer overflow in *");
  check_refused("{{ -(-9223372036854775807-1) }}", ErrorCode::kData, "integer overflow");
  check_refused("{{ (-9223372036854775807-1)|abs }}", ErrorCode::kData, "integer overflow");
  check_refused("{{ 99999999999999999999999 }}", ErrorCode::kConfig, "the number 99999999999999999999999 is out of range");
  check_refused("{{ 1e999999 }}", ErrorCode::kConfig, "is out of range");
  check_refused("{{ 1e300|int }}", ErrorCode::kData, "cannot convert");
  // Python's results where dstrain's differed.
  CHECK(render("{{ 'x'.count('') }} {{ 'abc'.count('') }} {{ ''.count('') }}") == "2 4 1");
  CHECK(render("{{ (10**9)|round }} {{ 1.5|round(10**9) }} {{ 2.5|round }} {{ 3.5|round }} {{ 1234.5|round(-2) }}") ==
        "1000000000.0 1.5 2.0 4.0 1200.0");
}

TEST_CASE("sandbox: values of the wrong kind are errors at their line, never a crash (D5)", "[text][jinja-sandbox]") {
  check_refused("{{ tools|dictsort }}", ErrorCode::kData, "filter 'dictsort': expected dict, got NoneType");
  check_refused("{{ 'a'.startswith(none) }}", ErrorCode::kData, "expected str, got NoneType");
  check_refused("{{ 'a'.endswith([1]) }}", ErrorCode::kData, "expected str, got int");
  check_refused("{{ 'a'.join(1) }}", ErrorCode::kData, "");
  check_refused("{{ 'x\\u12' }}", ErrorCode::kConfig, "escape needs 4 hex digits");
  check_refused("{{ '\\U0011ffff' }}", ErrorCode::kConfig, "beyond Unicode");
  // D13: list mutation, refused by name with its line, not an internal error.
  check_refused("{% set x = [] %}{{ x.append(1) }}", ErrorCode::kData, "the template changes a list ('append')");
  check_refused("{% set x = [] %}{% set y = x.pop() %}", ErrorCode::kData, "the template changes a list ('pop')");
  check_refused("{{ [1,2][9999999999999999999999] }}", ErrorCode::kConfig, "out of range");
  check_refused("{% set x = y [] %}", ErrorCode::kConfig, "a subscript needs an index");  // chat_fuzz's first finding (a null dereference)
  CHECK(render("{{ 'a'|indent(-1, true) }}") == "a");                                     // Python's " " * -1 is ""
}

TEST_CASE("sandbox: memory and time are bounded (D7, D12)", "[text][jinja-sandbox]") {
  using dstrain::text::jinja::kMaxRange;
  check_refused("{{ range(10**9)|length }}", ErrorCode::kData, "range() of 1000000000 items; the sandbox allows 100000");
  check_refused("{{ range(-9223372036854775807, 9223372036854775807, 3)|length }}", ErrorCode::kData, "the sandbox allows 100000");
  CHECK(render("{{ range(100000)|length }} {{ range(10, 0, -3)|list }}") == std::to_string(kMaxRange) + " [10, 7, 4, 1]");
  check_refused("{{ ('x' * 10**10)|length }}", ErrorCode::kData, "the sandbox allows 256 MiB");
  check_refused("{{ ([1] * 10**9)|length }}", ErrorCode::kData, "a list of 1000000000 items");
  check_refused("{{ 'a'|indent(10**10) }}", ErrorCode::kData, "256 MiB");
  check_refused("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                ErrorCode::kData, "256 MiB");
  check_refused("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                ErrorCode::kData, "256 MiB");
  check_refused("{{ ('x' * 1000000).replace('', 'yyyyyyyyyy' * 100) }}", ErrorCode::kData, "256 MiB");
  const auto start = std::chrono::steady_clock::now();
  check_refused("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", ErrorCode::kData,
                "rendering took more than 10000000 steps");
  check_refused("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}", ErrorCode::kData,
                "more than 10000000 steps");
  // Building large values in a loop costs steps by their size (chat_fuzz's slow input rebuilt a
  // range in each outer iteration; each iteration was one step).
  check_refused("{% for i in range(100000) %}{% set x = range(100000) %}{% endfor %}", ErrorCode::kData, "more than 10000000 steps");
  check_refused("{% set s = 'x' * 100000000 %}{% for i in range(100000) %}{% set t = s[1:] %}{% endfor %}", ErrorCode::kData,
                "more than 10000000 steps");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
  // One loop object, as Jinja2's: what a template keeps of it shows the loop's latest state.
  CHECK(render("{% set ns = namespace(l=none) %}{% for x in 'abc' %}{% set ns.l = loop %}{{ loop.cycle('p', 'q') }}{% endfor %}"
               "{{ ns.l.index }}{{ ns.l.last }}") == "pqp3True");
}

TEST_CASE("JSON nesting is measured before parsing (D4, D11)", "[text][jinja-sandbox]") {
  CHECK(dstrain::json_nesting_depth(R"({"a": [1, {"b": "[[[["}]})") == 3);
  CHECK(dstrain::json_nesting_depth(R"(["\"[[[", [[]]])") == 3);
  CHECK(dstrain::json_nesting_depth(std::string(100000, '[')) == dstrain::kMaxJsonDepth + 1);
  const std::string deep = R"([{"role": "user", "content": "Hi", "x": )" + std::string(40000, '[') + std::string(40000, ']') + "}]";
  try {
    render("{{ messages[0].content }}", deep);
    FAIL("a conversation nested 40,000 levels deep rendered");
  } catch (const std::invalid_argument& e) {
    CHECK_THAT(e.what(), Catch::Contains("nested more than 128 levels deep"));
  }
}

TEST_CASE("strings are scanned, not tabled per code point, with Python's results (D9)", "[text][jinja-sandbox]") {
  // Each expected string is what Jinja2's sandbox renders (checked with jinja2 3.1).
  CHECK(
      render("{{ ' a b  c  '.split(none, 1) }}|{{ '日本語x'[1:3] }}|{{ 'abc'[-1] }}|{{ '日本語'|reverse }}|{{ 'ab'.replace('', '-') }}") ==
      "['a', 'b  c  ']|本語|c|語本日|-a-b-");
  CHECK(render("{{ '日本'|list }}|{{ '日本語'.find('語') }}|{{ 'xxhixx'.strip('x') }}|{{ 'é日本é'.strip('é') }}|{{ '  '.lstrip() }}|") ==
        "['日', '本']|2|hi|日本||");
  CHECK(render("{{ '日本語'[::-1] }}|{{ '日本語'[5:1] }}|{{ '日本語'[-2:] }}|{{ '日本語'|length }}|{{ ' x\u3000'.strip() }}") ==
        "語本日||本語|3|x");
}
