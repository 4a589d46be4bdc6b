#pragma once
// A dataset that prepare-data wrote is one set of files: PREFIX.bin, PREFIX.idx, PREFIX.lossmask
// (fine-tuning sets) and PREFIX.json, which records the others' sizes and CRC-32Cs. prepare-data
// stages every file under a temporary name and publishes them together, PREFIX.json last; a
// reader checks the set before it trains on it, so that files from two runs (a failed or
// interrupted rewrite of the prefix) or a missing part are refused by name instead of trained on.
#include <string>

namespace dstrain::data {

// Throws Error{kData} naming the file when PREFIX's parts disagree:
//  - PREFIX.json exists but is not prepare-data's description (not JSON, or fields missing);
//  - PREFIX.bin's or PREFIX.idx's CRC-32C differs from the one PREFIX.json recorded;
//  - PREFIX.json records a loss mask and PREFIX.lossmask is missing, differs in size or CRC, or
//    PREFIX.json records none and one is there;
//  - PREFIX.lossmask exists without a PREFIX.json to check it against.
// A plain Megatron dataset (no PREFIX.json, no loss mask: Megatron's own tools) passes. CRCs of
// large files are cached by file identity (core/file_checksum.h): a set is read once per node.
void verify_dataset_set(const std::string& prefix);

}  // namespace dstrain::data
