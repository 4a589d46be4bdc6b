// libdstrain_parquet.so (see parquet_plugin_api.h): Parquet rows as JSON objects, one record batch
// in memory at a time, through the pyarrow wheel's libarrow and libparquet.
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "dstrain/core/json_string.h"
#include "dstrain/data/parquet_plugin_api.h"

struct dstrain_parquet {
  std::unique_ptr<parquet::arrow::FileReader> reader;
  std::shared_ptr<arrow::RecordBatchReader> batches;
  std::shared_ptr<arrow::RecordBatch> batch;
  int64_t row = 0, rows = 0;
  int64_t returned = 0;  // rows handed out so far
  std::string json;
};

namespace {

void set_error(char* error, size_t size, const std::string& what) {
  if (size == 0) return;
  std::snprintf(error, size, "%s", what.c_str());
}

void append_string(std::string& out, std::string_view s) { dstrain::append_json_string(out, s); }

void append_value(std::string& out, const arrow::Array& a, int64_t i);

// A binary column's bytes, refused when they are not UTF-8 text (JSON holds text only): the
// message names the column instead of every row reading as "not valid JSON".
struct NotText : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n;
  }
  return true;
}

void append_binary(std::string& out, std::string_view bytes) {
  if (!valid_utf8(bytes)) throw NotText("binary data that is not UTF-8 text");
  append_string(out, bytes);
}

template <class ListArray>
void append_list(std::string& out, const ListArray& list, int64_t i) {
  out += '[';
  const auto& values = *list.values();
  for (int64_t k = list.value_offset(i); k < list.value_offset(i) + list.value_length(i); ++k) {
    if (k > list.value_offset(i)) out += ", ";
    append_value(out, values, k);
  }
  out += ']';
}

void append_value(std::string& out, const arrow::Array& a, int64_t i) {
  using arrow::Type;
  if (a.IsNull(i)) return void(out += "null");
  switch (a.type_id()) {
    case Type::BOOL:
      out += static_cast<const arrow::BooleanArray&>(a).Value(i) ? "true" : "false";
      return;
    case Type::INT8:
    case Type::INT16:
    case Type::INT32:
    case Type::INT64:
    case Type::UINT8:
    case Type::UINT16:
    case Type::UINT32:
    case Type::UINT64:
      out += a.GetScalar(i).ValueOrDie()->ToString();
      return;
    case Type::FLOAT:
    case Type::DOUBLE: {
      const double d = a.type_id() == Type::FLOAT ? static_cast<const arrow::FloatArray&>(a).Value(i)
                                                  : static_cast<const arrow::DoubleArray&>(a).Value(i);
      if (!std::isfinite(d)) return void(out += "null");
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", d);
      out += buf;
      return;
    }
    case Type::STRING:
      return append_string(out, static_cast<const arrow::StringArray&>(a).GetView(i));
    case Type::LARGE_STRING:
      return append_string(out, static_cast<const arrow::LargeStringArray&>(a).GetView(i));
    case Type::BINARY:
      return append_binary(out, static_cast<const arrow::BinaryArray&>(a).GetView(i));
    case Type::LARGE_BINARY:
      return append_binary(out, static_cast<const arrow::LargeBinaryArray&>(a).GetView(i));
    case Type::LIST:
      return append_list(out, static_cast<const arrow::ListArray&>(a), i);
    case Type::LARGE_LIST:
      return append_list(out, static_cast<const arrow::LargeListArray&>(a), i);
    case Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      out += '{';
      for (int f = 0; f < s.num_fields(); ++f) {
        if (f > 0) out += ", ";
        append_string(out, s.type()->field(f)->name());
        out += ": ";
        append_value(out, *s.field(f), i);
      }
      out += '}';
      return;
    }
    case Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return append_value(out, *d.dictionary(), d.GetValueIndex(i));
    }
    default:  // dates, timestamps, decimals, binary: their text
      append_string(out, a.GetScalar(i).ValueOrDie()->ToString());
  }
}

}  // namespace

extern "C" {

int dstrain_parquet_abi(void) { return DSTRAIN_PARQUET_ABI; }

dstrain_parquet* dstrain_parquet_open(const char* path, char* error, size_t error_size) {
  auto file = arrow::io::ReadableFile::Open(path);
  if (!file.ok()) return set_error(error, error_size, file.status().ToString()), nullptr;
  auto reader = parquet::arrow::OpenFile(*file, arrow::default_memory_pool());
  if (!reader.ok()) return set_error(error, error_size, reader.status().ToString()), nullptr;
  auto out = std::make_unique<dstrain_parquet>();
  out->reader = std::move(*reader);
  auto batches = out->reader->GetRecordBatchReader();
  if (!batches.ok()) return set_error(error, error_size, batches.status().ToString()), nullptr;
  out->batches = std::move(*batches);
  out->rows = out->reader->parquet_reader()->metadata()->num_rows();
  return out.release();
}

int dstrain_parquet_next(dstrain_parquet* f, const char** json, size_t* size, char* error, size_t error_size) {
  while (!f->batch || f->row >= f->batch->num_rows()) {
    const arrow::Status st = f->batches->ReadNext(&f->batch);
    if (!st.ok()) return set_error(error, error_size, st.ToString()), -1;
    if (!f->batch) return 0;
    f->row = 0;
  }
  f->json.clear();
  f->json += '{';
  for (int c = 0; c < f->batch->num_columns(); ++c) {
    if (c > 0) f->json += ", ";
    append_string(f->json, f->batch->schema()->field(c)->name());
    f->json += ": ";
    try {
      append_value(f->json, *f->batch->column(c), f->row);
    } catch (const NotText& e) {
      return set_error(error, error_size,
                       "column '" + f->batch->schema()->field(c)->name() + "' holds " + e.what() + " (row " +
                           std::to_string(f->returned + 1) + "); dstrain reads text columns: drop or decode that one"),
             -1;
    }
  }
  f->json += '}';
  ++f->row, ++f->returned;
  *json = f->json.data(), *size = f->json.size();
  return 1;
}

int64_t dstrain_parquet_rows(dstrain_parquet* f) { return f->rows; }

void dstrain_parquet_close(dstrain_parquet* f) { delete f; }
}
