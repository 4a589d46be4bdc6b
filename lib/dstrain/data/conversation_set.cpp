#include "dstrain/data/conversation_set.h"

#include <fmt/format.h>

#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/config/enums.h"
#include "dstrain/core/error.h"
#include "dstrain/data/loss_mask.h"
#include "dstrain/data/token_file.h"

namespace dstrain::data {

MaskedTokens open_masked_tokens(const std::string& path, int64_t vocab_size) {
  const std::string prefix = config::megatron_prefix(path);
  std::shared_ptr<const TokenFile> file = open_token_file(path, config::DataFormat::kMegatron, 1);
  auto mask = std::make_shared<const LossMask>(prefix, file->size());
  // open_token_file checked the mask's size and CRC against PREFIX.json (data/dataset_set.h).
  int64_t trained = -1;
  if (const auto sidecar = config::read_dataset_sidecar(path); sidecar && sidecar->lossmask_bytes >= 0) trained = sidecar->trained_tokens;
  for (int64_t i = 0; vocab_size > 0 && i < file->size(); ++i)
    if (const int64_t t = file->at(i); t < 0 || t >= vocab_size)
      throw Error(ErrorCode::kData, fmt::format("{}: token {} at offset {} is outside model.vocab_size {}", file->path(), t, i, vocab_size),
                  "prepare the data with the model's tokenizer");
  return {std::move(file), std::move(mask), trained};
}

std::vector<int64_t> document_lengths(const TokenFile& file) {
  const auto& starts = file.document_starts();
  std::vector<int64_t> lengths;
  for (size_t d = 0; d < starts.size(); ++d) lengths.push_back((d + 1 < starts.size() ? starts[d + 1] : file.size()) - starts[d]);
  return lengths;
}

ConversationSet::ConversationSet(std::vector<MaskedTokens> sources, std::vector<ConversationRef> refs)
    : sources_(std::move(sources)), refs_(std::move(refs)) {}

ConversationSet ConversationSet::all_of(std::vector<MaskedTokens> sources) {
  std::vector<ConversationRef> refs;
  for (size_t s = 0; s < sources.size(); ++s)
    for (int64_t d = 0; d < static_cast<int64_t>(sources[s].tokens->document_starts().size()); ++d) refs.push_back({s, d});
  return ConversationSet(std::move(sources), std::move(refs));
}

ConversationSet::Span ConversationSet::span(int64_t i) const {
  const ConversationRef& r = refs_[static_cast<size_t>(i)];
  const MaskedTokens& source = sources_[r.source];
  const auto& starts = source.tokens->document_starts();
  const auto d = static_cast<size_t>(r.document);
  return {source.tokens.get(), source.mask.get(), starts[d], d + 1 < starts.size() ? starts[d + 1] : source.tokens->size()};
}

int64_t ConversationSet::length(int64_t i) const {
  const Span s = span(i);
  return s.end - s.begin;
}

std::vector<int64_t> ConversationSet::lengths() const {
  std::vector<int64_t> out;
  out.reserve(refs_.size());
  for (int64_t i = 0; i < size(); ++i) out.push_back(length(i));
  return out;
}

int64_t ConversationSet::trained_tokens(int64_t i) const {
  const Span s = span(i);
  int64_t n = 0;
  for (int64_t t = s.begin; t < s.end; ++t) n += s.mask->trained(t);
  return n;
}

}  // namespace dstrain::data
