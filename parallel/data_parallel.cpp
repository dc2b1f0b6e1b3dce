#include "parallel/data_parallel.h"

#include <algorithm>
#include <string>

#include "core/check.h"
#include "parallel/reduce_scatter_queue.h"

namespace trident {

namespace {
constexpr size_t kF = sizeof(float);
}  // namespace

// The resident store as the model sees it with overlap (stages 0-1): every backward
// release is reported to the owner, which issues a group's buckets at its last one.
class DataParallel::ReleaseCounter : public ParamStore {
 public:
  ReleaseCounter(DataParallel& owner, ResidentParamStore& inner) : owner_(owner), inner_(inner) {}
  void acquire(int group, Phase phase) override { inner_.acquire(group, phase); }
  void release(int group, Phase phase) override {
    inner_.release(group, phase);
    if (phase == Phase::kBackward) owner_.on_backward_release(group);
  }
  DevPtr params(int group) override { return inner_.params(group); }
  DevPtr grads(int group) override { return inner_.grads(group); }
  DType compute_dtype() const override { return inner_.compute_dtype(); }

 private:
  DataParallel& owner_;
  ResidentParamStore& inner_;
};

DataParallel::DataParallel(const ParamLayout& layout, Ops& ops, Communicator& dp, int zero_stage,
                           size_t bucket_bytes, const AdamWParams& adamw, DType compute,
                           const OverlapOptions& overlap)
    : layout_(layout),
      ops_(ops),
      dp_(dp),
      stage_(zero_stage),
      adamw_(adamw),
      compute_(compute),
      overlap_(overlap) {
  TRIDENT_CHECK_MSG(overlap.micro_batches >= 1, "micro_batches must be >= 1");
  // One dp rank: nothing to overlap (the reductions are local copies).
  if (dp.size() == 1) overlap_.grad_reduce = overlap_.param_gather = false;
  TRIDENT_CHECK_MSG(is_float_dtype(compute), "compute dtype must be f32 or bf16");
  TRIDENT_CHECK_MSG(zero_stage >= 0 && zero_stage <= 3,
                    "zero_stage must be 0..3, got " + std::to_string(zero_stage));
  TRIDENT_CHECK(bucket_bytes > 0);
  if (stage_ == 3) {
    sharded_ = std::make_unique<ShardedParamStore>(layout, ops, dp, compute);
    plan_ = sharded_->plan();
  } else {
    // Stage 2 must not allocate a full gradient buffer: its store holds gradients only as
    // a shard plus the groups in backward.
    if (stage_ == 2) {
      zero2_ = std::make_unique<GradShardedParamStore>(layout, ops, dp, compute);
    } else {
      resident_ = std::make_unique<ResidentParamStore>(layout, ops, compute);
    }
    const size_t bucket_floats = std::max<size_t>(1, bucket_bytes / kF);
    plan_ = ShardPlan(layout, dp.size(), std::vector<size_t>(layout.groups.size(), 0),
                      bucket_floats);
    // bucket_range() relies on the buckets following each other in the flat buffer.
    size_t end = 0;
    for (const ShardChunk& c : plan_.chunks()) {
      TRIDENT_CHECK_MSG(c.tensors.front().full_offset >= end,
                        "parameter groups overlap or are out of id order in the flat layout");
      const TensorShard& last = c.tensors.back();
      end = last.full_offset + static_cast<size_t>(last.split.rows * last.split.row_elems);
    }
    TRIDENT_CHECK(end <= layout.total_floats());
    // The store's per-group chunks and these buckets address one shard layout.
    if (zero2_) TRIDENT_CHECK(zero2_->plan().shard_floats() == plan_.shard_floats());
  }
  const size_t moment_floats = stage_ == 0 ? layout.total_floats() : plan_.shard_floats();
  exp_avg_ = DeviceBuffer(ops, moment_floats * kF);
  exp_avg_sq_ = DeviceBuffer(ops, moment_floats * kF);
  // Mixed precision: the fp32 masters live beside the compute weights, laid out like the
  // moments (stage 3's shard store keeps its own: its param_shard()).
  if (mixed() && stage_ <= 2) master_ = DeviceBuffer(ops, moment_floats * kF);
  if (stage_ == 1 || stage_ == 2) {
    // They all-gather the updated compute weights; stage 1 also reduce-scatters f32
    // gradients through the same buffer.
    const size_t es = stage_ == 1 ? kF : dtype_size(compute);
    collective_ = DeviceBuffer(ops, (dp.size() + 1) * plan_.max_chunk_floats() * es);
  }
  if (stage_ == 1) grad_shard1_ = DeviceBuffer(ops, plan_.shard_floats() * kF);
  square_sum_ = DeviceBuffer(ops, sizeof(double));
  if (overlap_.param_gather && sharded_) sharded_->enable_prefetch();
  if (overlap_.grad_reduce) {
    if (stage_ >= 1) {
      // Stage 2's store reduces whole groups (its own plan), not the buckets.
      const size_t chunk = zero2_ ? zero2_->plan().max_chunk_floats() : plan_.max_chunk_floats();
      queue_ = std::make_unique<ReduceScatterQueue>(ops, dp, chunk);
      if (zero2_) zero2_->set_reduce_queue(queue_.get());
      if (sharded_) sharded_->set_reduce_queue(queue_.get());
    }
    if (stage_ <= 1) {
      counter_ = std::make_unique<ReleaseCounter>(*this, *resident_);
      const int tied = head_reads_embeddings(layout) ? 2 : 1;
      expected_.assign(layout.groups.size(), 0);
      for (size_t g = 0; g < layout.groups.size(); ++g) {
        if (plan_.group_chunks(static_cast<int>(g)).empty()) continue;
        expected_[g] = overlap_.micro_batches * (g == 0 ? tied : 1);
      }
      released_.assign(layout.groups.size(), 0);
    }
  }
}

DataParallel::~DataParallel() = default;

ParamStore& DataParallel::store() {
  if (counter_) return *counter_;
  if (sharded_) return *sharded_;
  if (zero2_) return *zero2_;
  return *resident_;
}

DevPtr DataParallel::param_data() const {
  TRIDENT_CHECK(stage_ <= 2);
  return resident_ ? resident_->param_data() : zero2_->param_data();
}

DevPtr DataParallel::grad_shard() const {
  TRIDENT_CHECK(stage_ >= 1);
  if (stage_ == 1) return grad_shard1_.as(DType::kF32);
  return zero2_ ? zero2_->grad_shard() : sharded_->grad_shard();
}

std::pair<size_t, size_t> DataParallel::bucket_range(size_t b) const {
  const std::vector<ShardChunk>& chunks = plan_.chunks();
  auto end_of = [&](size_t i) {
    const TensorShard& last = chunks[i].tensors.back();
    return last.full_offset + static_cast<size_t>(last.split.rows * last.split.row_elems);
  };
  const size_t begin = b == 0 ? 0 : end_of(b - 1);
  const size_t end = b + 1 == chunks.size() ? layout_.total_floats() : end_of(b);
  return {begin, end};
}

void DataParallel::zero_grad() {
  TRIDENT_CHECK_MSG(all_reduces_.empty() && (!queue_ || queue_->in_flight() == 0),
                    "zero_grad() with gradient reductions in flight (reduce_gradients() first)");
  if (resident_) ops_.zero(resident_->grad_data(), resident_->num_floats() * kF);
  if (stage_ >= 1) ops_.zero(grad_shard(), plan_.shard_floats() * kF);
  std::fill(released_.begin(), released_.end(), 0);
  if (sharded_) sharded_->begin_step();
}

void DataParallel::issue_bucket(size_t b) {
  const std::string label = "grad bucket " + std::to_string(b);
  if (stage_ == 0) {
    const auto [begin, end] = bucket_range(b);
    const CommBuf data = CommBuf::device(resident_->grad_data() + begin, end - begin);
    if (overlap_.grad_reduce) {
      all_reduces_.push_back(dp_.iall_reduce(data, ReduceOp::kSum, {.label = label}));
    } else {
      dp_.all_reduce(data, ReduceOp::kSum, {.label = label});
    }
    return;
  }
  // Stage 1: the bucket's owned rows, summed over dp and scaled by 1/dp, into the shard.
  if (overlap_.grad_reduce) {
    queue_->issue(plan_.chunks()[b], resident_->grad_data(), grad_shard(), label);
  } else {
    reduce_scatter_add(ops_, dp_, plan_.chunks()[b], resident_->grad_data(), grad_shard(),
                       collective_.get(), label);
  }
}

void DataParallel::on_backward_release(int group) {
  const size_t g = static_cast<size_t>(group);
  if (expected_[g] == 0) return;  // no buckets (another pipeline stage's group)
  TRIDENT_CHECK_MSG(released_[g] < expected_[g],
                    "group " + std::to_string(group) + " released for backward after its " +
                        std::to_string(expected_[g]) +
                        " releases of the step issued its gradient buckets (micro_batches " +
                        std::to_string(overlap_.micro_batches) + ")");
  if (++released_[g] < expected_[g]) return;
  for (int b : plan_.group_chunks(group)) issue_bucket(static_cast<size_t>(b));
}

void DataParallel::reduce_gradients() {
  const int dp = dp_.size();
  if (sharded_) sharded_->end_step();
  if (stage_ <= 1) {
    if (overlap_.grad_reduce) {
      for (size_t g = 0; g < expected_.size(); ++g) {
        TRIDENT_CHECK_MSG(released_[g] == expected_[g],
                          "group " + std::to_string(g) + ": " + std::to_string(released_[g]) +
                              " backward releases in the step, expected " +
                              std::to_string(expected_[g]));
      }
    } else {
      for (size_t b = 0; b < plan_.chunks().size(); ++b) issue_bucket(b);
    }
  }
  for (CommWork& w : all_reduces_) w.wait();
  all_reduces_.clear();
  if (queue_) queue_->drain();
  if (stage_ == 0 && dp > 1) {
    ops_.scale(resident_->grad_data(), 1.0f / static_cast<float>(dp), resident_->num_floats());
  }
  // Stages 2-3 without overlap: every group was reduced on release(kBackward).
}

double DataParallel::owned_grad_square_sum(bool count_tp_replicated) const {
  if (stage_ == 0 && dp_.rank() != 0) return 0.0;
  const int rank = dp_.rank();
  DevPtr shard = stage_ >= 1 ? grad_shard() : DevPtr();
  const DevPtr acc = square_sum_.as(DType::kF64);
  ops_.zero(acc, sizeof(double));
  // Tensor by tensor in plan order, as the host sum did: the same double result.
  for (const ShardChunk& chunk : plan_.chunks()) {
    for (const TensorShard& t : chunk.tensors) {
      const ParamInfo& info = layout_.params[static_cast<size_t>(t.param)];
      if (info.tied_copy || (info.tp_replicated() && !count_tp_replicated)) continue;
      if (stage_ == 0) {
        ops_.sum_squares_accumulate(acc, resident_->grad_data() + t.full_offset,
                                    static_cast<size_t>(info.numel()));
      } else {
        ops_.sum_squares_accumulate(acc, shard + t.shard_offset, t.split.owned_floats(rank));
      }
    }
  }
  double sum = 0.0;
  ops_.download(&sum, acc, sizeof(double));
  return sum;
}

void DataParallel::scale_gradients(float s) {
  if (stage_ == 0) {
    ops_.scale(resident_->grad_data(), s, resident_->num_floats());
  } else {
    ops_.scale(grad_shard(), s, plan_.shard_floats());
  }
}

void DataParallel::step(float lr) {
  ++step_;
  AdamWParams p;
  p.lr = lr;
  p.beta1 = adamw_.beta1;
  p.beta2 = adamw_.beta2;
  p.eps = adamw_.eps;
  p.step = step_;
  const int rank = dp_.rank();
  DevPtr m = exp_avg_.as(DType::kF32);
  DevPtr v = exp_avg_sq_.as(DType::kF32);
  for (const ShardChunk& chunk : plan_.chunks()) {
    for (const TensorShard& t : chunk.tensors) {
      const ParamInfo& info = layout_.params[static_cast<size_t>(t.param)];
      p.weight_decay = info.decay ? adamw_.weight_decay : 0.0f;
      // In mixed precision AdamW updates the fp32 master and writes the bf16 compute copy
      // of the same elements (fp32: the parameters are the masters, no copy; stage 3:
      // the store casts the masters at each gather, no copy).
      if (stage_ == 0) {
        const size_t off = t.full_offset;
        const DevPtr compute = resident_->param_data() + off;
        ops_.adamw_update(mixed() ? master() + off : compute, resident_->grad_data() + off,
                          m + off, v + off, mixed() ? compute : DevPtr(),
                          static_cast<size_t>(info.numel()), p);
        continue;
      }
      const size_t n = t.split.owned_floats(rank);
      if (n == 0) continue;
      const size_t so = t.shard_offset;
      if (stage_ == 3) {
        ops_.adamw_update(sharded_->param_shard() + so, sharded_->grad_shard() + so, m + so, v + so,
                          DevPtr(), n, p);
        continue;
      }
      const size_t off = t.full_offset + t.split.begin_float(rank);
      DevPtr grad = grad_shard() + so;
      const DevPtr compute = param_data() + off;
      ops_.adamw_update(mixed() ? master() + so : compute, grad, m + so, v + so,
                        mixed() ? compute : DevPtr(), n, p);
    }
  }
  if (stage_ == 1 || stage_ == 2) all_gather_params();
}

void DataParallel::all_gather_params() {
  const int dp = dp_.size();
  const int rank = dp_.rank();
  DevPtr params = param_data();
  const DevPtr pack = collective_.as(compute_);
  const DevPtr segment = pack + static_cast<size_t>(dp) * plan_.max_chunk_floats();
  for (size_t b = 0; b < plan_.chunks().size(); ++b) {
    const ShardChunk& chunk = plan_.chunks()[b];
    // The compute weights travel (bf16 halves this all-gather).
    pack_own(ops_, chunk, rank, params, segment);
    dp_.all_gather(CommBuf::device(segment, chunk.chunk_floats),
                   CommBuf::device(pack, dp * chunk.chunk_floats),
                   {.label = "param bucket " + std::to_string(b)});
    unpack_chunk(ops_, chunk, dp, pack, params);
  }
}

std::vector<float> DataParallel::gather_param(int param) {
  if (sharded_) return sharded_->gather_param(param);
  const ParamInfo& info = layout_.params.at(static_cast<size_t>(param));
  std::vector<float> out(static_cast<size_t>(info.numel()));
  if (!mixed()) {
    ops_.download(out.data(), param_data() + info.offset, out.size() * kF);
  } else if (stage_ == 0) {
    ops_.download(out.data(), master() + info.offset, out.size() * kF);
  } else {
    // Stages 1-2 keep only the owned rows of the masters: all-gather the padded shards.
    const TensorShard& t = plan_.tensor(param);
    const size_t padded = t.split.padded_floats();
    DeviceBuffer mine(ops_, padded * kF);
    DeviceBuffer all(ops_, dp_.size() * padded * kF);
    ops_.copy(mine.get(), master() + t.shard_offset, t.split.owned_floats(dp_.rank()) * kF);
    dp_.all_gather(CommBuf::device(mine.as(DType::kF32), padded),
                   CommBuf::device(all.as(DType::kF32), dp_.size() * padded),
                   {.label = "gather master " + info.name});
    ops_.download(out.data(), all.get(), out.size() * kF);  // padding sits at the end
  }
  return out;
}

void DataParallel::load_param(int param, std::span<const float> host_full) {
  const ParamInfo& info = layout_.params.at(static_cast<size_t>(param));
  TRIDENT_CHECK_MSG(host_full.size() == static_cast<size_t>(info.numel()),
                    "load_param " + info.name + ": " + std::to_string(host_full.size()) +
                        " floats for " + info.local_shape.str());
  if (sharded_) {
    sharded_->load_param(param, host_full.data());
    return;
  }
  // The compute weights (rounded to bf16 in mixed precision), then the masters.
  ops_.upload_floats(param_data() + info.offset, host_full.data(), host_full.size());
  if (!mixed()) return;
  if (stage_ == 0) {
    ops_.upload(master() + info.offset, host_full.data(), host_full.size() * kF);
    return;
  }
  const TensorShard& t = plan_.tensor(param);
  const int rank = dp_.rank();
  ops_.upload(master() + t.shard_offset, host_full.data() + t.split.begin_float(rank),
              t.split.owned_floats(rank) * kF);
}

RowSplit DataParallel::shard_rows(int param) const { return plan_.tensor(param).split; }

DataParallel::GradSlice DataParallel::reduced_grad(int param) {
  const TensorShard& t = plan_.tensor(param);
  const int rank = dp_.rank();
  if (stage_ == 0) {
    return {resident_->grad_data() + t.full_offset,
            static_cast<size_t>(t.split.rows * t.split.row_elems)};
  }
  return {grad_shard() + t.shard_offset, t.split.owned_floats(rank)};
}

DataParallel::OwnedState DataParallel::owned_state(int param) {
  const TensorShard& t = plan_.tensor(param);
  const int rank = dp_.rank();
  OwnedState s;
  DevPtr m = exp_avg_.as(DType::kF32);
  DevPtr v = exp_avg_sq_.as(DType::kF32);
  if (stage_ == 0) {
    s.row_end = t.split.rows;
    s.floats = static_cast<size_t>(t.split.rows * t.split.row_elems);
    s.param = (mixed() ? master() : resident_->param_data()) + t.full_offset;
    s.exp_avg = m + t.full_offset;
    s.exp_avg_sq = v + t.full_offset;
    return s;
  }
  s.row_begin = t.split.row_begin(rank);
  s.row_end = t.split.row_end(rank);
  s.floats = t.split.owned_floats(rank);
  s.param = stage_ == 3 ? sharded_->param_shard() + t.shard_offset
            : mixed()    ? master() + t.shard_offset
                         : param_data() + t.full_offset + t.split.begin_float(rank);
  s.exp_avg = m + t.shard_offset;
  s.exp_avg_sq = v + t.shard_offset;
  return s;
}

DataParallel::Memory DataParallel::memory() const {
  Memory mem;
  const size_t shard = plan_.shard_floats();
  mem.optimizer = exp_avg_.bytes() + exp_avg_sq_.bytes();
  mem.master = mixed() ? (stage_ == 3 ? plan_.shard_floats() * kF : master_.bytes()) : 0;
  mem.comm_scratch = collective_.bytes() + (queue_ ? queue_->scratch_bytes() : 0);
  if (sharded_) {
    const DType compute = sharded_->compute_dtype();
    // bf16 keeps no compute shard (the store casts the masters at each gather).
    mem.params = (compute == DType::kF32 ? shard * kF : 0) + sharded_->param_pool_bytes();
    if (compute != DType::kF32) mem.master = shard * kF;
    mem.grads = shard * kF + sharded_->grad_pool_bytes();
    mem.comm_scratch += sharded_->scratch_bytes() + sharded_->prefetch_bytes();
  } else if (zero2_) {
    mem.params = layout_.total_floats() * dtype_size(zero2_->compute_dtype());
    mem.grads = shard * kF + zero2_->grad_pool_bytes();
    mem.comm_scratch += zero2_->scratch_bytes();
  } else {
    mem.params = resident_->num_floats() * dtype_size(resident_->compute_dtype());
    mem.grads = resident_->num_floats() * kF + grad_shard1_.bytes();
  }
  mem.params_peak = mem.params;
  mem.grads_peak = mem.grads;
  return mem;
}

void DataParallel::reset_memory_peak() {
  if (sharded_) sharded_->reset_peak();
  if (zero2_) zero2_->reset_peak();
}

}  // namespace trident
