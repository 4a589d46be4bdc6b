#pragma once
// What a parameter is for, declared by the model that makes it. Everything that used to be
// guessed from a name or a shape derives from the role: whether weight decay applies, whether
// DeepSeek's release stores it in FP8, what a `train.freeze` role selects.
#include <string>
#include <vector>

namespace dstrain::model {

enum class ParamRole {
  kEmbedding,      // model.embed_tokens
  kAttention,      // an attention projection (q/k/v/o, MLA's q_a/q_b/kv_a/kv_b)
  kMlp,            // a dense MLP's or the shared experts' projection
  kExpert,         // a routed expert's projection
  kRouter,         // the MoE router (mlp.gate)
  kNorm,           // an RMSNorm's weight
  kHead,           // lm_head
  kMtpProjection,  // multi-token prediction's eh_proj
  kBias,           // an additive bias
  kAdapter,        // trained beside a frozen base (low-rank adapters)
};

// Weight decay applies to matrices, never to norms or biases.
bool decays(ParamRole role);
// DeepSeek's FP8 release stores attention and MLP projections (dense, routed and shared experts)
// in FP8; not the router, norms, embedding, head, or MTP's eh_proj.
bool stored_as_fp8(ParamRole role);
// The role's name in recipes (train.freeze) and logs: embeddings, attention, mlp, experts, router,
// norms, head, mtp, bias, adapter.
const char* role_name(ParamRole role);
// Every role a recipe may name, in the order above.
const std::vector<ParamRole>& all_roles();

}  // namespace dstrain::model
