// The memory of torchtitan's op-level selective checkpointing (SelectiveReruns::
// kTorchtitanOp, plan/memory_plan.h): a model of that trainer's policy, so it is held to
// a count by hand from the policy as torchtitan's source states it
// (torchtitan/parallelisms/parallelize_llama.py, April 2024: every TransformerBlock
// saves the outputs of aten.mm "except every second mm", of the SDPA and of
// _c10d_functional.reduce_scatter_tensor; everything else is rerun), not to Trident's
// allocations.
#include <gtest/gtest.h>

#include <string>

#include "config/config.h"
#include "plan/memory_plan.h"
#include "plan/plan.h"
#include "tests/model/tiny_config.h"

namespace trident {
namespace {

// A bf16 llama (SwiGLU, RMSNorm, grouped-query attention) whose every buffer is a
// multiple of 64 bytes, so that the hand count needs no arena alignment: B = 2, T = 32
// (N = 64 tokens), C = 64, 4 heads of 16, 2 kv heads, F = 192, vocabulary 256, 4 layers.
Config llama_config(int tp, bool sp, Recompute recompute) {
  Config c;
  c.model = testing::tiny_model(Arch::kLlama, {.vocab_size = 256, .seq_len = 32, .n_layers = 4,
                                               .n_heads = 4, .d_model = 64, .d_ff = 192});
  c.training.precision = Precision::kBf16;
  c.training.recompute = recompute;
  c.parallel.tp = tp;
  c.parallel.sequence_parallel = sp;
  c.parallel.micro_batch_size = 2;
  c.training.global_batch_size = 2;
  c.data.train = "unused";
  EXPECT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
  return c;
}

RankMemory plan(const Config& c, SelectiveReruns reruns) {
  ModelPartition part;
  part.tp_size = c.parallel.tp;
  part.pp_size = 1;
  part.layer_end = c.model.n_layers;
  part.sequence_parallel = c.parallel.sequence_parallel;
  return estimate_rank_memory(c, part, 0, gpu_attention_state_bytes, reruns);
}

// By hand, per layer (tp t, bf16: 2 bytes): the block's mms in forward order are wq (1),
// wk (2), wv (3), wo (4), w1 (5), w3 (6), w2 (7), so wq's [N, 64/t], wv's [N, 32/t], w1's
// [N, 192/t] and w2's partial [N, 64] are saved; the SDPA's output [N, 64/t] and its
// log-sum-exp [B, 4/t, T] in f32; under sequence parallelism the reduce-scatters of wo and
// w2, [N/t, 64] each. Besides, per slot: the block inputs and the last block's output
// (5 x [n, 64], n = N/t under sequence parallelism) and the head's buffers (tokens and
// targets i32 [N], the final norm's output [N, 64] and its f32 rstd [n], torchtitan's f32
// logits [N, 256/t], the f32 losses [N] and cross-entropy statistics [3N]). One slot (one
// micro-batch per step, one stage).
TEST(TorchtitanOpMemory, ActivationsAreWhatThePolicySavesCountedByHand) {
  for (const auto& [tp, sp] : {std::pair{1, false}, std::pair{2, false}, std::pair{2, true}}) {
    const Config c = llama_config(tp, sp, Recompute::kSelective);
    const double N = 64, B = 2, T = 32, t = tp, n = sp ? N / t : N, L = 4;
    const double layer = 2 * (N * 64 / t + N * 32 / t + N * 192 / t + N * 64 + N * 64 / t) +
                         4 * (B * (4 / t) * T) + (sp ? 2 * 2 * (N / t * 64) : 0);
    const double residual = (L + 1) * 2 * n * 64;
    const double head = 4 * N + 4 * N + 2 * N * 64 + 4 * n + 4 * N * 256 / t + 4 * N + 4 * 3 * N;
    const RankMemory m = plan(c, SelectiveReruns::kTorchtitanOp);
    EXPECT_DOUBLE_EQ(m.activations, L * layer + residual + head) << "tp " << tp << " sp " << sp;
    // Backward reruns one block at a time with all of its tensors: full recomputation's
    // working set, the rest as Trident counts it.
    const RankMemory full =
        plan(llama_config(tp, sp, Recompute::kFull), SelectiveReruns::kAttentionCore);
    EXPECT_EQ(m.scratch, full.scratch) << "tp " << tp << " sp " << sp;
    EXPECT_EQ(m.params + m.master + m.grads + m.optimizer + m.comm_buffers,
              full.params + full.master + full.grads + full.optimizer + full.comm_buffers);
  }
}

// The policy keeps less than Trident's selective (which keeps every layer buffer but the
// attention state) and more than full recomputation (the block inputs alone).
TEST(TorchtitanOpMemory, KeepsLessThanTridentsSelectiveAndMoreThanFull) {
  for (const auto& [tp, sp] : {std::pair{1, false}, std::pair{2, true}}) {
    const Config selective = llama_config(tp, sp, Recompute::kSelective);
    const double op = plan(selective, SelectiveReruns::kTorchtitanOp).activations;
    const double trident = plan(selective, SelectiveReruns::kAttentionCore).activations;
    const double full =
        plan(llama_config(tp, sp, Recompute::kFull), SelectiveReruns::kTorchtitanOp).activations;
    EXPECT_LT(op, trident) << "tp " << tp;
    EXPECT_GT(op, full) << "tp " << tp;
    // The policy applies to selective recomputation only: full and none are Trident's.
    const Config none = llama_config(tp, sp, Recompute::kNone);
    EXPECT_EQ(plan(none, SelectiveReruns::kTorchtitanOp).total,
              plan(none, SelectiveReruns::kAttentionCore).total);
  }
}

}  // namespace
}  // namespace trident
