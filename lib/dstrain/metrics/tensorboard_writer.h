#pragma once
// TensorBoard event files, written natively: TFRecord framing (length, masked CRC-32C of the
// length, an Event protobuf, masked CRC-32C of it) and Event/Summary messages encoded by hand
// (../shared/docs/reference/file-formats.md §1). Scalars use the legacy simple_value form,
// which TensorBoard reads like tf.summary.scalar. No TensorFlow, no protobuf library.
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dstrain::metrics {

// The protobuf bytes of one Event (exposed for tests).
std::string encode_file_version_event(double wall_time);
std::string encode_scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
// SessionLog START at `step`: TensorBoard drops the events of later steps that an earlier
// launch wrote (a resume from a checkpoint replays them).
std::string encode_session_start_event(double wall_time, int64_t step);
// A text summary (TensorBoard's text plugin: a scalar DT_STRING tensor; Markdown in the UI).
std::string encode_text_event(double wall_time, int64_t step, const std::string& tag, const std::string& text);
// One TFRecord around `data`.
std::string tfrecord(const std::string& data);
uint32_t masked_crc32c(const void* data, size_t size);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new file events.out.tfevents.<10-digit time>.<host>.<pid>.0 in it.
  // resume_step > 0: a resumed run; its first event purges what an earlier launch wrote after it.
  explicit TensorBoardWriter(const std::string& dir, int64_t resume_step = 0);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  // One Event with every scalar of a step; flushed at once (a crash loses at most this step).
  void write_scalars(int64_t step, const std::vector<std::pair<std::string, float>>& scalars, double wall_time);
  void write_text(int64_t step, const std::string& tag, const std::string& text, double wall_time);
  const std::string& path() const { return path_; }

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace dstrain::metrics
