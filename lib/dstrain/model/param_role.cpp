#include "dstrain/model/param_role.h"

namespace dstrain::model {

bool decays(ParamRole role) { return role != ParamRole::kNorm && role != ParamRole::kBias; }

bool stored_as_fp8(ParamRole role) { return role == ParamRole::kAttention || role == ParamRole::kMlp || role == ParamRole::kExpert; }

const char* role_name(ParamRole role) {
  switch (role) {
    case ParamRole::kEmbedding:
      return "embeddings";
    case ParamRole::kAttention:
      return "attention";
    case ParamRole::kMlp:
      return "mlp";
    case ParamRole::kExpert:
      return "experts";
    case ParamRole::kRouter:
      return "router";
    case ParamRole::kNorm:
      return "norms";
    case ParamRole::kHead:
      return "head";
    case ParamRole::kMtpProjection:
      return "mtp";
    case ParamRole::kBias:
      return "bias";
    case ParamRole::kAdapter:
      return "adapter";
  }
  return "?";
}

const std::vector<ParamRole>& all_roles() {
  static const std::vector<ParamRole> roles = {ParamRole::kEmbedding, ParamRole::kAttention, ParamRole::kMlp,  ParamRole::kExpert,
                                               ParamRole::kRouter,    ParamRole::kNorm,      ParamRole::kHead, ParamRole::kMtpProjection,
                                               ParamRole::kBias,      ParamRole::kAdapter};
  return roles;
}

}  // namespace dstrain::model
