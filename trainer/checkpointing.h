// What a rank saves into and loads from a sharded checkpoint (checkpoint/): for every
// parameter three global tensors, "param/<name>", "adam_m/<name>" and "adam_v/<name>",
// each saved as the rectangular boxes that ranks own: the tensor-parallel slice of the
// rank's pipeline stage, cut to the rows its data-parallel rank keeps optimizer state
// for. Replicated copies are saved once (tp rank 0 for tp-replicated tensors, dp rank 0
// under ZeRO-0, the first stage for a tied embedding), so the boxes of all ranks cover
// every tensor exactly once, whatever the layout. Loading reads each rank's own boxes
// from whatever boxes are on disk, which is what lets any layout resume any other.
// Expert parallelism: each routed expert is a tensor of its own name held by one ep rank
// of each replica, so it is saved once by that rank's expert-data-parallel replica 0
// (under ZeRO-0) or in the shards of its expert-data-parallel group, and resharding
// across ep is resharding by name.
#pragma once

#include <vector>

#include "checkpoint/box.h"
#include "checkpoint/reader.h"
#include "comm/topology.h"
#include "core/param_layout.h"
#include "parallel/data_parallel.h"

namespace trident {

// The boxes this rank saves, in device memory (f32; the writer downloads them through
// its Ops); the data pointers stay valid until the next optimizer step.
// `experts` (ep > 1, else null): the engine of the parameters in groups >= first_expert_group,
// whose replicas are numbered by expert_dp_rank.
struct ExpertEngine {
  DataParallel* dp = nullptr;
  int first_group = 0;
  int expert_dp_rank = 0;
  bool holds(const ParamInfo& p) const { return dp != nullptr && p.group >= first_group; }
};
std::vector<BoxRef> checkpoint_boxes(const ParamLayout& layout, DataParallel& dp,
                                     const RankCoords& coords, int zero_stage,
                                     const ExpertEngine& experts = {});

// Loads parameters (all of this rank's tensor-parallel part) and AdamW moments (the
// owned rows, uploaded into device memory through `ops`) from `checkpoint`. Errors name
// the tensor (missing, a global shape that does not match this model, or a dtype that
// is not f32).
Status load_checkpoint_state(Checkpoint& checkpoint, const ParamLayout& layout, DataParallel& dp,
                             Ops& ops, const ExpertEngine& experts = {});

}  // namespace trident
