#include "dstrain/report/run_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"
#include "dstrain/report/font.h"
#include "dstrain/report/png.h"

namespace dstrain::report {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint32_t kPalette[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b, 0xe377c2, 0x7f7f7f};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), finite only
};

struct Chart {
  std::string id, title, x_label, y_label;
  std::vector<Series> series;
  bool empty() const {
    return std::all_of(series.begin(), series.end(), [](const Series& s) { return s.points.empty(); });
  }
};

std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> rows;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      rows.push_back(json::parse(line));
    } catch (const json::exception&) {
      // a line cut by a crash: skip it
    }
  }
  return rows;
}

Series series_of(const std::vector<json>& rows, const std::string& key, double scale = 1.0, const std::string& name = "") {
  Series s{name.empty() ? key : name, {}};
  for (const auto& r : rows) {
    if (!r.contains(key) || !r[key].is_number() || !r.contains("step")) continue;
    const double v = r[key].get<double>() * scale;
    if (std::isfinite(v)) s.points.emplace_back(r["step"].get<double>(), v);
  }
  return s;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

struct Frame {
  double x0, x1, y0, y1;
  static Frame of(const Chart& c) {
    Frame f{1e300, -1e300, 1e300, -1e300};
    for (const auto& s : c.series)
      for (const auto& [x, y] : s.points)
        f.x0 = std::min(f.x0, x), f.x1 = std::max(f.x1, x), f.y0 = std::min(f.y0, y), f.y1 = std::max(f.y1, y);
    if (f.x1 <= f.x0) f.x1 = f.x0 + 1;
    if (f.y1 <= f.y0) f.y1 = f.y0 + std::max(1e-12, std::abs(f.y0) * 0.1), f.y0 -= std::max(1e-12, std::abs(f.y0) * 0.1);
    const double pad = (f.y1 - f.y0) * 0.05;
    f.y0 -= pad, f.y1 += pad;
    return f;
  }
};

constexpr int kW = 720, kH = 280, kLeft = 84, kRight = 20, kTop = 30, kBottom = 40;

std::string svg_of(const Chart& c) {
  const Frame f = Frame::of(c);
  auto px = [&](double x) { return kLeft + (x - f.x0) / (f.x1 - f.x0) * (kW - kLeft - kRight); };
  auto py = [&](double y) { return kH - kBottom - (y - f.y0) / (f.y1 - f.y0) * (kH - kTop - kBottom); };
  std::string out = fmt::format(
      "<svg class=\"chart\" data-chart=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">\n",
      c.id, kW, kH, kW, kH);
  out += fmt::format("<text x=\"{}\" y=\"18\" class=\"title\">{}</text>\n", kLeft, escape(c.title));
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" class=\"plot\"/>\n", kLeft, kTop, kW - kLeft - kRight,
                     kH - kTop - kBottom);
  for (int i = 0; i <= 4; ++i) {
    const double y = f.y0 + (f.y1 - f.y0) * i / 4.0, x = f.x0 + (f.x1 - f.x0) * i / 4.0;
    out += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" class=\"grid\"/>", kLeft, kW - kRight, py(y), py(y));
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" class=\"tick\" text-anchor=\"end\">{:.4g}</text>", kLeft - 6, py(y) + 4, y);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" class=\"tick\" text-anchor=\"middle\">{:.5g}</text>\n", px(x), kH - kBottom + 16, x);
  }
  out += fmt::format("<text x=\"{}\" y=\"{}\" class=\"axis\" text-anchor=\"middle\">{}</text>\n", (kLeft + kW - kRight) / 2, kH - 6,
                     escape(c.x_label));
  out += fmt::format("<text x=\"14\" y=\"{}\" class=\"axis\" transform=\"rotate(-90 14 {})\" text-anchor=\"middle\">{}</text>\n", kH / 2,
                     kH / 2, escape(c.y_label));
  int k = 0;
  for (const auto& s : c.series) {
    const uint32_t color = kPalette[k % 8];
    if (!s.points.empty()) {
      std::string d;
      for (size_t i = 0; i < s.points.size(); ++i)
        d += fmt::format("{}{:.1f},{:.1f}", i ? " L" : "M", px(s.points[i].first), py(s.points[i].second));
      out += fmt::format(
          "<path class=\"series\" data-series=\"{}\" data-points=\"{}\" d=\"{}\" stroke=\"#{:06x}\" fill=\"none\" stroke-width=\"1.8\"/>\n",
          escape(s.name), s.points.size(), d, color);
      out += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"#{:06x}\"/><text x=\"{}\" y=\"{}\" class=\"legend\">{}</text>\n",
          kW - kRight - 150, kTop + 6 + 16 * k, color, kW - kRight - 135, kTop + 15 + 16 * k, escape(s.name));
    }
    ++k;
  }
  return out + "</svg>\n";
}

// The PNG copy of a chart, the SVG's twin: title, grid, tick numbers, axis labels, legend.
Image png_of(const Chart& c) {
  const Frame f = Frame::of(c);
  auto px = [&](double x) { return kLeft + (x - f.x0) / (f.x1 - f.x0) * (kW - kLeft - kRight); };
  auto py = [&](double y) { return kH - kBottom - (y - f.y0) / (f.y1 - f.y0) * (kH - kTop - kBottom); };
  constexpr uint32_t kInk = 0x333333;
  Image img(kW, kH);
  draw_text(img, kLeft, 6, c.title, 0x222222, 2);
  for (int i = 0; i <= 4; ++i) {
    const double v = f.y0 + (f.y1 - f.y0) * i / 4.0, y = py(v);
    img.line(kLeft, y, kW - kRight, y, 0xE0E0E0);
    const std::string tick = fmt::format("{:.4g}", v);
    draw_text(img, kLeft - 6 - text_width(tick), static_cast<int>(y) - 3, tick, kInk);
    const double xv = f.x0 + (f.x1 - f.x0) * i / 4.0;
    const std::string xtick = fmt::format("{:.5g}", xv);
    draw_text(img, static_cast<int>(px(xv)) - text_width(xtick) / 2, kH - kBottom + 6, xtick, kInk);
  }
  draw_text(img, (kLeft + kW - kRight - text_width(c.x_label)) / 2, kH - 14, c.x_label, kInk);
  draw_text_up(img, 6, (kH + text_width(c.y_label)) / 2, c.y_label, kInk);
  img.line(kLeft, kTop, kLeft, kH - kBottom, 0x404040);
  img.line(kLeft, kH - kBottom, kW - kRight, kH - kBottom, 0x404040);
  int k = 0;
  for (const auto& s : c.series) {
    const uint32_t color = kPalette[k % 8];
    for (size_t i = 1; i < s.points.size(); ++i)
      img.line(px(s.points[i - 1].first), py(s.points[i - 1].second), px(s.points[i].first), py(s.points[i].second), color, 2);
    if (s.points.size() == 1)
      img.rect(static_cast<int>(px(s.points[0].first)) - 2, static_cast<int>(py(s.points[0].second)) - 2,
               static_cast<int>(px(s.points[0].first)) + 2, static_cast<int>(py(s.points[0].second)) + 2, color);
    img.rect(kW - kRight - 150, kTop + 6 + 16 * k, kW - kRight - 140, kTop + 16 + 16 * k, color);  // legend swatch
    draw_text(img, kW - kRight - 135, kTop + 8 + 16 * k, s.name, kInk);
    ++k;
  }
  return img;
}

double mean_of(const Series& s, size_t skip_first) {
  double sum = 0;
  size_t n = 0;
  for (size_t i = skip_first; i < s.points.size(); ++i) sum += s.points[i].second, ++n;
  return n ? sum / static_cast<double>(n) : std::nan("");
}

// The rows by their value of `key` (a set's or a task's name), in order of first appearance.
std::vector<std::pair<std::string, std::vector<json>>> grouped_by(const std::vector<json>& rows, const char* key) {
  std::vector<std::pair<std::string, std::vector<json>>> groups;
  for (const auto& r : rows) {
    const std::string name = r.value(key, "");
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == name; });
    if (it == groups.end()) it = groups.insert(groups.end(), {name, {}});
    it->second.push_back(r);
  }
  return groups;
}

// Each task's accuracy over the training curve (eval.tasks: metrics.jsonl rows with "task"): acc
// and acc_norm of a multiple-choice task, exact_match of a generative one.
Chart tasks_chart(const std::vector<json>& tasks) {
  Chart chart{"tasks", "Tasks", "step", "accuracy", {}};
  for (const auto& [name, of_task] : grouped_by(tasks, "task")) {
    const bool generative = of_task.front().contains("exact_match");
    for (const char* metric :
         generative ? std::vector<const char*>{"exact_match", "exact_match_flexible"} : std::vector<const char*>{"acc", "acc_norm"})
      if (of_task.front().contains(metric)) chart.series.push_back(series_of(of_task, metric, 1.0, std::string(metric) + " " + name));
  }
  return chart;
}

// The charts of a run; t0 receives the wall time of its first step or failure.
std::vector<Chart> charts_of(const std::vector<json>& rows, const std::vector<json>& evals, const std::vector<json>& tasks,
                             const std::vector<json>& failures, double& t0) {
  std::vector<Chart> charts;
  Chart loss{"loss", "Training loss", "step", "loss", {series_of(rows, "loss")}};
  // Each evaluation set's validation loss over the training curve (metrics.jsonl rows with "eval").
  for (const auto& [name, of_set] : grouped_by(evals, "eval")) loss.series.push_back(series_of(of_set, "val_loss", 1.0, "val " + name));
  if (!evals.empty()) loss.title = "Training and validation loss";
  charts.push_back(std::move(loss));
  if (!tasks.empty()) charts.push_back(tasks_chart(tasks));
  charts.push_back({"lr", "Learning rate", "step", "lr", {series_of(rows, "lr")}});
  charts.push_back({"throughput", "Throughput", "step", "tokens/s", {series_of(rows, "tokens_per_s")}});
  charts.push_back({"mfu", "Model FLOPs utilisation", "step", "MFU %", {series_of(rows, "mfu", 100.0, "mfu %")}});
  charts.push_back({"loss_scale", "Loss scale", "step", "scale", {series_of(rows, "loss_scale")}});
  charts.push_back({"grad_norm", "Gradient norm", "step", "norm", {series_of(rows, "grad_norm")}});
  Chart breakdown{"breakdown", "Step time breakdown", "step", "ms", {}};
  for (const char* key :
       {"step_ms", "forward_ms", "backward_ms", "reduce_ms", "gather_ms", "optimizer_ms", "data_wait_ms", "checkpoint_ms"})
    if (Series s = series_of(rows, key); !s.points.empty()) breakdown.series.push_back(std::move(s));
  charts.push_back(breakdown);
  // The timeline: steps reached against wall time since the first step; failures as markers.
  t0 = 1e300;
  for (const auto& r : rows)
    if (r.contains("time") && r["time"].is_number()) t0 = std::min(t0, r["time"].get<double>());
  for (const auto& f : failures)
    if (f.contains("time") && f["time"].is_number()) t0 = std::min(t0, f["time"].get<double>());
  Chart timeline{"timeline", "Timeline: steps, failures and restarts", "seconds since start", "step", {{"step", {}}, {"failures", {}}}};
  for (const auto& r : rows)
    if (r.contains("time") && r["time"].is_number())
      timeline.series[0].points.emplace_back(r["time"].get<double>() - t0, r["step"].get<double>());
  for (const auto& f : failures)
    if (f.contains("time") && f["time"].is_number())
      timeline.series[1].points.emplace_back(f["time"].get<double>() - t0, f.value("step_reached", 0.0));
  std::sort(timeline.series[0].points.begin(), timeline.series[0].points.end());
  charts.push_back(timeline);

  return charts;
}

std::string summary_table(const std::string& run_dir, const std::vector<json>& rows, const std::vector<json>& evals, size_t failures) {
  // Summary numbers.
  const Series loss = series_of(rows, "loss"), tps = series_of(rows, "tokens_per_s"), mfu = series_of(rows, "mfu", 100.0);
  std::string summary = "<table class=\"summary\">";
  auto row = [&summary](const std::string& k, const std::string& v) {
    summary += fmt::format("<tr><th>{}</th><td>{}</td></tr>", escape(k), escape(v));
  };
  row("run directory", run_dir);
  row("steps recorded", std::to_string(rows.size()));
  if (!rows.empty()) row("last step", rows.back().value("step", json(0)).dump());
  if (!loss.points.empty())
    row("loss (first → last)", fmt::format("{:.4f} → {:.4f}", loss.points.front().second, loss.points.back().second));
  if (!tps.points.empty()) row("mean tokens/s (after step 1)", fmt::format("{:.0f}", mean_of(tps, 1)));
  if (!mfu.points.empty()) row("mean MFU (after step 1)", fmt::format("{:.3f} %", mean_of(mfu, 1)));
  if (!evals.empty()) {
    const json& last = evals.back();
    row("validation loss (last)",
        fmt::format("{:.4f} ({}, step {})", last.value("val_loss", 0.0), last.value("eval", std::string()), last.value("step", 0)));
  }
  row("failures", std::to_string(failures));
  summary += "</table>\n";

  return summary;
}

std::string failure_table(const std::vector<json>& failures, double t0) {
  std::string table =
      "<table class=\"failures\"><tr><th>time "
      "(s)</th><th>generation</th><th>kind</th><th>node</th><th>rank</th><th>step</th><th>what</th></tr>";
  for (const auto& f : failures)
    table += fmt::format("<tr><td>{:.1f}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                         f.value("time", 0.0) - t0, f.value("generation", 0), escape(f.value("kind", std::string("exit"))),
                         f.value("node", 0), f.value("rank", -1), f.value("step_reached", 0), escape(f.value("what", std::string())));
  table += failures.empty() ? "<tr><td colspan=\"7\">none</td></tr></table>\n" : "</table>\n";

  return table;
}

std::string straggler_table(const std::vector<json>& stragglers) {
  std::string table =
      "<table class=\"stragglers\"><tr><th>rank</th><th>host</th><th>compute ms/step</th><th>wait ms/step</th><th>slow in checks</th></tr>";
  if (!stragglers.empty()) {
    std::map<int, int> slow_count;
    for (const auto& check : stragglers)
      for (const auto& r : check.value("ranks", json::array()))
        if (r.value("slow", false)) ++slow_count[r.value("rank", -1)];
    const json& last = stragglers.back();
    for (const auto& r : last.value("ranks", json::array())) {
      const int rank = r.value("rank", -1);
      table += fmt::format("<tr class=\"{}\"><td>{}</td><td>{}</td><td>{:.1f}</td><td>{:.1f}</td><td>{} of {}</td></tr>",
                           slow_count[rank] ? "slow" : "ok", rank, escape(r.value("host", std::string())), r.value("compute_ms", 0.0),
                           r.value("wait_ms", 0.0), slow_count[rank], stragglers.size());
    }
    table += fmt::format("</table><p>last check at step {}: median compute {:.1f} ms/step; slow = more than {:.0f}% above it</p>\n",
                         last.value("step", 0), last.value("median_compute_ms", 0.0), 100.0 * last.value("threshold", 0.0));
  } else {
    table += "<tr><td colspan=\"5\">no straggler checks in this run (one rank, or logging.straggler_interval = 0)</td></tr></table>\n";
  }

  return table;
}

std::string page(const std::string& run_dir, const std::string& summary, const std::string& body, const std::string& stragglers,
                 const std::string& failures) {
  return fmt::format(R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dstrain report: {}</title>
<style>
body {{ font-family: sans-serif; margin: 24px; color: #222; background: #fff; }}
h1 {{ font-size: 20px; }} h2 {{ font-size: 16px; margin-top: 24px; }}
table {{ border-collapse: collapse; margin: 8px 0; }} th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: left; font-size: 13px; }}
tr.slow td {{ background: #fde0dc; }}
svg.chart {{ display: block; margin: 12px 0; }}
.plot {{ fill: #fafafa; stroke: #444; }} .grid {{ stroke: #e0e0e0; }} .tick, .legend {{ font-size: 11px; fill: #333; }}
.axis {{ font-size: 12px; fill: #333; }} .title {{ font-size: 14px; font-weight: bold; fill: #222; }} .none {{ color: #888; }}
</style></head><body>
<h1>dstrain report: {}</h1>
{}
<h2>Charts</h2>
{}
<h2>Stragglers</h2>
{}
<h2>Failures and restarts</h2>
{}
<p class="none">PNG copies of the charts are next to this page. Written by dstrain report from metrics.jsonl, stragglers.jsonl and failures.jsonl.</p>
</body></html>
)",
                     escape(fs::path(run_dir).filename().string()), escape(run_dir), summary, body, stragglers, failures);
}

}  // namespace

ReportFiles write_run_report(const std::string& run_dir, const std::string& out_dir) {
  const std::string metrics_path = run_dir + "/metrics.jsonl";
  if (!fs::exists(metrics_path))
    throw Error(ErrorCode::kUsage, fmt::format("'{}' has no metrics.jsonl", run_dir),
                "pass the run_dir of a `dstrain train` run with the jsonl sink");
  std::vector<json> rows, evals, tasks;  // step rows, evaluation rows, task rows
  for (json& r : read_jsonl(metrics_path)) (r.contains("eval") ? evals : r.contains("task") ? tasks : rows).push_back(std::move(r));
  const std::vector<json> failures = read_jsonl(run_dir + "/failures.jsonl");
  const std::vector<json> stragglers = read_jsonl(run_dir + "/stragglers.jsonl");
  fs::create_directories(out_dir);
  double t0 = 0;
  const std::vector<Chart> charts = charts_of(rows, evals, tasks, failures, t0);
  ReportFiles out;
  out.steps = static_cast<int>(rows.size());
  std::string body;
  for (const auto& c : charts) {
    if (c.empty()) {
      body += fmt::format("<section><h2>{}</h2><p class=\"none\">not recorded in this run</p></section>\n", escape(c.title));
      continue;
    }
    body += "<section>" + svg_of(c) + "</section>\n";
    const std::string png = out_dir + "/" + c.id + ".png";
    write_file_atomic(png, encode_png(png_of(c)));
    out.pngs.push_back(png);
    ++out.charts;
  }

  out.html = out_dir + "/index.html";
  write_file_atomic(out.html, page(run_dir, summary_table(run_dir, rows, evals, failures.size()), body, straggler_table(stragglers),
                                   failure_table(failures, t0)));
  return out;
}

}  // namespace dstrain::report
