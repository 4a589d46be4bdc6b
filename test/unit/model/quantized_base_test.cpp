// lora.base nf4 | fp8 (model/nf4.h, model/quantized_base.h): NF4 codes, block maxima and
// dequantized weights bit for bit as bitsandbytes makes them (a hidden case fed by
// test/dist/qlora_reference.py); a model whose frozen projections are quantized computes what the
// same model computes on the dequantized weights, its adapters' gradients included, and holds
// neither the base's parameters nor their memory.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cstdlib>
#include <map>
#include <string>

#include "catch_torch.h"
#include "dstrain/cost/model_costs.h"
#include "dstrain/io/safetensors.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/hf_fp8.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/lora.h"
#include "dstrain/model/moe_experts.h"
#include "dstrain/model/nf4.h"
#include "dstrain/model/quantized_base.h"
#include "engine_harness.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

at::Tensor tensor_of(const io::SafetensorsFile& file, const std::string& name) {
  const io::TensorInfo* t = file.find(name);
  REQUIRE(t != nullptr);
  const std::map<std::string, at::ScalarType> types = {{"F32", at::kFloat}, {"BF16", at::kBFloat16}, {"U8", at::kByte}};
  return at::from_blob(const_cast<uint8_t*>(t->data), t->shape, at::TensorOptions().dtype(types.at(t->dtype))).clone();
}

// The model with rank-4 adapters whose B is not zero (drawn from `seed`), everything else frozen.
std::unique_ptr<model::CausalLM> adapted_model(const config::ModelConfig& cfg) {
  auto m = model::make_model(cfg, 3);
  model::LoraSpec spec;
  spec.rank = 4, spec.alpha = 8;
  model::attach_lora(*m, spec, 11);
  const at::Generator gen = at::detail::createCPUGenerator(21);
  c10::NoGradGuard no_grad;
  for (const auto& p : m->parameters())
    if (p.name.find(".lora_B.") != std::string::npos) p.tensor.copy_(at::randn(p.tensor.sizes(), gen) * 0.1);
  return m;
}

config::Recipe nf4_recipe() {
  config::Recipe r;
  r.lora.rank = 4, r.lora.base = config::LoraBase::kNf4;
  return r;
}

}  // namespace

TEST_CASE("NF4 as bitsandbytes makes it: codes, block maxima and dequantized weights bit for bit", "[.][nf4-bnb]") {
  const char* path = std::getenv("DSTRAIN_NF4_REFERENCE");
  if (!path) FAIL("DSTRAIN_NF4_REFERENCE is not set: this case compares with test/dist/qlora_reference.py's file");
  const io::SafetensorsFile file(path);
  int compared = 0;
  for (const io::TensorInfo& t : file.tensors()) {
    const std::string suffix = ".weight";
    if (t.name.size() < suffix.size() || t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string name = t.name.substr(0, t.name.size() - suffix.size());
    INFO(name);
    const at::Tensor weight = tensor_of(file, t.name);
    const model::Nf4Weight q = model::quantize_nf4(weight);
    CHECK(at::equal(q.codes, tensor_of(file, name + ".codes")));
    CHECK(at::equal(q.absmax_codes, tensor_of(file, name + ".absmax_codes")));
    CHECK(at::equal(q.absmax_scales, tensor_of(file, name + ".absmax_scales")));
    CHECK(q.absmax_offset == tensor_of(file, name + ".absmax_offset").item<float>());
    // In the weight's dtype (bitsandbytes dequantizes into the quantized tensor's), saved as float32.
    CHECK(at::equal(model::dequantize_nf4(q, weight.scalar_type()).to(at::kFloat).reshape(-1),
                    tensor_of(file, name + ".dequantized").reshape(-1)));
    ++compared;
  }
  CHECK(compared == 6);
}

TEST_CASE("NF4: the maps, the storage's size, and a dequantized weight within half a code step of its block's maximum", "[model]") {
  CHECK(model::nf4_values().numel() == 16);
  const at::Tensor map = model::dynamic_map();
  REQUIRE(map.numel() == 256);
  CHECK(at::equal(map, std::get<0>(map.sort())));
  CHECK(map[255].item<float>() == 1.0f);
  const at::Tensor w = at::randn({48, 100}, at::detail::createCPUGenerator(4));  // 4800 elements: 75 blocks
  const model::Nf4Weight q = model::quantize_nf4(w);
  CHECK(q.codes.numel() == 2400);
  CHECK(q.absmax_codes.numel() == 75);
  CHECK(q.absmax_scales.numel() == 1);
  CHECK(q.bytes() == 2400 + 75 + 4);
  const at::Tensor back = model::dequantize_nf4(q, at::kFloat);
  REQUIRE(back.sizes() == w.sizes());
  const at::Tensor block_max = std::get<0>(w.reshape({75, 64}).abs().max(1));
  // NF4's widest gap is 0.3037 (between -1 and -0.6962); the maxima add their own 8-bit error.
  CHECK(((back - w).abs().reshape({75, 64}) <= block_max.view({-1, 1}) * 0.16).all().item<bool>());
  CHECK(model::dequantize_nf4(q, at::kBFloat16).scalar_type() == at::kBFloat16);
}

TEST_CASE("A quantized base: the same logits and adapter gradients as the dequantized weights, and no base parameters", "[model]") {
  for (const bool moe : {false, true}) {
    DYNAMIC_SECTION((moe ? "MLA + MoE" : "dense")) {
      const config::ModelConfig cfg = moe ? test::tiny_v3() : test::tiny_model_config();
      auto quantized = adapted_model(cfg), reference = adapted_model(cfg);
      const size_t before = quantized->parameters().size();
      // The reference: every frozen projection replaced by its NF4 round trip, in place.
      {
        c10::NoGradGuard no_grad;
        for (size_t i = 0; i < reference->parameters().size(); ++i) {
          const model::ParamPlace& place = reference->parameter_places()[i];
          if (!place.trains && model::stored_as_fp8(place.role)) {
            const at::Tensor& t = reference->parameters()[i].tensor;
            t.copy_(model::dequantize_nf4(model::quantize_nf4(t), t.scalar_type()));
          }
        }
      }
      const model::QuantizedBase q = model::quantize_base(*quantized, nf4_recipe(), at::kCPU);
      CHECK(q.projections > 0);
      CHECK(quantized->parameters().size() == before - static_cast<size_t>(q.projections));
      for (const auto& p : quantized->parameters()) CHECK_FALSE(p.tensor.is_meta());
      for (model::Linear* l : quantized->linears()) CHECK((l->weight.is_meta() == (l->base != nullptr)));
      CHECK(q.bytes < q.model_bytes / 7);
      const at::Tensor tokens = at::randint(0, cfg.vocab_size, {2, 12}, at::detail::createCPUGenerator(5), at::kLong);
      CHECK(at::equal(quantized->logits(tokens), reference->logits(tokens)));
      const at::Tensor labels = at::roll(tokens, -1, 1);
      model::mean_loss(*quantized, tokens, labels).backward();
      model::mean_loss(*reference, tokens, labels).backward();
      std::map<std::string, at::Tensor> grads;
      for (const auto& p : reference->parameters())
        if (p.tensor.grad().defined()) grads[p.name] = p.tensor.grad();
      int adapters = 0;
      for (const auto& p : quantized->parameters()) {
        if (p.name.find(".lora_") == std::string::npos) continue;
        INFO(p.name);
        REQUIRE(p.tensor.grad().defined());
        const at::Tensor want = grads.at(p.name);
        CHECK((p.tensor.grad() - want).abs().max().item<double>() <= 1e-5 * (want.abs().max().item<double>() + 1e-12));
        ++adapters;
      }
      CHECK(adapters > 0);
    }
  }
}

TEST_CASE("The dry run plans a quantized base as built: its elements, and model states at its bytes per element", "[model]") {
  for (const bool moe : {false, true}) {
    DYNAMIC_SECTION((moe ? "MLA + MoE" : "dense")) {
      config::Recipe r = nf4_recipe();
      r.model = moe ? test::tiny_v3() : test::tiny_model_config();
      r.lora.experts = false;
      r.frozen = model::lora_counts(r);
      const int last = static_cast<int>(r.model.num_layers) + 1;
      const double planned = r.frozen.quantized_in(0, last, false) + r.frozen.quantized_in(0, last, true);
      auto m = model::make_model(r.model, 3);
      model::attach_lora(*m, model::lora_spec_of(r.lora), 11);
      const model::QuantizedBase q = model::quantize_base(*m, r, at::kCPU);
      CHECK(planned == static_cast<double>(q.elements));
      CHECK(r.frozen.quantized_in(0, last, true) == (moe ? static_cast<double>(q.elements) - r.frozen.quantized_in(0, last, false) : 0.0));
      config::Recipe in_dtype = r;
      in_dtype.lora.base = config::LoraBase::kModel;
      in_dtype.frozen = model::lora_counts(in_dtype);
      const double saved = cost::model_state_memory(in_dtype).device_bytes - cost::model_state_memory(r).device_bytes;
      CHECK(saved == Approx(planned * (4.0 - cost::lora_base_bytes_per_element(r))).epsilon(1e-12));
      CHECK(cost::lora_base_bytes_per_element(r) == Approx(static_cast<double>(q.bytes) / static_cast<double>(q.elements)).epsilon(0.01));
    }
  }
}
