// An unpaired set's assembly (data/kto_set.h) as TRL 1.16's KTOTrainer builds it: pairs unpaired per
// chunk of rows, examples whose prompt fills max_length dropped before the KL completions rotate
// within chunks of kl_batch_size, each sequence cut from the right. (dist.kto compares whole sets
// with TRL's.)
#include "catch_torch.h"

#include <vector>

#include "dstrain/data/kto_set.h"

using namespace dstrain;

namespace {

// An example whose prompt is {id} (or `prompt_length` copies) and whose completion is {id + 100}.
data::UnpairedExample example(uint32_t id, bool desirable, size_t prompt_length = 1) {
  return {std::vector<uint32_t>(prompt_length, id), {id + 100}, desirable};
}

data::UnpairedRow labelled(uint32_t id, bool desirable, size_t prompt_length = 1) {
  return {{example(id, desirable, prompt_length)}, false};
}

data::UnpairedRow pair(uint32_t id) { return {{example(id, true), example(id + 50, false)}, true}; }

}  // namespace

TEST_CASE("kto set: KL completions rotate by one within each chunk, in set order", "[data]") {
  std::vector<data::UnpairedRow> rows;
  for (uint32_t i = 1; i <= 5; ++i) rows.push_back(labelled(i, i % 2 == 1));
  const data::KtoSet set = data::assemble_kto_set(rows, {0, 2});
  REQUIRE(set.sequences.size() == 10);
  CHECK(set.labels == "10101");
  // Chunks {1, 2}, {3, 4}, {5}: the first of each takes the chunk's last completion.
  const std::vector<uint32_t> kl_of = {102, 101, 104, 103, 105};
  for (size_t i = 0; i < 5; ++i) {
    CHECK(set.sequences[2 * i].tokens == std::vector<uint32_t>{static_cast<uint32_t>(i + 1), static_cast<uint32_t>(i + 101)});
    CHECK(set.sequences[2 * i].mask == std::vector<uint8_t>{0, 1});
    CHECK(set.sequences[2 * i + 1].tokens == std::vector<uint32_t>{static_cast<uint32_t>(i + 1), kl_of[i]});
    CHECK(set.sequences[2 * i + 1].mask == std::vector<uint8_t>{0, 1});
  }
}

TEST_CASE("kto set: pairs are unpaired per chunk of 1000 rows, chosen first", "[data]") {
  std::vector<data::UnpairedRow> rows;
  for (uint32_t i = 0; i < data::kUnpairChunkRows + 2; ++i) rows.push_back(pair(i % 50));
  const data::KtoSet set = data::assemble_kto_set(rows, {0, 8});
  REQUIRE(set.labels.size() == 2 * rows.size());
  const size_t n = data::kUnpairChunkRows;
  CHECK(set.labels.substr(0, n) == std::string(n, '1'));
  CHECK(set.labels.substr(n, n) == std::string(n, '0'));
  CHECK(set.labels.substr(2 * n) == "1100");
  CHECK(set.sequences[2 * n].tokens.front() == 50);  // the first chunk's first rejected example: pair 0's
  CHECK(set.sequences[4 * n].tokens.front() == 0);   // the second chunk's chosen examples: pairs 1000 and 1001
  CHECK(set.sequences[4 * n + 2].tokens.front() == 1);
}

TEST_CASE("kto set: prompts that fill max_length are dropped before the rotation; sequences are cut from the right", "[data]") {
  std::vector<data::UnpairedRow> rows = {labelled(1, true, 3), labelled(2, false, 4), labelled(3, true, 2), labelled(4, false, 1)};
  const data::KtoSet set = data::assemble_kto_set(rows, {3, 2});
  CHECK(set.prompt_too_long == 2);
  REQUIRE(set.labels == "10");
  // Examples 3 and 4 form the first chunk; each sequence fits in 3 tokens.
  CHECK(set.sequences[0].tokens == std::vector<uint32_t>{3, 3, 103});
  CHECK(set.sequences[1].tokens == std::vector<uint32_t>{3, 3, 104});
  CHECK(set.sequences[3].tokens == std::vector<uint32_t>{4, 103});
  std::vector<data::UnpairedRow> long_completion = {{{{{7}, {1, 2, 3, 4}, true}}, false}, labelled(8, false)};
  const data::KtoSet cut = data::assemble_kto_set(long_completion, {3, 2});
  CHECK(cut.truncated == 1);
  CHECK(cut.sequences[0].tokens == std::vector<uint32_t>{7, 1, 2});
  CHECK(cut.sequences[0].mask == std::vector<uint8_t>{0, 1, 1});
  CHECK(cut.sequences[2].tokens == std::vector<uint32_t>{8, 108});
  CHECK(cut.sequences[3].tokens == std::vector<uint32_t>{8, 1, 2});  // its KL completion cut too
  CHECK(cut.longest == 3);
}
