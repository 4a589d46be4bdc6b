#include "dstrain/model/nf4.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

namespace dstrain::model {
namespace {

// The 8-bit quantization of the block maxima as bitsandbytes' CPU kernel does it: a table of
// 65536 evenly spaced points in [-1, 1], each mapped to its nearest code (by float32 midpoints);
// a value is scaled by its block's reciprocal maximum and rounded to the nearest point. Each
// float32 step below is the kernel's, in its order.
constexpr int kTableSize = 65536;

std::vector<uint8_t> dynamic_map_table() {
  const at::Tensor map = dynamic_map().contiguous();
  const float* code = map.data_ptr<float>();
  std::array<float, 255> mid{};
  for (size_t i = 0; i < mid.size(); ++i) mid[i] = 0.5f * (code[i] + code[i + 1]);
  std::vector<uint8_t> table(kTableSize);
  size_t c = 0;
  for (int i = 0; i < kTableSize; ++i) {
    const float point = -1.0f + (2.0f * static_cast<float>(i)) / static_cast<float>(kTableSize - 1);
    while (c < mid.size() && mid[c] < point) ++c;
    table[static_cast<size_t>(i)] = static_cast<uint8_t>(c);
  }
  return table;
}

// x: float32 on the CPU. Returns the codes, and each block's maximum in `scales`.
at::Tensor quantize_dynamic(const at::Tensor& x, int64_t block, at::Tensor& scales) {
  static const std::vector<uint8_t> table = dynamic_map_table();
  const at::Tensor in = x.contiguous();
  const int64_t n = in.numel(), blocks = (n + block - 1) / block;
  at::Tensor codes = at::empty({n}, at::kByte);
  scales = at::empty({blocks}, at::kFloat);
  const float* v = in.data_ptr<float>();
  uint8_t* out = codes.data_ptr<uint8_t>();
  float* s = scales.data_ptr<float>();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t start = b * block, end = std::min(start + block, n);
    float amax = 0.0f;
    for (int64_t i = start; i < end; ++i) amax = std::max(amax, std::isnan(v[i]) ? 0.0f : std::fabs(v[i]));
    s[b] = amax;
    if (amax == 0.0f) {
      std::memset(out + start, 0, static_cast<size_t>(end - start));
      continue;
    }
    const float inv = 1.0f / amax;
    for (int64_t i = start; i < end; ++i) {
      const float scaled = std::clamp(v[i] * inv, -1.0f, 1.0f);
      const float shifted = scaled + 1.0f;
      const float half = shifted * 0.5f;
      const float stretched = half * static_cast<float>(kTableSize - 1);
      out[i] = table[static_cast<uint16_t>(stretched + 0.5f)];
    }
  }
  return codes;
}

// The maps on the device a weight dequantizes on, copied there once (a copy per use would be a
// host-to-device transfer per projection and step).
struct MapsOnDevice {
  at::Tensor values, dynamic;
};
const MapsOnDevice& maps_on(const c10::Device& device) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, MapsOnDevice> cache;  // by device type and index: no string per use
  const std::lock_guard<std::mutex> lock(mutex);
  auto [it, added] = cache.try_emplace(std::pair<int, int>{static_cast<int>(device.type()), device.index()});
  if (added) it->second = {nf4_values().to(device), dynamic_map().to(device)};
  return it->second;
}

}  // namespace

const at::Tensor& nf4_values() {
  static const at::Tensor values =
      at::tensor(std::vector<float>{-1.0f, -0x1.647362p-1f, -0x1.0cd66p-1f, -0x1.94654p-2f, -0x1.23449ap-2f, -0x1.7a6a7ep-3f,
                                    -0x1.74f0e2p-4f, 0.0f, 0x1.45f5fep-4f, 0x1.4995c6p-3f, 0x1.f809bap-3f, 0x1.5a0674p-2f, 0x1.c3497p-2f,
                                    0x1.200f56p-1f, 0x1.722766p-1f, 1.0f},
                 at::kFloat);
  return values;
}

// bitsandbytes' create_dynamic_map(signed=True): 7 exponent ranges, each the midpoints of
// float32 linspace(0.1, 1) scaled by its power of ten, both signs, then 0 and 1; sorted.
const at::Tensor& dynamic_map() {
  static const at::Tensor map = [] {
    std::vector<at::Tensor> parts;
    constexpr int kExponentBits = 7;
    for (int i = 0; i < kExponentBits; ++i) {
      const int64_t items = (int64_t{1} << i) + 1;
      const at::Tensor bounds = at::linspace(0.1, 1.0, items, at::kFloat);
      const at::Tensor means = (bounds.slice(0, 0, items - 1) + bounds.slice(0, 1)) / 2.0;
      const double power = std::pow(10.0, -(kExponentBits - 1) + i);
      parts.push_back(means * power);
      parts.push_back(means * -power);
    }
    parts.push_back(at::tensor(std::vector<float>{0.0f, 1.0f}, at::kFloat));
    return std::get<0>(at::cat(parts).sort());
  }();
  return map;
}

int64_t Nf4Weight::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Nf4Weight::bytes() const { return codes.numel() + absmax_codes.numel() + absmax_scales.numel() * 4; }

Nf4Weight quantize_nf4(const at::Tensor& weight) {
  Nf4Weight q;
  q.shape = weight.sizes().vec();
  // bitsandbytes' quantize_4bit kernel (the CPU's is its default, in torch ops): the same ops here.
  const at::Tensor flat = weight.detach().reshape(-1).to(at::kCPU).to(at::kFloat);
  const int64_t n = flat.numel(), rem = n % kNf4BlockSize, full = n - rem;
  const at::Tensor whole = flat.slice(0, 0, full).reshape({full / kNf4BlockSize, kNf4BlockSize});
  at::Tensor absmax = std::get<0>(whole.abs().max(-1));
  at::Tensor scaled = (whole * absmax.clamp_min(1e-38).reciprocal().view({-1, 1})).clamp(-1, 1).reshape(-1);
  if (rem > 0) {
    const at::Tensor tail = flat.slice(0, full);
    const at::Tensor tail_max = tail.abs().max().clamp_min(1e-38);
    absmax = at::cat({absmax, tail_max.unsqueeze(0)});
    scaled = at::cat({scaled, (tail / tail_max).clamp(-1, 1)});
  }
  if (scaled.numel() % 2 != 0) scaled = at::constant_pad_nd(scaled, {0, 1});
  const at::Tensor& code = nf4_values();
  const at::Tensor bounds = (code.slice(0, 0, 15) + code.slice(0, 1)) / 2;
  const at::Tensor nibbles = at::bucketize(scaled, bounds, /*out_int32=*/true).to(at::kByte);
  q.codes = nibbles.slice(0, 0, c10::nullopt, 2).bitwise_left_shift(4).bitwise_or(nibbles.slice(0, 1, c10::nullopt, 2));
  // Double quantization (compress_statistics): the maxima less their mean, in blocks of 256.
  const at::Tensor offset = absmax.mean();
  q.absmax_offset = offset.item<float>();
  q.absmax_codes = quantize_dynamic(absmax - offset, kNf4AbsmaxBlockSize, q.absmax_scales);
  return q;
}

at::Tensor dequantize_nf4(const Nf4Weight& q, c10::ScalarType dtype) {
  const c10::Device device = q.codes.device();
  // The maxima: code x its block's scale, plus the offset (float32, as bitsandbytes).
  const int64_t blocks = q.absmax_codes.numel();
  const MapsOnDevice& maps = maps_on(device);
  at::Tensor maxima = maps.dynamic.index_select(0, q.absmax_codes.to(at::kLong));
  const int64_t padded = ((blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize) * kNf4AbsmaxBlockSize;
  maxima = (at::constant_pad_nd(maxima, {0, padded - blocks}).view({-1, kNf4AbsmaxBlockSize}) * q.absmax_scales.view({-1, 1}))
               .reshape(-1)
               .slice(0, 0, blocks) +
           q.absmax_offset;
  // The elements: NF4 value x its block's maximum, in float32, then rounded once.
  const at::Tensor nibbles = at::stack({q.codes.bitwise_right_shift(4), q.codes.bitwise_and(15)}, 1).reshape(-1).to(at::kLong);
  const int64_t n = q.numel();
  at::Tensor values = maps.values.index_select(0, nibbles).slice(0, 0, n);
  const int64_t padded_n = blocks * kNf4BlockSize;
  values = (at::constant_pad_nd(values, {0, padded_n - n}).view({blocks, kNf4BlockSize}) * maxima.view({-1, 1})).reshape(-1).slice(0, 0, n);
  return values.view(q.shape).to(dtype);
}

Nf4Weight nf4_to(const Nf4Weight& q, const c10::Device& device) {
  Nf4Weight out = q;
  out.codes = q.codes.to(device), out.absmax_codes = q.absmax_codes.to(device), out.absmax_scales = q.absmax_scales.to(device);
  return out;
}

}  // namespace dstrain::model
