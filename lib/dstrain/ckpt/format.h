#pragma once
// Internal to ckpt/: names and JSON helpers shared by the writer and the reader.
#include <string>

#include "dstrain/ckpt/checkpoint.h"

namespace dstrain::ckpt::detail {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kCommitted = "COMMITTED";
constexpr const char* kFormatName = "dstrain-checkpoint";
constexpr const char* kPartialSuffix = ".partial";

[[noreturn]] void corrupt(const std::string& where, const std::string& what);
// Tests of crash safety: the fault injector's crash_at_save_point=k ends the process abruptly
// (no flushing, like SIGKILL) at the k-th of these points in this process's saves.
void crash_point();

}  // namespace dstrain::ckpt::detail
