#include "dstrain/train/checkpointer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "dstrain/ckpt/base_model.h"
#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/comm/communicator.h"
#include "dstrain/config/recipe.h"
#include "dstrain/core/atomic_file.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/core/error.h"
#include "dstrain/core/log.h"
#include "dstrain/model/lora.h"
#include "dstrain/zero/engine.h"

namespace dstrain::train {
namespace fs = std::filesystem;
namespace {

const char* dtype_name(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? "float64" : "float32"; }

ckpt::TensorMeta meta_of(const model::NamedTensor& t) { return {t.name, dtype_name(t.tensor), t.tensor.sizes().vec()}; }

std::string model_line(const config::Recipe& r) {
  const auto& m = r.model;
  return fmt::format("{} hidden {} layers {} heads {} vocab {}", config::name(m.family), m.hidden_size, m.num_layers, m.num_heads,
                     m.vocab_size);
}

// What a rank tells rank 0 about its file: with a shard table, its size, CRC and the pieces the
// table does not place (rank 0's replicated tensors).
ckpt::ShardFile summary_of(ckpt::ShardFile file, const ckpt::ShardTable* table) {
  if (!table) return file;
  std::set<std::string> placed;
  for (const auto& prefix : table->prefixes)
    for (const auto& u : table->units)
      for (const auto& p : u.params) placed.insert(prefix + p.name);
  file.pieces.erase(
      std::remove_if(file.pieces.begin(), file.pieces.end(), [&](const ckpt::Piece& p) { return placed.count(p.tensor) > 0; }),
      file.pieces.end());
  return file;
}

// A LoRA run's adapters (lora.*) must be the checkpoint's: the same projections, the same rank.
void check_same_adapters(const ckpt::Reader& reader, const std::vector<zero::Engine::StateTensor>& tensors, const std::string& dir) {
  std::set<std::string> now;
  for (const auto& t : tensors) {
    if (!model::is_adapter_name(t.name) || t.name.rfind("exp_avg", 0) == 0) continue;
    now.insert(t.name);
    const ckpt::TensorMeta* then = reader.find(t.name);
    if (then && then->shape != t.shape)
      throw Error(ErrorCode::kConfig,
                  fmt::format("lora: checkpoint {} holds {} of shape [{}], this run's is [{}]: the adapters' rank differs", dir, t.name,
                              fmt::join(then->shape, ", "), fmt::join(t.shape, ", ")),
                  "resume with the lora.rank that wrote the checkpoint");
  }
  size_t then_count = 0;
  std::string missing;
  for (const auto& t : reader.tensors()) {
    if (!model::is_adapter_name(t.name) || t.name.rfind("exp_avg", 0) == 0) continue;
    ++then_count;
    if (missing.empty() && !now.count(t.name)) missing = t.name;
  }
  const bool absent = std::any_of(now.begin(), now.end(), [&](const std::string& n) { return !reader.find(n); });
  if (!missing.empty() || absent)
    throw Error(ErrorCode::kConfig,
                fmt::format("lora: checkpoint {} was written with {} adapter tensors, this run has {}{}", dir, then_count, now.size(),
                            missing.empty() ? "" : fmt::format(" (it lacks {})", missing)),
                then_count == 0 ? "this checkpoint trained every parameter: resume it without lora, or export it (dstrain export-hf) "
                                  "and start a LoRA run from it (model.init_from)"
                                : "resume with the lora block (rank, targets) that wrote the checkpoint");
}

// A checkpoint holds optimizer state (exp_avg.<name>) for exactly the parameters that trained:
// resuming with another train.freeze would train a parameter from no state, or drop one's.
void check_same_frozen_set(const ckpt::Reader& reader, const std::vector<zero::Engine::StateTensor>& tensors, const std::string& dir) {
  static const std::string kState = "exp_avg.";
  std::set<std::string> trains;
  for (const auto& t : tensors)
    if (t.name.rfind(kState, 0) == 0) trains.insert(t.name.substr(kState.size()));
  std::vector<std::string> now_frozen, now_trained;
  for (const auto& t : tensors) {
    if (t.name.rfind(kState, 0) == 0 || t.name.rfind("exp_avg_sq.", 0) == 0) continue;  // the parameters' own entries only
    const bool trained_then = reader.find(kState + t.name) != nullptr, trains_now = trains.count(t.name) > 0;
    if (trained_then && !trains_now) now_frozen.push_back(t.name);
    if (!trained_then && trains_now && reader.find(t.name)) now_trained.push_back(t.name);
  }
  if (now_frozen.empty() && now_trained.empty()) return;
  auto some = [](const std::vector<std::string>& names) {
    const size_t shown = std::min<size_t>(names.size(), 6);
    return fmt::format("{}{}", fmt::join(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(shown), ", "),
                       names.size() > shown ? fmt::format(" and {} more", names.size() - shown) : "");
  };
  std::string what;
  if (!now_frozen.empty()) what += fmt::format("{} parameter(s) trained there are frozen now ({})", now_frozen.size(), some(now_frozen));
  if (!now_trained.empty())
    what +=
        fmt::format("{}{} parameter(s) frozen there would train now ({})", what.empty() ? "" : "; ", now_trained.size(), some(now_trained));
  throw Error(ErrorCode::kConfig,
              fmt::format("train.freeze: checkpoint {} was written with another set of frozen parameters: {}", dir, what),
              "resume with the train.freeze that wrote the checkpoint; to change it, export the checkpoint (dstrain export-hf) and start a "
              "new run from it (model.init_from)");
}

}  // namespace

Checkpointer::Checkpointer(const config::Recipe& recipe, std::string ckpt_dir, comm::Communicator& comm, zero::Engine& engine,
                           std::vector<model::Stateful*> replicated, std::string run_id)
    : recipe_(recipe), dir_(std::move(ckpt_dir)), comm_(comm), engine_(engine) {
  replicated_.push_back(&engine_);
  replicated_.insert(replicated_.end(), replicated.begin(), replicated.end());
  // Does every rank see rank 0's checkpoint directory? Rank 0 drops a probe named after the run;
  // each rank looks for it.
  const std::string probe = (fs::path(dir_) / (".probe-" + run_id)).string();
  if (comm_.rank() == 0) {
    fs::create_directories(dir_);
    std::ofstream(probe) << "dstrain\n";
  }
  comm_.barrier()->wait();
  const bool seen = fs::exists(probe);
  const auto all = comm_.all_gather_bytes(seen ? "1" : "0");
  shared_ = std::all_of(all.begin(), all.end(), [](const std::string& s) { return s == "1"; });
  comm_.barrier()->wait();
  if (comm_.rank() == 0) {
    fs::remove(probe);
    log::info(shared_ ? fmt::format("checkpoints: every rank writes its own shard into {}", dir_)
                      : fmt::format("checkpoints: some ranks cannot see {} (no shared filesystem): rank 0 gathers and writes them", dir_));
    if (recipe_.checkpoint.async && !shared_)
      log::warn("checkpoint.async needs a filesystem every rank shares: saving synchronously instead");
  }
  async_ = recipe_.checkpoint.async && shared_;
  if (model::lora_checkpoints_name_base(recipe_)) identify_base();
}

void Checkpointer::identify_base() {
  // Rank 0 reads the files (their checksums are cached per file version); every rank learns the
  // answer, or the error, so that all refuse a resume alike.
  std::string answer;
  if (comm_.rank() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const ckpt::BaseModel base = ckpt::identify_base(recipe_.model.init_from);
      uint64_t bytes = 0;
      for (const auto& f : base.files) bytes += f.bytes;
      log::info(fmt::format("lora: checkpoints hold what trains and name the base {} ({} file{}, {}, checksummed in {:.2f} s)", base.path,
                            base.files.size(), base.files.size() == 1 ? "" : "s", cost::bytes_text(static_cast<double>(bytes)),
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
      answer = "ok" + ckpt::to_json(base);
    } catch (const Error& e) {
      answer = "error" + std::string(e.what());
    }
  }
  answer = comm_.broadcast_bytes(answer, 0);
  if (answer.rfind("ok", 0) != 0)
    throw Error(ErrorCode::kCheckpoint, answer.substr(5), "model.init_from names the Hugging Face folder the adapters are trained on");
  base_ = std::make_shared<const ckpt::BaseModel>(ckpt::base_model_from_json(answer.substr(2)));
}

// A checkpoint that names its base resumes on that base only; one that holds its base's weights
// (written before checkpoints named it) is taken as it is.
void Checkpointer::check_base(const ckpt::Reader& reader, const std::string& dir) const {
  const ckpt::BaseModel& then = reader.state().base;
  if (then.empty()) {
    if (base_ && comm_.rank() == 0)
      log::warn(
          fmt::format("checkpoint {} names no base (it was written before checkpoints named one): model.init_from {} is taken as its base",
                      dir, base_->path));
    return;
  }
  if (!base_)
    throw Error(ErrorCode::kCheckpoint, fmt::format("checkpoint {} holds LoRA adapters without their base, which was {}", dir, then.path),
                fmt::format("resume with model.init_from: {} (and the lora block that wrote the checkpoint)", then.path));
  ckpt::check_checkpoint_base(dir, then, *base_);
  if (then.path != base_->path && comm_.rank() == 0)
    log::info(fmt::format("the checkpoint's base {} is at {} now (the same files)", then.path, base_->path));
}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();  // errors were for finish(); here only wait
}

void Checkpointer::set_stage_state(StageState stage) {
  if (!shared_)
    throw Error(ErrorCode::kConfig,
                fmt::format("pipeline parallelism needs a checkpoint directory every rank shares, and some ranks cannot see {}", dir_),
                "put checkpoint.dir (or run_dir) on a filesystem every node mounts");
  if (async_ && comm_.rank() == 0) log::warn("checkpoint.async: pipeline-parallel runs save synchronously for now");
  async_ = false;
  stage_ = std::make_unique<StageState>(std::move(stage));
}

std::vector<ckpt::TensorMeta> Checkpointer::all_ranks_metas(const std::vector<ckpt::TensorMeta>& mine) const {
  std::string text;
  for (const auto& m : mine) text += fmt::format("{}\t{}\t{}\n", m.name, m.dtype, fmt::join(m.shape, ","));
  std::vector<ckpt::TensorMeta> out;
  std::set<std::string> seen;
  for (const std::string& part : comm_.gather_bytes(text, 0)) {  // empty on the other ranks
    std::istringstream lines(part);
    for (std::string line; std::getline(lines, line);) {
      const size_t a = line.find('\t'), b = line.find('\t', a + 1);
      ckpt::TensorMeta m{line.substr(0, a), line.substr(a + 1, b - a - 1), {}};
      std::istringstream dims(line.substr(b + 1));
      for (std::string d; std::getline(dims, d, ',');) m.shape.push_back(std::stoll(d));
      if (seen.insert(m.name).second) out.push_back(std::move(m));
    }
  }
  return out;
}

void Checkpointer::finish() {
  if (writer_.joinable()) writer_.join();
  if (writer_error_) std::rethrow_exception(std::exchange(writer_error_, nullptr));
}

std::string Checkpointer::save(int64_t step, int64_t samples_consumed) {
  finish();          // at most one save pending
  engine_.settle();  // zero.delayed_update: the pending update goes into the model before the state is saved
  const int rank = comm_.rank();
  // The global tensors: the engine's sharded ones (master weights, moments), then the replicated state.
  std::vector<ckpt::TensorMeta> metas;
  for (const auto& t : engine_.state_tensors()) metas.push_back({t.name, t.dtype, t.shape});
  if (copy_)
    for (const auto& t : copy_->state_tensors()) metas.push_back({copy_prefix_ + t.name, t.dtype, t.shape});
  model::NamedTensors replicated;
  for (const model::Stateful* s : replicated_)
    for (auto& t : s->state()) replicated.push_back(std::move(t));
  for (const auto& t : replicated) metas.push_back(meta_of(t));
  model::NamedTensors per_stage;
  if (stage_)
    for (const model::Stateful* s : stage_->states)
      for (auto& t : s->state()) per_stage.push_back(std::move(t));
  for (const auto& t : per_stage) metas.push_back(meta_of(t));

  if (rank == 0) ckpt::prepare_staging(dir_, step);
  comm_.barrier()->wait();
  const std::string staging = ckpt::staging_dir(dir_, step);

  std::vector<ckpt::PieceView> mine;
  model::NamedTensors gathered;  // no shared filesystem: rank 0's full copy
  model::NamedTensors copy_gathered;
  if (shared_) {
    for (const auto& run : engine_.saved_shard_runs()) mine.push_back({run.tensor, run.start, run.count, run.data});
    if (copy_)
      for (const auto& run : copy_->saved_shard_runs()) mine.push_back({copy_prefix_ + run.tensor, run.start, run.count, run.data});
  } else {
    gathered = rank == 0 ? engine_.full_state() : model::NamedTensors{};
    engine_.gather_full_state(gathered);
    for (const auto& t : gathered) mine.push_back({t.name, 0, t.tensor.numel(), t.tensor.data_ptr()});
    if (copy_) {
      copy_gathered = rank == 0 ? copy_->full_state() : model::NamedTensors{};
      copy_->gather_full_state(copy_gathered);
      for (const auto& t : copy_gathered) mine.push_back({copy_prefix_ + t.name, 0, t.tensor.numel(), t.tensor.data_ptr()});
    }
  }
  std::vector<at::Tensor> host_copies;  // replicated tensors that live on a GPU, read through the host
  auto write_whole = [&](const model::NamedTensors& tensors) {
    for (const auto& t : tensors) {
      host_copies.push_back(t.tensor.to(at::kCPU).contiguous());
      mine.push_back({t.name, 0, t.tensor.numel(), host_copies.back().data_ptr()});
    }
  };
  if (rank == 0) write_whole(replicated);
  if (stage_ && stage_->writer) write_whole(per_stage);
  // Sharded: the shard table places every rank's shards, so a rank reports only its file's size,
  // CRC and replicated pieces (issue 26: not 3 pieces per unit and rank).
  const std::shared_ptr<const ckpt::ShardTable> table =
      shared_ && !stage_ && !copy_ && engine_.has_shard_table() ? std::make_shared<const ckpt::ShardTable>(engine_.shard_table()) : nullptr;
  const std::vector<ckpt::TensorMeta> manifest_metas = stage_ ? all_ranks_metas(metas) : metas;
  if (async_) {
    std::string dir = save_in_background(step, samples_consumed, staging, metas, mine, table);  // copies the pieces first
    engine_.drop_host_copies();
    if (copy_) copy_->drop_host_copies();
    return dir;
  }
  std::string summary;
  if (!mine.empty()) summary = ckpt::to_json(summary_of(ckpt::write_shard(staging, rank, metas, mine), table.get()));
  engine_.drop_host_copies();
  if (copy_) copy_->drop_host_copies();
  const auto summaries = comm_.gather_bytes(summary, 0);  // only rank 0 commits (issue 26)
  std::string committed;
  if (rank == 0) {
    std::vector<ckpt::ShardFile> files;
    for (const auto& s : summaries)
      if (!s.empty()) files.push_back(ckpt::shard_file_from_json(s));
    committed = ckpt::commit(dir_, train_state(step, samples_consumed), manifest_metas, files,
                             {recipe_.checkpoint.keep_last, recipe_.checkpoint.keep_every, best_step_}, table.get());
  }
  comm_.barrier()->wait();
  return committed;
}

void Checkpointer::add_copy(zero::Engine& copy, std::string prefix) { copy_ = &copy, copy_prefix_ = std::move(prefix); }

void Checkpointer::load_copy(const ckpt::Reader& reader, const std::string& dir) {
  if (!copy_) return;
  const std::vector<zero::Engine::ShardRun> runs = copy_->shard_runs();
  const bool held = std::all_of(runs.begin(), runs.end(), [&](const auto& run) { return reader.find(copy_prefix_ + run.tensor); });
  // Every rank decides alike: the checkpoint has the copy or not (what this rank holds may be empty).
  const bool all_held = comm_.all_gather_bytes(held ? "1" : "0") == std::vector<std::string>(static_cast<size_t>(comm_.world_size()), "1");
  if (!all_held) {
    if (comm_.rank() == 0) log::warn(fmt::format("checkpoint {} holds no {}* tensors: the copy stays as it was made", dir, copy_prefix_));
    copy_->drop_host_copies();
    return;
  }
  for (const auto& run : runs) reader.read(copy_prefix_ + run.tensor, run.start, run.count, run.data, "float32");
  copy_->publish_loaded_shard();
}

ckpt::TrainState Checkpointer::train_state(int64_t step, int64_t samples_consumed) const {
  ckpt::TrainState ts;
  ts.step = step;
  ts.samples_consumed = samples_consumed;
  ts.tokens_consumed = samples_consumed * recipe_.data.seq_len;
  ts.world_size = comm_.world_size();
  ts.zero_stage = recipe_.zero.stage;
  ts.precision = config::name(recipe_.precision.dtype);
  ts.config_hash = config::config_hash(recipe_);
  ts.model = model_line(recipe_);
  if (base_) ts.base = *base_;
  return ts;
}

std::string Checkpointer::save_in_background(int64_t step, int64_t samples_consumed, const std::string& staging,
                                             const std::vector<ckpt::TensorMeta>& metas, const std::vector<ckpt::PieceView>& pieces,
                                             std::shared_ptr<const ckpt::ShardTable> table) {
  // The only time training waits: copying this rank's pieces into host memory.
  auto snapshot = std::make_shared<std::vector<std::vector<char>>>();
  std::vector<ckpt::PieceView> owned;
  std::map<std::string, int64_t> esize;
  for (const auto& m : metas) esize[m.name] = ckpt::dtype_size(m.dtype);
  for (const auto& p : pieces) {
    const auto* bytes = static_cast<const char*>(p.data);
    snapshot->emplace_back(bytes, bytes + p.count * esize.at(p.tensor));
    owned.push_back({p.tensor, p.start, p.count, snapshot->back().data()});
  }
  const int rank = comm_.rank();
  const int writers = engine_.shard_writers();
  const ckpt::TrainState ts = train_state(step, samples_consumed);
  const ckpt::Retention retention{recipe_.checkpoint.keep_last, recipe_.checkpoint.keep_every, best_step_};
  const auto timeout = std::chrono::seconds(recipe_.launch.timeout_s);
  const std::string root = dir_;
  // `snapshot` is captured explicitly: `owned` points into it, and the thread outlives this call.
  writer_ = std::thread([=, snapshot = snapshot]() {
    (void)snapshot;
    try {
      const auto t0 = std::chrono::steady_clock::now();
      if (!owned.empty()) {
        const ckpt::ShardFile f = summary_of(ckpt::write_shard(staging, rank, metas, owned), table.get());
        write_file_atomic((fs::path(staging) / fmt::format("rank_{:05d}.json", rank)).string(), ckpt::to_json(f));
      }
      if (rank != 0) return;
      // Rank 0 commits once every writer's summary is on the shared filesystem.
      std::vector<ckpt::ShardFile> files;
      for (int r = 0; r < writers; ++r) {
        const fs::path summary = fs::path(staging) / fmt::format("rank_{:05d}.json", r);
        while (!fs::exists(summary)) {
          if (std::chrono::steady_clock::now() - t0 > timeout)
            throw Error(ErrorCode::kCheckpoint,
                        fmt::format("asynchronous checkpoint of step {}: rank {} did not finish its shard within {} s", ts.step, r,
                                    timeout.count()),
                        "check that every rank's filesystem is the same and has space; the previous checkpoint is intact");
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        files.push_back(ckpt::shard_file_from_json(read_file(summary.string())));
        fs::remove(summary);
      }
      const std::string dir = ckpt::commit(root, ts, metas, files, retention, table.get());
      log::info(fmt::format("checkpoint saved in the background: {} ({:.2f} s)", dir,
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
    } catch (...) {
      writer_error_ = std::current_exception();
    }
  });
  return (fs::path(root) / ckpt::step_dir_name(step)).string();
}

std::string Checkpointer::verify_share(const std::string& dir, std::unique_ptr<ckpt::Reader>& reader) const {
  try {
    reader = std::make_unique<ckpt::Reader>(dir, /*verified=*/true);  // sizes only; the CRCs of this rank's share next
    reader->verify(comm_.rank(), comm_.world_size());
    return "";
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {  // whatever a damaged checkpoint provokes, the next one is tried
    return fmt::format("checkpoint {}: {}", dir, e.what());
  }
}

Checkpointer::Resumed Checkpointer::resume(const std::string& from) {
  // Rank 0 lists the candidates; every rank checks its share of each one's files, so that at
  // scale no rank reads every file while the others wait (issue 26).
  const std::string root = from.empty() ? dir_ : from;
  const bool named = fs::exists(fs::path(root) / "manifest.json");  // one checkpoint, named: it must verify
  std::string listing;
  if (comm_.rank() == 0) {
    std::vector<std::string> skipped;
    const std::vector<std::string> candidates = named ? std::vector<std::string>{root} : ckpt::checkpoint_candidates(root, &skipped);
    for (const auto& why : skipped) log::warn("skipping a checkpoint that does not verify: " + why);
    listing = fmt::format("{}", fmt::join(candidates, "\n"));
  }
  listing = comm_.broadcast_bytes(listing, 0);
  std::unique_ptr<ckpt::Reader> reader;
  std::string chosen;
  bool fell_back = false;
  for (size_t at = 0; !listing.empty() && at <= listing.size();) {
    const size_t end = std::min(listing.find('\n', at), listing.size());
    const std::string dir = listing.substr(at, end - at);
    at = end + 1;
    const std::string problem = verify_share(dir, reader);
    at::Tensor bad = at::tensor({problem.empty() ? 0.0f : 1.0f}, at::kFloat);
    comm_.all_reduce(bad)->wait();
    if (bad.item<float>() == 0) {
      chosen = dir;
      break;
    }
    // Every rank learns the first problem (by rank) from rank 0.
    std::string first;
    for (const auto& p : comm_.gather_bytes(problem, 0))  // empty on the other ranks
      if (first.empty()) first = p;
    first = comm_.broadcast_bytes(first, 0);
    if (named) throw Error(ErrorCode::kCheckpoint, first, "the checkpoint is damaged; resume from another one (--resume-from)");
    if (comm_.rank() == 0) log::warn("skipping a checkpoint that does not verify: " + first);
    fell_back = true;
  }
  if (chosen.empty())
    throw Error(ErrorCode::kCheckpoint, fmt::format("no committed checkpoint in {} verifies", root),
                "see the warnings above for each one; start the run again with `dstrain train`");
  if (fell_back && comm_.rank() == 0) log::warn(fmt::format("falling back to {}", chosen));
  check_same_adapters(*reader, engine_.state_tensors(), chosen);
  check_same_frozen_set(*reader, engine_.state_tensors(), chosen);
  check_base(*reader, chosen);
  // This rank's shard, from whichever files hold its global ranges: any world size or stage.
  for (const auto& run : engine_.shard_runs()) reader->read(run.tensor, run.start, run.count, run.data, "float32");
  load_copy(*reader, chosen);
  std::vector<model::Stateful*> loaded_whole = replicated_;
  if (stage_) loaded_whole.insert(loaded_whole.end(), stage_->states.begin(), stage_->states.end());
  for (model::Stateful* s : loaded_whole) {
    model::NamedTensors loaded;
    for (const auto& t : s->state()) {
      const ckpt::TensorMeta* meta = reader->find(t.name);
      if (!meta && s->state_optional()) continue;
      if (!meta || meta->shape != t.tensor.sizes().vec())
        throw Error(ErrorCode::kCheckpoint,
                    fmt::format("checkpoint {}: tensor '{}' is {} in the checkpoint, the run needs [{}]", chosen, t.name,
                                meta ? fmt::format("[{}]", fmt::join(meta->shape, ", ")) : "missing", fmt::join(t.tensor.sizes(), ", ")),
                    "resume with the recipe that wrote the checkpoint");
      at::Tensor host = at::empty(t.tensor.sizes(), t.tensor.options().device(at::kCPU));
      reader->read(t.name, 0, t.tensor.numel(), host.data_ptr(), dtype_name(t.tensor));
      loaded.push_back({t.name, host});
    }
    s->load_state(loaded);
  }
  engine_.publish_loaded_shard();
  return {chosen, reader->state().step, reader->state().samples_consumed};
}

}  // namespace dstrain::train
