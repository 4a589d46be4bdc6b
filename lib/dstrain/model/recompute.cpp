#include "dstrain/model/recompute.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include "dstrain/model/linear.h"

namespace dstrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Holds the region until backward (saved_data keeps it as a capsule).
struct RegionHolder : torch::CustomClassHolder {
  Region region;
  explicit RegionHolder(Region r) : region(std::move(r)) {}
};

struct Recomputed : torch::autograd::Function<Recomputed> {
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs, c10::intrusive_ptr<RegionHolder> holder) {
    std::vector<at::Tensor> in(inputs.begin(), inputs.end());
    variable_list outs = holder->region(in, /*again=*/false);  // grad mode is off here: nothing is kept
    ctx->save_for_backward(in);
    ctx->saved_data["region"] = c10::IValue::make_capsule(std::move(holder));
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto holder = c10::static_intrusive_pointer_cast<RegionHolder>(ctx->saved_data["region"].toCapsule());
    std::vector<at::Tensor> in;
    for (const at::Tensor& t : ctx->get_saved_variables()) in.push_back(t.detach().requires_grad_(t.requires_grad()));
    variable_list outs;
    {
      const at::AutoGradMode grad(true);
      outs = holder->region(in, /*again=*/true);
    }
    variable_list roots, root_grads;
    for (size_t i = 0; i < outs.size() && i < grads.size(); ++i)
      if (grads[i].defined() && outs[i].requires_grad()) roots.push_back(outs[i]), root_grads.push_back(grads[i]);
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    variable_list result;
    for (const at::Tensor& t : in) result.push_back(t.requires_grad() ? t.grad() : at::Tensor());
    result.emplace_back();  // the region itself
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> recompute(const Region& region, const std::vector<at::Tensor>& inputs) {
  bool any = false;
  for (const at::Tensor& t : inputs) any = any || t.requires_grad();
  if (!at::GradMode::is_enabled() || !any) return region(inputs, /*again=*/false);
  // The recomputation in backward sees the rows of the forward (its random choices are theirs).
  const Region keyed = [region, rows = current_training_rows()](const std::vector<at::Tensor>& in, bool again) {
    const TrainingRowsScope scope(rows);
    return region(in, again);
  };
  return Recomputed::apply(at::TensorList(inputs), c10::make_intrusive<RegionHolder>(keyed));
}

at::Tensor recompute(const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& input) {
  return recompute([fn](const std::vector<at::Tensor>& in, bool) { return std::vector<at::Tensor>{fn(in[0])}; }, {input}).at(0);
}

}  // namespace dstrain::model
