// Where one rank's parameters and gradients live, as the model sees them. The layout
// (core/param_layout.h) says what the tensors are; a store says where their values are.
//
// The model reads parameters and accumulates gradients only through a ParamStore, a
// group at a time, between acquire() and release(). A resident store (ZeRO 0-2) keeps
// every group in one contiguous buffer; a sharded store (ZeRO-3) all-gathers a group
// on acquire and frees it on release, reduce-scattering its gradients after backward.
//
// Precision. Parameters are seen in the store's compute dtype (f32, or bf16 for
// training.precision bf16: the compute weights of mixed precision); gradients are always
// f32. Where the fp32 master weights of bf16 training live is the owner's business
// (DataParallel), except for ZeRO-3, whose store keeps the master shard too.
#pragma once

#include <cstddef>
#include <vector>

#include "core/param_layout.h"
#include "kernels/ops.h"

namespace trident {

enum class Phase { kForward, kBackward };

// CHECK-fails unless `compute` is a parameter compute dtype (f32 or bf16).
void check_compute_dtype(DType compute);

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // Between acquire(g, phase) and release(g, phase), params(g) holds group g's
  // (tensor-parallel local) parameters in ParamLayout order, and during kBackward
  // grads(g) is a buffer of the same layout into which the model accumulates.
  virtual void acquire(int group, Phase phase) = 0;
  virtual void release(int group, Phase phase) = 0;
  // params(g) is of compute_dtype(); grads(g) is f32.
  virtual DevPtr params(int group) = 0;
  virtual DevPtr grads(int group) = 0;
  virtual DType compute_dtype() const = 0;
};

// Every group resident in two contiguous buffers (parameters in the compute dtype,
// gradients f32) of layout.total_floats() elements in the flat layout (group g at
// groups[g].offset), so param_data() + ParamInfo::offset is a tensor (element offsets are
// the same in both dtypes). acquire/release do nothing.
class ResidentParamStore : public ParamStore {
 public:
  // `compute`: f32 or bf16.
  ResidentParamStore(const ParamLayout& layout, Ops& ops, DType compute = DType::kF32);
  void acquire(int, Phase) override {}
  void release(int, Phase) override {}
  DevPtr params(int group) override { return param_data() + group_offset_[group]; }
  DevPtr grads(int group) override { return grad_data() + group_offset_[group]; }
  DType compute_dtype() const override { return compute_; }
  DevPtr param_data() { return params_.as(compute_); }
  DevPtr grad_data() { return grads_.as(DType::kF32); }
  size_t num_floats() const { return total_; }
  // Offset of a group's buffer within param_data() / grad_data().
  size_t group_offset(int group) const { return group_offset_[group]; }

 private:
  size_t total_ = 0;
  DType compute_ = DType::kF32;
  std::vector<size_t> group_offset_;
  DeviceBuffer params_;
  DeviceBuffer grads_;
};

}  // namespace trident
