#pragma once
// dstrain's checkpoint format (versions 3 and 4; version 2 is read too), free of torch so that
// inspect-ckpt and tests read it cheaply. A checkpoint is a directory:
//   step_XXXXXXXX/manifest.json    format, version, step, samples and tokens consumed, world size,
//                                  ZeRO stage, precision, config hash, model, creation time;
//                                  version 4: the base a LoRA run's adapters belong to (`base`:
//                                  its folder and its weight files' sizes and CRC-32C), whose
//                                  frozen weights the checkpoint names instead of holding;
//                                  every tensor's global name, dtype and shape with its pieces
//                                  (file, byte offset, element range of the flattened tensor),
//                                  or, for the ZeRO engine's sharded tensors, "pieces": "shards":
//                                  their place follows from the shard table (ShardTable, version 3),
//                                  so the manifest grows with the parameters and the files, not with
//                                  their product (issue 26: 11.4M pieces for 7B at 16k ranks);
//                                  every file's size and CRC-32C
//   step_XXXXXXXX/rank_NNNNN.bin   raw little-endian bytes: one file per writing rank (its ZeRO
//                                  shard: ranges of the master weights and Adam moments)
//   step_XXXXXXXX/COMMITTED        written last: a directory without it is never loaded
//   latest                         names the newest committed step directory; updated after COMMITTED
//   best                           checkpoint.keep_best: the step directory of the lowest validation loss
// The ranks write their files into step_XXXXXXXX.partial/; rank 0, once all have finished,
// writes the manifest, renames the directory, then writes COMMITTED and `latest`. Loading reads
// any element range of any tensor from whichever pieces hold it, so a checkpoint loads at any
// world size and ZeRO stage. Nothing here runs code on load (no pickle); every file is checksummed.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dstrain::ckpt {

constexpr int kFormatVersion = 4;  // written when a base is named, else 3; 2 to 4 are read
constexpr int kOldestReadableVersion = 2;

// A LoRA run's frozen base, named instead of saved: the Hugging Face folder it was read from and
// each weight file's size and CRC-32C (a resume, an eval or a merge reads the base from there and
// refuses another one). Empty for a checkpoint that holds every weight it needs.
struct BaseFile {
  std::string name;  // relative to the folder
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};
struct BaseModel {
  std::string path;  // absolute
  std::vector<BaseFile> files;
  bool empty() const { return path.empty(); }
};

struct TrainState {
  int64_t step = 0;              // optimizer steps completed
  int64_t samples_consumed = 0;  // global data cursor (positions in the global sample order)
  int64_t tokens_consumed = 0;
  int64_t world_size = 0;  // of the run that wrote it
  int64_t zero_stage = 0;
  std::string precision;  // fp32, bf16, fp16
  std::string config_hash;
  std::string model;    // one line: family and sizes
  std::string created;  // UTC, ISO 8601 (set by the writer)
  BaseModel base;       // format 4: the frozen base the checkpoint does not hold
};

struct TensorMeta {
  std::string name;
  std::string dtype;  // float32, float64
  std::vector<int64_t> shape;
  int64_t numel() const;
};
int64_t dtype_size(const std::string& dtype);  // throws Error{kCheckpoint} for an unknown one

// What a rank writes: `count` elements of `tensor`, from element `start` of its flattened form.
struct PieceView {
  std::string tensor;
  int64_t start = 0, count = 0;
  const void* data = nullptr;
};

struct Piece {
  std::string tensor;
  int64_t start = 0, count = 0;
  uint64_t offset = 0;  // bytes into the file
};

// Where a ZeRO engine's sharded tensors lie in the rank files (format 3). The parameters are
// packed into units; unit u's flat buffer is split into `ranks` chunks of `chunk` elements (the
// tail padded). The file of rank r (rank_NNNNN.bin) holds, for each state prefix in order (the
// master weights "", then "exp_avg.", "exp_avg_sq."), for each unit in order, the parameter
// elements that fall in chunk r, float32. Rank 0's file continues with listed pieces.
struct ShardTable {
  struct Param {
    std::string name;
    int64_t offset = 0, numel = 0;  // within the unit's flat buffer; params in offset order
  };
  struct Unit {
    int64_t chunk = 0;
    std::vector<Param> params;
  };
  int64_t ranks = 0;
  std::vector<std::string> prefixes;
  std::vector<Unit> units;
  // Elements of one state that rank r's file holds.
  int64_t rank_elements(int64_t rank) const;
  // Where each unit's part begins in rank r's file, in elements of one state (size units + 1: the
  // last entry is rank_elements).
  std::vector<int64_t> rank_unit_starts(int64_t rank) const;
};
std::string shard_file_name(int64_t rank);  // rank_NNNNN.bin

struct ShardFile {
  std::string name;  // rank_NNNNN.bin
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  std::vector<Piece> pieces;
};
// ShardFile <-> one line of JSON (ranks send theirs to rank 0 through the store).
std::string to_json(const ShardFile& f);
ShardFile shard_file_from_json(const std::string& json);

struct Retention {
  int64_t keep_last = 0;   // keep the newest N committed checkpoints; 0 keeps all
  int64_t keep_every = 0;  // also keep those whose step is a multiple of this; 0: none
  int64_t best_step = -1;  // checkpoint.keep_best: never prune this step's; when it is the one committed, `best` names it
};

std::string step_dir_name(int64_t step);

// The multi-writer protocol. Rank 0: prepare_staging (a fresh, empty step_X.partial). Then every
// writing rank: write_shard (fsynced). Then rank 0, with every rank's ShardFile: commit.
std::string prepare_staging(const std::string& root, int64_t step);
std::string staging_dir(const std::string& root, int64_t step);
ShardFile write_shard(const std::string& staging, int rank, const std::vector<TensorMeta>& tensors, const std::vector<PieceView>& pieces);
// Checks that the pieces (and the shard table, which covers the tensors it names, with every
// rank's file of the size it implies) cover every tensor exactly, writes the manifest, renames,
// marks COMMITTED, moves `latest`, then prunes by `retention` (only older, committed checkpoints).
// With a table, the files' summaries carry only their replicated pieces: only sizes and CRCs
// travel from the ranks.
std::string commit(const std::string& root, TrainState state, const std::vector<TensorMeta>& tensors, const std::vector<ShardFile>& files,
                   Retention retention, const ShardTable* table = nullptr);

// One writer, whole tensors (tests, tools): prepare_staging + write_shard + commit.
struct TensorView {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data;
  uint64_t nbytes;
};
std::string save_checkpoint(const std::string& root, const TrainState& state, const std::vector<TensorView>& tensors, Retention retention);

// Reads a committed checkpoint: the manifest at once (validated), files on demand. Each file's
// size and CRC-32C are checked the first time it is read from.
class Reader {
 public:
  // `verified`: every file's CRC was checked already (by the ranks of a resume, each its share):
  // reads check only sizes. verify() always checks CRCs.
  explicit Reader(const std::string& dir, bool verified = false);
  ~Reader();
  const std::string& dir() const { return dir_; }
  const TrainState& state() const { return state_; }
  const std::vector<TensorMeta>& tensors() const { return tensors_; }
  const TensorMeta* find(const std::string& name) const;
  // Elements [start, start+count) of the flattened tensor into dst (dtype must match).
  void read(const std::string& name, int64_t start, int64_t count, void* dst, const std::string& dtype) const;
  // Checks every file (size and CRC-32C); throws Error{kCheckpoint} naming the file and its tensors.
  void verify() const;
  // The same for files part, part + parts, ... in name order: each rank of a resume checks its
  // share, so that no rank reads every file (issue 26).
  void verify(int part, int parts) const;

 private:
  struct Impl;
  std::string dir_;
  TrainState state_;
  std::vector<TensorMeta> tensors_;
  std::unique_ptr<Impl> impl_;
};

// Whether any directory under `root` is a committed checkpoint (no verification: cheap).
bool has_committed_checkpoint(const std::string& root);
// The directory `latest` names, if it exists and is committed (throws when `latest` is broken).
std::optional<std::string> latest_checkpoint(const std::string& root);
// The directory `best` names (checkpoint.keep_best), if it exists and is committed.
std::optional<std::string> best_checkpoint(const std::string& root);
// The committed checkpoints under `root` in the order a resume tries them: the one `latest` names,
// then the others from the newest (a broken `latest` is reported in `skipped`). Not verified.
std::vector<std::string> checkpoint_candidates(const std::string& root, std::vector<std::string>* skipped = nullptr);
// The newest committed checkpoint that verifies, starting at `latest` and falling back to older
// ones (each skipped one is reported in `skipped`, with why). nullopt when there is none.
std::optional<std::string> usable_checkpoint(const std::string& root, std::vector<std::string>* skipped = nullptr);

// Whole tensors (export, inspect): every tensor assembled from its pieces.
struct TensorData {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
struct Checkpoint {
  std::string dir;
  TrainState state;
  std::vector<TensorData> tensors;
};
Checkpoint load_checkpoint(const std::string& dir);

struct FileCheck {
  std::string name;
  uint64_t bytes;
  bool ok;
  std::string problem;  // missing, truncated, corrupt: with the tensors it holds
};
struct Inspection {
  std::string dir;
  bool committed;
  TrainState state;
  std::vector<TensorMeta> tensors;
  std::map<std::string, std::vector<std::string>> files_of_tensor;  // which files hold each tensor
  std::vector<FileCheck> files;
  // What the reader refuses in the manifest itself (COMMITTED's checksum, names, shapes, pieces
  // that do not tile the files); empty when it would load.
  std::string manifest_problem;
};
// Reads the manifest and checks every file without throwing on corrupt data (for inspect-ckpt).
Inspection inspect_checkpoint(const std::string& dir);

}  // namespace dstrain::ckpt
