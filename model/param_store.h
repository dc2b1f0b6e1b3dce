// Parameter layout of one rank's part of the model, and where the values live.
//
// Parameters are split three ways before they reach a rank:
// - pipeline: a rank holds the groups of its stage only. Group 0 = embeddings (wte,
//   wpe) on the first stage; group 1 + i = layer i; group L + 1 = the head (lnf.*, and
//   lm_head.weight or, when tied, a copy of wte) on the last stage.
// - tensor parallel: a tensor is split along one dimension (`split_dim`) over the tp
//   ranks (column-parallel q/k/v/fc/gate/up and the vocabulary rows of wte/lm_head
//   along dim 0; row-parallel attn.o/mlp.proj/mlp.down along dim 1), or replicated
//   (split_dim = -1: norms, biases of row-parallel layers, wpe).
// - data parallel (ZeRO): the store decides; see parallel/data_parallel.h.
//
// The model reads parameters and accumulates gradients only through a ParamStore, a
// group at a time, between acquire() and release(). A resident store (ZeRO 0-2) keeps
// every group in one contiguous buffer; a sharded store (ZeRO-3) all-gathers a group
// on acquire and frees it on release, reduce-scattering its gradients after backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace trident {

struct ParamInfo {
  std::string name;         // global name (model/transformer.h)
  Shape shape;              // global shape
  Shape local_shape;        // this rank's tensor-parallel part
  int split_dim = -1;       // -1: replicated over tp; else the dimension split over tp
  int64_t split_offset = 0; // where this rank's part starts along split_dim
  int group = 0;            // parameter group (see above)
  size_t offset = 0;        // in floats, from the start of the stage's flat layout (all
                            // groups in id order); minus groups[group].offset it is the
                            // offset inside the group's own buffer
  bool decay = false;       // AdamW weight decay applies (2-D tensors)
  bool tied_copy = false;   // the last stage's copy of wte: same values as the first
                            // stage's; its gradient is summed over the embedding group
                            // and it is counted once in norms and checkpoints
  int64_t numel() const { return local_shape.numel(); }
  bool tp_replicated() const { return split_dim < 0; }
};

struct ParamGroup {
  int id = 0;
  size_t offset = 0;         // start of the group in the stage's flat layout (16-aligned)
  size_t num_floats = 0;     // size of the group's buffer (tensors 16-float aligned)
  std::vector<int> params;   // indices into the parameter table
};

struct ParamLayout {
  std::vector<ParamInfo> params;
  std::vector<ParamGroup> groups;  // indexed by group id; groups of other stages are empty
  size_t total_floats() const;  // the flat layout: last group's offset + num_floats
  const ParamInfo* find(const std::string& name) const;
};

// This rank's tensor-parallel part of a global tensor (`global`: row-major, p.shape)
// as a local_shape array; and the inverse, writing a local part into its place.
std::vector<float> local_part(const ParamInfo& p, const float* global);
void place_local_part(const ParamInfo& p, const float* local, float* global);

enum class Phase { kForward, kBackward };

class ParamStore {
 public:
  virtual ~ParamStore() = default;
  // Between acquire(g, phase) and release(g, phase), params(g) holds group g's
  // (tensor-parallel local) parameters in ParamLayout order, and during kBackward
  // grads(g) is a buffer of the same layout into which the model accumulates.
  virtual void acquire(int group, Phase phase) = 0;
  virtual void release(int group, Phase phase) = 0;
  virtual float* params(int group) = 0;
  virtual float* grads(int group) = 0;
};

// Every group resident in two contiguous buffers (parameters, gradients) of
// layout.total_floats() floats in the flat layout (group g at groups[g].offset), so
// param_data() + ParamInfo::offset is a tensor. acquire/release do nothing.
class ResidentParamStore : public ParamStore {
 public:
  ResidentParamStore(const ParamLayout& layout, Ops& ops);
  void acquire(int, Phase) override {}
  void release(int, Phase) override {}
  float* params(int group) override { return params_.as<float>() + group_offset_[group]; }
  float* grads(int group) override { return grads_.as<float>() + group_offset_[group]; }
  float* param_data() { return params_.as<float>(); }
  float* grad_data() { return grads_.as<float>(); }
  size_t num_floats() const { return total_; }
  // Offset of a group's buffer within param_data() / grad_data().
  size_t group_offset(int group) const { return group_offset_[group]; }

 private:
  size_t total_ = 0;
  std::vector<size_t> group_offset_;
  DeviceBuffer params_;
  DeviceBuffer grads_;
};

}  // namespace trident
