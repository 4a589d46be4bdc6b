#pragma once
// Logging for people (metrics for machines are a separate channel). One process-wide logger:
// plain lines "2026-11-29 19:40:01 [rank 1] WARN message" to stderr. Format with fmt in the .cpp
// that logs; this header stays free of fmt.
#include <string>
#include <string_view>

namespace dstrain::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// The rank shown in every line; -1 (the launcher) shows no rank.
void set_rank(int rank);
void set_level(Level level);
Level level();

// Also append every line to `path` ("" stops): a rank started by srun or torchrun keeps its own
// logs/rank_XXXXX.log as the launcher keeps its workers' (issue 25).
void set_file(const std::string& path);

void write(Level level, std::string_view message);
// Only to the file of set_file (e.g. the error main() prints to the terminal anyway).
void write_to_file(Level level, std::string_view message);
inline void debug(std::string_view m) { write(Level::kDebug, m); }
inline void info(std::string_view m) { write(Level::kInfo, m); }
inline void warn(std::string_view m) { write(Level::kWarn, m); }
inline void error(std::string_view m) { write(Level::kError, m); }

}  // namespace dstrain::log
