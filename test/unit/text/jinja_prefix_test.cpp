// Resumed prefix renderings (issue 55, D10): ChatTemplate::prefixes gives, for every k and both
// values of add_generation_prompt, exactly the text of a render from the start with messages[:k],
// for the fixture templates and for templates built to defeat resuming (looking ahead, at the
// count, at add_generation_prompt, writing state a resume cannot copy). The real templates resume
// (that is what makes a conversation linear in its turns); the hostile ones fall back.
#include "catch_torch.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/jinja.h"

using dstrain::text::ChatTemplate;

namespace {

const std::string kFixtures = std::string(DSTRAIN_SOURCE_DIR) + "/test/fixtures/chat_templates/";

std::string read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> fixture_conversations() {
  std::vector<std::string> out;
  std::ifstream in(kFixtures + "conversations.jsonl");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  // A system message late (V3 joins them at the top), tools, and a longer alternation.
  out.push_back(R"([{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"system","content":"late"},)"
                R"({"role":"user","content":"c"},{"role":"assistant","content":"d"}])");
  std::string long_one = "[";
  for (int i = 0; i < 12; ++i)
    long_one += std::string(i ? "," : "") + R"({"role":")" + (i % 2 ? "assistant" : "user") + R"(","content":"turn )" + std::to_string(i) +
                (i == 7 ? " stop" : "") + R"("})";
  out.push_back(long_one + "]");
  return out;
}

struct Counts {
  size_t resumed = 0, rendered = 0;
  size_t inner = 0;  // prefixes of 1..n-1 messages: those a top-level loop can resume at
};

// Every prefix of every conversation, resumed or not, against a render from the start.
Counts check_prefixes(const std::string& source, const std::string& name, const std::vector<std::string>& conversations) {
  const ChatTemplate tmpl(source, name);
  const dstrain::text::ChatTemplateSource src{source, name, "<s>", "</s>"};
  Counts counts;
  for (const auto& conversation : conversations) {
    const auto context = dstrain::text::chat_context(conversation, src, false);
    const size_t n = context.as_dict().find("messages")->as_list().size();
    std::unique_ptr<ChatTemplate::PrefixRenders> prefixes;
    try {
      prefixes = tmpl.prefixes(context, std::vector<bool>(n + 1, true));
    } catch (const dstrain::Error&) {
      CHECK_THROWS_AS(tmpl.render(context), dstrain::Error);  // the template refuses the conversation either way
      continue;
    }
    CHECK(prefixes->full().text == tmpl.render(context).text);
    for (size_t k = 0; k <= n; ++k) {
      for (const bool generation_prompt : {false, true}) {
        INFO(name << " " << conversation << " k=" << k << " add_generation_prompt=" << generation_prompt);
        auto exact_context = dstrain::text::chat_context(conversation, src, generation_prompt);
        const auto& all = exact_context.as_dict().find("messages")->as_list();
        dstrain::text::jinja::Dict d;
        for (const auto& [key, value] : exact_context.as_dict().items())
          d.set(key, key == "messages" ? dstrain::text::jinja::Value(dstrain::text::jinja::List(all.begin(), all.begin() + k)) : value);
        std::string exact;
        bool refused = false;
        try {
          exact = tmpl.render(dstrain::text::jinja::Value(d)).text;
        } catch (const dstrain::Error&) {
          refused = true;
        }
        if (refused) {
          CHECK_THROWS_AS(prefixes->prefix(k, generation_prompt), dstrain::Error);
          continue;
        }
        const auto p = prefixes->prefix(k, generation_prompt);
        REQUIRE(p.shared <= prefixes->full().text.size());
        CHECK(prefixes->full().text.substr(0, p.shared) + p.tail == exact);
      }
    }
    counts.inner += n > 1 ? 2 * (n - 1) : 0;
    counts.resumed += prefixes->resumed();
    counts.rendered += prefixes->rendered();
  }
  return counts;
}

}  // namespace

TEST_CASE("prefixes: the fixture templates resume, and every prefix is exact", "[text][jinja-prefix]") {
  const auto conversations = fixture_conversations();
  for (const std::string name : {"deepseek-v3-style", "deepseek-r1-style", "deepseek-llm-chat", "deepseek-coder-instruct",
                                 "chatml-qwen-style", "llama3-style", "mistral-style", "whitespace", "generation-spans", "constructs"}) {
    const Counts c = check_prefixes(read(kFixtures + name + ".jinja"), name + ".jinja", conversations);
    INFO(name << ": " << c.resumed << " of " << c.inner << " inner prefixes resumed, " << c.rendered << " rendered from the start");
    WARN(name << ": " << c.resumed << " of " << c.inner << " inner prefixes resumed");
    // constructs.jinja reads messages[-1] and loop.length, which depend on the count, and
    // whitespace.jinja writes something else for the last message: they must not resume.
    if (std::string(name) == "constructs" || std::string(name) == "whitespace")
      CHECK(c.resumed == 0);
    else
      CHECK(c.resumed * 10 >= c.inner * 9);
  }
}

TEST_CASE("prefixes: templates that look ahead, at the count or at the prompt flag fall back, exactly", "[text][jinja-prefix]") {
  const auto conversations = fixture_conversations();
  const auto body = std::string("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}");
  struct Case {
    std::string source;
    bool resumes;  // whether some prefix may still be resumed
  };
  const std::vector<Case> cases = {
      {"{% if messages|length > 2 %}MANY{% endif %}" + body, false},
      {"{% for m in messages %}{{ m.content }}{% if loop.last %}END{% endif %}{% endfor %}", false},
      {"{% for m in messages %}{{ m.content }}{% if loop.revindex0 == 1 %}!{% endif %}{{ loop.length }}{% endfor %}", false},
      {"{% for m in messages %}{% if messages[loop.index0 + 1] is defined %}+{% endif %}{{ m.content }}{% endfor %}", false},
      {"{% for m in messages %}{{ m.content }}{{ loop.nextitem }}{% endfor %}", false},
      {"{% for m in messages %}{{ m.content }}{% if m.role == 'system' and not loop.last %}, then{% endif %}{% endfor %}", true},
      {"{% for m in messages if m.role == 'user' %}{{ m.content }}{% if loop.last %}.{% endif %}{% endfor %}", false},
      {"{% for m in messages %}{{ messages[-1].content }}{% endfor %}", false},
      {"{% set n = messages %}{{ n|length }}" + body, false},
      {"{% if add_generation_prompt %}G{% endif %}" + body + "{% if add_generation_prompt %}A:{% endif %}", true},
      {"{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}[{{ ns.n }}]", true},
      {"{% set ns = namespace(s='') %}{% for m in messages %}{% if m.role == 'system' %}{% set ns.s = ns.s + m.content %}{% endif %}"
       "{% endfor %}{{ ns.s }}" +
           body,
       true},
      {"{% for m in messages %}{% if 'stop' in m.content %}{% break %}{% endif %}{{ m.content }}{% endfor %}!", true},
      {"{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.content }}{% endfor %}", true},
      {"{% set rest = messages[2:] %}" + body + "{{ rest|length }}{% for m in rest %}{{ m.role }}{% endfor %}", true},
      {"{% macro count() %}{{ messages|length }}{% endmacro %}" + body + "{{ count() }}", true},
      {"{% for m in messages %}{{ loop.cycle('a', 'b') }}{% for x in messages %}{% endfor %}{% endfor %}", false},
      {"{% set holder = [namespace(v='')] %}{% for m in messages %}{% for h in holder %}{% set h.v = h.v + m.content %}{% endfor %}"
       "{% endfor %}{{ holder[0].v }}",
       false},
      {"{% set a = namespace(x=1) %}{% set b = namespace(x=2) %}{% for m in messages %}{% set a.other = b %}{% endfor %}"
       "{% set b.x = 3 %}{{ a.other.x }}",
       false},
      {body + "{% if messages[-1].role == 'user' %}{{ raise_exception('ends with a user') }}{% endif %}", true},
      // A refused prefix, then more prefixes resumed from a top-level scope with names in it.
      {"{% set g = namespace(n=0) %}{% set tail = messages[1:] %}" + body +
           "{% if messages[-1].role == 'user' %}{{ raise_exception('ends with a user') }}{% endif %}{{ g.n }}{{ tail|length }}",
       true},
      {"{% set l = messages %}{% for m in l %}{{ m.content }}{% if m.role == 'assistant' %}{{ loop.index0 }}{% endif %}{% endfor %}", true},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i << ": " << cases[i].source);
    const Counts c = check_prefixes(cases[i].source, "case.jinja", conversations);
    if (!cases[i].resumes) CHECK(c.resumed == 0);
    if (cases[i].resumes) CHECK(c.resumed > 0);
  }
}

TEST_CASE("prefixes: resume points keep a bounded amount alive", "[text][jinja-prefix]") {
  // Each iteration builds a new, longer string in a namespace: keeping every resume point's would
  // hold 600 * 599 / 2 * 4 KB = 720 MB. Past jinja/limits.h's 256 MiB, prefixes are rendered from
  // the start instead, and are still exact.
  const std::string source =
      "{% set ns = namespace(all='') %}{% for m in messages %}{% set ns.all = ns.all + m.content %}{{ m.role }}{% endfor %}"
      "{{ ns.all|length }}";
  const ChatTemplate tmpl(source, "grow.jinja");
  const dstrain::text::ChatTemplateSource src{source, "grow.jinja", "<s>", "</s>"};
  std::string conversation = "[";
  for (int i = 0; i < 600; ++i)
    conversation += std::string(i ? "," : "") + R"({"role":")" + (i % 2 ? "assistant" : "user") + R"(","content":")" +
                    std::string(4096, static_cast<char>('a' + i % 26)) + R"("})";
  conversation += "]";
  const auto context = dstrain::text::chat_context(conversation, src, false);
  const auto prefixes = tmpl.prefixes(context, std::vector<bool>(601, true));
  for (const size_t k : {1, 100, 300, 500, 599}) {
    dstrain::text::jinja::Dict d;
    const auto& all = context.as_dict().find("messages")->as_list();
    for (const auto& [key, value] : context.as_dict().items())
      d.set(key, key == "messages" ? dstrain::text::jinja::Value(dstrain::text::jinja::List(all.begin(), all.begin() + k)) : value);
    const auto p = prefixes->prefix(k, false);
    CHECK(prefixes->full().text.substr(0, p.shared) + p.tail == tmpl.render(dstrain::text::jinja::Value(d)).text);
  }
  CHECK(prefixes->resumed() == 3);
  CHECK(prefixes->rendered() == 2);
}
