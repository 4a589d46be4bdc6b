#include "dstrain/data/dataset_set.h"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/core/file_checksum.h"

namespace dstrain::data {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPrepareAgain = "run `dstrain prepare-data` for this prefix again (it writes the whole set together)";

[[noreturn]] void refuse(const std::string& what) { throw Error(ErrorCode::kData, what, kPrepareAgain); }

// A recorded CRC-32C ("89abcdef"), or -1 when absent.
int64_t recorded_crc(const nlohmann::json& object, const char* key, const std::string& sidecar) {
  const auto it = object.find(key);
  if (it == object.end()) return -1;
  if (!it->is_string() || it->get<std::string>().size() != 8 ||
      it->get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
    refuse(fmt::format("{}: \"{}\" is not a CRC-32C of 8 hex digits", sidecar, key));
  return static_cast<int64_t>(std::strtoul(it->get<std::string>().c_str(), nullptr, 16));
}

void check_file(const std::string& path, int64_t crc, int64_t bytes, const std::string& sidecar) {
  const FileSum sum = file_checksum(path);
  if (!sum.exists) refuse(fmt::format("'{}' is missing; {} records it as part of the dataset", path, sidecar));
  if (bytes >= 0 && static_cast<int64_t>(sum.size) != bytes)
    refuse(fmt::format("'{}' is {} bytes; {} recorded {}: the files are not one set (from different runs of prepare-data)", path, sum.size,
                       sidecar, bytes));
  if (crc >= 0 && sum.crc32c != static_cast<uint32_t>(crc))
    refuse(
        fmt::format("'{}' has CRC-32C {:08x}; {} recorded {:08x}: the files are not one set (from different runs of "
                    "prepare-data), or the file changed",
                    path, sum.crc32c, sidecar, static_cast<uint32_t>(crc)));
}

}  // namespace

void verify_dataset_set(const std::string& prefix) {
  const std::string sidecar = prefix + ".json", mask = prefix + ".lossmask";
  const bool has_mask = fs::exists(mask);
  if (!fs::exists(sidecar)) {
    if (has_mask)
      refuse(
          fmt::format("'{}' has no '{}' beside it: prepare-data writes both, and without it the loss mask cannot be checked "
                      "against the tokens",
                      mask, sidecar));
    return;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(sidecar));
  } catch (const nlohmann::json::exception& e) {
    refuse(fmt::format("'{}' is not valid JSON ({}): the dataset's description is broken", sidecar, e.what()));
  }
  if (!j.is_object() || j.value("format", "") != "megatron" || !j.contains("vocab_size") || !j.at("vocab_size").is_number_integer())
    refuse(fmt::format("'{}' is not prepare-data's description of a dataset (no \"format\": \"megatron\" with a \"vocab_size\")", sidecar));
  check_file(prefix + ".bin", recorded_crc(j, "crc32c_bin", sidecar), -1, sidecar);
  check_file(prefix + ".idx", recorded_crc(j, "crc32c_idx", sidecar), -1, sidecar);
  const auto m = j.find("loss_mask");
  if (m == j.end()) {
    if (has_mask)
      refuse(
          fmt::format("'{}' records no loss mask, but '{}' is there: the files are not one set (from different runs of "
                      "prepare-data)",
                      sidecar, mask));
    return;
  }
  if (!m->is_object() || !m->contains("bytes") || !m->at("bytes").is_number_integer())
    refuse(fmt::format("'{}': \"loss_mask\" lacks its \"bytes\"", sidecar));
  if (!has_mask)
    refuse(
        fmt::format("'{}' is missing; {} records it (a fine-tuning set): without it every token, prompts included, would be "
                    "trained",
                    mask, sidecar));
  check_file(mask, recorded_crc(*m, "crc32c", sidecar), m->at("bytes").get<int64_t>(), sidecar);
}

}  // namespace dstrain::data
