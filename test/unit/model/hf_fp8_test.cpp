// DeepSeek's block-scaled FP8 weights: the format's reader and writer against element loops
// (test/model/fp8_test.sh checks them against a PyTorch weight_dequant and transformers).
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "dstrain/core/error.h"
#include "dstrain/io/safetensors.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_export.h"
#include "dstrain/model/hf_fp8.h"
#include "model/tiny_models.h"
#include "test_support.h"

using namespace dstrain;

namespace {

at::Tensor param(const model::CausalLM& m, const std::string& name) {
  for (const auto& p : m.parameters())
    if (p.name == name) return p.tensor;
  throw std::runtime_error("no parameter " + name);
}

void write_config(const std::string& dir, const std::string& quantization) {
  std::ofstream(dir + "/config.json") << R"({"model_type": "deepseek_v3", "quantization_config": )" << quantization << "}\n";
}

// The same model's weights, read back from an FP8 export, rewritten with `edit` applied to the
// tensors (by name) so that a test can break one of them.
void rewrite(const std::string& dir, const std::function<void(std::vector<io::TensorToWrite>&)>& edit) {
  const std::string path = dir + "/model.safetensors";
  std::vector<std::vector<uint8_t>> copies;
  std::vector<io::TensorToWrite> tensors;
  {
    const io::SafetensorsFile file(path);
    copies.reserve(file.tensors().size());
    for (const auto& t : file.tensors()) {
      copies.emplace_back(t.data, t.data + t.nbytes());
      tensors.push_back({t.name, t.dtype, t.shape, copies.back().data(), t.nbytes()});
    }
  }
  edit(tensors);
  io::write_safetensors(path, tensors);
}

}  // namespace

TEST_CASE("fp8 dequantization is W[i,j] * s[i/128, j/128] at V3's partial-block shape", "[fp8]") {
  // kv_a_proj_with_mqa of V3: [576, 7168], a 5 x 56 grid whose last row of blocks has 64 rows.
  const int64_t rows = 576, cols = 7168;
  auto gen = at::detail::createCPUGenerator(3);
  const at::Tensor w8 = (at::randn({rows, cols}, gen) * 100).clamp(-448, 448).to(at::kFloat8_e4m3fn);
  const at::Tensor s = at::rand({5, 56}, gen) * 1e-3 + 1e-5;
  const model::Fp8Format f;
  CHECK(model::scale_grid({rows, cols}, f) == std::vector<int64_t>{5, 56});
  const at::Tensor got = model::dequantize_fp8(w8, s, f);
  const at::Tensor w = w8.to(at::kFloat);
  const float* pw = w.data_ptr<float>();
  const float* ps = s.data_ptr<float>();
  const float* pg = got.data_ptr<float>();
  int64_t differ = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) differ += pg[i * cols + j] != pw[i * cols + j] * ps[(i / 128) * 56 + j / 128];
  CHECK(differ == 0);
}

TEST_CASE("fp8 quantization keeps every value within half a float8 step of its block", "[fp8]") {
  auto gen = at::detail::createCPUGenerator(5);
  // Blocks of very different magnitudes, a block of zeros, and values down in the subnormals.
  at::Tensor w = at::randn({300, 200}, gen) * 0.02;
  w.slice(0, 0, 128).slice(1, 0, 128).mul_(1000);
  w.slice(0, 128, 256).slice(1, 128, 200).zero_();
  w.slice(0, 256, 300).slice(1, 0, 64).mul_(1e-6);
  for (const bool ue8m0 : {false, true}) {
    model::Fp8Format f;
    f.ue8m0 = ue8m0;
    const model::Fp8Weight q = model::quantize_fp8(w, f);
    CHECK(q.weight.scalar_type() == at::kFloat8_e4m3fn);
    REQUIRE(q.scale_inv.sizes().vec() == std::vector<int64_t>{3, 2});
    const at::Tensor back = model::dequantize_fp8(q.weight, q.scale_inv, f);
    const at::Tensor s = q.scale_inv.repeat_interleave(128, 0).slice(0, 0, 300).repeat_interleave(128, 1).slice(1, 0, 200);
    // Half a step of e4m3: 2^-4 of a normal value, 2^-10 (in units of the scale) below 2^-6.
    const at::Tensor bound = at::maximum(w.abs() * std::ldexp(1.0, -4), s * std::ldexp(1.0, -10)) * (1 + 1e-6);
    CHECK(((back - w).abs() <= bound).all().item<bool>());
    CHECK(at::equal(back.slice(0, 128, 256).slice(1, 128, 200), w.slice(0, 128, 256).slice(1, 128, 200)));  // zeros stay zeros
    const at::Tensor amax = w.abs().amax();
    CHECK((w.abs() / s <= 448).all().item<bool>());
    if (ue8m0) {
      const at::Tensor log2 = at::log2(q.scale_inv);
      CHECK(at::equal(log2, at::round(log2)));  // powers of two
    } else {
      CHECK(q.scale_inv[0][0].item<float>() == Approx(w.slice(0, 0, 128).slice(1, 0, 128).abs().max().item<float>() / 448));
    }
    (void)amax;
  }
}

TEST_CASE("fp8: which tensors DeepSeek's release stores in FP8 follows from their declared roles", "[fp8]") {
  config::ModelConfig cfg = test::tiny_v3();
  cfg.mtp_depth = 1;
  std::set<std::string> fp8;
  for (const auto& s : model::model_tensor_shapes(cfg))
    if (model::stored_as_fp8(s.role)) fp8.insert(s.name);
  const std::string mtp = fmt::format("model.layers.{}.", cfg.num_layers);
  for (const std::string& name : std::vector<std::string>{
           "model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.q_b_proj.weight",
           "model.layers.0.self_attn.kv_a_proj_with_mqa.weight", "model.layers.0.self_attn.kv_b_proj.weight",
           "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight",
           "model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.1.mlp.shared_experts.down_proj.weight",
           mtp + "mlp.experts.0.gate_proj.weight", mtp + "self_attn.o_proj.weight"})
    CHECK(fp8.count(name));
  for (const std::string& name :
       std::vector<std::string>{"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.1.mlp.gate.weight",
                                "model.layers.1.mlp.gate.e_score_correction_bias", "model.layers.0.input_layernorm.weight",
                                "model.layers.0.self_attn.kv_a_layernorm.weight", mtp + "eh_proj.weight", mtp + "enorm.weight"})
    CHECK_FALSE(fp8.count(name));
  // Every tensor has its name's role: the count of each agrees with the names the release uses.
  size_t projections = 0;
  for (const auto& s : model::model_tensor_shapes(cfg))
    projections += s.name.find("_proj") != std::string::npos && s.name.find("eh_proj") == std::string::npos ? 1 : 0;
  CHECK(fp8.size() == projections);
}

TEST_CASE("fp8: quantization_config is read as DeepSeek writes it, and refused by key", "[fp8]") {
  test::TempDir dir;
  CHECK_FALSE(model::read_fp8_format(dir.path()));
  write_config(dir.path(), R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 64],
                              "scale_fmt": "ue8m0"})");
  const auto f = model::read_fp8_format(dir.path());
  REQUIRE(f);
  CHECK((f->fmt == "e4m3" && f->block_rows == 128 && f->block_cols == 64 && f->ue8m0 && f->activation_scheme == "dynamic"));
  CHECK(model::fp8_format_json(*f).find(R"("weight_block_size":[128,64])") != std::string::npos);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"quant_method": "awq"})", "quantization_config.quant_method: 'awq' is not fp8"},
      {R"({"quant_method": "fp8", "fmt": "e3m4"})", "quantization_config.fmt: 'e3m4'"},
      {R"({"quant_method": "fp8", "weight_block_size": [128]})", "quantization_config.weight_block_size: [128]"},
      {R"({"quant_method": "fp8", "weight_block_size": [0, 128]})", "quantization_config.weight_block_size"},
      {R"({"quant_method": "fp8", "scale_fmt": "e4m3"})", "quantization_config.scale_fmt: 'e4m3'"},
  };
  for (const auto& [json, message] : bad) {
    write_config(dir.path(), json);
    CHECK_THROWS_WITH(model::read_fp8_format(dir.path()), Catch::Contains(message) && Catch::Contains("config.json"));
  }
}

TEST_CASE("fp8: a model written in FP8 loads as its dequantized weights; broken scales are named", "[fp8]") {
  test::TempDir dir;
  const config::ModelConfig cfg = test::tiny_v3();
  auto a = model::make_model(cfg, 7);
  model::HfExportOptions o;
  o.dtype = "F8_E4M3";
  o.fp8.block_rows = 16, o.fp8.block_cols = 32;  // partial blocks at every edge of the tiny shapes
  std::vector<model::TensorShape> shapes;
  for (const auto& p : a->parameters()) shapes.push_back({p.name, p.tensor.sizes().vec()});
  const std::string hf = dir.path() + "/fp8";
  o.max_shard_bytes = 20000;  // several shards: the loader follows the index
  model::export_hf_streaming(
      cfg, shapes, [&](const model::TensorShape& t) { return param(*a, t.name).detach().clone(); }, o, hf);
  auto b = model::make_model(cfg, 8);
  model::load_hf_weights(hf, cfg, b->parameters(), b->buffers());
  std::set<std::string> fp8;
  for (size_t i = 0; i < a->parameters().size(); ++i)
    if (model::stored_as_fp8(a->parameter_places()[i].role)) fp8.insert(a->parameters()[i].name);
  c10::NoGradGuard no_grad;
  for (const auto& p : a->parameters()) {
    const at::Tensor got = param(*b, p.name);
    const at::Tensor hf_layout = model::permute_rope_rows(cfg, p.name, p.tensor, true);
    at::Tensor want;
    if (fp8.count(p.name)) {
      const auto q = model::quantize_fp8(hf_layout, o.fp8);
      want = model::permute_rope_rows(cfg, p.name, model::dequantize_fp8(q.weight, q.scale_inv, o.fp8), false);
    } else {
      want = p.tensor.to(at::kBFloat16).to(at::kFloat);  // kept in bf16, as DeepSeek does
    }
    INFO(p.name);
    CHECK(at::equal(got, want));
  }
}

TEST_CASE("fp8: missing, mis-shaped and non-finite scales are checkpoint errors naming the tensor", "[fp8]") {
  test::TempDir dir;
  const config::ModelConfig cfg = test::tiny_v3();
  auto a = model::make_model(cfg, 7);
  model::HfExportOptions o;
  o.dtype = "F8_E4M3";
  std::vector<model::TensorShape> shapes;
  for (const auto& p : a->parameters()) shapes.push_back({p.name, p.tensor.sizes().vec()});
  const auto reader = [&](const model::TensorShape& t) { return param(*a, t.name).detach().clone(); };
  const std::string hf = dir.path() + "/fp8", o_proj = "model.layers.1.self_attn.o_proj.weight";
  const auto fresh = [&] { model::export_hf_streaming(cfg, shapes, reader, o, hf); };
  auto b = model::make_model(cfg, 8);
  const auto load = [&] { model::load_hf_weights(hf, cfg, b->parameters(), b->buffers()); };

  fresh();
  rewrite(hf, [&](auto& t) { t.erase(std::find_if(t.begin(), t.end(), [&](const auto& x) { return x.name == o_proj + "_scale_inv"; })); });
  CHECK_THROWS_WITH(load(), Catch::Contains("'" + o_proj + "' is F8_E4M3 but its block scales '" + o_proj + "_scale_inv' are in no file"));

  fresh();
  const std::vector<float> wrong(2, 1.0f);
  rewrite(hf, [&](auto& t) {
    for (auto& x : t)
      if (x.name == o_proj + "_scale_inv") x.shape = {1, 2}, x.data = wrong.data(), x.nbytes = 8;
  });
  CHECK_THROWS_WITH(load(),
                    Catch::Contains("'" + o_proj + "_scale_inv' has shape [1, 2], but 128×128 blocks of the [64, 64] weight need [1, 1]"));

  fresh();
  const float nan = std::nanf("");
  rewrite(hf, [&](auto& t) {
    for (auto& x : t)
      if (x.name == o_proj + "_scale_inv") x.data = &nan;
  });
  try {
    load();
    FAIL("a NaN scale loaded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kCheckpoint);
    CHECK_THAT(e.what(), Catch::Contains("the block scales '" + o_proj + "_scale_inv' of '" + o_proj + "' hold a non-finite value"));
  }

  fresh();
  std::remove((hf + "/config.json").c_str());
  std::ofstream(hf + "/config.json") << R"({"model_type": "deepseek_v3"})";
  CHECK_THROWS_WITH(load(), Catch::Contains("is F8_E4M3, but " + hf + "/config.json has no quantization_config"));
}

TEST_CASE("MTP's copies of the embedding and head are compared as stored, byte for byte", "[mtp]") {
  test::TempDir dir;
  config::ModelConfig cfg = test::tiny_v3();
  cfg.mtp_depth = 1;
  auto a = model::make_model(cfg, 7);
  std::vector<model::TensorShape> shapes;
  for (const auto& p : a->parameters()) shapes.push_back({p.name, p.tensor.sizes().vec()});
  const std::string hf = dir.path() + "/bf16";
  model::HfExportOptions o;
  o.dtype = "BF16";
  model::export_hf_streaming(
      cfg, shapes, [&](const model::TensorShape& t) { return param(*a, t.name).detach().clone(); }, o, hf);
  const std::string copy = "model.layers.3.embed_tokens.weight", main = "model.embed_tokens.weight";
  {
    const model::HfWeights weights(hf, cfg);
    REQUIRE(weights.has(copy));
    CHECK(weights.stored_alike(copy, main));
    CHECK(weights.stored_alike("model.layers.3.shared_head.head.weight", "lm_head.weight"));
    CHECK_FALSE(weights.stored_alike(main, "lm_head.weight"));  // same shape and dtype, other values
  }
  rewrite(hf, [&](std::vector<io::TensorToWrite>& tensors) {
    for (auto& t : tensors)
      if (t.name == copy) const_cast<uint8_t*>(static_cast<const uint8_t*>(t.data))[t.nbytes - 1] ^= 1;  // one bit of the last value
  });
  const model::HfWeights weights(hf, cfg);
  CHECK_FALSE(weights.stored_alike(copy, main));
}
