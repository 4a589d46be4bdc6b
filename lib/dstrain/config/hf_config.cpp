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
  for (const char* key :
       {"model.vocab_size", "model.hidden_size", "model.num_layers", "model.num_heads", "model.intermediate_size", "model.max_seq_len"})
    if (ctx.explicitly_set(key))
      ctx.problem(Location{ctx.recipe.sources[key]}, fmt::format("{} is set together with model.hf_config; give the sizes one way", key));
  const Node root = parse_json_with_comments(*text, path, ctx.problems);
  if (!root.is_object()) return;
  const Node* type = root.find("model_type");
  const std::string model_type = type ? type->text : "";
  auto take = [&](const std::vector<std::pair<const char*, const char*>>& mapping) {
    // The config.json fills the model section; a key the recipe sets itself keeps the recipe's value.
    for (const auto& [hf, ours] : mapping)
      if (const Node* v = root.find(hf); v && v->kind != Node::Kind::kNull && !ctx.explicitly_set(ours))
        ctx.set(ours, *v, v->where, true, hf);
  };
  take({{"vocab_size", "model.vocab_size"},
        {"hidden_size", "model.hidden_size"},
        {"num_hidden_layers", "model.num_layers"},
        {"num_attention_heads", "model.num_heads"},
        {"intermediate_size", "model.intermediate_size"},
        {"max_position_embeddings", "model.max_seq_len"},
        {"rope_theta", "model.rope_theta"},
        {"rms_norm_eps", "model.rms_norm_eps"},
        {"initializer_range", "model.init_std"}});
  if (const Node* rs = root.find("rope_scaling"); rs && rs->kind != Node::Kind::kNull)
    ctx.warning(rs->where,
                "rope_scaling is accepted but not applied yet: positions use plain RoPE (right for pretraining at the original context)");
  bool tied = false;
  if (const Node* t = root.find("tie_word_embeddings"); t && node_bool(*t, true, tied) && tied)
    ctx.problem(t->where, "tie_word_embeddings = true is not supported: DeepSeek models keep lm_head separate");
  if (model_type == "llama") {
    ctx.set("model.family", Node{Node::Kind::kString, "dense", {}, {}, {}, type->where}, type->where, false, "model_type");
    take({{"num_key_value_heads", "model.num_kv_heads"}});
  } else if (model_type == "deepseek_v2" || model_type == "deepseek_v3") {
    ctx.set("model.family", Node{Node::Kind::kString, "mla_moe", {}, {}, {}, type->where}, type->where, false, "model_type");
    if (const Node* q = root.find("q_lora_rank"); q && q->kind == Node::Kind::kNull)
      ctx.set("model.q_lora_rank", Node{Node::Kind::kNumber, "0", {}, {}, {}, q->where}, q->where, false, "q_lora_rank");
    take({{"q_lora_rank", "model.q_lora_rank"},
          {"kv_lora_rank", "model.kv_lora_rank"},
          {"qk_nope_head_dim", "model.qk_nope_head_dim"},
          {"qk_rope_head_dim", "model.qk_rope_head_dim"},
          {"v_head_dim", "model.v_head_dim"},
          {"moe_intermediate_size", "model.moe_intermediate_size"},
          {"n_routed_experts", "model.n_routed_experts"},
          {"n_shared_experts", "model.n_shared_experts"},
          {"num_experts_per_tok", "model.num_experts_per_tok"},
          {"first_k_dense_replace", "model.first_k_dense_replace"},
          {"moe_layer_freq", "model.moe_layer_freq"},
          {"scoring_func", "model.scoring_func"},
          {"topk_method", "model.topk_method"},
          {"n_group", "model.n_group"},
          {"topk_group", "model.topk_group"},
          {"norm_topk_prob", "model.norm_topk_prob"},
          {"routed_scaling_factor", "model.routed_scaling_factor"},
          {"aux_loss_alpha", "model.aux_loss_alpha"}});
    if (const Node* n = root.find("num_nextn_predict_layers"); n && n->text != "0")
      ctx.warning(n->where, "num_nextn_predict_layers: multi-token prediction is not implemented; the MTP module is ignored");
  } else {
    ctx.problem(
        type ? type->where : root.where,
        fmt::format("model_type '{}' is not supported: dstrain trains llama (deepseek-llm, deepseek-coder), deepseek_v2 and deepseek_v3",
                    model_type.empty() ? "(none)" : model_type));
  }
  (void)where;
}

}  // namespace dstrain::config
