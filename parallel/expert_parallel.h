// Expert parallelism's parameter split (parallel.ep > 1): the routed experts of each layer
// sit in parameter groups of their own (model/model_description.h moe_expert_group:
// L + 2 + layer), which the trainer reduces and shards over the expert-data-parallel group
// (the dp ranks holding the same experts) while every other group goes over dp. Two
// DataParallel engines, each over a subset of the one layout, and one store the model
// reads both through.
//
// layout_subset: a copy of `layout` keeping groups [begin, end) (a table of `end` groups;
// those before `begin` are emptied) with their offsets compacted from 0, so a
// DataParallel over it allocates exactly those groups. Parameter indices are those of
// `layout` (the parameter table is copied whole; the parameters of dropped groups are in
// no group and no engine touches them), so callers address a parameter by one index.
//
// SplitParamStore: groups below `first_split` from `low`, the others from `high`.
#pragma once

#include "core/param_layout.h"
#include "parallel/param_store.h"

namespace trident {

ParamLayout layout_subset(const ParamLayout& layout, int begin, int end);

class SplitParamStore : public ParamStore {
 public:
  // Both stores must outlive this one and have the same compute dtype (CHECK).
  SplitParamStore(ParamStore& low, ParamStore& high, int first_split);
  void acquire(int group, Phase phase) override { of(group).acquire(group, phase); }
  void release(int group, Phase phase) override { of(group).release(group, phase); }
  DevPtr params(int group) override { return of(group).params(group); }
  DevPtr grads(int group) override { return of(group).grads(group); }
  DType compute_dtype() const override { return low_.compute_dtype(); }

 private:
  ParamStore& of(int group) { return group < first_split_ ? low_ : high_; }
  ParamStore& low_;
  ParamStore& high_;
  int first_split_;
};

}  // namespace trident
