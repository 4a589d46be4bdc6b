#pragma once
// Reading a JSON Lines file row by row, with errors that name FILE:LINE.
#include <cstdint>
#include <functional>
#include <string>

namespace dstrain::data {

// Calls `on_line(line)` for each non-blank line of `path` (the caller parses it: nlohmann stays out
// of headers). An std::invalid_argument or Error thrown by `on_line` becomes Error{kData}
// "PATH:LINE: what", with `hint` (an Error keeps its own). Throws Error{kData} when the file
// cannot be read, with `open_hint`.
void for_each_json_line(const std::string& path, const std::string& hint, const std::string& open_hint,
                        const std::function<void(const std::string& line)>& on_line);

}  // namespace dstrain::data
