#include "catch_torch.h"

#include <cmath>
#include <limits>
#include <string>

#include "dstrain/core/atomic_file.h"
#include "dstrain/metrics/jsonl_sink.h"
#include "test_support.h"
#include "dstrain/metrics/tensorboard_writer.h"

using namespace dstrain;

namespace {

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += std::string{digits[c >> 4], digits[c & 15], ' '};
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace

// The worked bytes of ../shared/docs/reference/file-formats.md §1.6.
TEST_CASE("TensorBoard records match the reference bytes", "[metrics]") {
  CHECK(hex(metrics::tfrecord(metrics::encode_file_version_event(1700000000.0))) ==
        "18 00 00 00 00 00 00 00 a3 7f 4b 22 09 00 00 00 40 fc 54 d9 41 1a 0d 62 72 61 69 6e 2e 45 76 65 6e 74 3a 32 ec ed 8f 9d");
  CHECK(hex(metrics::tfrecord(metrics::encode_scalars_event(1700000001.5, 100, {{"loss", 2.5f}}))) ==
        "1a 00 00 00 00 00 00 00 12 9b d8 2d 09 00 00 60 40 fc 54 d9 41 10 64 2a 0d 0a 0b 0a 04 6c 6f 73 73 15 00 00 20 40 c7 c3 57 82");
}

TEST_CASE("a SessionLog START event encodes status 1 at its step", "[metrics]") {
  // wall_time, step 11, then field 7 (SessionLog) holding field 1 = 1.
  CHECK(hex(metrics::encode_session_start_event(1700000000.0, 11)) == "09 00 00 00 40 fc 54 d9 41 10 0b 3a 02 08 01");
}

TEST_CASE("JSONL lines write non-finite values as null and keep every key", "[metrics]") {
  metrics::StepMetrics m;
  m.step = 3;
  m.wall_time = 1.5;
  m.loss = 2.0;
  m.grad_norm = std::numeric_limits<double>::infinity();
  m.stragglers = {1, 3};
  const std::string line = metrics::jsonl_line(m);
  CHECK(line.rfind("{\"step\":3,\"time\":1.500,\"loss\":2,\"lr\":null,\"grad_norm\":null,", 0) == 0);
  CHECK(line.find("\"skipped\":false,\"bad_steps\":0,\"tokens\":0,\"epoch\":null,\"accumulation\":0,") != std::string::npos);
  CHECK(line.find(",\"stragglers\":[1,3]}") != std::string::npos);
}

TEST_CASE("a task's JSONL row names the task and holds acc, acc_norm and the questions", "[metrics]") {
  metrics::TaskMetrics m;
  m.step = 40, m.wall_time = 2.25, m.name = "arc \"easy\"", m.acc = 0.625, m.acc_norm = 0.65, m.questions = 40, m.eval_ms = 12.5;
  CHECK(metrics::jsonl_line(m) ==
        "{\"step\":40,\"time\":2.250,\"task\":\"arc \\\"easy\\\"\",\"acc\":0.625,\"acc_norm\":0.65,\"n\":40,\"eval_ms\":12.5}");
  m.acc = std::nan("");
  CHECK(metrics::jsonl_line(m).find("\"acc\":null,") != std::string::npos);
}

TEST_CASE("a generative task's JSONL row holds exact_match in place of acc and acc_norm", "[metrics]") {
  metrics::TaskMetrics m;
  m.step = 7, m.wall_time = 1, m.name = "gsm8k", m.exact_match = 0.25, m.questions = 8, m.eval_ms = 3;
  CHECK(metrics::jsonl_line(m) == "{\"step\":7,\"time\":1.000,\"task\":\"gsm8k\",\"exact_match\":0.25,\"n\":8,\"eval_ms\":3}");
  m.exact_match_flexible = 0.5;
  CHECK(metrics::jsonl_line(m).find("\"exact_match\":0.25,\"exact_match_flexible\":0.5,\"n\":8") != std::string::npos);
}

TEST_CASE("a resumed run drops a metrics line torn by a crash mid-write, and later steps", "[metrics]") {
  test::TempDir dir;
  const std::string path = dir.path() + "/metrics.jsonl";
  std::string text;
  for (int step = 1; step <= 3; ++step) {
    metrics::StepMetrics m;
    m.step = step;
    text += metrics::jsonl_line(m) + "\n";
  }
  write_file_atomic(path, text + "{\"step\":4,\"time\":1.2,\"lo");  // the audit's torn last line
  { metrics::JsonlSink resumed(path, 2); }                          // resuming from the checkpoint of step 2
  CHECK(read_file(path) == text.substr(0, text.find("{\"step\":3")));
  write_file_atomic(path, text + "{\"step\":");
  { metrics::JsonlSink resumed(path, 3); }
  CHECK(read_file(path) == text);
}
