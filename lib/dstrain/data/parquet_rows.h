#pragma once
// A Parquet file's rows as JSON objects, through libdstrain_parquet.so (parquet_plugin_api.h),
// loaded on first use from DSTRAIN_PARQUET_PLUGIN or beside the dstrain binary.
#include <cstdint>
#include <string>

namespace dstrain::data {

class ParquetRows {
 public:
  // Throws Error{kEnvironment} when the plugin is missing (it is built when the pyarrow wheel is
  // installed) and Error{kData} naming the file when it is not readable Parquet.
  explicit ParquetRows(const std::string& path);
  ~ParquetRows();
  ParquetRows(const ParquetRows&) = delete;
  ParquetRows& operator=(const ParquetRows&) = delete;
  // The next row's JSON text; false after the last. Throws Error{kData} naming the file.
  bool next(std::string& json);
  int64_t rows() const;

 private:
  std::string path_;
  void* file_ = nullptr;
};

// Where the plugin is, or "" when there is none.
std::string parquet_plugin_path();

}  // namespace dstrain::data
