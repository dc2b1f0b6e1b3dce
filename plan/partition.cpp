#include "plan/partition.h"

#include "parallel/pipeline.h"

namespace trident {

ModelPartition stage_partition(const Config& config, int tp_rank, int pp_rank, int ep_rank) {
  const ParallelConfig& par = config.parallel;
  ModelPartition part;
  part.tp_rank = tp_rank;
  part.tp_size = par.tp;
  part.pp_rank = pp_rank;
  part.pp_size = par.pp;
  part.sequence_parallel = par.sequence_parallel;
  // Context parallelism: every cp rank holds the same sizes (the trainer sets its rank).
  part.cp_size = par.cp;
  // Expert parallelism: which routed experts this rank holds.
  part.ep_rank = ep_rank;
  part.ep_size = par.ep;
  const std::vector<int> counts =
      stage_layer_counts(config.model.n_layers, par.pp, par.stage_layers);
  part.layer_begin = 0;
  for (int s = 0; s < pp_rank; ++s) part.layer_begin += counts[static_cast<size_t>(s)];
  part.layer_end = part.layer_begin + counts[static_cast<size_t>(pp_rank)];
  return part;
}

std::vector<ModelPartition> rank_chunks(const Config& config, int tp_rank, int pp_rank,
                                        int ep_rank) {
  const ParallelConfig& par = config.parallel;
  if (par.virtual_stages == 1) return {stage_partition(config, tp_rank, pp_rank, ep_rank)};
  ModelPartition part = stage_partition(config, tp_rank, pp_rank, ep_rank);
  part.num_chunks = par.virtual_stages;
  std::vector<ModelPartition> chunks;
  const auto ranges = chunk_layer_ranges(config.model.n_layers, par.pp, par.virtual_stages);
  for (int c = 0; c < par.virtual_stages; ++c) {
    const LayerRange& r = ranges[static_cast<size_t>(pp_rank)][static_cast<size_t>(c)];
    part.chunk = c;
    part.layer_begin = r.begin;
    part.layer_end = r.end;
    chunks.push_back(part);
  }
  return chunks;
}

}  // namespace trident
