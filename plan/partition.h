// Which part of the model a rank holds: its tensor-parallel slice and its pipeline
// stage's layers, as one model chunk, or with parallel.virtual_stages v > 1 (interleaved
// 1F1B) as v chunks in layer order (parallel/pipeline.h chunk_layer_ranges: chunk c of
// pipeline rank s is virtual stage c * pp + s). The trainer builds one model per chunk
// from these; the memory plan and the traffic model count from the same list.
#pragma once

#include <vector>

#include "model/transformer.h"
#include "config/config.h"

namespace trident {

// The stage of the rank at (tp_rank, pp_rank) as one model chunk of its layers
// (parallel.stage_layers, or balanced), whatever parallel.virtual_stages is: the plan
// counts a stage's work and parameter table from it. `ep_rank`: which routed experts it
// holds under parallel.ep (every ep rank holds as many).
ModelPartition stage_partition(const Config& config, int tp_rank, int pp_rank, int ep_rank = 0);

// The model chunks of the rank at (tp_rank, pp_rank) under `config` (validated).
// v == 1: one chunk, the stage's layers (parallel.stage_layers, or balanced).
std::vector<ModelPartition> rank_chunks(const Config& config, int tp_rank, int pp_rank,
                                        int ep_rank = 0);

}  // namespace trident
