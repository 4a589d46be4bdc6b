#include "dstrain/train/reference_logps.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dstrain/ckpt/base_model.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/config/dataset_sidecar.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/core/crc32c.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/core/sha256.h"
#include "dstrain/data/preference_pairs.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/preference_loss.h"
#include "dstrain/train/step_runner.h"

namespace dstrain::train {
namespace {

constexpr char kMagic[] = "DSTRREF1\n";
constexpr int kVersion = 1;

std::string serialize(const std::string& key, const std::string& data, const std::vector<double>& table) {
  const size_t bytes = table.size() * sizeof(double);
  const nlohmann::json header = {{"version", kVersion},
                                 {"key", key},
                                 {"pairs", table.size() / 2},
                                 {"crc32c", fmt::format("{:08x}", crc32c(table.data(), bytes))},
                                 {"data", data}};
  std::string out = kMagic + header.dump() + "\n";
  const size_t at = out.size();
  out.resize(at + bytes);
  std::memcpy(out.data() + at, table.data(), bytes);
  return out;
}

// The table in `path`, checked against the key and the pair count (Error{kData} naming the file).
std::vector<double> read_table(const std::string& path, const std::string& key, int64_t pairs) {
  const std::string text = read_file(path);
  const auto bad = [&path](const std::string& why) {
    return Error(ErrorCode::kData, fmt::format("{}: {}", path, why),
                 "delete the file: the next run computes the reference log-probs again");
  };
  const size_t magic = sizeof(kMagic) - 1, eol = text.find('\n', magic);
  if (text.compare(0, magic, kMagic) != 0 || eol == std::string::npos) throw bad("not a dstrain reference log-probs file");
  const auto header = nlohmann::json::parse(text.substr(magic, eol - magic), nullptr, false);
  if (!header.is_object() || header.value("version", 0) != kVersion) throw bad("an unknown version of the reference log-probs format");
  if (header.value("key", "") != key || header.value("pairs", int64_t{-1}) != pairs)
    throw bad(fmt::format("made for another model or data (key {}, {} pairs; this run's key is {}, {} pairs)", header.value("key", ""),
                          header.value("pairs", int64_t{-1}), key, pairs));
  std::vector<double> table(static_cast<size_t>(2 * pairs));
  const size_t bytes = table.size() * sizeof(double);
  if (text.size() != eol + 1 + bytes)
    throw bad(fmt::format("{} bytes of values where {} pairs need {}", text.size() - eol - 1, pairs, bytes));
  std::memcpy(table.data(), text.data() + eol + 1, bytes);
  if (fmt::format("{:08x}", crc32c(table.data(), bytes)) != header.value("crc32c", "")) throw bad("its values fail their CRC-32C");
  return table;
}

// This rank's share of the pass: each real row's completion log-prob sum at its place in the
// table (zero elsewhere).
std::vector<double> compute_share(const config::Recipe& r, const data::PreferencePairs& pairs, StepRunner& runner,
                                  comm::Communicator& comm) {
  const int64_t micro = r.train.micro_batch_size, n = pairs.file_pairs(), world = comm.world_size();
  const int64_t groups = (n + micro - 1) / micro, rounds = (groups + world - 1) / world;
  std::vector<double> table(static_cast<size_t>(2 * n), 0.0);
  std::vector<at::Tensor> captured;
  const model::Objective reference = reference_capture(r, captured);
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t g = round * world + comm.rank();
    captured.clear();
    runner.forward_with(reference, {pairs.in_order(g * micro, micro, std::min(n, (g + 1) * micro))});
    const at::Tensor values = captured.at(0).to(at::kCPU).contiguous();
    for (int64_t i = 0; i < 2 * micro && g * micro + i / 2 < n; ++i)
      table[static_cast<size_t>(2 * g * micro + i)] = values.data_ptr<double>()[i];
  }
  return table;
}

// PREFIX.ref.<key> beside the set: the key hashes the model's identity and the set's PREFIX.json.
std::string reference_path(const std::string& identity, const std::string& data_path) {
  nlohmann::json what = nlohmann::json::parse(identity);
  const auto sidecar = config::read_dataset_sidecar(data_path);
  what["data"] = sidecar ? read_file(sidecar->file) : std::string();
  return config::megatron_prefix(data_path) + ".ref." + to_hex(sha256(what.dump())).substr(0, 16);
}

// One set's table; `path` is rank 0's (empty elsewhere).
void prepare_one(const config::Recipe& r, const data::PreferencePairs& pairs, const std::string& path, StepRunner& runner,
                 model::CausalLM& model, comm::Communicator& comm, const std::string& moved) {
  const bool leader = comm.rank() == 0;
  const std::string key = path.substr(path.rfind('.') + 1);
  // Rank 0 decides for everyone (other nodes need not see the file): 1 read, 0 compute, 2 refuse.
  const int64_t decision = comm::sum_exactly(comm, leader ? (std::filesystem::exists(path) ? 1 : !moved.empty() ? 2 : 0) : 0);
  if (decision == 2)
    throw Error(ErrorCode::kData,
                fmt::format("{} is missing: {} needs the reference log-probs the run's start made (the model has moved since)",
                            leader ? path : "the reference log-probs file beside " + pairs.path(), moved),
                "restore the file beside the dataset (a run makes it from its starting model before its first step)");
  const auto start = std::chrono::steady_clock::now();
  std::vector<double> mine;
  if (decision == 1) {
    mine = leader ? read_table(path, key, pairs.file_pairs()) : std::vector<double>(static_cast<size_t>(2 * pairs.file_pairs()), 0.0);
  } else {
    if (leader)
      log::info(fmt::format("reference log-probs: one forward pass over the {} {} of {} by the starting model", pairs.file_pairs(),
                            pairs.unit(), pairs.path()));
    mine = compute_share(r, pairs, runner, comm);
    model.take_expert_load();  // what the pass left for training's first step
    model.take_all_to_all_wait_ms();
  }
  std::vector<double> table = comm::sum_in_rank_order(comm, mine);
  if (decision == 0 && leader) write_file_atomic(path, serialize(key, pairs.path(), table));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (leader)
    log::info(fmt::format("reference log-probs: {} {} ({} {}, {:.2f} s)", decision == 1 ? "read from" : "written to", path,
                          pairs.file_pairs(), pairs.unit(), seconds));
  *pairs.reference() = std::move(table);
}

}  // namespace

model::Objective reference_capture(const config::Recipe& recipe, std::vector<at::Tensor>& captured) {
  model::Objective reference;
  const model::CompletionOptions options{recipe.train.loss_chunk_tokens, recipe.preference.ld_alpha};
  reference.set_sequence_loss({}, [&captured, options](const model::CausalLM&, const model::CausalLM::Hidden& h, const data::Batch& batch) {
    const at::Tensor logps = model::completion_logps(h, batch, options).logps;
    captured.push_back(logps.to(at::kDouble));
    return model::SequenceLossValue{at::zeros({}, logps.options()), {}};
  });
  return reference;
}

// What the reference log-probs depend on besides the set: the model section, seed, dtype, LoRA
// block, LD-DPO's alpha and the init_from folders' files (checksummed whole: read once per run, not per set).
std::string reference_model_identity(const config::Recipe& r) {
  nlohmann::json all = nlohmann::json::parse(config::to_canonical_json(r));
  nlohmann::json what = {{"model", all["model"]}, {"seed", all["seed"]}, {"dtype", all["precision"]["dtype"]}, {"lora", all["lora"]}};
  what["model"].erase("init_from");                                            // the folder's files below, wherever it is
  if (r.preference.ld_alpha != 1.0) what["ld_alpha"] = r.preference.ld_alpha;  // LD-DPO's weighted sums
  if (!r.model.init_from.empty()) what["init_from"] = ckpt::to_json(ckpt::identify_base(r.model.init_from));
  if (!r.lora.init_from.empty()) what["lora_init_from"] = ckpt::to_json(ckpt::identify_base(r.lora.init_from));
  return what.dump();
}

void prepare_reference_logps(const config::Recipe& r, const std::vector<const data::PreferencePairs*>& sets, StepRunner& runner,
                             model::CausalLM& model, comm::Communicator& comm, const std::string& moved) {
  // Only rank 0 reads the model's and the sets' files for the keys (other nodes need not see them).
  const bool leader = comm.rank() == 0;
  const std::string identity = leader ? reference_model_identity(r) : std::string();
  for (const data::PreferencePairs* pairs : sets)
    prepare_one(r, *pairs, leader ? reference_path(identity, pairs->path()) : std::string(), runner, model, comm, moved);
}

}  // namespace dstrain::train
