// model.hf_config: the model section from a Hugging Face config.json, read as transformers reads
// it: both the transformers 4 layout (rope_theta and rope_scaling at the top) and the 5 layout
// (rope_parameters), and for every key the file omits, the default of transformers' config class
// for that model_type (LlamaConfig, DeepseekV2Config, DeepseekV3Config of transformers 5), never
// dstrain's own: a saved DeepseekV3 config without routing keys routes as V3 does.
#include <fmt/format.h>

#include <cctype>
#include <filesystem>
#include <map>

#include "dstrain/config/assign.h"
#include "dstrain/config/load_context.h"
#include "dstrain/core/atomic_file.h"

namespace dstrain::config {
namespace {

struct Key {
  const char* hf;    // the config.json key
  const char* ours;  // the recipe key
  // transformers' default when the file omits it, per model_type: "" = none (dstrain's default
  // stays), nullptr = the model type has no such key.
  const char* llama;
  const char* v2;
  const char* v3;

  const char* default_for(const std::string& model_type) const {
    return model_type == "deepseek_v3" ? v3 : model_type == "deepseek_v2" ? v2 : llama;
  }
};

// transformers 5.24's defaults (configuration_llama.py, configuration_deepseek_v2.py,
// configuration_deepseek_v3.py). V2 hard-codes softmax routing; V3 sigmoid scores with the
// aux-loss-free bias (noaux_tc) and group-limited selection; neither has moe_layer_freq (1).
const std::vector<Key>& hf_keys() {
  static const std::vector<Key> keys = {
      // hf key                   recipe key                    llama     deepseek_v2  deepseek_v3
      {"vocab_size", "model.vocab_size", "32000", "102400", "129280"},
      {"hidden_size", "model.hidden_size", "4096", "4096", "7168"},
      {"num_hidden_layers", "model.num_layers", "32", "32", "61"},
      {"num_attention_heads", "model.num_heads", "32", "32", "128"},
      {"intermediate_size", "model.intermediate_size", "11008", "11008", "18432"},
      {"max_position_embeddings", "model.max_seq_len", "2048", "2048", "4096"},
      {"rms_norm_eps", "model.rms_norm_eps", "1e-6", "1e-6", "1e-6"},
      {"initializer_range", "model.init_std", "0.02", "0.02", "0.02"},
      {"num_key_value_heads", "model.num_kv_heads", "0", nullptr, nullptr},
      {"q_lora_rank", "model.q_lora_rank", nullptr, "1536", "1536"},
      {"kv_lora_rank", "model.kv_lora_rank", nullptr, "512", "512"},
      {"qk_nope_head_dim", "model.qk_nope_head_dim", nullptr, "128", "128"},
      {"qk_rope_head_dim", "model.qk_rope_head_dim", nullptr, "64", "64"},
      {"v_head_dim", "model.v_head_dim", nullptr, "128", "128"},
      {"moe_intermediate_size", "model.moe_intermediate_size", nullptr, "1407", "2048"},
      {"n_routed_experts", "model.n_routed_experts", nullptr, "64", "256"},
      {"n_shared_experts", "model.n_shared_experts", nullptr, "2", "1"},
      {"num_experts_per_tok", "model.num_experts_per_tok", nullptr, "", "8"},
      {"first_k_dense_replace", "model.first_k_dense_replace", nullptr, "0", "3"},
      {"moe_layer_freq", "model.moe_layer_freq", nullptr, "1", "1"},
      {"scoring_func", "model.scoring_func", nullptr, "softmax", "sigmoid"},
      {"topk_method", "model.topk_method", nullptr, "greedy", "noaux_tc"},
      {"n_group", "model.n_group", nullptr, "1", "8"},
      {"topk_group", "model.topk_group", nullptr, "1", "4"},
      {"norm_topk_prob", "model.norm_topk_prob", nullptr, "false", "true"},
      {"routed_scaling_factor", "model.routed_scaling_factor", nullptr, "1.0", "2.5"},
      {"aux_loss_alpha", "model.aux_loss_alpha", nullptr, "", ""},
      {"num_nextn_predict_layers", "model.mtp_depth", nullptr, nullptr, ""},  // V3's MTP modules (transformers ignores them)
  };
  return keys;
}

Node value_node(const std::string& text, const Location& where) {
  const bool boolean = text == "true" || text == "false";
  const bool word = !boolean && !text.empty() && (std::isalpha(static_cast<unsigned char>(text[0])) != 0);
  return Node{boolean ? Node::Kind::kBool : word ? Node::Kind::kString : Node::Kind::kNumber, text, {}, {}, {}, where};
}

class HfConfigReader {
 public:
  HfConfigReader(const Node& root, const std::string& path, LoadContext& ctx) : root_(root), path_(path), ctx_(ctx) {}

  void read(const std::string& model_type, const Location& type_where) {
    const Location file_where{path_, 0, 0};
    for (const Key& k : hf_keys()) {
      const char* fallback = k.default_for(model_type);
      if (fallback == nullptr) continue;
      if (ctx_.explicitly_set(k.ours)) continue;  // a key the recipe sets itself keeps the recipe's value
      const Node* v = root_.find(k.hf);
      if (k.ours == std::string("model.q_lora_rank") && v && v->kind == Node::Kind::kNull) {
        set(k.ours, value_node("0", v->where), v->where.str() + " (null: a direct q_proj)", k.hf);
      } else if (v && v->kind != Node::Kind::kNull) {
        set(k.ours, *v, "", k.hf);
      } else if (*fallback) {
        set(k.ours, value_node(fallback, type_where), fmt::format("{} (not in the file: transformers' default for {})", path_, model_type),
            k.hf);
      }
    }
    read_rope();
    bool tied = false;
    if (const Node* t = root_.find("tie_word_embeddings"); t && node_bool(*t, true, tied) && tied)
      ctx_.problem(t->where, "tie_word_embeddings = true is not supported: DeepSeek models keep lm_head separate");
    if (const Node* r = root_.find("rope_interleave"); r && r->kind == Node::Kind::kBool && r->text == "false")
      ctx_.problem(r->where, "rope_interleave = false is not supported: dstrain reads DeepSeek weights in their interleaved RoPE layout");
  }

 private:
  void set(const std::string& ours, const Node& value, const std::string& source, const std::string& hf) {
    if (ctx_.set(ours, value, value.where, true, hf) && !source.empty()) ctx_.recipe.sources[ours] = source;
  }

  // rope_parameters (transformers 5) or rope_scaling (4), with rope_theta inside or at the top.
  void read_rope() {
    const Node* params = root_.find("rope_parameters");
    if (!params || params->kind == Node::Kind::kNull) params = root_.find("rope_scaling");
    const bool has_params = params && params->is_object();
    const Node* theta = has_params && params->find("rope_theta") ? params->find("rope_theta") : root_.find("rope_theta");
    if (!ctx_.explicitly_set("model.rope_theta")) {
      if (theta && theta->kind != Node::Kind::kNull)
        set("model.rope_theta", *theta, "", "rope_theta");
      else
        set("model.rope_theta", value_node("10000", Location{path_, 0, 0}), path_ + " (not in the file: transformers' default 10000)",
            "rope_theta");
    }
    if (!has_params) return;
    const Node* type = params->find("rope_type") ? params->find("rope_type") : params->find("type");
    const std::string kind = type ? type->text : "default";
    if (const Node* p = params->find("partial_rotary_factor"); p && p->text != "1" && p->text != "1.0")
      ctx_.problem(p->where, "partial_rotary_factor other than 1 is not supported: dstrain rotates the whole head (or MLA's rope part)");
    if (const Node* t = params->find("truncate"); t && t->kind == Node::Kind::kBool && t->text == "false")
      ctx_.problem(
          t->where,
          "YaRN with truncate = false is not supported: dstrain floors and ceils the correction range, as transformers does by default");
    if (kind == "default") return;
    if (kind != "linear" && kind != "yarn") {
      ctx_.problem(type->where, fmt::format("rope_type '{}' is not supported: dstrain implements default, linear and yarn RoPE", kind));
      return;
    }
    if (!ctx_.explicitly_set("model.rope_scaling")) set("model.rope_scaling", value_node(kind, type->where), "", "rope_type");
    // yarn without a factor: the context over the original (transformers' rule).
    const Node* factor = params->find("factor");
    const Node* original = root_.find("original_max_position_embeddings") ? root_.find("original_max_position_embeddings")
                                                                          : params->find("original_max_position_embeddings");
    if (factor && factor->kind != Node::Kind::kNull) {
      take("model.rope_factor", factor, "factor");
    } else if (kind == "yarn" && original && !ctx_.explicitly_set("model.rope_factor")) {
      double o = 0;
      if (node_number(*original, true, o) && o > 0)
        set("model.rope_factor", value_node(fmt::format("{}", static_cast<double>(ctx_.recipe.model.max_seq_len) / o), original->where),
            original->where.str() + " (max_position_embeddings / original_max_position_embeddings)", "factor");
    } else {
      ctx_.problem(params->where, fmt::format("rope_type {} needs a factor", kind));
    }
    if (kind == "linear") return;
    take("model.rope_original_max_position", original, "original_max_position_embeddings");
    take("model.rope_beta_fast", params->find("beta_fast"), "beta_fast");
    take("model.rope_beta_slow", params->find("beta_slow"), "beta_slow");
    take("model.rope_mscale", params->find("mscale"), "mscale");
    take("model.rope_mscale_all_dim", params->find("mscale_all_dim"), "mscale_all_dim");
    take("model.rope_attention_factor", params->find("attention_factor"), "attention_factor");
  }

  void take(const std::string& ours, const Node* v, const char* hf) {
    if (v && v->kind != Node::Kind::kNull && !ctx_.explicitly_set(ours)) set(ours, *v, "", hf);
  }

  const Node& root_;
  const std::string& path_;
  LoadContext& ctx_;
};

}  // namespace

void apply_hf_config(const std::string& given, const Location& where, LoadContext& ctx) {
  const Location at{ctx.recipe.sources["model.hf_config"]};
  // A model directory stands for its config.json.
  const std::string path = std::filesystem::is_directory(given) ? (std::filesystem::path(given) / "config.json").string() : given;
  ctx.recipe.model.hf_config = path;
  const auto text = ctx.read(path);
  if (!text) {
    ctx.problem(at, fmt::format("model.hf_config: '{}' does not exist or is not a file (give a config.json or the model directory "
                                "that holds one)",
                                path));
    return;
  }
  const Node root = parse_json_with_comments(*text, path, ctx.problems);
  if (!root.is_object()) return;
  const Node* type = root.find("model_type");
  const std::string model_type = type ? type->text : "";
  if (model_type != "llama" && model_type != "deepseek_v2" && model_type != "deepseek_v3") {
    ctx.problem(
        type ? type->where : root.where,
        fmt::format("model_type '{}' is not supported: dstrain trains llama (deepseek-llm, deepseek-coder), deepseek_v2 and deepseek_v3",
                    model_type.empty() ? "(none)" : model_type));
    return;
  }
  ctx.set("model.family", Node{Node::Kind::kString, model_type == "llama" ? "dense" : "mla_moe", {}, {}, {}, type->where}, type->where,
          false, "model_type");
  HfConfigReader(root, path, ctx).read(model_type, type->where);
  (void)where;
}

}  // namespace dstrain::config
