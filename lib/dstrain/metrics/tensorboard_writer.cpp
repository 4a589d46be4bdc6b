#include "dstrain/metrics/tensorboard_writer.h"

#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "dstrain/core/crc32c.h"
#include "dstrain/core/host.h"
#include "dstrain/core/error.h"

namespace dstrain::metrics {
namespace {

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, int field, int wire_type) {
  varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}
template <typename T>
void little_endian(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86 and ARM Linux are little-endian
  out.append(b, sizeof(T));
}
void length_delimited(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tfrecord(const std::string& data) {
  std::string out;
  const uint64_t length = data.size();
  little_endian(out, length);
  little_endian(out, masked_crc32c(out.data(), 8));
  out += data;
  little_endian(out, masked_crc32c(data.data(), data.size()));
  return out;
}

std::string encode_file_version_event(double wall_time) {
  std::string e;
  key(e, 1, 1);  // wall_time: double
  little_endian(e, wall_time);
  length_delimited(e, 3, "brain.Event:2");  // file_version
  return e;
}

std::string encode_scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    length_delimited(v, 1, tag);  // Summary.Value.tag
    key(v, 2, 5);                 // simple_value: float
    little_endian(v, value);
    length_delimited(summary, 1, v);  // Summary.value (repeated)
  }
  std::string e;
  key(e, 1, 1);
  little_endian(e, wall_time);
  if (step != 0) {  // proto3 omits defaults
    key(e, 2, 0);
    varint(e, static_cast<uint64_t>(step));
  }
  length_delimited(e, 5, summary);  // Event.summary
  return e;
}

std::string encode_text_event(double wall_time, int64_t step, const std::string& tag, const std::string& text) {
  std::string plugin, metadata, tensor, v, summary, e;
  length_delimited(plugin, 1, "text");    // PluginData.plugin_name
  length_delimited(metadata, 1, plugin);  // SummaryMetadata.plugin_data
  key(tensor, 1, 0);                      // TensorProto.dtype = DT_STRING (7)
  varint(tensor, 7);
  length_delimited(tensor, 2, std::string());  // tensor_shape: a scalar
  length_delimited(tensor, 8, text);           // string_val
  length_delimited(v, 1, tag);                 // Summary.Value.tag
  length_delimited(v, 8, tensor);              // Summary.Value.tensor
  length_delimited(v, 9, metadata);            // Summary.Value.metadata
  length_delimited(summary, 1, v);
  key(e, 1, 1);
  little_endian(e, wall_time);
  if (step != 0) {
    key(e, 2, 0);
    varint(e, static_cast<uint64_t>(step));
  }
  length_delimited(e, 5, summary);
  return e;
}

std::string encode_session_start_event(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);
  little_endian(e, wall_time);
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  std::string session;
  key(session, 1, 0);  // SessionLog.status = START (1)
  varint(session, 1);
  length_delimited(e, 7, session);
  return e;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t resume_step) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const double now = unix_seconds();
  path_ = fmt::format("{}/events.out.tfevents.{:010d}.{}.{}.0", dir, static_cast<int64_t>(now), host_name(), ::getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_)
    throw Error(ErrorCode::kEnvironment, fmt::format("cannot write the TensorBoard event file {}: {}", path_, std::strerror(errno)),
                "check that the directory is writable, or set logging.tensorboard_dir");
  std::string records = tfrecord(encode_file_version_event(now));
  if (resume_step > 0) records += tfrecord(encode_session_start_event(now, resume_step + 1));
  std::fwrite(records.data(), 1, records.size(), file_);
  std::fflush(file_);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::write_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars, double wall_time) {
  const std::string record = tfrecord(encode_scalars_event(wall_time, step, scalars));
  std::fwrite(record.data(), 1, record.size(), file_);
  std::fflush(file_);
}

void TensorBoardWriter::write_text(int64_t step, const std::string& tag, const std::string& text, double wall_time) {
  const std::string record = tfrecord(encode_text_event(wall_time, step, tag, text));
  std::fwrite(record.data(), 1, record.size(), file_);
  std::fflush(file_);
}

}  // namespace dstrain::metrics
