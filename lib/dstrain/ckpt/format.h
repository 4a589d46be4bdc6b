#pragma once
// Internal to ckpt/: names and JSON helpers shared by the writer and the reader.
#include <cstdint>
#include <optional>
#include <string>

#include "dstrain/ckpt/checkpoint.h"

namespace dstrain::ckpt::detail {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kCommitted = "COMMITTED";
constexpr const char* kFormatName = "dstrain-checkpoint";
constexpr const char* kPartialSuffix = ".partial";
constexpr const char* kShardPieces = "shards";  // a tensor's "pieces" when the shard table places it

[[noreturn]] void corrupt(const std::string& where, const std::string& what);

// Only names dstrain writes are ever listed, pruned or loaded (a user's `step_00000050.bak` or a
// stray `step_old` is left alone): "step_" and 8 or more digits; the same + ".partial".
std::optional<int64_t> step_of_name(const std::string& name);
bool is_staging_name(const std::string& name);
// A manifest's file name: a plain name in the checkpoint directory ([A-Za-z0-9_.-], not "." or "..").
bool is_plain_file_name(const std::string& name);
// COMMITTED's text: the step and the manifest's CRC-32C, which the reader checks when present
// (a manifest edited after the commit, e.g. a piece's offset, is refused).
std::string committed_text(int64_t step, uint32_t manifest_crc);
// False when COMMITTED records a checksum that is not the manifest's (or an unreadable one);
// true when it matches or when COMMITTED predates the checksum (older dstrain).
bool committed_matches(const std::string& committed_text, uint32_t manifest_crc);
// Tests of crash safety: the fault injector's crash_at_save_point=k ends the process abruptly
// (no flushing, like SIGKILL) at the k-th of these points in this process's saves.
void crash_point();

}  // namespace dstrain::ckpt::detail
