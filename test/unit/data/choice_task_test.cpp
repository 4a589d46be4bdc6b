// Multiple-choice scoring (data/choice_task.h): acc and acc_norm as lm-evaluation-harness's
// process_results computes them, ties to the first choice as numpy's argmax, and the tasks' JSON
// hand-over. (dist.choice_tasks checks the tokenization and log-likelihoods against lm-eval itself.)
#include <vector>

#include "catch_torch.h"
#include "dstrain/core/error.h"
#include "dstrain/data/choice_task.h"

using namespace dstrain;

namespace {

data::ChoiceTask two_questions() {
  data::ChoiceTask t{"t", "t.jsonl", {}};
  data::ChoiceQuestion a;  // three choices of 1, 10 and 4 characters, gold 1
  a.gold = 1, a.choice_chars = {1, 10, 4};
  a.requests = {{{1, 2}, {3}}, {{1, 2}, {4, 5}}, {{1, 2}, {6}}};
  data::ChoiceQuestion b;  // two choices of 2 characters, gold 0
  b.gold = 0, b.choice_chars = {2, 2};
  b.requests = {{{7}, {8}}, {{7}, {9}}};
  t.questions = {a, b};
  return t;
}

}  // namespace

TEST_CASE("choice tasks: acc takes the most likely choice, acc_norm the most likely per character", "[data]") {
  const data::ChoiceTask t = two_questions();
  // a: -2 wins plainly (choice 0), but per character -12/10 beats -2/1 and -6/4: acc_norm picks 1 (gold).
  // b: equal log-likelihoods: the first (0, gold) for both, as np.argmax.
  const data::ChoiceScore s = data::score_choice_task(t, {-2.0, -12.0, -6.0, -3.0, -3.0});
  CHECK(s.n == 2);
  CHECK(s.pred == std::vector<int64_t>{0, 0});
  CHECK(s.pred_norm == std::vector<int64_t>{1, 0});
  CHECK(s.acc == 0.5);
  CHECK(s.acc_norm == 1.0);
  CHECK_THROWS_AS(data::score_choice_task(t, {-1.0, -2.0}), Error);  // not one value per request
}

TEST_CASE("choice tasks: the launcher's JSON gives the workers the same tasks", "[data]") {
  const data::ChoiceTask t = two_questions();
  const std::vector<data::ChoiceTask> back = data::choice_tasks_from_json(data::choice_tasks_json({t}));
  REQUIRE(back.size() == 1);
  CHECK(back[0].name == "t");
  CHECK(back[0].requests() == 5);
  REQUIRE(back[0].questions.size() == 2);
  CHECK(back[0].questions[0].gold == 1);
  CHECK(back[0].questions[0].choice_chars == std::vector<double>{1, 10, 4});
  CHECK(back[0].questions[0].requests[1].context == std::vector<uint32_t>{1, 2});
  CHECK(back[0].questions[0].requests[1].continuation == std::vector<uint32_t>{4, 5});
  CHECK(back[0].questions[1].requests[1].continuation == std::vector<uint32_t>{9});
}
