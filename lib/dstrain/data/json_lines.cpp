#include "dstrain/data/json_lines.h"

#include <fmt/format.h>

#include <fstream>
#include <stdexcept>

#include "dstrain/core/error.h"

namespace dstrain::data {

void for_each_json_line(const std::string& path, const std::string& hint, const std::string& open_hint,
                        const std::function<void(const std::string& line)>& on_line) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::kData, fmt::format("{}: cannot read the file", path), open_hint);
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      on_line(line);
    } catch (const std::invalid_argument& e) {
      throw Error(ErrorCode::kData, fmt::format("{}:{}: {}", path, number, e.what()), hint);
    } catch (const Error& e) {
      throw Error(ErrorCode::kData, fmt::format("{}:{}: {}", path, number, e.what()), e.hint());
    }
  }
}

}  // namespace dstrain::data
