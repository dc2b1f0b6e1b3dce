// The geometry of dim-0 sharding over the data-parallel group (ZeRO / FSDP2 style): how
// tensors split by rows, how they are packed into chunks for one collective, and the
// collectives that move a chunk. The stores built on it: parallel/sharded_param_store.h;
// the overlapped reduce-scatters: parallel/reduce_scatter_queue.h.
//
// Geometry. A tensor with local (tensor-parallel) shape (R, ...) is split by rows: with
// rows_per_rank = ceil(R / dp), dp rank r owns rows [r * rows_per_rank,
// min(R, (r + 1) * rows_per_rank)), possibly none. A 1-D tensor's rows are its
// elements; a 0-D tensor is one row. Every shard is therefore a rectangular box of the
// global tensor (checkpoints stay reshardable) and a contiguous range of the tensor.
//
// Packing. Several tensors move in one collective as a chunk (a gradient bucket, or a
// whole group for ZeRO-3). A chunk's per-rank segment holds, for each of its tensors in
// order, that rank's rows padded to rows_per_rank rows, so every segment has the same
// size (chunk_floats) and one reduce_scatter / all_gather over a [dp, chunk_floats]
// buffer moves the whole chunk. The flat "shard buffer" of a rank is its segments of
// every chunk, concatenated in chunk order: TensorShard::shard_offset is where a
// tensor's (padded) shard starts in it. Padding rows are always zero there.
//
// Dtypes. pack/unpack move elements of the buffers' dtype (full and packed must agree);
// chunk_floats, shard_offset and full_offset count elements whatever the dtype. Gradients
// and their reductions are f32.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/param_layout.h"
#include "kernels/ops.h"

namespace trident {

// How one tensor is split by rows over `dp` ranks.
struct RowSplit {
  int64_t rows = 0;           // R: local_shape[0] (numel for 1-D, 1 for 0-D)
  int64_t row_elems = 0;      // floats per row
  int64_t rows_per_rank = 0;  // ceil(R / dp)
  int64_t row_begin(int rank) const { return std::min(rows, rank * rows_per_rank); }
  int64_t row_end(int rank) const { return std::min(rows, (rank + 1) * rows_per_rank); }
  size_t owned_floats(int rank) const {
    return static_cast<size_t>((row_end(rank) - row_begin(rank)) * row_elems);
  }
  size_t begin_float(int rank) const { return static_cast<size_t>(row_begin(rank) * row_elems); }
  size_t padded_floats() const { return static_cast<size_t>(rows_per_rank * row_elems); }
};
RowSplit row_split(const Shape& local_shape, int dp);

struct TensorShard {
  int param = 0;            // index into ParamLayout::params
  RowSplit split;
  size_t full_offset = 0;   // tensor start in the full buffer the plan was made for
  size_t shard_offset = 0;  // padded shard start in the rank's shard buffer
};

// Tensors moved by one collective; never spans two groups.
struct ShardChunk {
  int group = 0;
  std::vector<TensorShard> tensors;  // ascending full_offset
  size_t chunk_floats = 0;           // one rank's segment (sum of padded shards)
  size_t shard_offset = 0;           // segment start in the shard buffer
  size_t full_floats() const;        // sum of the tensors' numel
};

// Chunks of a layout for a dp group of `dp` ranks. A tensor's full_offset is
// ParamInfo::offset - full_base[group] (full_base = 0 for the flat layout, the group
// offsets for per-group buffers). Groups in id order, tensors by offset; a new chunk
// starts at each group and when adding a tensor would take the chunk's full size past
// max_chunk_floats (a chunk holds at least one tensor).
class ShardPlan {
 public:
  ShardPlan() = default;
  ShardPlan(const ParamLayout& layout, int dp, const std::vector<size_t>& full_base,
            size_t max_chunk_floats);
  const std::vector<ShardChunk>& chunks() const { return chunks_; }
  size_t shard_floats() const { return shard_floats_; }  // one rank's shard buffer
  size_t max_chunk_floats() const { return max_chunk_; }  // largest chunk_floats
  int dp() const { return dp_; }
  // The tensor of parameter `param`; CHECK-fails when the layout has none.
  const TensorShard& tensor(int param) const;
  // Chunk indices of group g (empty when the group has no tensors).
  const std::vector<int>& group_chunks(int group) const;

 private:
  int dp_ = 1;
  std::vector<ShardChunk> chunks_;
  size_t shard_floats_ = 0;
  size_t max_chunk_ = 0;
  std::vector<std::pair<int, int>> where_;     // param -> (chunk, index), (-1, -1) if none
  std::vector<std::vector<int>> group_chunks_;  // group -> chunk indices
};

// Copies every rank's rows of the chunk's tensors from full[...] into
// packed[dp * chunk_floats] (rank r's segment at r * chunk_floats); padding zeroed.
void pack_chunk(Ops& ops, const ShardChunk& chunk, int dp, DevPtr full, DevPtr packed);
// The inverse: writes every rank's rows from packed back into full.
void unpack_chunk(Ops& ops, const ShardChunk& chunk, int dp, DevPtr packed, DevPtr full);
// Copies this rank's rows into segment[chunk_floats]; padding zeroed.
void pack_own(Ops& ops, const ShardChunk& chunk, int rank, DevPtr full, DevPtr segment);
// Collective over dp: reduce-scatters the chunk's full gradients (full[...], f32, as for
// pack_chunk) over the dp ranks, scales the sum by 1/dp (the loss is the mean over dp)
// and ADDS this rank's segment to shard[chunk.shard_offset ...]. `scratch`: at least
// collective_scratch_bytes(dp.size(), chunk.chunk_floats) bytes, overwritten.
void reduce_scatter_add(Ops& ops, Communicator& dp, const ShardChunk& chunk, DevPtr full,
                        DevPtr shard, DevPtr scratch, const std::string& label);

// The local end of reduce_scatter_add: scales this rank's summed segment (`floats` f32)
// by 1/dp and adds it to `shard` (the segment's place in the shard buffer).
void finish_reduce_scatter(Ops& ops, int dp, DevPtr summed, DevPtr shard, size_t floats);

// Bytes of the scratch one collective of a store needs for chunks of at most
// max_chunk_floats: (dp + 1) * max_chunk_floats f32 (a reduce-scatter's [dp, chunk] pack
// and its result; an all-gather needs dp * chunk elements of at most 4 bytes).
size_t collective_scratch_bytes(int dp, size_t max_chunk_floats);

}  // namespace trident
