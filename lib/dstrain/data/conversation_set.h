#pragma once
// Fine-tuning conversations (prepare-data --chat: the documents of a Megatron set with a loss mask
// beside it), from one or more sets, as one list: training packs the conversations of each source
// that eval.split leaves in, an evaluation set the ones it holds out or all of an eval.paths set,
// and every packed row reads them through this list. Conversation i is document
// refs[i].document of source refs[i].source.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dstrain::data {

class TokenFile;
class LossMask;

// A fine-tuning set's tokens and the mask of the tokens it trains.
struct MaskedTokens {
  std::shared_ptr<const TokenFile> tokens;
  std::shared_ptr<const LossMask> mask;
  int64_t trained = -1;  // the tokens the mask trains, as PREFIX.json recorded it (-1: not recorded)
};

// Opens PREFIX (the path of a Megatron set, either file or the prefix) with its PREFIX.lossmask,
// checks the mask against what PREFIX.json recorded (when it did) and every token against
// [0, vocab_size) (vocab_size > 0). Throws Error{kData} naming the file.
MaskedTokens open_masked_tokens(const std::string& path, int64_t vocab_size);

// The token counts of `file`'s documents (its .idx), in order.
std::vector<int64_t> document_lengths(const TokenFile& file);

struct ConversationRef {
  size_t source = 0;
  int64_t document = 0;
};

class ConversationSet {
 public:
  ConversationSet(std::vector<MaskedTokens> sources, std::vector<ConversationRef> refs);
  // Every conversation of `sources`, source by source in file order.
  static ConversationSet all_of(std::vector<MaskedTokens> sources);

  int64_t size() const { return static_cast<int64_t>(refs_.size()); }
  const std::vector<MaskedTokens>& sources() const { return sources_; }
  const ConversationRef& ref(int64_t i) const { return refs_[static_cast<size_t>(i)]; }

  // Conversation i: its tokens [begin, end) of its source's file, and that source.
  struct Span {
    const TokenFile* tokens;
    const LossMask* mask;
    int64_t begin, end;
  };
  Span span(int64_t i) const;
  int64_t length(int64_t i) const;
  std::vector<int64_t> lengths() const;     // of every conversation, in order
  int64_t trained_tokens(int64_t i) const;  // of conversation i, that its mask trains

 private:
  std::vector<MaskedTokens> sources_;
  std::vector<ConversationRef> refs_;
};

}  // namespace dstrain::data
