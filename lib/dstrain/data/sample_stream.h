#pragma once
// Where global sample positions come from: one token file, or a weighted blend of several. Each
// source has its own seeded sample order; position p goes to the source data::BlendOrder gives
// (Megatron's blending rule), as that source's next sample. Reads are fast when positions grow
// (each rank reads its positions in increasing order); a jump back replays the blend.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dstrain/data/blend_order.h"
#include "dstrain/data/global_sampler.h"
#include "dstrain/data/token_file.h"

namespace dstrain::data {

class SampleStream {
 public:
  // vocab_size > 0: every token read is checked against [0, vocab_size).
  SampleStream(std::vector<std::unique_ptr<TokenFile>> files, std::vector<double> weights, int64_t seq_len, uint64_t seed,
               int64_t vocab_size = 0);
  // Global sample `position`: seq_len + 1 tokens into out. Throws Error{kData} naming the file
  // and token offset of a token outside the vocabulary (never an index error in the model).
  void read(int64_t position, int64_t* out);
  int64_t num_samples() const;
  size_t num_sources() const { return files_.size(); }

 private:
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<GlobalSampler> samplers_;
  BlendOrder blend_;
  int64_t seq_len_;
  int64_t vocab_size_;
};

}  // namespace dstrain::data
