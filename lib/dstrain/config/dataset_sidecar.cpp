#include "dstrain/config/dataset_sidecar.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/sha256.h"

namespace dstrain::config {

std::string megatron_prefix(const std::string& path) {
  const bool suffixed = path.size() > 4 && (path.compare(path.size() - 4, 4, ".bin") == 0 || path.compare(path.size() - 4, 4, ".idx") == 0);
  return suffixed ? path.substr(0, path.size() - 4) : path;
}

std::optional<DatasetSidecar> read_dataset_sidecar(const std::string& data_path,
                                                   const std::function<std::optional<std::string>(const std::string&)>& read) {
  DatasetSidecar s;
  s.file = megatron_prefix(data_path) + ".json";
  const auto text = read(s.file);
  if (!text) return std::nullopt;
  const auto j = nlohmann::json::parse(*text, nullptr, false);
  if (!j.is_object() || j.value("format", "") != "megatron" || !j.contains("vocab_size") || !j.at("vocab_size").is_number_integer())
    return std::nullopt;
  s.vocab_size = j.at("vocab_size").get<int64_t>();
  if (j.contains("eos") && j.at("eos").is_number_integer()) s.eos = j.at("eos").get<int64_t>();
  s.tokenizer = j.value("tokenizer", "");
  s.tokenizer_sha256 = j.value("tokenizer_sha256", "");
  if (const std::string dir = j.value("tokenizer_dir", ""); !dir.empty())
    s.tokenizer_dir = (std::filesystem::path(s.file).parent_path() / dir).string();
  if (const auto m = j.find("loss_mask"); m != j.end() && m->is_object()) {
    s.lossmask_bytes = m->value("bytes", int64_t{-1});
    s.trained_tokens = m->value("trained_tokens", int64_t{-1});
    if (const auto c = j.find("chat"); c != j.end() && c->is_object())
      s.longest_conversation = c->value("longest_conversation", int64_t{-1}), s.end_of_turn = c->value("end_of_turn", std::string());
    if (const auto p = j.find("preference"); p != j.end() && p->is_object()) {
      s.preference_pairs = p->value("pairs", int64_t{-1}), s.longest_conversation = p->value("longest_sequence", int64_t{-1});
      if (const auto margins = p->find("margins"); margins != p->end()) {  // what is not a number reads as NaN (refused by the reader)
        if (!margins->is_array()) s.preference_margins.push_back(std::nan(""));
        if (margins->is_array())
          for (const auto& v : *margins) s.preference_margins.push_back(v.is_number() ? v.get<double>() : std::nan(""));
      }
    }
    if (const auto k = j.find("kto"); k != j.end() && k->is_object()) {
      s.kto_examples = k->value("examples", int64_t{-1}), s.longest_conversation = k->value("longest_sequence", int64_t{-1});
      s.kto_labels = k->value("labels", std::string());
    }
    s.lossmask_crc32c = static_cast<uint32_t>(std::strtoul(m->value("crc32c", std::string("0")).c_str(), nullptr, 16));
  }
  return s;
}

std::optional<DatasetSidecar> read_dataset_sidecar(const std::string& data_path) {
  return read_dataset_sidecar(data_path, [](const std::string& path) -> std::optional<std::string> {
    if (!std::filesystem::is_regular_file(path)) return std::nullopt;
    return read_file(path);
  });
}

namespace {

// A file's sha256, remembered by path, size and modification time: a recipe is loaded several
// times per command (layers, resolution, the workers' checks), a tokenizer.json is megabytes.
std::string remembered_sha256(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::pair<std::string, std::string>> known;  // path -> (identity, sha256)
  const auto mtime = std::filesystem::last_write_time(path).time_since_epoch().count();
  const std::string identity = fmt::format("{}:{}", std::filesystem::file_size(path), mtime);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(path);
  if (it == known.end() || it->second.first != identity)
    it = known.insert_or_assign(path, std::pair{identity, to_hex(sha256(read_file(path)))}).first;
  return it->second.second;
}

}  // namespace

std::string other_tokenizer_than(const std::string& model_dir, const std::string& data_path) {
  const auto sidecar = read_dataset_sidecar(data_path);
  if (!sidecar || sidecar->tokenizer_sha256.empty()) return "";
  const std::string json = (std::filesystem::path(model_dir) / "tokenizer.json").string();
  if (!std::filesystem::is_regular_file(json)) return "";  // weights alone: nothing to compare with
  const std::string sha = remembered_sha256(json);
  if (sha == sidecar->tokenizer_sha256) return "";
  return fmt::format("'{}' was prepared with another tokenizer (sha256 {}, {}) than the weights' own {} (sha256 {})", data_path,
                     sidecar->tokenizer_sha256.substr(0, 12), sidecar->file, json, sha.substr(0, 12));
}

namespace {

// The weights of model.init_from were trained on their folder's tokenizer: data tokenized with
// another one (of the same vocabulary size) would train and export with no error, and mean nothing.
std::string init_tokenizer_problem(const Recipe& r, const std::string& data) {
  if (r.model.init_from.empty() || r.data.other_tokenizer) return "";
  const std::string other = other_tokenizer_than(r.model.init_from, data);
  if (other.empty()) return "";
  return fmt::format(
      "model.init_from: {}: the token ids would mean other words to the model; prepare the data again with --tokenizer {}, or set "
      "data.other_tokenizer: true if the two tokenizers give the same ids",
      other, r.model.init_from);
}

// Every objective but sft trains on, and scores, preference pairs (kto: unpaired examples); sft text or conversations.
std::string pair_kind_problem(const Recipe& r, const DatasetSidecar& s, const std::string& path, bool eval) {
  const bool pairs = r.train.trains_pairs(), kto = r.train.objective == TrainObjective::kKto;
  const std::string objective = name(r.train.objective);
  const std::string who = eval ? "eval.paths: " : fmt::format("train.objective {}: ", objective);
  if (kto && s.kto_examples < 0)
    return fmt::format(
        "{}'{}' is not a set of KTO examples ({}); prepare its rows (prompt, completion, label; or chosen/rejected pairs, "
        "which it unpairs as TRL does) with dstrain prepare-data --preference --kto",
        who, path, s.file);
  if (pairs && !kto && s.preference_pairs < 0)
    return fmt::format(
        "{}'{}' is not a set of preference pairs ({}); {}prepare chosen/rejected rows with dstrain prepare-data --preference{}", who, path,
        s.file, eval ? fmt::format("a {} run evaluates held-out pairs: ", objective) : "",
        s.kto_examples >= 0 ? " (it holds KTO examples: train.objective kto trains on them)" : "");
  if (!pairs && (s.preference_pairs >= 0 || s.kto_examples >= 0))
    return fmt::format(
        "{}'{}' holds {} ({}); {}", eval ? "eval.paths: " : "", path,
        s.kto_examples >= 0 ? fmt::format("{} KTO examples", s.kto_examples) : fmt::format("{} preference pairs", s.preference_pairs),
        s.file,
        eval                  ? "only a preference run (train.objective dpo, cpo, simpo, orpo, kto or reward) scores them"
        : s.kto_examples >= 0 ? "set train.objective: kto to train on them"
                              : "set train.objective: dpo (or cpo, simpo, orpo; reward, for a reward model) to train on them");
  return "";
}

}  // namespace

std::vector<std::string> sidecar_problems(const Recipe& r, const std::function<std::optional<std::string>(const std::string&)>& read) {
  std::vector<std::string> problems;
  if (r.data.format != DataFormat::kMegatron) return problems;
  const std::vector<std::string> sources = r.data.sources();
  std::optional<DatasetSidecar> first;
  size_t fine_tuning = 0;  // sources with a loss mask (prepare-data --chat)
  for (const auto& path : sources) {
    const auto s = read_dataset_sidecar(path, read);
    if (!s) continue;
    if (s->vocab_size > r.model.vocab_size)
      problems.push_back(
          fmt::format("model.vocab_size: {} is smaller than the vocabulary '{}' was tokenized with ({} ids, {}); set "
                      "model.vocab_size to at least {}",
                      r.model.vocab_size, path, s->vocab_size, s->file, s->vocab_size));
    if (r.data.eos_token >= 0 && s->eos >= 0 && r.data.eos_token != s->eos)
      problems.push_back(
          fmt::format("data.eos_token: {} is not the end-of-document token of '{}', which is {} ({}); set data.eos_token: {}",
                      r.data.eos_token, path, s->eos, s->file, s->eos));
    if (first && first->tokenizer_sha256 != s->tokenizer_sha256)
      problems.push_back(
          fmt::format("data.paths: '{}' and '{}' were tokenized with different tokenizers ({} and {}); blend datasets of one "
                      "tokenizer",
                      sources.front(), path, first->file, s->file));
    if (s->lossmask_bytes >= 0) ++fine_tuning;
    if (const std::string p = pair_kind_problem(r, *s, path, false); !p.empty()) problems.push_back(p);
    if (s->lossmask_bytes >= 0 && s->longest_conversation > r.data.seq_len)
      problems.push_back(fmt::format(
          "data.seq_len: {} ({}) is shorter than the longest conversation of '{}' ({} tokens, {}); conversations are "
          "never split: {}prepare the data again with --max-length {} (longer conversations are then dropped)",
          r.data.seq_len, r.sources.count("data.seq_len") ? r.sources.at("data.seq_len") : "default", path, s->longest_conversation,
          s->file, s->longest_conversation <= r.model.max_seq_len ? fmt::format("set data.seq_len: {}, or ", s->longest_conversation) : "",
          std::min(r.data.seq_len, r.model.max_seq_len)));
    if (!first) first = s;
  }
  if (fine_tuning > 0 && fine_tuning < sources.size())
    problems.push_back(
        fmt::format("data.paths: {} of the {} sources are fine-tuning sets (a loss mask beside them) and the others text; a "
                    "run trains on conversations or on text: blend sets of one kind (prepare the text with --chat, or train "
                    "on it in a run of its own)",
                    fine_tuning, sources.size()));
  if (fine_tuning > 0 && (r.data.document_mask || r.data.reset_positions))
    problems.push_back(
        "data.document_mask / data.reset_positions: a fine-tuning set always keeps attention and positions inside each "
        "conversation; remove them");
  if (fine_tuning == 0 && r.data.packing != Packing::kNone && first)
    problems.push_back(
        fmt::format("data.packing: {} packs the conversations of a fine-tuning set (prepare-data --chat), and '{}' has no "
                    "loss mask; remove data.packing to pretrain on it",
                    name(r.data.packing), sources.front()));
  if (const std::string p = init_tokenizer_problem(r, sources.front()); !p.empty()) problems.push_back(p);
  // Evaluation sets: the same tokenizer as the training data, or the loss means nothing.
  for (const auto& path : r.eval.paths) {
    const auto s = read_dataset_sidecar(path, read);
    if (!s) continue;
    if (s->vocab_size > r.model.vocab_size)
      problems.push_back(fmt::format("eval.paths: '{}' was tokenized with {} ids ({}), more than model.vocab_size {}", path, s->vocab_size,
                                     s->file, r.model.vocab_size));
    if (s->lossmask_bytes >= 0 && s->longest_conversation > r.data.seq_len)
      problems.push_back(
          fmt::format("data.seq_len: {} is shorter than the longest conversation of the evaluation set '{}' ({} tokens, {}); "
                      "conversations are never split: raise data.seq_len, or prepare the set with --max-length {}",
                      r.data.seq_len, path, s->longest_conversation, s->file, r.data.seq_len));
    if (first && first->tokenizer_sha256 != s->tokenizer_sha256)
      problems.push_back(
          fmt::format("eval.paths: '{}' was tokenized with another tokenizer ({}) than the training data '{}' ({}); "
                      "tokenize the evaluation text with the training data's tokenizer",
                      path, s->file, sources.front(), first->file));
    if (const std::string p = pair_kind_problem(r, *s, path, true); !p.empty()) problems.push_back(p);
  }
  return problems;
}

}  // namespace dstrain::config
