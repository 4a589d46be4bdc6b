#include "dstrain/data/score_token.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/text/tokenizer.h"

namespace dstrain::data {

namespace {

// tokenizer_config.json's pad_token (a string or an AddedToken's content); "" when none.
std::string configured_pad_token(const std::string& tokenizer_dir) {
  const std::filesystem::path path = std::filesystem::path(tokenizer_dir) / "tokenizer_config.json";
  if (!std::filesystem::is_regular_file(path)) return "";
  const nlohmann::json config = nlohmann::json::parse(read_file(path.string()), nullptr, false);
  if (!config.is_object() || !config.contains("pad_token")) return "";
  const nlohmann::json& v = config.at("pad_token");
  const nlohmann::json& content = v.is_object() && v.contains("content") ? v.at("content") : v;
  return content.is_string() ? content.get<std::string>() : "";
}

}  // namespace

int64_t score_pad_token(const config::DatasetSidecar& sidecar) {
  if (!sidecar.tokenizer_dir.empty())
    if (const std::string pad = configured_pad_token(sidecar.tokenizer_dir); !pad.empty()) {
      if (const auto id = text::Tokenizer::load(sidecar.tokenizer_dir)->token_id(pad)) return int64_t{*id};
      throw Error(ErrorCode::kData,
                  fmt::format("{}/tokenizer_config.json: pad_token '{}' is not in the tokenizer's vocabulary", sidecar.tokenizer_dir, pad),
                  "fix the tokenizer's pad_token and prepare the set again with prepare-data --preference");
    }
  if (sidecar.eos >= 0) return sidecar.eos;
  throw Error(ErrorCode::kData,
              fmt::format("{}: the set's tokenizer has neither a pad_token nor an end-of-document token, and a reward model reads its "
                          "score at the last token that is not the pad token",
                          sidecar.file),
              "prepare the set with a tokenizer that names its eos_token (or pad_token)");
}

int64_t score_position(const std::vector<int64_t>& tokens, int64_t pad) {
  for (size_t i = tokens.size(); i-- > 0;)
    if (tokens[i] != pad) return static_cast<int64_t>(i);
  return 0;
}

}  // namespace dstrain::data
