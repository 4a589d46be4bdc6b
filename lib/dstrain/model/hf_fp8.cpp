#include "dstrain/model/hf_fp8.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>

#include "dstrain/core/atomic_file.h"
#include "dstrain/core/error.h"

namespace dstrain::model {
namespace {

constexpr const char* kFp8Hint =
    "dstrain reads DeepSeek's block-scaled FP8 (quant_method fp8, fmt e4m3 or e5m2, weight_block_size [rows, cols]); "
    "dequantize the folder with its publisher's tool, or re-download it";

[[noreturn]] void bad_config(const std::string& path, const std::string& key, const std::string& what) {
  throw Error(ErrorCode::kCheckpoint, fmt::format("{}: quantization_config.{}: {}", path, key, what), kFp8Hint);
}

double fp8_max(const std::string& fmt) { return fmt == "e5m2" ? 57344.0 : 448.0; }

// The smallest power of two at or above x > 0 (ue8m0 scales), exactly: frexp, not log2.
float power_of_two_at_or_above(float x) {
  int e = 0;
  const float m = std::frexp(x, &e);  // x = m · 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, m == 0.5f ? e - 1 : e);
}

// [R, C] per-block values → [rows, cols] per element.
at::Tensor expand_blocks(const at::Tensor& grid, int64_t rows, int64_t cols, const Fp8Format& f) {
  return grid.repeat_interleave(f.block_rows, 0).slice(0, 0, rows).repeat_interleave(f.block_cols, 1).slice(1, 0, cols);
}

}  // namespace

std::optional<Fp8Format> read_fp8_format(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::is_regular_file(path)) return std::nullopt;
  const auto config = nlohmann::json::parse(read_file(path), nullptr, false);
  if (!config.is_object() || !config.contains("quantization_config") || config["quantization_config"].is_null()) return std::nullopt;
  const auto& q = config["quantization_config"];
  if (!q.is_object()) bad_config(path, "", "is not an object");
  const auto text = [&](const char* key, const char* fallback) {
    if (!q.contains(key) || q[key].is_null()) return std::string(fallback);
    if (!q[key].is_string()) bad_config(path, key, "is not a string");
    return q[key].get<std::string>();
  };
  Fp8Format f;
  if (const std::string method = text("quant_method", ""); method != "fp8")
    bad_config(path, "quant_method", fmt::format("'{}' is not fp8: dstrain reads no other quantized weights", method));
  f.fmt = text("fmt", "e4m3");
  if (f.fmt != "e4m3" && f.fmt != "e5m2") bad_config(path, "fmt", fmt::format("'{}' is neither e4m3 nor e5m2", f.fmt));
  if (q.contains("weight_block_size") && !q["weight_block_size"].is_null()) {
    const auto& b = q["weight_block_size"];
    // DeepSeek's blocks are 128 x 128; a bound keeps the scale grid's arithmetic far from overflow.
    constexpr int64_t kMaxBlock = 65536;
    auto in_range = [&](const nlohmann::json& n) { return n.is_number_integer() && n.get<int64_t>() > 0 && n.get<int64_t>() <= kMaxBlock; };
    if (!b.is_array() || b.size() != 2 || !in_range(b[0]) || !in_range(b[1]))
      bad_config(path, "weight_block_size", fmt::format("{} is not two integers [rows, cols] from 1 to {}", b.dump(), kMaxBlock));
    f.block_rows = b[0].get<int64_t>(), f.block_cols = b[1].get<int64_t>();
  }
  const std::string scale_fmt = text("scale_fmt", "");
  if (!scale_fmt.empty() && scale_fmt != "ue8m0")
    bad_config(path, "scale_fmt", fmt::format("'{}' is not ue8m0 (power-of-two scales) or absent (any float32 scale)", scale_fmt));
  f.ue8m0 = scale_fmt == "ue8m0";
  f.activation_scheme = text("activation_scheme", "dynamic");
  return f;
}

std::string fp8_format_json(const Fp8Format& f) {
  nlohmann::json q = {{"activation_scheme", f.activation_scheme},
                      {"fmt", f.fmt},
                      {"quant_method", "fp8"},
                      {"weight_block_size", {f.block_rows, f.block_cols}}};
  if (f.ue8m0) q["scale_fmt"] = "ue8m0";
  return q.dump();
}

std::string scale_name_of(const std::string& weight_name) { return weight_name + "_scale_inv"; }

std::vector<int64_t> scale_grid(const std::vector<int64_t>& shape, const Fp8Format& f) {
  if (shape.size() != 2) return {};
  return {(shape[0] + f.block_rows - 1) / f.block_rows, (shape[1] + f.block_cols - 1) / f.block_cols};
}

at::Tensor dequantize_fp8(const at::Tensor& weight, const at::Tensor& scale_inv, const Fp8Format& f) {
  return weight.to(at::kFloat) * expand_blocks(scale_inv.to(at::kFloat), weight.size(0), weight.size(1), f);
}

Fp8Weight quantize_fp8(const at::Tensor& weight, const Fp8Format& f) {
  const at::Tensor w = weight.to(at::kFloat).contiguous();
  const int64_t rows = w.size(0), cols = w.size(1);
  const auto grid = scale_grid(w.sizes().vec(), f);
  // Pad to whole blocks with zeros (they do not move an absolute maximum), then reduce each block.
  const at::Tensor padded = at::constant_pad_nd(w, {0, grid[1] * f.block_cols - cols, 0, grid[0] * f.block_rows - rows});
  const at::Tensor amax = padded.view({grid[0], f.block_rows, grid[1], f.block_cols}).abs().amax({1, 3}).contiguous();
  at::Tensor scale = amax / fp8_max(f.fmt);
  float* s = scale.data_ptr<float>();
  for (int64_t i = 0; i < scale.numel(); ++i) {
    if (!std::isfinite(s[i]))
      throw Error(ErrorCode::kCheckpoint, "a weight to quantize to FP8 holds a non-finite value",
                  "export from a checkpoint whose weights are finite");
    if (s[i] == 0) s[i] = 1;  // a block of zeros: any scale stores it exactly
    if (f.ue8m0) s[i] = power_of_two_at_or_above(s[i]);
  }
  const at::ScalarType type = f.fmt == "e5m2" ? at::kFloat8_e5m2 : at::kFloat8_e4m3fn;
  return {(w / expand_blocks(scale, rows, cols, f)).to(type), scale};
}

}  // namespace dstrain::model
