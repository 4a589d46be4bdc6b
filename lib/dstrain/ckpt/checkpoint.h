#pragma once
// dstrain's checkpoint format (version 1), free of torch so that inspect-ckpt and tests read it
// cheaply. A checkpoint is a directory:
//   step_XXXXXXXX/manifest.json   format, version, step, config hash, world size, data cursor,
//                                 tensors (name, dtype, shape, file, offset, bytes), files (bytes, crc32c)
//   step_XXXXXXXX/tensors.bin     the raw little-endian tensor bytes, back to back
//   step_XXXXXXXX/COMMITTED       written last: a directory without it is never loaded
//   latest                        names the newest committed step directory; updated after COMMITTED
// Nothing here runs code on load (no pickle); every file is checksummed.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dstrain::ckpt {

constexpr int kFormatVersion = 1;

struct TrainState {
  int64_t step = 0;              // optimizer steps completed
  int64_t samples_consumed = 0;  // global data cursor (positions in the global sample order)
  int64_t world_size = 0;        // of the run that wrote it
  std::string config_hash;
};

struct TensorView {  // what save_checkpoint writes: borrowed bytes
  std::string name;
  std::string dtype;  // "float32"
  std::vector<int64_t> shape;
  const void* data;
  uint64_t nbytes;
};

struct TensorData {  // what load_checkpoint returns: owned bytes
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

struct Retention {
  int64_t keep_last = 0;   // keep the newest N committed checkpoints; 0 keeps all
  int64_t keep_every = 0;  // also keep those whose step is a multiple of this; 0: none
};

std::string step_dir_name(int64_t step);
// Writes and commits a checkpoint under `root`, moves `latest`, then deletes the committed
// checkpoints that `retention` does not keep. Returns the new directory.
std::string save_checkpoint(const std::string& root, const TrainState& state, const std::vector<TensorView>& tensors, Retention retention);
// The directory `latest` names, if it exists and is committed.
std::optional<std::string> latest_checkpoint(const std::string& root);
// Reads a committed checkpoint and verifies every checksum; throws Error{kCheckpoint} naming the
// file and what is wrong.
Checkpoint load_checkpoint(const std::string& dir);

struct FileCheck {
  std::string name;
  uint64_t bytes;
  bool ok;
  std::string problem;
};
struct Inspection {
  std::string dir;
  bool committed;
  TrainState state;
  std::vector<TensorData> tensors;  // shapes and names only: bytes left empty
  std::vector<FileCheck> files;
};
// Reads the manifest and checks every file without throwing on corrupt data (for inspect-ckpt).
Inspection inspect_checkpoint(const std::string& dir);

}  // namespace dstrain::ckpt
