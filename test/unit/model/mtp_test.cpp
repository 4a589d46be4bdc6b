// Multi-token prediction: its targets, and (hidden) the data for test/model/mtp_reference.py,
// which recomputes the loss and every gradient with an independent PyTorch implementation.
#include "catch_torch.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <string>
#include <vector>

#include "dstrain/config/recipe.h"
#include "dstrain/data/batch.h"
#include "dstrain/io/safetensors.h"
#include "dstrain/model/causal_lm.h"
#include "dstrain/model/loss.h"
#include "dstrain/model/mtp_loss.h"
#include "dstrain/model/objective.h"
#include "dstrain/model/z_loss.h"
#include "model/tiny_models.h"

using namespace dstrain;

namespace {

// Two rows of 12: row 0 two documents (5 + 7 tokens, positions restarting, one masked target),
// row 1 one document.
data::Batch documents_batch(int64_t vocab) {
  const int64_t B = 2, T = 12;
  const at::Tensor all = at::randint(0, vocab, {B, T + 1}, at::detail::createCPUGenerator(8), at::kLong);
  data::Batch b;
  b.tokens = all.narrow(1, 0, T).clone();
  b.labels = all.narrow(1, 1, T).clone();
  b.labels[0][2] = data::kIgnoreIndex;
  b.document_lengths = {{5, 7}, {12}};
  b.document_ids = at::zeros({B, T}, at::kLong);
  b.document_ids[0].narrow(0, 5, 7).fill_(1);
  b.positions = at::arange(T, at::kLong).repeat({B, 1});
  b.positions[0].narrow(0, 5, 7).sub_(5);
  b.sequential_positions = false;
  b.trained_targets = b.labels.ne(data::kIgnoreIndex).sum().item<int64_t>();
  return b;
}

void write_tensor(const std::string& path, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  std::ofstream(path, std::ios::binary).write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.nbytes()));
}

}  // namespace

TEST_CASE("MTP targets: the main target k ahead, never across a document", "[model][mtp]") {
  const data::Batch b = documents_batch(97);
  for (int64_t k = 1; k <= 3; ++k) {
    const at::Tensor l = model::mtp_labels(b, k);
    REQUIRE(l.sizes().vec() == std::vector<int64_t>{2, 12 - k});
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t i = 0; i < 12 - k; ++i) {
        const bool same_document = b.document_ids[r][i].item<int64_t>() == b.document_ids[r][i + k].item<int64_t>();
        CHECK(l[r][i].item<int64_t>() == (same_document ? b.labels[r][i + k].item<int64_t>() : data::kIgnoreIndex));
      }
  }
  CHECK(model::mtp_labels(b, 1)[0][1].item<int64_t>() == data::kIgnoreIndex);  // the main target it stands for is masked
  CHECK(model::mtp_labels(b, 1)[0][4].item<int64_t>() == data::kIgnoreIndex);  // token 5 starts another document
  data::Batch whole = b;
  whole.document_ids = at::Tensor();
  CHECK(at::equal(model::mtp_labels(whole, 2), b.labels.narrow(1, 2, 10)));  // documents not cut: nothing to cross
}

TEST_CASE("MTP's weight follows its token schedule", "[model][mtp]") {
  config::ModelConfig c;
  c.mtp_depth = 2, c.mtp_loss_weight = 0.3, c.mtp_loss_weight_until_tokens = 1000, c.mtp_loss_weight_after = 0.1;
  CHECK(c.mtp_weight_at(999) == 0.3);
  CHECK(c.mtp_weight_at(1000) == 0.1);
  c.mtp_loss_weight_until_tokens = 0;
  CHECK(c.mtp_weight_at(1 << 30) == 0.3);
}

TEST_CASE("export MTP losses and gradients for the independent PyTorch reference", "[.][model-mtp-reference]") {
  const char* out = std::getenv("DSTRAIN_REFERENCE_DIR");
  if (!out) FAIL("DSTRAIN_REFERENCE_DIR is not set: this case only exports data for test/model/*.sh");
  // Depth 1 and 2; then depth 1 with PaLM's z-loss, the head chunked (train.loss_chunk_tokens 5).
  struct Case {
    int64_t depth;
    double z_loss_weight;
    int64_t chunk;
    std::string name;
  };
  for (const Case& c : {Case{1, 0, 0, "mtp1"}, Case{2, 0, 0, "mtp2"}, Case{1, 0.05, 5, "mtp1_zloss"}}) {
    const int64_t depth = c.depth;
    const std::string dir = std::string(out) + "/" + c.name;
    std::filesystem::create_directories(dir);
    config::ModelConfig cfg = test::tiny_v3();
    cfg.mtp_depth = depth, cfg.mtp_loss_weight = 0.3;
    auto m = model::make_model(cfg, 9);
    {
      c10::NoGradGuard no_grad;
      for (const auto& b : m->buffers()) b.tensor.copy_(at::randn({cfg.n_routed_experts}, at::detail::createCPUGenerator(4)) * 0.05);
    }
    const data::Batch batch = documents_batch(cfg.vocab_size);
    model::Objective loss(c.chunk);
    model::add_mtp_terms(loss, cfg);
    model::add_z_loss_term(loss, c.z_loss_weight);
    const model::ObjectiveValue parts = loss(*m, batch);
    parts.mean().backward();
    std::vector<io::TensorToWrite> tensors, grads;
    for (const auto* group : {&m->parameters(), &m->buffers()})
      for (const auto& p : *group)
        tensors.push_back({p.name, "F32", p.tensor.sizes().vec(), p.tensor.data_ptr(), static_cast<uint64_t>(p.tensor.nbytes())});
    io::write_safetensors(dir + "/model.safetensors", tensors);
    std::vector<at::Tensor> held;  // an expert no token chose has no gradient: zeros
    for (const auto& p : m->parameters()) {
      held.push_back(p.tensor.grad().defined() ? p.tensor.grad() : at::zeros_like(p.tensor));
      grads.push_back({p.name, "F32", p.tensor.sizes().vec(), held.back().data_ptr(), static_cast<uint64_t>(held.back().nbytes())});
    }
    io::write_safetensors(dir + "/grads.safetensors", grads);
    config::Recipe r;
    r.model = cfg;
    r.train.z_loss_weight = c.z_loss_weight;
    std::ofstream(dir + "/config.json") << config::to_canonical_json(r);
    write_tensor(dir + "/tokens.bin", batch.tokens);
    write_tensor(dir + "/labels.bin", batch.labels);
    write_tensor(dir + "/positions.bin", batch.positions);
    write_tensor(dir + "/documents.bin", batch.document_ids);
    std::ofstream values(dir + "/loss.txt");
    values << std::setprecision(17) << parts.mean().item<double>() << "\n";
    for (int64_t t = 0; t < parts.terms.size(0); ++t)
      values << parts.terms[t][0].item<double>() << " " << parts.terms[t][1].item<double>() << "\n";
  }
}
