// Reading a Hugging Face tokenizer.json into a Tokenizer: every key dstrain knows is read, every
// component it does not implement is refused by name (never silently approximated).
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/json_depth.h"
#include "dstrain/text/tokenizer_impl.h"

namespace dstrain::text {
namespace {

using json = nlohmann::json;

// The largest token id dstrain accepts: tables are sized by the largest id (real vocabularies hold
// under 300,000), so an id of 2^31-1 in a 10 KB file would otherwise ask for 64 GB.
constexpr uint64_t kMaxTokenId = (1u << 24) - 1;

// The GPT-2 pattern of tokenizers' ByteLevel pre-tokenizer (use_regex: true).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void refuse(const std::string& where, const std::string& what, const std::string& hint = {}) {
  throw Error(ErrorCode::kData, fmt::format("tokenizer.json: {}: {}", where, what),
              hint.empty() ? "dstrain reads BPE tokenizers (byte-level as GPT-2, Llama 3 and DeepSeek use, or with byte_fallback); "
                             "convert this one or prepare the data with its own tools"
                           : hint);
}

const json& member(const json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key)) refuse(where, fmt::format("the key '{}' is missing", key));
  return object.at(key);
}

std::string type_of(const json& component, const std::string& where) {
  const json& type = member(component, "type", where);
  if (!type.is_string()) refuse(where + ".type", "is not a string");
  return type.get<std::string>();
}

bool flag(const json& object, const char* key, bool fallback, const std::string& where) {
  if (!object.contains(key) || object.at(key).is_null()) return fallback;
  if (!object.at(key).is_boolean()) refuse(where + "." + key, "is not true or false");
  return object.at(key).get<bool>();
}

std::string text_of(const json& value, const std::string& where) {
  if (!value.is_string()) refuse(where, "is not a string");
  return value.get<std::string>();
}

// A Split/Replace pattern: {"Regex": "..."} or {"String": "..."}.
void read_pattern(const json& pattern, const std::string& where, std::shared_ptr<const Regex>& regex, std::string& literal) {
  if (pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex")) {
    regex = std::make_shared<Regex>(text_of(pattern.at("Regex"), where + ".Regex"));
  } else if (pattern.is_object() && pattern.size() == 1 && pattern.contains("String")) {
    literal = text_of(pattern.at("String"), where + ".String");
    if (literal.empty()) refuse(where + ".String", "is empty");
  } else {
    refuse(where, "is neither {\"Regex\": ...} nor {\"String\": ...}");
  }
}

void read_normalizer(const json& n, const std::string& where, Normalizer& out) {
  const std::string type = type_of(n, where);
  NormalizerStep step{};
  if (type == "Sequence") {
    const json& list = member(n, "normalizers", where);
    if (!list.is_array()) refuse(where + ".normalizers", "is not a list");
    for (size_t i = 0; i < list.size(); ++i) read_normalizer(list[i], fmt::format("{}.normalizers[{}]", where, i), out);
    return;
  } else if (type == "NFC") {
    step.kind = NormalizerStep::Kind::kNfc;
  } else if (type == "NFD") {
    step.kind = NormalizerStep::Kind::kNfd;
  } else if (type == "NFKC") {
    step.kind = NormalizerStep::Kind::kNfkc;
  } else if (type == "NFKD") {
    step.kind = NormalizerStep::Kind::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = NormalizerStep::Kind::kLowercase;
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    step.text = text_of(member(n, "prepend", where), where + ".prepend");
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    read_pattern(member(n, "pattern", where), where + ".pattern", step.regex, step.text);
    step.content = text_of(member(n, "content", where), where + ".content");
  } else if (type == "Strip") {
    step.kind = NormalizerStep::Kind::kStrip;
    step.left = flag(n, "strip_left", true, where);
    step.right = flag(n, "strip_right", true, where);
  } else {
    refuse(where, fmt::format("the normalizer '{}' is not supported (dstrain has NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, "
                              "Strip and Sequence)",
                              type));
  }
  out.add(std::move(step));
}

SplitBehavior read_behavior(const json& value, const std::string& where) {
  const std::string name = text_of(value, where);
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  refuse(where, fmt::format("'{}' is not a split behavior (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)", name));
}

// Flattens Sequences; returns the steps in order. `names` collects the types for describe().
void read_pre_tokenizer(const json& p, const std::string& where, std::vector<PreTokenizerStep>& out, std::vector<std::string>& names) {
  const std::string type = type_of(p, where);
  PreTokenizerStep step{};
  if (type == "Sequence") {
    const json& list = member(p, "pretokenizers", where);
    if (!list.is_array()) refuse(where + ".pretokenizers", "is not a list");
    for (size_t i = 0; i < list.size(); ++i) read_pre_tokenizer(list[i], fmt::format("{}.pretokenizers[{}]", where, i), out, names);
    return;
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    read_pattern(member(p, "pattern", where), where + ".pattern", step.regex, step.literal);
    step.behavior = read_behavior(member(p, "behavior", where), where + ".behavior");
    step.invert = flag(p, "invert", false, where);
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kDigits;
    step.individual_digits = flag(p, "individual_digits", false, where);
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = flag(p, "add_prefix_space", true, where);
    if (flag(p, "use_regex", true, where)) step.regex = std::make_shared<Regex>(kGpt2Pattern);
  } else {
    refuse(where, fmt::format("the pre-tokenizer '{}' is not supported (dstrain has Split, Digits, ByteLevel and Sequence)", type));
  }
  names.push_back(type);
  out.push_back(std::move(step));
}

std::vector<std::pair<std::string, std::string>> read_merges(const json& merges) {
  if (!merges.is_array()) refuse("model.merges", "is not a list");
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {  // the older "left right" form
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        refuse(fmt::format("model.merges[{}]", i), fmt::format("'{}' is not two tokens separated by one space", s));
      out.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      refuse(fmt::format("model.merges[{}]", i), "is neither \"left right\" nor [\"left\", \"right\"]");
    }
  }
  return out;
}

void read_model(const json& model, bool byte_level, Tokenizer::Impl& impl) {
  if (!model.is_object()) refuse("model", "is not an object");
  const std::string type = model.contains("type") ? type_of(model, "model") : (model.contains("merges") ? "BPE" : "");
  if (type != "BPE")
    refuse("model.type", fmt::format("the model '{}' is not supported: dstrain reads BPE tokenizers", type.empty() ? "(none)" : type));
  if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout").get<double>() != 0.0)
    refuse("model.dropout", "BPE dropout samples different tokens each time", "set model.dropout to null for preparing data");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model.at(key).is_null() && !text_of(model.at(key), std::string("model.") + key).empty())
      refuse(std::string("model.") + key, "is not supported (it is for WordPiece-style BPE, not what DeepSeek, GPT-2 or Llama use)");
  BpeConfig config;
  config.byte_level = byte_level;
  config.ignore_merges = flag(model, "ignore_merges", false, "model");
  config.byte_fallback = flag(model, "byte_fallback", false, "model");
  config.fuse_unk = flag(model, "fuse_unk", false, "model");
  if (model.contains("unk_token") && !model.at("unk_token").is_null()) config.unk_token = text_of(model.at("unk_token"), "model.unk_token");
  const json& vocab_json = member(model, "vocab", "model");
  if (!vocab_json.is_object()) refuse("model.vocab", "is not an object of token: id");
  std::unordered_map<std::string, uint32_t> vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > kMaxTokenId)
      refuse("model.vocab." + token, fmt::format("is not a token id (0 to {}: vocabularies are far smaller)", kMaxTokenId));
    vocab.emplace(token, id.get<uint32_t>());
  }
  impl.model = std::make_unique<Bpe>(vocab, read_merges(member(model, "merges", "model")), config);
  impl.content_to_id = std::move(vocab);
}

// The ids of the special token named `name` in a TemplateProcessing's special_tokens.
std::vector<uint32_t> template_ids(const json& processor, const std::string& name, const std::string& where) {
  const json& specials = member(processor, "special_tokens", where);
  if (!specials.is_object() || !specials.contains(name)) refuse(where + ".special_tokens", fmt::format("has no entry '{}'", name));
  const json& ids = member(specials.at(name), "ids", where + ".special_tokens." + name);
  std::vector<uint32_t> out;
  for (const auto& id : ids) {
    if (!id.is_number_unsigned()) refuse(where + ".special_tokens." + name + ".ids", "holds something that is not a token id");
    out.push_back(id.get<uint32_t>());
  }
  return out;
}

void read_post_processor(const json& p, const std::string& where, Tokenizer::Impl& impl, std::vector<std::string>& names) {
  const std::string type = type_of(p, where);
  std::vector<uint32_t> prefix, suffix;
  if (type == "Sequence") {
    const json& list = member(p, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) read_post_processor(list[i], fmt::format("{}.processors[{}]", where, i), impl, names);
    return;
  } else if (type == "ByteLevel") {
    return;  // it only trims offsets, which data preparation does not keep
  } else if (type == "TemplateProcessing") {
    const json& single = member(p, "single", where);
    bool seen_a = false;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& item = single[i];
      const std::string at = fmt::format("{}.single[{}]", where, i);
      if (item.contains("Sequence")) {
        if (text_of(member(item.at("Sequence"), "id", at), at + ".Sequence.id") != "A" || seen_a)
          refuse(at, "a single-sequence template holds $A once and no other sequence");
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        const auto ids = template_ids(p, text_of(member(item.at("SpecialToken"), "id", at), at + ".SpecialToken.id"), where);
        (seen_a ? suffix : prefix).insert((seen_a ? suffix : prefix).end(), ids.begin(), ids.end());
      } else {
        refuse(at, "is neither a Sequence nor a SpecialToken");
      }
    }
    if (!seen_a) refuse(where + ".single", "has no $A");
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const json& pair = member(p, key, where);
      if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_unsigned()) refuse(where + "." + key, "is not [token, id]");
      (std::string(key) == "cls" ? prefix : suffix).push_back(pair[1].get<uint32_t>());
    }
  } else {
    refuse(where, fmt::format("the post-processor '{}' is not supported (dstrain has TemplateProcessing, ByteLevel, RobertaProcessing, "
                              "BertProcessing and Sequence)",
                              type));
  }
  // A later processor wraps what the earlier ones made.
  impl.prefix_ids.insert(impl.prefix_ids.begin(), prefix.begin(), prefix.end());
  impl.suffix_ids.insert(impl.suffix_ids.end(), suffix.begin(), suffix.end());
  names.push_back(type);
}

void read_added_tokens(const json& list, Tokenizer::Impl& impl) {
  if (list.is_null()) return;
  if (!list.is_array()) refuse("added_tokens", "is not a list");
  std::vector<AddedToken> raw, normalized;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("added_tokens[{}]", i);
    const json& t = list[i];
    AddedToken token;
    token.content = text_of(member(t, "content", where), where + ".content");
    const json& id = member(t, "id", where);
    if (!id.is_number_unsigned() || id.get<uint64_t>() > kMaxTokenId)
      refuse(where + ".id", fmt::format("is not a token id (0 to {})", kMaxTokenId));
    token.id = id.get<uint32_t>();
    if (flag(t, "single_word", false, where))
      refuse(where + ".single_word", fmt::format("is true for '{}': single-word added tokens are not supported", token.content),
             "set single_word to false if the token may match inside words");
    token.lstrip = flag(t, "lstrip", false, where);
    token.rstrip = flag(t, "rstrip", false, where);
    token.normalized = flag(t, "normalized", true, where);
    token.special = flag(t, "special", false, where);
    impl.content_to_id[token.content] = token.id;
    impl.added.push_back(token);
    (token.normalized ? normalized : raw).push_back(std::move(token));
  }
  // Normalized tokens are matched in normalized text, so their patterns are normalized too.
  for (auto& t : normalized) {
    if (!impl.normalizer) break;
    std::string n;
    impl.normalizer->apply(t.content, n);
    t.content = n;
  }
  impl.raw_matcher = AddedTokenMatcher(std::move(raw));
  impl.normalized_matcher = AddedTokenMatcher(std::move(normalized));
}

}  // namespace

void parse_tokenizer_json(const std::string& text, Tokenizer::Impl& impl) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    throw Error(ErrorCode::kData, fmt::format("'{}' nests JSON more than {} levels deep", impl.json_path, kMaxJsonDepth),
                "a tokenizer.json nests a few levels (a Sequence of normalizers); pass the tokenizer.json itself");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kData, fmt::format("'{}' is not valid JSON: {}", impl.json_path, e.what()), "pass the tokenizer.json itself");
  }
  try {
    if (!j.is_object()) refuse("(top level)", "is not an object");
    for (const char* key : {"truncation", "padding"})
      if (j.contains(key) && !j.at(key).is_null())
        refuse(key, "is set; it would cut or pad every document", fmt::format("set \"{}\": null in the file", key));
    std::vector<std::string> pre_names, post_names;
    if (j.contains("normalizer") && !j.at("normalizer").is_null()) {
      impl.normalizer.emplace();
      read_normalizer(j.at("normalizer"), "normalizer", *impl.normalizer);
      if (impl.normalizer->empty()) impl.normalizer.reset();  // DeepSeek's empty Sequence
    }
    std::vector<PreTokenizerStep> steps;
    if (j.contains("pre_tokenizer") && !j.at("pre_tokenizer").is_null())
      read_pre_tokenizer(j.at("pre_tokenizer"), "pre_tokenizer", steps, pre_names);
    bool byte_level = false;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].kind != PreTokenizerStep::Kind::kByteLevel) continue;
      if (i + 1 != steps.size())
        refuse("pre_tokenizer", "ByteLevel is followed by other pre-tokenizers; dstrain supports it only as the last one");
      byte_level = true;
    }
    for (auto& step : steps) impl.pre_tokenizer.add(std::move(step));
    read_model(member(j, "model", "(top level)"), byte_level, impl);
    read_added_tokens(j.contains("added_tokens") ? j.at("added_tokens") : json(), impl);
    if (j.contains("post_processor") && !j.at("post_processor").is_null())
      read_post_processor(j.at("post_processor"), "post_processor", impl, post_names);
    if (j.contains("decoder") && !j.at("decoder").is_null()) impl.decoder = type_of(j.at("decoder"), "decoder");
    impl.byte_level = byte_level;
    impl.vocab_size = impl.model->max_id() + 1;
    for (const auto& t : impl.added) impl.vocab_size = std::max(impl.vocab_size, t.id + 1);
    std::string pre;
    for (const auto& n : pre_names) pre += (pre.empty() ? "" : " > ") + n;
    impl.describe = fmt::format("BPE{} with {} ids, {} added tokens; pre-tokenizer {}; normalizer {}; template {} + $A + {}",
                                byte_level ? " (byte-level)" : "", impl.vocab_size, impl.added.size(), pre.empty() ? "none" : pre,
                                impl.normalizer ? "yes" : "none", impl.prefix_ids.size(), impl.suffix_ids.size());
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kData, fmt::format("'{}': unexpected value: {}", impl.json_path, e.what()),
                "check the file against transformers");
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{} ({})", e.what(), impl.json_path), e.hint());
  }
}

std::optional<uint32_t> Tokenizer::default_end_of_document() const {
  const auto config_path = std::filesystem::path(impl_->folder) / "tokenizer_config.json";
  if (!impl_->folder.empty() && std::filesystem::is_regular_file(config_path)) {
    const json config = json::parse(read_file(config_path.string()), nullptr, false);
    if (config.is_object() && config.contains("eos_token")) {
      const json& eos = config.at("eos_token");
      const json& content = eos.is_object() && eos.contains("content") ? eos.at("content") : eos;
      if (content.is_string())
        if (auto id = token_id(content.get<std::string>())) return id;
    }
  }
  for (const char* name : {"<|endoftext|>", "<｜end▁of▁sentence｜>", "<|end_of_text|>", "</s>", "<eos>"})
    if (auto id = token_id(name)) return id;
  return std::nullopt;
}

}  // namespace dstrain::text
