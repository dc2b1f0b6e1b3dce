#include "parallel/shard_plan.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace trident {

RowSplit row_split(const Shape& local_shape, int dp) {
  TRIDENT_CHECK(dp >= 1);
  RowSplit s;
  if (local_shape.rank() == 0) {
    s.rows = 1;
    s.row_elems = 1;
  } else {
    s.rows = local_shape[0];
    s.row_elems = 1;
    for (int d = 1; d < local_shape.rank(); ++d) s.row_elems *= local_shape[d];
  }
  s.rows_per_rank = (s.rows + dp - 1) / dp;
  return s;
}

size_t ShardChunk::full_floats() const {
  size_t n = 0;
  for (const TensorShard& t : tensors) n += static_cast<size_t>(t.split.rows * t.split.row_elems);
  return n;
}

ShardPlan::ShardPlan(const ParamLayout& layout, int dp, const std::vector<size_t>& full_base,
                     size_t max_chunk_floats)
    : dp_(dp) {
  TRIDENT_CHECK(full_base.size() == layout.groups.size());
  where_.assign(layout.params.size(), {-1, -1});
  group_chunks_.resize(layout.groups.size());
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    std::vector<int> order = layout.groups[g].params;
    std::sort(order.begin(), order.end(), [&](int a, int b) {
      return layout.params[static_cast<size_t>(a)].offset <
             layout.params[static_cast<size_t>(b)].offset;
    });
    ShardChunk chunk;
    size_t chunk_full = 0;
    auto close = [&] {
      if (chunk.tensors.empty()) return;
      chunk.group = static_cast<int>(g);
      chunk.shard_offset = shard_floats_;
      for (TensorShard& t : chunk.tensors) t.shard_offset += shard_floats_;
      shard_floats_ += chunk.chunk_floats;
      max_chunk_ = std::max(max_chunk_, chunk.chunk_floats);
      const int c = static_cast<int>(chunks_.size());
      for (size_t i = 0; i < chunk.tensors.size(); ++i)
        where_[static_cast<size_t>(chunk.tensors[i].param)] = {c, static_cast<int>(i)};
      group_chunks_[g].push_back(c);
      chunks_.push_back(std::move(chunk));
      chunk = ShardChunk{};
      chunk_full = 0;
    };
    for (int p : order) {
      const ParamInfo& info = layout.params[static_cast<size_t>(p)];
      TRIDENT_CHECK_MSG(info.group == static_cast<int>(g),
                        "parameter " + info.name + " listed in group " + std::to_string(g));
      TRIDENT_CHECK(info.offset >= full_base[g]);
      const size_t n = static_cast<size_t>(info.numel());
      if (!chunk.tensors.empty() && chunk_full + n > max_chunk_floats) close();
      TensorShard t;
      t.param = p;
      t.split = row_split(info.local_shape, dp);
      t.full_offset = info.offset - full_base[g];
      t.shard_offset = chunk.chunk_floats;  // within the chunk until close()
      chunk.chunk_floats += t.split.padded_floats();
      chunk_full += n;
      chunk.tensors.push_back(t);
    }
    close();
  }
}

const TensorShard& ShardPlan::tensor(int param) const {
  TRIDENT_CHECK_MSG(param >= 0 && static_cast<size_t>(param) < where_.size() &&
                        where_[static_cast<size_t>(param)].first >= 0,
                    "no shard for parameter " + std::to_string(param));
  const auto [c, i] = where_[static_cast<size_t>(param)];
  return chunks_[static_cast<size_t>(c)].tensors[static_cast<size_t>(i)];
}

const std::vector<int>& ShardPlan::group_chunks(int group) const {
  TRIDENT_CHECK(group >= 0 && static_cast<size_t>(group) < group_chunks_.size());
  return group_chunks_[static_cast<size_t>(group)];
}

namespace {
// Bytes per element of a pack/unpack pair; the two buffers must agree.
size_t element_bytes(DevPtr a, DevPtr b) {
  TRIDENT_CHECK_MSG(a.dtype() == b.dtype(), std::string("shard pack between ") +
                                                dtype_name(a.dtype()) + " and " +
                                                dtype_name(b.dtype()) + " buffers");
  return dtype_size(a.dtype());
}
}  // namespace

void pack_own(Ops& ops, const ShardChunk& chunk, int rank, DevPtr full, DevPtr segment) {
  const size_t es = element_bytes(full, segment);
  for (const TensorShard& t : chunk.tensors) {
    DevPtr dst = segment + (t.shard_offset - chunk.shard_offset);
    const size_t n = t.split.owned_floats(rank);
    ops.copy(dst, full + t.full_offset + t.split.begin_float(rank), n * es);
    ops.zero(dst + n, (t.split.padded_floats() - n) * es);
  }
}

void pack_chunk(Ops& ops, const ShardChunk& chunk, int dp, DevPtr full, DevPtr packed) {
  for (int r = 0; r < dp; ++r) pack_own(ops, chunk, r, full, packed + r * chunk.chunk_floats);
}

void unpack_chunk(Ops& ops, const ShardChunk& chunk, int dp, DevPtr packed, DevPtr full) {
  const size_t es = element_bytes(full, packed);
  for (int r = 0; r < dp; ++r) {
    DevPtr segment = packed + r * chunk.chunk_floats;
    for (const TensorShard& t : chunk.tensors) {
      ops.copy(full + t.full_offset + t.split.begin_float(r),
               segment + (t.shard_offset - chunk.shard_offset),
               t.split.owned_floats(r) * es);
    }
  }
}

size_t collective_scratch_bytes(int dp, size_t max_chunk_floats) {
  return (static_cast<size_t>(dp) + 1) * max_chunk_floats * sizeof(float);
}

void reduce_scatter_add(Ops& ops, Communicator& dp, const ShardChunk& chunk, DevPtr full,
                        DevPtr shard, DevPtr scratch, const std::string& label) {
  const size_t n = static_cast<size_t>(dp.size());
  const DevPtr packed = scratch.as(DType::kF32);
  const DevPtr mine = packed + n * chunk.chunk_floats;
  pack_chunk(ops, chunk, dp.size(), full, packed);
  dp.reduce_scatter(CommBuf::device(packed, n * chunk.chunk_floats),
                    CommBuf::device(mine, chunk.chunk_floats), {.label = label});
  finish_reduce_scatter(ops, dp.size(), mine, shard + chunk.shard_offset, chunk.chunk_floats);
}

void finish_reduce_scatter(Ops& ops, int dp, DevPtr summed, DevPtr shard, size_t floats) {
  // Mean over dp ranks, then accumulate over micro-batches.
  if (dp > 1) ops.scale(summed, 1.0f / static_cast<float>(dp), floats);
  ops.accumulate(shard, summed, floats);
}

}  // namespace trident
