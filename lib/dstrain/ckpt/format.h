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

}  // namespace dstrain::ckpt::detail
