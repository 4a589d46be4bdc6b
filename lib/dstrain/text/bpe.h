#pragma once
// The BPE model of a Hugging Face tokenizer.json, with the merge order of `tokenizers` (lowest
// rank first, leftmost first among equal ranks) so that ids match it exactly. Byte-level models
// work on bytes (the vocabulary is translated from GPT-2's alphabet at load); the others on UTF-8
// characters, with byte_fallback (<0xNN> tokens) and the unknown token as configured.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dstrain::text {

struct BpeConfig {
  bool byte_level = false;  // the input is bytes (a ByteLevel pre-tokenizer ran before the model)
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  std::optional<std::string> unk_token;
};

// Per-thread state of encoding: a cache of recent words and scratch space.
class BpeScratch {
 public:
  BpeScratch();
  ~BpeScratch();
  BpeScratch(const BpeScratch&) = delete;
  BpeScratch& operator=(const BpeScratch&) = delete;

 private:
  friend class Bpe;
  struct Impl;
  Impl* impl_;
};

class Bpe {
 public:
  // `vocab`: token string (as in tokenizer.json) -> id; `merges`: pairs in rank order. Throws
  // Error{kData} naming the first merge whose parts or result are not in the vocabulary.
  Bpe(const std::unordered_map<std::string, uint32_t>& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
      const BpeConfig& config);

  // Appends the ids of one pre-tokenized piece (bytes for a byte-level model, else UTF-8).
  // Characters with no token and no fallback are dropped, as `tokenizers` drops them; `dropped`
  // counts them.
  void encode(std::string_view piece, std::vector<uint32_t>& out, BpeScratch& scratch, size_t& dropped) const;

  // The bytes (byte-level) or text of token `id`; nullopt when the model has no such id.
  std::optional<std::string> token_bytes(uint32_t id) const;
  uint32_t max_id() const { return max_id_; }

 private:
  struct Merge {
    uint32_t rank, new_id;
  };
  const Merge* find_merge(uint32_t left, uint32_t right) const;
  void merge_word(std::string_view piece, std::vector<uint32_t>& out, BpeScratch& scratch, size_t& dropped) const;
  void initial_symbols(std::string_view piece, std::vector<uint32_t>& ids, size_t& dropped) const;

  BpeConfig config_;
  std::unordered_map<std::string, uint32_t> vocab_;  // token bytes (byte-level) or text -> id
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::array<int64_t, 256> byte_ids_{};      // byte-level: the id of each single byte (-1: none)
  std::array<int64_t, 256> fallback_ids_{};  // byte_fallback: the id of <0xNN> (-1: none)
  int64_t unk_id_ = -1;
  uint32_t max_id_ = 0;
  // Open-addressing table of merges keyed by (left << 32 | right).
  std::vector<uint64_t> merge_keys_;
  std::vector<Merge> merge_values_;
  uint64_t merge_mask_ = 0;
};

}  // namespace dstrain::text
