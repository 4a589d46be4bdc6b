#include "dstrain/bench/checkpoint_bench.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include "dstrain/ckpt/checkpoint.h"
#include "dstrain/zero/layout.h"

namespace dstrain::zero {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// DeepSeek LLM 7B's parameters in the dense model's order and names (model/dense_model.cpp).
std::vector<Layout::Param> dense_7b() {
  const int64_t V = 102400, H = 4096, I = 11008, L = 30;
  std::vector<Layout::Param> p{{"model.embed_tokens.weight", V * H, 0, true}};
  for (int64_t i = 0; i < L; ++i) {
    const std::string layer = fmt::format("model.layers.{}.", i);
    for (const auto& [name, numel, ndim] : std::vector<std::tuple<std::string, int64_t, int64_t>>{{"input_layernorm.weight", H, 1},
                                                                                                  {"self_attn.q_proj.weight", H * H, 2},
                                                                                                  {"self_attn.k_proj.weight", H * H, 2},
                                                                                                  {"self_attn.v_proj.weight", H * H, 2},
                                                                                                  {"self_attn.o_proj.weight", H * H, 2},
                                                                                                  {"post_attention_layernorm.weight", H, 1},
                                                                                                  {"mlp.gate_proj.weight", I * H, 2},
                                                                                                  {"mlp.up_proj.weight", I * H, 2},
                                                                                                  {"mlp.down_proj.weight", H * I, 2}})
      p.push_back({layer + name, numel, static_cast<int>(i) + 1, ndim >= 2});
  }
  p.push_back({"model.norm.weight", H, static_cast<int>(L) + 1, false});
  p.push_back({"lm_head.weight", V * H, static_cast<int>(L) + 1, true});
  return p;
}

const char* const kPrefixes[] = {"", "exp_avg.", "exp_avg_sq."};

ckpt::ShardTable table_of(const Layout& layout) {
  ckpt::ShardTable t;
  t.ranks = layout.world_size();
  t.prefixes.assign(std::begin(kPrefixes), std::end(kPrefixes));
  for (const Unit& u : layout.units()) {
    ckpt::ShardTable::Unit unit{u.chunk(), {}};
    for (int i = u.first_param; i < u.first_param + u.num_params; ++i)
      unit.params.push_back({layout.params()[static_cast<size_t>(i)].name, layout.params()[static_cast<size_t>(i)].offset,
                             layout.params()[static_cast<size_t>(i)].numel});
    t.units.push_back(std::move(unit));
  }
  return t;
}

// Rank 0 commits from the ranks' summaries, then one rank opens the manifest.
void commit_and_load(const std::string& root, const std::string& label, const std::vector<ckpt::TensorMeta>& metas,
                     const std::vector<ckpt::ShardFile>& files, const ckpt::ShardTable* table, std::vector<CheckpointMetadataPhase>& out) {
  ckpt::TrainState state;
  state.step = 1, state.world_size = table ? table->ranks : static_cast<int64_t>(files.size()), state.zero_stage = 2;
  ckpt::prepare_staging(root, 1);
  auto start = Clock::now();
  const std::string dir = ckpt::commit(root, state, metas, files, {}, table);
  const double commit_s = seconds_since(start);
  const auto manifest_bytes = static_cast<int64_t>(std::filesystem::file_size(std::filesystem::path(dir) / "manifest.json"));
  out.push_back({"checkpoint commit on rank 0, 7B (" + label + ")", commit_s, manifest_bytes});
  start = Clock::now();
  const ckpt::Reader reader(dir, /*verified=*/true);
  out.push_back({"manifest load on a rank, 7B (" + label + ")", seconds_since(start), manifest_bytes});
  std::filesystem::remove_all(root);
}

}  // namespace

std::vector<CheckpointMetadataPhase> bench_checkpoint_metadata(int ranks, int pieces_up_to, const std::string& scratch) {
  const Layout layout(dense_7b(), ranks, 500000000);  // zero.reduce_bucket_size's default
  std::vector<ckpt::TensorMeta> metas;
  for (const char* prefix : kPrefixes)
    for (const auto& p : layout.params()) metas.push_back({prefix + p.name, "float32", {p.numel}});
  metas.push_back({"engine.state", "float64", {5}});
  const ckpt::ShardTable table = table_of(layout);
  std::vector<ckpt::ShardFile> summaries, listed;
  for (int r = 0; r < ranks; ++r) {
    const uint64_t shard_bytes = static_cast<uint64_t>(table.rank_elements(r)) * 3 * 4;
    ckpt::ShardFile f{ckpt::shard_file_name(r), shard_bytes, 0, {}};
    if (r == 0) f.pieces.push_back({"engine.state", 0, 5, shard_bytes}), f.bytes += 40;
    summaries.push_back(f);
    if (ranks > pieces_up_to) continue;
    uint64_t at = 0;  // format 2: every segment of every state, listed
    for (const char* prefix : kPrefixes)
      for (const ShardSegment& s : layout.segments(r)) {
        f.pieces.push_back({prefix + layout.params()[static_cast<size_t>(s.param)].name, s.param_offset, s.numel, at});
        at += static_cast<uint64_t>(s.numel) * 4;
      }
    listed.push_back(std::move(f));
  }
  std::vector<CheckpointMetadataPhase> out;
  commit_and_load(scratch + "/table", "format 3: shard table", metas, summaries, &table, out);
  if (ranks <= pieces_up_to) commit_and_load(scratch + "/pieces", "format 2: every rank's pieces", metas, listed, nullptr, out);
  return out;
}

}  // namespace dstrain::zero
