#pragma once
// The C interface of libdstrain_parquet.so, the optional plugin that reads Apache Parquet files
// through the Arrow/Parquet C++ libraries of the pyarrow wheel. dstrain loads it with dlopen only
// when an input is a .parquet file, so the binary runs (and trains) where pyarrow is absent; only
// C types cross the boundary, so the plugin's C++ runtime never meets dstrain's.
#include <stddef.h>
#include <stdint.h>

extern "C" {

#define DSTRAIN_PARQUET_ABI 1

struct dstrain_parquet;

// The plugin's interface version (DSTRAIN_PARQUET_ABI).
int dstrain_parquet_abi(void);
// Opens a file; null with `error` filled when it cannot be read as Parquet.
dstrain_parquet* dstrain_parquet_open(const char* path, char* error, size_t error_size);
// The next row as one JSON object (columns as keys; lists, structs and maps as JSON arrays and
// objects; nulls as null), valid until the next call. Returns 1 for a row, 0 at the end, -1 with
// `error` filled.
int dstrain_parquet_next(dstrain_parquet* file, const char** json, size_t* size, char* error, size_t error_size);
int64_t dstrain_parquet_rows(dstrain_parquet* file);  // rows in the file (its metadata)
void dstrain_parquet_close(dstrain_parquet* file);
}
