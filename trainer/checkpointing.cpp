#include "trainer/checkpointing.h"

namespace trident {

namespace {

// The global box of rows [row_begin, row_end) of a parameter's tensor-parallel part.
void owned_box(const ParamInfo& p, int64_t row_begin, int64_t row_end,
               std::vector<int64_t>* start, std::vector<int64_t>* extent) {
  const int64_t r0 = p.split_dim == 0 ? p.split_offset : 0;
  start->assign(1, r0 + row_begin);
  extent->assign(1, row_end - row_begin);
  if (p.shape.rank() == 2) {
    start->push_back(p.split_dim == 1 ? p.split_offset : 0);
    extent->push_back(p.local_shape[1]);
  }
}

std::string tensor_name(const char* kind, const ParamInfo& p) { return std::string(kind) + "/" + p.name; }

}  // namespace

std::vector<BoxRef> checkpoint_boxes(const ParamLayout& layout, DataParallel& dense,
                                     const RankCoords& coords, int zero_stage,
                                     const ExpertEngine& experts) {
  std::vector<BoxRef> boxes;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ParamInfo& p = layout.params[i];
    if (p.tied_copy) continue;                               // the first stage saves wte
    if (p.tp_replicated() && coords.tp_rank != 0) continue;  // one tp copy
    // One dp x cp copy (the cp ranks of a replica hold the same parameters); of a routed
    // expert under expert parallelism, one expert-data-parallel copy.
    const bool expert = experts.holds(p);
    const int replica = expert ? experts.expert_dp_rank : coords.dp_rank;
    if (zero_stage == 0 && (replica != 0 || coords.cp_rank != 0)) continue;
    DataParallel& dp = expert ? *experts.dp : dense;
    const DataParallel::OwnedState st = dp.owned_state(static_cast<int>(i));
    if (st.row_end <= st.row_begin) continue;
    BoxRef box;
    box.global_shape = p.shape.dims();
    owned_box(p, st.row_begin, st.row_end, &box.start, &box.extent);
    for (auto [kind, data] : {std::pair<const char*, DevPtr>{"param", st.param},
                              {"adam_m", st.exp_avg},
                              {"adam_v", st.exp_avg_sq}}) {
      box.tensor = tensor_name(kind, p);
      box.data = data;
      boxes.push_back(box);
    }
  }
  return boxes;
}

Status load_checkpoint_state(Checkpoint& ckpt, const ParamLayout& layout, DataParallel& dense,
                             Ops& ops, const ExpertEngine& experts) {
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const ParamInfo& p = layout.params[i];
    DataParallel& dp = experts.holds(p) ? *experts.dp : dense;
    for (const char* kind : {"param", "adam_m", "adam_v"}) {
      const std::string name = tensor_name(kind, p);
      TRIDENT_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ckpt.shape(name));
      if (shape != p.shape.dims()) {
        return Status::invalid_input(ckpt.dir() + ": tensor " + name + " has shape " +
                                     Shape(shape).str() + " but this model needs " +
                                     p.shape.str());
      }
    }
    // Parameters: this rank's whole tensor-parallel part (the store shards it).
    std::vector<int64_t> start, extent;
    owned_box(p, 0, p.local_shape[0], &start, &extent);
    std::vector<float> full(static_cast<size_t>(p.numel()));
    TRIDENT_RETURN_IF_ERROR(ckpt.read_box(tensor_name("param", p), start, extent, full.data()));
    dp.load_param(static_cast<int>(i), full);
    // Moments: the rows whose optimizer state this rank keeps.
    const DataParallel::OwnedState st = dp.owned_state(static_cast<int>(i));
    if (st.row_end <= st.row_begin) continue;
    owned_box(p, st.row_begin, st.row_end, &start, &extent);
    TRIDENT_RETURN_IF_ERROR(
        ckpt.read_box(tensor_name("adam_m", p), start, extent, st.exp_avg, ops));
    TRIDENT_RETURN_IF_ERROR(
        ckpt.read_box(tensor_name("adam_v", p), start, extent, st.exp_avg_sq, ops));
  }
  return Status::ok();
}

}  // namespace trident
