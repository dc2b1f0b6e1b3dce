#include "trainer/optimizer.h"

#include <cmath>

namespace trident {

AdamW::AdamW(Transformer& model, Ops& ops, const TrainingConfig& training)
    : model_(model),
      ops_(ops),
      training_(training),
      m_(ops, model.num_param_floats() * sizeof(float)),
      v_(ops, model.num_param_floats() * sizeof(float)) {}

double AdamW::grad_norm() const {
  // Alignment gaps between tensors are zero in the gradient buffer, so the whole
  // buffer can be reduced at once.
  return std::sqrt(ops_.sum_squares(model_.grad_data(), model_.num_param_floats()));
}

float AdamW::clip(double norm) {
  if (training_.grad_clip <= 0.0f || norm <= training_.grad_clip) return 1.0f;
  const float scale = static_cast<float>(training_.grad_clip / norm);
  ops_.scale(model_.grad_data(), scale, model_.num_param_floats());
  return scale;
}

void AdamW::step(float lr) {
  ++step_;
  AdamWParams p;
  p.lr = lr;
  p.beta1 = training_.beta1;
  p.beta2 = training_.beta2;
  p.eps = training_.eps;
  p.step = step_;
  for (const ParamInfo& info : model_.params()) {
    p.weight_decay = info.decay ? training_.weight_decay : 0.0f;
    ops_.adamw_update(model_.param_data() + info.offset, model_.grad_data() + info.offset,
                      m_.as<float>() + info.offset, v_.as<float>() + info.offset,
                      static_cast<size_t>(info.numel()), p);
  }
}

}  // namespace trident
