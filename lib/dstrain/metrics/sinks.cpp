#include "dstrain/metrics/sinks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/metrics/jsonl_sink.h"
#include "dstrain/metrics/tensorboard_writer.h"

namespace dstrain::metrics {
namespace fs = std::filesystem;

MetricSinks::MetricSinks(const SinkOptions& o) : o_(o) {
  if (!o.jsonl_path.empty()) jsonl_ = std::make_unique<JsonlSink>(o.jsonl_path, o.keep_through_step);
  if (!o.tensorboard_dir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(o.tensorboard_dir, o.keep_through_step);
  if (!o.csv_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o.csv_dir, ec);
    if (ec)
      throw Error(ErrorCode::kEnvironment, fmt::format("cannot create the CSV directory {}: {}", o.csv_dir, ec.message()),
                  "set logging.csv_dir");
    // A resume keeps the rows up to its checkpoint's step; a new run starts the files afresh.
    for (const auto& entry : fs::directory_iterator(o.csv_dir)) {
      if (entry.path().extension() != ".csv") continue;
      if (o.keep_through_step <= 0) {
        fs::remove(entry.path(), ec);
        continue;
      }
      std::istringstream in(read_file(entry.path().string()));
      std::string line, kept;
      std::getline(in, line);
      kept = line + "\n";  // the header
      while (std::getline(in, line))
        if (!line.empty() && std::atoll(line.c_str()) <= o.keep_through_step) kept += line + "\n";
      write_file_atomic(entry.path().string(), kept);
    }
  }
}

MetricSinks::~MetricSinks() {
  for (auto& [name, f] : csv_) std::fclose(f);
}

void MetricSinks::write(const StepMetrics& m) {
  if (jsonl_) jsonl_->write(m);
  if (!tensorboard_ && o_.csv_dir.empty()) return;
  std::vector<std::pair<std::string, float>> scalars;
  for (const auto& [name, value] : scalar_fields(m)) {
    if (!std::isfinite(value)) continue;
    if (tensorboard_) scalars.emplace_back("train/" + name, static_cast<float>(value));
    if (!o_.csv_dir.empty()) write_csv(name, m.step, value);
  }
  if (tensorboard_) tensorboard_->write_scalars(m.step, scalars, m.wall_time);
}

void MetricSinks::write(const EvalMetrics& m) {
  if (jsonl_) jsonl_->write(m);
  std::vector<std::pair<std::string, float>> scalars;
  std::vector<std::pair<std::string, double>> values{{"loss", m.val_loss}, {"ppl", m.val_ppl}};
  values.insert(values.end(), m.metrics.begin(), m.metrics.end());
  for (const auto& [what, value] : values) {
    if (!std::isfinite(value)) continue;
    if (tensorboard_) scalars.emplace_back(fmt::format("val/{}/{}", m.name, what), static_cast<float>(value));
    if (!o_.csv_dir.empty()) write_csv(fmt::format("val_{}_{}", m.name, what), m.step, value);
  }
  if (tensorboard_ && !scalars.empty()) tensorboard_->write_scalars(m.step, scalars, m.wall_time);
}

void MetricSinks::write(const TaskMetrics& m) {
  if (jsonl_) jsonl_->write(m);
  std::vector<std::pair<std::string, float>> scalars;
  for (const auto& [what, value] : {std::pair<const char*, double>{"acc", m.acc},
                                    {"acc_norm", m.acc_norm},
                                    {"exact_match", m.exact_match},
                                    {"exact_match_flexible", m.exact_match_flexible}}) {
    if (!std::isfinite(value)) continue;
    if (tensorboard_) scalars.emplace_back(fmt::format("task/{}/{}", m.name, what), static_cast<float>(value));
    if (!o_.csv_dir.empty()) write_csv(fmt::format("task_{}_{}", m.name, what), m.step, value);
  }
  if (tensorboard_ && !scalars.empty()) tensorboard_->write_scalars(m.step, scalars, m.wall_time);
}

void MetricSinks::write_text(int64_t step, const std::string& tag, const std::string& text, double wall_time) {
  if (tensorboard_) tensorboard_->write_text(step, tag, text, wall_time);
}

void MetricSinks::write_csv(const std::string& name, int64_t step, double value) {
  std::FILE*& f = csv_[name];
  if (!f) {
    std::string file = name;  // TRL's names hold slashes (rewards/chosen): one file each, rewards_chosen.csv
    std::replace(file.begin(), file.end(), '/', '_');
    const std::string path = o_.csv_dir + "/" + file + ".csv";
    const bool fresh = !fs::exists(path);
    f = std::fopen(path.c_str(), "a");
    if (!f) throw Error(ErrorCode::kEnvironment, fmt::format("cannot write {}: {}", path, std::strerror(errno)), "check the CSV directory");
    if (fresh) std::fprintf(f, "step,%s\n", name.c_str());
  }
  std::fprintf(f, "%lld,%.9g\n", static_cast<long long>(step), value);
  std::fflush(f);
}

}  // namespace dstrain::metrics
