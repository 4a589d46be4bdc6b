#include "dstrain/data/parquet_rows.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "dstrain/core/error.h"
#include "dstrain/data/parquet_plugin_api.h"

namespace dstrain::data {
namespace fs = std::filesystem;
namespace {

struct Plugin {
  decltype(&dstrain_parquet_open) open = nullptr;
  decltype(&dstrain_parquet_next) next = nullptr;
  decltype(&dstrain_parquet_rows) rows = nullptr;
  decltype(&dstrain_parquet_close) close = nullptr;
};

template <class F>
F symbol(void* handle, const char* name, const std::string& path) {
  void* s = ::dlsym(handle, name);
  if (!s) throw Error(ErrorCode::kEnvironment, fmt::format("{} has no {}: not dstrain's Parquet plugin", path, name), "rebuild dstrain");
  return reinterpret_cast<F>(s);
}

// Loaded once per process and kept (dlclose would unload libarrow under live threads).
const Plugin& plugin() {
  static std::once_flag once;
  static Plugin p;
  std::call_once(once, [] {
    const std::string path = parquet_plugin_path();
    if (path.empty())
      throw Error(ErrorCode::kEnvironment, "Parquet input needs libdstrain_parquet.so, which this dstrain was built without",
                  "install the pyarrow wheel (scripts/setup.sh does) and build again, or convert the file to JSON Lines: "
                  "python -c \"import pandas; pandas.read_parquet('IN.parquet').to_json('OUT.jsonl', orient='records', lines=True)\"");
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) throw Error(ErrorCode::kEnvironment, fmt::format("cannot load {}: {}", path, ::dlerror()), "build dstrain again");
    if (symbol<decltype(&dstrain_parquet_abi)>(handle, "dstrain_parquet_abi", path)() != DSTRAIN_PARQUET_ABI)
      throw Error(ErrorCode::kEnvironment, fmt::format("{} is from another dstrain (its interface differs)", path), "build dstrain again");
    p.open = symbol<decltype(p.open)>(handle, "dstrain_parquet_open", path);
    p.next = symbol<decltype(p.next)>(handle, "dstrain_parquet_next", path);
    p.rows = symbol<decltype(p.rows)>(handle, "dstrain_parquet_rows", path);
    p.close = symbol<decltype(p.close)>(handle, "dstrain_parquet_close", path);
  });
  if (!p.open) throw Error(ErrorCode::kEnvironment, "the Parquet plugin failed to load earlier", "");
  return p;
}

}  // namespace

std::string parquet_plugin_path() {
  if (const char* env = std::getenv("DSTRAIN_PARQUET_PLUGIN"); env && *env) return fs::is_regular_file(env) ? env : "";
  std::error_code ec;
  const fs::path beside = fs::read_symlink("/proc/self/exe", ec).parent_path() / "libdstrain_parquet.so";
  return !ec && fs::is_regular_file(beside) ? beside.string() : "";
}

ParquetRows::ParquetRows(const std::string& path) : path_(path) {
  char error[512] = "";
  file_ = plugin().open(path.c_str(), error, sizeof error);
  if (!file_)
    throw Error(ErrorCode::kData, fmt::format("cannot read '{}' as Parquet: {}", path, error),
                "pass a .parquet file as Hugging Face dataset repositories ship them");
}

ParquetRows::~ParquetRows() {
  if (file_) plugin().close(static_cast<dstrain_parquet*>(file_));
}

bool ParquetRows::next(std::string& json) {
  const char* text = nullptr;
  size_t size = 0;
  char error[512] = "";
  const int r = plugin().next(static_cast<dstrain_parquet*>(file_), &text, &size, error, sizeof error);
  if (r < 0) {
    const bool not_text = std::strstr(error, "not UTF-8 text") != nullptr;  // the plugin names the column
    throw Error(ErrorCode::kData, fmt::format("cannot read '{}': {}", path_, error),
                not_text ? "write a Parquet file without that column (pyarrow: table.drop_columns([...]))"
                         : "a truncated or corrupt Parquet file?");
  }
  if (r == 0) return false;
  json.assign(text, size);
  return true;
}

int64_t ParquetRows::rows() const { return plugin().rows(static_cast<dstrain_parquet*>(file_)); }

}  // namespace dstrain::data
