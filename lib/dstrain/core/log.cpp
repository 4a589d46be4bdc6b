#include "dstrain/core/log.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace dstrain::log {
namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_level{static_cast<int>(Level::kInfo)};
std::mutex g_mutex;
std::FILE* g_file = nullptr;  // under g_mutex

const char* level_name(Level l) {
  switch (l) {
    case Level::kDebug:
      return "DEBUG";
    case Level::kInfo:
      return "INFO";
    case Level::kWarn:
      return "WARN";
    case Level::kError:
      return "ERROR";
  }
  return "?";
}
}  // namespace

void set_rank(int rank) { g_rank = rank; }

void set_file(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_file) std::fclose(g_file), g_file = nullptr;
  if (!path.empty()) g_file = std::fopen(path.c_str(), "a");  // a log that cannot be opened must not stop the run
}
void set_level(Level l) { g_level = static_cast<int>(l); }
Level level() { return static_cast<Level>(g_level.load()); }

namespace {
std::string format_line(Level l, std::string_view message) {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm local{};
  localtime_r(&now, &local);
  const int rank = g_rank.load();
  return rank >= 0 ? fmt::format("{:%Y-%m-%d %H:%M:%S} [rank {}] {} {}\n", local, rank, level_name(l), message)
                   : fmt::format("{:%Y-%m-%d %H:%M:%S} {} {}\n", local, level_name(l), message);
}
}  // namespace

void write(Level l, std::string_view message) {
  if (static_cast<int>(l) < g_level.load()) return;
  const std::string line = format_line(l, message);
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  if (g_file) std::fwrite(line.data(), 1, line.size(), g_file), std::fflush(g_file);
}

void write_to_file(Level l, std::string_view message) {
  const std::string line = format_line(l, message);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_file) std::fwrite(line.data(), 1, line.size(), g_file), std::fflush(g_file);
}

}  // namespace dstrain::log
