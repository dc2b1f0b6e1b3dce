// Parameter layout of one rank's part of the model: a flat buffer described by a table
// of (name, global shape, local shape, split, group, offset). The model fills it
// (model/model_description.h's describe_params); parallel/ (stores, ZeRO) and checkpoints know the
// parameters only through it, never through the model.
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
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace trident {

// How a parameter's initial values are drawn (model/transformer.h "Initialisation"): the
// rule its model description row declares (model/model_description.h).
enum class InitKind {
  kNormal,          // N(0, model.init_std)
  kResidualNormal,  // N(0, init_std / sqrt(2 * n_layers)): projections into the residual
  kVocabNormal,     // kNormal on the vocabulary's rows; the padded rows stay zero
  kZeros,           // biases
  kOnes,            // norm weights
};

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
  InitKind init = InitKind::kNormal;  // its description row's rule
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
  const ParamInfo* find(std::string_view name) const;  // null when absent
};

// This rank's tensor-parallel part of a global tensor (`global`: row-major, p.shape)
// as a local_shape array; and the inverse, writing a local part into its place.
std::vector<float> local_part(const ParamInfo& p, const float* global);
void place_local_part(const ParamInfo& p, const float* local, float* global);

}  // namespace trident
