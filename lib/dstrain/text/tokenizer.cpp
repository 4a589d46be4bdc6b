#include "dstrain/text/tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <functional>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/sha256.h"
#include "dstrain/text/byte_level.h"
#include "dstrain/text/tokenizer_impl.h"

namespace dstrain::text {
namespace fs = std::filesystem;

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Session::Session() : impl_(std::make_unique<Impl>()) {}
Tokenizer::Session::~Session() = default;
size_t Tokenizer::Session::dropped_characters() const { return impl_->dropped; }

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::string& path) {
  fs::path file(path);
  if (fs::is_directory(file)) file /= "tokenizer.json";
  if (!fs::is_regular_file(file))
    throw Error(ErrorCode::kData, fmt::format("no tokenizer at '{}'", file.string()),
                "pass a tokenizer.json or the folder transformers saved the tokenizer in (it holds tokenizer.json)");
  const auto t = from_json(read_file(file.string()), file.string());
  t->impl_->folder = file.parent_path().string();
  return t;
}

std::shared_ptr<const Tokenizer> Tokenizer::from_json(const std::string& json, const std::string& name) {
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  t->impl_->json_path = name;
  t->impl_->folder = "";  // no files beside it
  t->impl_->sha256 = to_hex(dstrain::sha256(json));
  parse_tokenizer_json(json, *t->impl_);
  return t;
}

namespace {
// Added tokens still in raw-text coordinates (all of them before a normalizer rewrites the text)
// remember where they end there.
void mark_raw_ends(std::vector<Piece>& list) {
  for (auto& piece : list)
    if (piece.token >= 0 && piece.raw_end == 0) piece.raw_end = piece.end;
}
}  // namespace

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& ids, Session& session, bool add_special_tokens,
                       std::vector<TokenCut>* cuts) const {
  const Impl& m = *impl_;
  auto& s = *session.impl_;
  if (add_special_tokens) ids.insert(ids.end(), m.prefix_ids.begin(), m.prefix_ids.end());
  auto& pieces = s.pieces;
  std::string_view buffer = text;  // what the pieces index: the text itself (not copied), or its normalized form
  pieces.list.assign(1, Piece{0, static_cast<uint32_t>(text.size()), -1});
  if (!m.raw_matcher.empty()) {
    s.cut.clear();
    for (const auto& piece : pieces.list) m.raw_matcher.split(buffer, piece, s.cut);
    pieces.list.swap(s.cut);
    if (cuts) mark_raw_ends(pieces.list);
  }
  if (m.normalizer) {  // normalize each plain piece, then find the normalized added tokens in it
    s.scratch.text.clear();
    s.scratch.list.clear();
    for (const auto& piece : pieces.list) {
      const auto begin = static_cast<uint32_t>(s.scratch.text.size());
      if (piece.token >= 0) {
        s.scratch.text.append(buffer.substr(piece.begin, piece.end - piece.begin));
      } else {
        m.normalizer->apply(buffer.substr(piece.begin, piece.end - piece.begin), s.normalized);
        s.scratch.text += s.normalized;
      }
      s.scratch.list.push_back({begin, static_cast<uint32_t>(s.scratch.text.size()), piece.token, piece.raw_end});
    }
    std::swap(pieces, s.scratch);
    buffer = pieces.text;
  }
  if (!m.normalized_matcher.empty()) {
    s.cut.clear();
    for (const auto& piece : pieces.list) {
      if (piece.token >= 0)
        s.cut.push_back(piece);
      else
        m.normalized_matcher.split(buffer, piece, s.cut);
    }
    pieces.list.swap(s.cut);
  }
  // Tokens found after a first pass cut the text are cuts only where that pass was the only one
  // (the second pass sees plain pieces the first pass bounded, which a different text may not).
  if (cuts && !m.normalizer && m.raw_matcher.empty()) mark_raw_ends(pieces.list);
  const size_t first_id = ids.size();
  const std::function<void(std::string_view)> model = [&](std::string_view piece) { m.model->encode(piece, ids, s.bpe, s.dropped); };
  for (const auto& piece : pieces.list) {
    if (piece.token >= 0) {
      ids.push_back(static_cast<uint32_t>(piece.token));
      if (cuts && piece.raw_end > 0) cuts->push_back({piece.raw_end, ids.size() - first_id});
    } else {
      m.pre_tokenizer.for_each_piece(buffer.substr(piece.begin, piece.end - piece.begin), model);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), m.suffix_ids.begin(), m.suffix_ids.end());
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  if (!impl_->byte_level && !impl_->decoder.empty())
    throw Error(ErrorCode::kData, fmt::format("decoding with the '{}' decoder is not supported ({})", impl_->decoder, impl_->json_path),
                "dstrain decodes byte-level tokenizers and ones without a decoder; decode with transformers instead");
  std::unordered_map<uint32_t, const AddedToken*> added;
  for (const auto& t : impl_->added) added[t.id] = &t;
  std::string out;
  for (uint32_t id : ids) {
    if (auto it = added.find(id); it != added.end()) {
      if (!skip_special_tokens || !it->second->special) out += it->second->content;
    } else if (auto bytes = impl_->model->token_bytes(id)) {
      out += *bytes;
    } else {
      throw Error(ErrorCode::kData, fmt::format("token id {} is not in the tokenizer's vocabulary ({} ids)", id, impl_->vocab_size),
                  "the data was made with another tokenizer: pass the one it was prepared with");
    }
  }
  return out;
}

uint32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

size_t Tokenizer::longest_added_token() const {
  size_t n = 0;
  for (const auto& t : impl_->added) n = std::max(n, t.content.size());
  return n;
}

std::optional<uint32_t> Tokenizer::token_id(std::string_view content) const {
  if (auto it = impl_->content_to_id.find(std::string(content)); it != impl_->content_to_id.end()) return it->second;
  return std::nullopt;
}

const std::string& Tokenizer::json_path() const { return impl_->json_path; }
const std::string& Tokenizer::sha256() const { return impl_->sha256; }
std::string Tokenizer::describe() const { return impl_->describe; }

std::vector<std::string> Tokenizer::files() const {
  std::vector<std::string> out{impl_->json_path};
  if (fs::path(impl_->json_path).filename() != "tokenizer.json") return out;  // a lone file: its siblings are not its
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"})
    if (fs::is_regular_file(fs::path(impl_->folder) / name)) out.push_back((fs::path(impl_->folder) / name).string());
  return out;
}

}  // namespace dstrain::text
