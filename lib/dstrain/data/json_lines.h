#pragma once
// Reading a JSON Lines file row by row, with errors that name FILE:LINE.
#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace dstrain::data {

// Calls `on_row(row)` for each non-blank line of `path`, parsed as JSON (a line that is not JSON
// is handed over as a discarded value: `row.is_discarded()`). An std::invalid_argument or Error
// thrown by `on_row` becomes Error{kData} "PATH:LINE: what", with `hint` (an Error keeps its own).
// Throws Error{kData} when the file cannot be read, with `open_hint`.
void for_each_json_line(const std::string& path, const std::string& hint, const std::string& open_hint,
                        const std::function<void(const nlohmann::json& row)>& on_row);

}  // namespace dstrain::data
