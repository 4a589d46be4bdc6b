#include "dstrain/data/kto_set.h"

#include <algorithm>

namespace dstrain::data {
namespace {

// TRL's order: each chunk of paired rows becomes its chosen examples, then its rejected ones.
std::vector<UnpairedExample> in_trl_order(std::vector<UnpairedRow> rows) {
  std::vector<UnpairedExample> out;
  for (size_t first = 0; first < rows.size();) {
    if (!rows[first].paired) {
      for (UnpairedExample& e : rows[first].examples) out.push_back(std::move(e));
      ++first;
      continue;
    }
    size_t end = first;
    while (end < rows.size() && end - first < kUnpairChunkRows && rows[end].paired) ++end;
    for (size_t half = 0; half < 2; ++half)
      for (size_t r = first; r < end; ++r) out.push_back(std::move(rows[r].examples[half]));
    first = end;
  }
  return out;
}

KtoSequence sequence(const std::vector<uint32_t>& prompt, const std::vector<uint32_t>& completion, int64_t max_length, bool& cut) {
  KtoSequence s;
  s.tokens = prompt;
  s.tokens.insert(s.tokens.end(), completion.begin(), completion.end());
  s.mask.assign(prompt.size(), 0);
  s.mask.resize(s.tokens.size(), 1);
  if (max_length > 0 && static_cast<int64_t>(s.tokens.size()) > max_length) {
    s.tokens.resize(static_cast<size_t>(max_length)), s.mask.resize(static_cast<size_t>(max_length));
    cut = true;
  }
  return s;
}

}  // namespace

KtoSet assemble_kto_set(std::vector<UnpairedRow> rows, const KtoSetOptions& o) {
  std::vector<UnpairedExample> examples = in_trl_order(std::move(rows));
  KtoSet set;
  const auto fills = [&o](const UnpairedExample& e) { return o.max_length > 0 && static_cast<int64_t>(e.prompt.size()) >= o.max_length; };
  set.prompt_too_long = std::count_if(examples.begin(), examples.end(), fills);
  examples.erase(std::remove_if(examples.begin(), examples.end(), fills), examples.end());
  const size_t chunk = static_cast<size_t>(std::max<int64_t>(o.kl_batch_size, 1));
  for (size_t i = 0; i < examples.size(); ++i) {
    const size_t first = i - i % chunk, last = std::min(first + chunk, examples.size()) - 1;
    const UnpairedExample& e = examples[i];
    const std::vector<uint32_t>& kl_completion = examples[i == first ? last : i - 1].completion;
    bool cut = false;
    set.sequences.push_back(sequence(e.prompt, e.completion, o.max_length, cut));
    set.truncated += cut;
    bool kl_cut = false;
    set.sequences.push_back(sequence(e.prompt, kl_completion, o.max_length, kl_cut));
    set.labels.push_back(e.desirable ? '1' : '0');
    for (size_t k = set.sequences.size() - 2; k < set.sequences.size(); ++k)
      set.longest = std::max(set.longest, static_cast<int64_t>(set.sequences[k].tokens.size()));
  }
  return set;
}

}  // namespace dstrain::data
