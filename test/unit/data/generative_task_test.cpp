// Generative exact-match tasks (data/generative_task.h): Python's re in Oniguruma's Python syntax,
// lm-eval's RegexFilter and exact_match, the task files and their errors. The expected values are
// what Python 3.11's re and lm-eval 0.4.13's functions give on the same strings (dist.generative_tasks
// checks whole generations against lm-eval itself).
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "catch_torch.h"
#include "dstrain/core/error.h"
#include "dstrain/data/generative_task.h"
#include "dstrain/data/prompts.h"
#include "dstrain/text/regex.h"

using namespace dstrain;
using Groups = std::vector<std::vector<std::string>>;

namespace {

text::Regex python(const std::string& pattern) { return text::Regex(pattern, text::RegexSyntax::kPython); }

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path) << text;
  return path;
}

// Byte-level: no tokenizer folder needed, every byte one token.
const data::PromptCodec& bytes() {
  static const data::PromptCodec codec("", 256);
  return codec;
}

std::string error_of(const std::string& path, int64_t max_length = 512, config::TaskFormat format = config::TaskFormat::kDstrain) {
  try {
    data::read_generative_task(path, "t", bytes(), max_length, format);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kData);
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("regex: Python's findall and sub", "[data]") {
  CHECK(python("#### (\\-?[0-9\\.\\,]+)").find_groups("so the answer is #### 1,234.\nQuestion: next #### 7") == Groups{{"1,234."}, {"7"}});
  CHECK(python("(-?[$0-9.,]{2,})|(-?[0-9]+)").find_groups("He paid $1,200 and then 7 more") == Groups{{"$1,200", ""}, {"", "7"}});
  CHECK(python("(?s).*#### ").remove_all("line one\nline #### two #### 42") == "42");  // (?s): dot matches newlines
  CHECK(python("\\.$").remove_all("the end.\n") == "the end\n");                       // $ before a final newline
  CHECK(python("\\.$").remove_all("a.b.") == "a.b");
  CHECK(python("(\\w+)").find_groups("是ENERache 🍣 x_1") == Groups{{"是ENERache"}, {"x_1"}});  // \w beyond ASCII
  CHECK(python("[A-Z]+").find_groups("no capitals").empty());
  CHECK(python("(a)|(b)").remove_all("b a") == " ");
  CHECK(python("^\\s*the\\s+").remove_all("  The cat") == "  The cat");  // case matters without ignore_case
  CHECK_THROWS_AS(python("(unclosed"), Error);
}

namespace {
std::string filtered(const data::AnswerFilter& filter, const std::string& text) { return data::AnswerScorer({filter}, {}).answer(0, text); }
bool exact_match(const data::ExactMatchRules& rules, const std::string& answer, const std::string& target) {
  return data::AnswerScorer({}, rules).matches(answer, target);
}
}  // namespace

TEST_CASE("generative tasks: lm-eval's RegexFilter", "[data]") {
  const data::AnswerFilter strict{"exact_match", "#### (\\-?[0-9\\.\\,]+)", 0, "[invalid]"};
  const data::AnswerFilter flexible{"exact_match_flexible", "(-?[$0-9.,]{2,})|(-?[0-9]+)", -1, "[invalid]"};
  const data::AnswerScorer gsm8k({strict, flexible}, {});
  CHECK(gsm8k.answer(0, "so the answer is #### 1,234.\nQuestion: next #### 7") == "1,234.");
  CHECK(gsm8k.answer(0, "no marker 42") == "[invalid]");
  CHECK(gsm8k.answer(1, "He paid $1,200 and then 7 more") == "7");  // the last match, its non-empty group
  CHECK(filtered({"m", "(\\d+)", 0, "none"}, "x 12 y") == "12");
  CHECK(filtered({"m", "(a)?(x)", 0, "none"}, " x") == "x");      // a tuple: its first non-empty group
  CHECK(filtered({"m", "(\\s*)(x)", 0, "none"}, "  x").empty());  // "  " is not empty: stripped to ""
  CHECK(filtered({"m", "", 0, "none"}, " all of it ") == " all of it ");
  CHECK_THROWS_AS(data::AnswerScorer({{"m", "(unclosed", 0, "none"}}, {}), Error);
}

TEST_CASE("generative tasks: lm-eval's exact_match options", "[data]") {
  const data::ExactMatchRules gsm8k{{",", "\\$", "(?s).*#### ", "\\.$"}, true, false, false};
  CHECK(exact_match(gsm8k, "1,234.", "She sold 1234 clips.\n#### 1,234"));
  CHECK(exact_match(gsm8k, "$18", "Janet makes $18 #### 18"));
  CHECK(exact_match(gsm8k, "[invalid]", "x #### [invalid]"));  // lm-eval's quirk, kept
  CHECK_FALSE(exact_match(gsm8k, "17", "#### 18"));
  CHECK(exact_match({{}, true, false, false}, "ÉCOLE", "école"));
  CHECK(exact_match({{}, false, true, false}, "it's  fine!", "its  fine"));
  CHECK_FALSE(exact_match({{}, false, false, false}, " 4 ", "4"));
  CHECK(exact_match({{}, false, false, true}, " 4 ", "4\n"));  // dstrain's strip
}

TEST_CASE("generative tasks: files, settings and the gsm8k rows", "[data]") {
  const std::string path = write_file("gen_task_ok.jsonl",
                                      "{\"settings\": {\"until\": [\"\\n\"], \"max_gen_toks\": 8, \"regex_pattern\": \"(\\\\d+)\", "
                                      "\"ignore_case\": true}}\n\n{\"context\": \"2+2=\", \"target\": \"4\"}\n");
  const data::GenerativeTask t = data::read_generative_task(path, "t", bytes(), 64);
  CHECK(t.until == std::vector<std::string>{"\n"});
  CHECK(t.max_gen_toks == 8);
  REQUIRE(t.filters.size() == 1);
  CHECK(t.filters[0].regex_pattern == "(\\d+)");
  CHECK(t.rules.ignore_case);
  CHECK(t.rules.strip);
  REQUIRE(t.questions.size() == 1);
  CHECK(t.questions[0].prompt == std::vector<int64_t>{'2', '+', '2', '='});
  CHECK(data::is_generative_task_file(path, config::TaskFormat::kDstrain));
  const data::GenerativeTask back = data::generative_tasks_from_json(data::generative_tasks_json({t})).at(0);
  CHECK(back.questions[0].prompt == t.questions[0].prompt);
  CHECK(back.filters[0].regex_pattern == t.filters[0].regex_pattern);
  CHECK(back.rules.ignore_case == t.rules.ignore_case);
  CHECK(back.until == t.until);

  const std::string gsm = write_file("gen_task_gsm8k.jsonl", "{\"question\": \"Q?\", \"answer\": \"A #### 3\"}\n");
  const data::GenerativeTask g = data::read_generative_task(gsm, "g", bytes(), 512, config::TaskFormat::kGsm8k);
  const std::string context = "Question: Q?\nAnswer:";
  CHECK(g.questions[0].prompt == std::vector<int64_t>(context.begin(), context.end()));
  CHECK(g.until == std::vector<std::string>{"Question:", "</s>", "<|im_end|>"});
  CHECK(g.max_gen_toks == 256);
  CHECK(g.filters.size() == 2);

  const std::string choice = write_file("gen_task_choice.jsonl", "{\"context\": \"a\", \"choices\": [\"b\"], \"gold\": 0}\n");
  CHECK_FALSE(data::is_generative_task_file(choice, config::TaskFormat::kDstrain));
}

TEST_CASE("generative tasks: bad files are refused by file:line", "[data]") {
  CHECK_THAT(error_of(write_file("g1.jsonl", "{\"settings\": {\"untill\": []}}\n{\"context\": \"a\", \"target\": \"b\"}\n")),
             Catch::Contains("g1.jsonl:1: settings has an unknown key \"untill\""));
  CHECK_THAT(error_of(write_file("g2.jsonl", "{\"settings\": {\"regex_pattern\": \"(\"}}\n")),
             Catch::Contains("g2.jsonl:1: the regular expression '(' does not compile"));
  CHECK_THAT(error_of(write_file("g3.jsonl", "{\"context\": \"a\", \"target\": \"b\"}\n{\"settings\": {}}\n")),
             Catch::Contains("g3.jsonl:2: \"settings\" belongs on the first line"));
  CHECK_THAT(error_of(write_file("g4.jsonl", "{\"context\": \"a\"}\n")),
             Catch::Contains("g4.jsonl:1: \"target\" is missing or not a string"));
  CHECK_THAT(error_of(write_file("g5.jsonl", "{\"context\": \"abcdef\", \"target\": \"b\"}\n"), 260),
             Catch::Contains("g5.jsonl:1: the context's 6 tokens and max_gen_toks 256 make 262, more than the model's 260 positions"));
  CHECK_THAT(error_of(write_file("g6.jsonl", "{\"question\": \"q\"}\n"), 512, config::TaskFormat::kGsm8k),
             Catch::Contains("g6.jsonl:1: \"answer\" is missing or not a string"));
  CHECK_THAT(error_of(write_file("g7.jsonl", "{\"settings\": {\"max_gen_toks\": 0}}\n")),
             Catch::Contains("\"max_gen_toks\" is less than 1"));
  CHECK_THAT(error_of(write_file("g8.jsonl", "{\"settings\": {}}\n")), Catch::Contains("g8.jsonl: no task rows"));
  CHECK_THAT(error_of(write_file("g9.jsonl", "{\"context\": \"\", \"target\": \"b\"}\n")), Catch::Contains("\"context\" is empty"));
}
