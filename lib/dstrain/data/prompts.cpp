#include "dstrain/data/prompts.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "dstrain/core/error.h"
#include "dstrain/text/chat_template_file.h"
#include "dstrain/text/jinja.h"
#include "dstrain/text/tokenizer.h"
#include "dstrain/text/utf8.h"

namespace dstrain::data {

struct PromptCodec::Impl {
  std::string dir;
  std::shared_ptr<const text::Tokenizer> tokenizer;  // null: bytes
  int64_t byte_end = -1;
  std::unique_ptr<text::ChatTemplate> chat;
  text::ChatTemplateSource chat_source;
};

PromptCodec::PromptCodec(const std::string& tokenizer_dir, int64_t end_of_document) : impl_(std::make_unique<Impl>()) {
  impl_->dir = tokenizer_dir;
  impl_->byte_end = end_of_document;
  if (!tokenizer_dir.empty()) impl_->tokenizer = text::Tokenizer::load(tokenizer_dir);
}

PromptCodec::~PromptCodec() = default;

std::vector<int64_t> PromptCodec::encode_text(const std::string& text, bool add_special_tokens) const {
  if (!impl_->tokenizer) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
    return std::vector<int64_t>(bytes, bytes + text.size());
  }
  std::vector<uint32_t> ids;
  text::Tokenizer::Session session;
  impl_->tokenizer->encode(text, ids, session, add_special_tokens);
  return {ids.begin(), ids.end()};
}

std::vector<int64_t> PromptCodec::encode_messages(const std::string& json) {
  Impl& s = *impl_;
  if (!s.tokenizer)
    throw Error(ErrorCode::kConfig,
                "this model was trained on bytes: it has no tokenizer and no chat template to render a conversation with",
                "give it plain text ({\"prompt\": TEXT}, --prompt), or train on conversations (prepare-data --chat)");
  if (!s.chat) {
    s.chat_source = text::read_chat_template(s.dir);
    s.chat = std::make_unique<text::ChatTemplate>(s.chat_source.source, s.chat_source.name);
  }
  // A chat template prints its own BOS: no special tokens added, as apply_chat_template(tokenize=True).
  const std::string rendered = s.chat->render(text::chat_context(json, s.chat_source, /*generation_prompt=*/true)).text;
  std::vector<uint32_t> ids;
  text::Tokenizer::Session session;
  s.tokenizer->encode(rendered, ids, session, /*add_special_tokens=*/false);
  return {ids.begin(), ids.end()};
}

std::string PromptCodec::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::string s;
  if (!impl_->tokenizer) {  // bytes; the end-of-document token has no text
    for (const int64_t id : ids)
      if (id >= 0 && id < 256) s.push_back(static_cast<char>(id));
  } else {
    // Ids past the tokenizer's (a vocabulary padded for the GPU's tiles) have no text, as in transformers.
    std::vector<uint32_t> known;
    for (const int64_t id : ids)
      if (id >= 0 && id < impl_->tokenizer->vocab_size()) known.push_back(static_cast<uint32_t>(id));
    s = impl_->tokenizer->decode(known, skip_special_tokens);
  }
  text::repair_utf8(s);
  return s;
}

int64_t PromptCodec::end_of_sequence() const {
  if (!impl_->tokenizer) return impl_->byte_end;
  const auto eos = impl_->tokenizer->default_end_of_document();
  return eos ? static_cast<int64_t>(*eos) : -1;
}

const std::string& PromptCodec::tokenizer_dir() const { return impl_->dir; }

std::shared_ptr<const text::Tokenizer> PromptCodec::tokenizer() const { return impl_->tokenizer; }

int64_t PromptCodec::vocab_size() const { return impl_->tokenizer ? impl_->tokenizer->vocab_size() : impl_->byte_end >= 0 ? 257 : 256; }

std::string PromptCodec::bos_text() const {
  if (!impl_->tokenizer) return "";
  text::ChatTemplateSource special;
  text::read_special_tokens(impl_->dir, special);
  return special.bos_token;
}

std::vector<Prompt> read_prompts(const std::string& path, PromptCodec& codec) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kUsage, fmt::format("{}: cannot be read", path), "pass a JSON Lines file of prompts");
  std::vector<Prompt> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, n);
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, false);
    if (row.is_object() && row.contains("prompt") && row["prompt"].is_string()) {
      out.push_back({where, row["prompt"].get<std::string>(), codec.encode_text(row["prompt"].get<std::string>())});
    } else if (row.is_object() && row.contains("messages") && row["messages"].is_array()) {
      try {
        out.push_back({where, row["messages"].dump(), codec.encode_messages(line)});
      } catch (const Error& e) {
        throw Error(e.code(), where + ": " + e.what(), e.hint());
      }
    } else {
      throw Error(ErrorCode::kData, fmt::format("{}: a prompt is a JSON object with \"prompt\" (text) or \"messages\" (a list)", where),
                  "write one {\"prompt\": \"...\"} or {\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]} per line");
    }
  }
  return out;
}

}  // namespace dstrain::data
