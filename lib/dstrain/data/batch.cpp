#include "dstrain/data/batch.h"

#include <ATen/ATen.h>

namespace dstrain::data {

Batch Batch::to(const c10::Device& device) const {
  Batch out = *this;
  out.tokens = tokens.to(device);
  out.labels = labels.to(device);
  if (!sequential_positions) out.positions = positions.to(device);  // else the models do not read them: they stay on the host
  if (document_ids.defined()) out.document_ids = document_ids.to(device);
  if (target_weights.defined()) out.target_weights = target_weights.to(device);
  if (reference_logps.defined()) out.reference_logps = reference_logps.to(device);
  if (score_positions.defined()) out.score_positions = score_positions.to(device);
  if (desirable.defined()) out.desirable = desirable.to(device);
  if (margins.defined()) out.margins = margins.to(device);
  if (ahead_tokens.defined()) out.ahead_tokens = ahead_tokens.to(device), out.ahead_labels = ahead_labels.to(device);
  if (ahead_weights.defined()) out.ahead_weights = ahead_weights.to(device);
  return out;
}

int64_t chosen_targets(const Batch& b) {
  if (b.pairs <= 0) return 0;
  return b.labels.narrow(0, 0, 2 * b.pairs).view({b.pairs, 2, -1}).select(1, 0).ne(kIgnoreIndex).sum().item<int64_t>();
}

Batch pretraining_batch(const at::Tensor& windows, int64_t eos, bool mask_documents, bool restart_positions) {
  const at::Tensor cpu = windows.to(at::kCPU, at::kLong).contiguous();
  const int64_t B = cpu.size(0), T = cpu.size(1) - 1;
  Batch b;
  b.tokens = cpu.narrow(1, 0, T);
  b.labels = cpu.narrow(1, 1, T);
  b.trained_targets = B * T;
  b.positions = at::empty({B, T}, at::kLong);
  if (eos >= 0 && mask_documents) b.document_ids = at::empty({B, T}, at::kLong);
  b.sequential_positions = eos < 0 || !restart_positions;
  const int64_t* tokens = cpu.data_ptr<int64_t>();
  int64_t* positions = b.positions.data_ptr<int64_t>();
  int64_t* ids = b.document_ids.defined() ? b.document_ids.data_ptr<int64_t>() : nullptr;
  for (int64_t r = 0; r < B; ++r) {
    const int64_t* row = tokens + r * (T + 1);
    std::vector<int64_t> lengths{0};
    for (int64_t t = 0; t < T; ++t) {
      positions[r * T + t] = b.sequential_positions ? t : lengths.back();
      if (ids) ids[r * T + t] = static_cast<int64_t>(lengths.size()) - 1;
      ++lengths.back();
      if (eos >= 0 && row[t] == eos && t + 1 < T) lengths.push_back(0);
    }
    b.document_lengths.push_back(std::move(lengths));
  }
  if (!b.sequential_positions) {  // no row was cut: the fast path's positions are the same
    b.sequential_positions = true;
    for (const auto& lengths : b.document_lengths) b.sequential_positions = b.sequential_positions && lengths.size() == 1;
  }
  return b;
}

void weigh_per_sample(Batch& b) {
  const at::Tensor labels = b.labels.to(at::kCPU, at::kLong).contiguous();
  b.target_weights = at::zeros(labels.sizes(), at::kFloat);
  const int64_t* l = labels.data_ptr<int64_t>();
  float* w = b.target_weights.data_ptr<float>();
  const int64_t T = b.length();
  b.samples = 0;
  for (int64_t r = 0; r < b.rows(); ++r) {
    int64_t begin = r * T;
    for (const int64_t length : b.document_lengths.at(static_cast<size_t>(r))) {
      int64_t trained = 0;
      for (int64_t t = begin; t < begin + length; ++t) trained += l[t] != kIgnoreIndex;
      if (trained > 0) {
        ++b.samples;
        for (int64_t t = begin; t < begin + length; ++t)
          if (l[t] != kIgnoreIndex) w[t] = static_cast<float>(1.0 / static_cast<double>(trained));
      }
      begin += length;
    }
  }
}

Batch labelled_batch(const at::Tensor& tokens, const at::Tensor& labels) {
  Batch b;
  b.tokens = tokens, b.labels = labels;
  b.positions = at::arange(tokens.size(1), tokens.options().dtype(at::kLong)).expand(tokens.sizes());
  b.trained_targets = labels.ne(kIgnoreIndex).sum().item<int64_t>();
  b.document_lengths.assign(static_cast<size_t>(tokens.size(0)), {tokens.size(1)});
  return b;
}

}  // namespace dstrain::data
