#include "catch_torch.h"

#include <map>
#include <set>

#include "dstrain/core/atomic_file.h"
#include "dstrain/data/sample_stream.h"
#include "test_support.h"

using namespace dstrain;

TEST_CASE("blends draw each source in proportion, each of its samples once per its epoch", "[data]") {
  test::TempDir dir;
  // Source a: 101 samples of 4 tokens whose first token is the sample id; source b: 51.
  std::string a, b;
  for (int i = 0; i < 101 * 4 + 1; ++i) a += static_cast<char>(i % 4 == 0 ? (i / 4) % 256 : 'a');
  for (int i = 0; i < 51 * 4 + 1; ++i) b += static_cast<char>(i % 4 == 0 ? 200 : 'b');
  write_file_atomic(dir.path() + "/a.txt", a);
  write_file_atomic(dir.path() + "/b.txt", b);
  auto open = [&] {
    std::vector<std::unique_ptr<data::TokenFile>> files;
    files.push_back(data::open_token_file(dir.path() + "/a.txt", dstrain::config::DataFormat::kBytes, 4));
    files.push_back(data::open_token_file(dir.path() + "/b.txt", dstrain::config::DataFormat::kBytes, 4));
    return files;
  };
  data::SampleStream stream(open(), {3, 1}, 4, 5);
  CHECK(stream.num_samples() == 152);
  std::map<char, int> per_source;
  std::set<int64_t> firsts_of_a;
  int64_t tokens[5];
  std::vector<std::vector<int64_t>> seen;
  for (int64_t p = 0; p < 400; ++p) {
    stream.read(p, tokens);
    seen.emplace_back(tokens, tokens + 5);
    per_source[tokens[1] == 'a' ? 'a' : 'b'] += 1;
    if (tokens[1] == 'a' && p < 400 * 3 / 4 && firsts_of_a.size() < 101) firsts_of_a.insert(tokens[0]);
  }
  CHECK(per_source['a'] == 300);  // exactly 3:1 (greedy: never more than one sample off its share)
  CHECK(per_source['b'] == 100);
  CHECK(firsts_of_a.size() == 101);  // source a's first epoch: all of its samples
  // A jump back (a resume) reads the same samples again.
  data::SampleStream again(open(), {3, 1}, 4, 5);
  for (int64_t p : {250, 17, 399, 0}) {
    again.read(p, tokens);
    CHECK(std::vector<int64_t>(tokens, tokens + 5) == seen[static_cast<size_t>(p)]);
  }
}
