// model.hf_config: the sizes of a Hugging Face LLaMA-style config.json.
#include <fmt/format.h>

#include <filesystem>

#include "dstrain/config/assign.h"
#include "dstrain/config/load_context.h"
#include "dstrain/core/atomic_file.h"

namespace dstrain::config {

void apply_hf_config(const std::string& path, const Location& where, LoadContext& ctx) {
  const Location at{ctx.recipe.sources["model.hf_config"]};
  const auto text = ctx.read(path);
  if (!text) {
    ctx.problem(at, fmt::format("model.hf_config: '{}' does not exist or is not a file", path));
    return;
  }
  for (const char* key : {"model.vocab_size", "model.hidden_size", "model.num_layers", "model.num_heads", "model.intermediate_size", "model.max_seq_len"})
    if (ctx.explicitly_set(key))
      ctx.problem(Location{ctx.recipe.sources[key]}, fmt::format("{} is set together with model.hf_config; give the sizes one way", key));
  const Node root = parse_json_with_comments(*text, path, ctx.problems);
  if (!root.is_object()) return;
  const Node* type = root.find("model_type");
  if (!type || type->text != "llama") {
    const std::string found = type ? type->text : "(none)";
    ctx.problem(type ? type->where : root.where,
                fmt::format("model_type '{}' is not supported yet: dstrain trains the dense LLaMA-style DeepSeek models (model_type llama); "
                            "DeepSeek-V2/V3 (MoE + MLA) come with the model issue", found));
    return;
  }
  const std::vector<std::pair<const char*, const char*>> mapping = {
      {"vocab_size", "model.vocab_size"},          {"hidden_size", "model.hidden_size"},   {"num_hidden_layers", "model.num_layers"},
      {"num_attention_heads", "model.num_heads"},  {"intermediate_size", "model.intermediate_size"},
      {"max_position_embeddings", "model.max_seq_len"}, {"rope_theta", "model.rope_theta"}, {"rms_norm_eps", "model.rms_norm_eps"},
      {"initializer_range", "model.init_std"}};
  for (const auto& [hf, ours] : mapping)
    if (const Node* v = root.find(hf)) ctx.set(ours, *v, v->where, true, hf);
  if (const Node* kv = root.find("num_key_value_heads"); kv && kv->kind != Node::Kind::kNull) {
    const Node* heads = root.find("num_attention_heads");
    if (!heads || kv->text != heads->text)
      ctx.problem(kv->where, "num_key_value_heads differs from num_attention_heads (grouped-query attention), which dstrain does not implement yet");
  }
  bool tied = false;
  if (const Node* t = root.find("tie_word_embeddings"); t && node_bool(*t, true, tied) && tied)
    ctx.problem(t->where, "tie_word_embeddings = true is not supported: DeepSeek models keep lm_head separate");
  if (const Node* rs = root.find("rope_scaling"); rs && rs->kind != Node::Kind::kNull)
    ctx.problem(rs->where, "rope_scaling is not supported yet; dstrain applies plain RoPE");
  (void)where;
}

}  // namespace dstrain::config
