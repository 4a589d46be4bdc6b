#include "dstrain/text/bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <queue>

#include "dstrain/core/error.h"
#include "dstrain/text/byte_level.h"
#include "dstrain/text/utf8.h"

namespace dstrain::text {

struct BpeScratch::Impl {
  struct Symbol {
    uint32_t id;
    int32_t prev, next;
    bool alive;
  };
  struct Candidate {
    uint32_t rank, pos, new_id;
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }  // min-heap
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
  std::vector<uint32_t> ids;
  std::string key;
  std::unordered_map<std::string, std::vector<uint32_t>> cache;
};

BpeScratch::BpeScratch() : impl_(new Impl) {}
BpeScratch::~BpeScratch() { delete impl_; }

namespace {

constexpr size_t kCacheWords = 1 << 17;  // words kept per thread before the cache starts over
constexpr size_t kCacheMaxBytes = 256;   // longer pieces are not cached (they rarely repeat)
constexpr uint64_t kEmptyKey = ~uint64_t{0};

uint64_t pair_key(uint32_t left, uint32_t right) { return (uint64_t{left} << 32) | right; }
uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

Bpe::Bpe(const std::unordered_map<std::string, uint32_t>& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
         const BpeConfig& config)
    : config_(config) {
  for (const auto& [token, id] : vocab) max_id_ = std::max(max_id_, id);
  id_to_token_.resize(size_t{max_id_} + 1);
  has_id_.assign(size_t{max_id_} + 1, false);
  for (const auto& [token, id] : vocab) {
    std::optional<std::string> key = config.byte_level ? byte_level_decode(token) : std::optional<std::string>(token);
    id_to_token_[id] = key ? *key : token;
    has_id_[id] = true;
    if (key) vocab_.emplace(std::move(*key), id);
  }
  byte_ids_.fill(-1);
  fallback_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (auto it = vocab_.find(std::string(1, static_cast<char>(b))); config.byte_level && it != vocab_.end()) byte_ids_[b] = it->second;
    if (auto it = vocab.find(fmt::format("<0x{:02X}>", b)); it != vocab.end()) fallback_ids_[b] = it->second;
  }
  if (config.unk_token)
    if (auto it = vocab.find(*config.unk_token); it != vocab.end()) unk_id_ = it->second;

  size_t capacity = 16;
  while (capacity < merges.size() * 2) capacity *= 2;
  merge_keys_.assign(capacity, kEmptyKey);
  merge_values_.resize(capacity);
  merge_mask_ = capacity - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto l = vocab.find(left), r = vocab.find(right), joined = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || joined == vocab.end())
      throw Error(ErrorCode::kData,
                  fmt::format("tokenizer.json: merge {} ('{}' '{}') names a token that is not in model.vocab", rank + 1, left, right),
                  "the vocabulary and the merges must come from the same tokenizer");
    const uint64_t key = pair_key(l->second, r->second);
    uint64_t slot = mix(key) & merge_mask_;
    while (merge_keys_[slot] != kEmptyKey && merge_keys_[slot] != key) slot = (slot + 1) & merge_mask_;
    merge_keys_[slot] = key;  // a repeated pair keeps its last rank, as tokenizers' map does
    merge_values_[slot] = {static_cast<uint32_t>(rank), joined->second};
  }
}

const Bpe::Merge* Bpe::find_merge(uint32_t left, uint32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    if (merge_keys_[slot] == key) return &merge_values_[slot];
    if (merge_keys_[slot] == kEmptyKey) return nullptr;
  }
}

std::optional<std::string> Bpe::token_bytes(uint32_t id) const {
  if (id > max_id_ || !has_id_[id]) return std::nullopt;
  return id_to_token_[id];
}

// The symbols before any merge, with the unknown-character rules of tokenizers' BPE::merge_word
// (including its order: byte-fallback tokens go out before a pending unknown token).
void Bpe::initial_symbols(std::string_view piece, std::vector<uint32_t>& ids, size_t& dropped) const {
  int64_t pending_unk = -1;
  for (size_t i = 0; i < piece.size();) {
    const uint32_t length = config_.byte_level ? 1 : decode_utf8(piece, i).length;
    const std::string_view unit = piece.substr(i, length);
    i += length;
    int64_t id = -1;
    if (config_.byte_level) {
      id = byte_ids_[static_cast<unsigned char>(unit[0])];
    } else if (auto it = vocab_.find(std::string(unit)); it != vocab_.end()) {
      id = it->second;
    }
    if (id >= 0) {
      if (pending_unk >= 0) ids.push_back(static_cast<uint32_t>(pending_unk)), pending_unk = -1;
      ids.push_back(static_cast<uint32_t>(id));
      continue;
    }
    if (config_.byte_fallback) {
      std::string shown(unit);
      if (config_.byte_level) shown.clear(), append_utf8(shown, byte_level_char(static_cast<unsigned char>(unit[0])));
      const bool all = std::all_of(shown.begin(), shown.end(), [&](char c) { return fallback_ids_[static_cast<unsigned char>(c)] >= 0; });
      if (all) {
        for (char c : shown) ids.push_back(static_cast<uint32_t>(fallback_ids_[static_cast<unsigned char>(c)]));
        continue;
      }
    }
    if (!config_.unk_token) {
      ++dropped;
      continue;
    }
    if (unk_id_ < 0)
      throw Error(ErrorCode::kData, fmt::format("tokenizer.json: the unknown token '{}' is not in model.vocab", *config_.unk_token),
                  "add it to the vocabulary or set model.unk_token to null");
    if (pending_unk >= 0 && !config_.fuse_unk) ids.push_back(static_cast<uint32_t>(pending_unk));
    pending_unk = unk_id_;
  }
  if (pending_unk >= 0) ids.push_back(static_cast<uint32_t>(pending_unk));
}

void Bpe::merge_word(std::string_view piece, std::vector<uint32_t>& out, BpeScratch& scratch, size_t& dropped) const {
  auto& s = *scratch.impl_;
  s.ids.clear();
  initial_symbols(piece, s.ids, dropped);
  const auto n = static_cast<int32_t>(s.ids.size());
  s.symbols.resize(s.ids.size());
  for (int32_t i = 0; i < n; ++i) s.symbols[i] = {s.ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  s.heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i)
    if (const Merge* m = find_merge(s.ids[i], s.ids[i + 1])) s.heap.push_back({m->rank, static_cast<uint32_t>(i), m->new_id});
  std::make_heap(s.heap.begin(), s.heap.end());
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end());
    const auto top = s.heap.back();
    s.heap.pop_back();
    auto& left = s.symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const auto right = s.symbols[right_pos];
    const Merge* now = find_merge(left.id, right.id);
    if (!now || now->new_id != top.new_id) continue;  // an entry made stale by an earlier merge
    left.id = top.new_id;
    left.next = right.next;
    s.symbols[right_pos].alive = false;
    if (right.next >= 0) s.symbols[right.next].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0)
      if (const Merge* m = find_merge(s.symbols[left.prev].id, left.id)) {
        s.heap.push_back({m->rank, static_cast<uint32_t>(left.prev), m->new_id});
        std::push_heap(s.heap.begin(), s.heap.end());
      }
    if (left.next >= 0)
      if (const Merge* m = find_merge(left.id, s.symbols[left.next].id)) {
        s.heap.push_back({m->rank, top.pos, m->new_id});
        std::push_heap(s.heap.begin(), s.heap.end());
      }
  }
  for (const auto& symbol : s.symbols)
    if (symbol.alive) out.push_back(symbol.id);
}

void Bpe::encode(std::string_view piece, std::vector<uint32_t>& out, BpeScratch& scratch, size_t& dropped) const {
  if (piece.empty()) return;
  auto& s = *scratch.impl_;
  s.key.assign(piece.data(), piece.size());
  if (config_.ignore_merges)
    if (auto it = vocab_.find(s.key); it != vocab_.end()) return out.push_back(it->second);
  const bool cacheable = piece.size() <= kCacheMaxBytes;
  if (cacheable) {
    if (auto it = s.cache.find(s.key); it != s.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  const size_t dropped_before = dropped;
  merge_word(piece, out, scratch, dropped);
  if (cacheable && dropped == dropped_before) {  // words with dropped characters are counted every time
    if (s.cache.size() >= kCacheWords) s.cache.clear();
    s.cache.emplace(s.key, std::vector<uint32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
  }
}

}  // namespace dstrain::text
