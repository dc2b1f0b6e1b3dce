// AdamW over a Transformer's parameter table, with global-norm gradient clipping.
// Moments are fp32 buffers of the parameter buffer's layout. Weight decay applies to
// parameters with ParamInfo::decay (2-D tensors). Not thread-safe; one per model.
#pragma once

#include <cstdint>

#include "kernels/ops.h"
#include "model/transformer.h"
#include "trainer/config.h"

namespace trident {

class AdamW {
 public:
  AdamW(Transformer& model, Ops& ops, const TrainingConfig& training);

  // sqrt of the sum of squared gradients over every parameter.
  double grad_norm() const;
  // If grad_clip > 0 and norm > grad_clip, scales the gradients by grad_clip / norm.
  // Returns the scale applied (1 when none).
  float clip(double norm);
  // One update with learning rate `lr`; advances the step counter.
  void step(float lr);
  int steps_taken() const { return step_; }
  size_t state_bytes() const { return m_.bytes() + v_.bytes(); }

 private:
  Transformer& model_;
  Ops& ops_;
  TrainingConfig training_;
  DeviceBuffer m_;  // first moments, parameter-buffer layout
  DeviceBuffer v_;  // second moments
  int step_ = 0;
};

}  // namespace trident
