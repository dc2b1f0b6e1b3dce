// The model presets of the CPU benchmarks (bench_model, bench_gemm, bench_checkpoint):
// GPT-2 shapes, byte vocabulary, and the micro-batch of one training step; and the
// mixture-of-experts models bench_model compares with them.
// bench/torch_model.py's PRESETS are the same two models for PyTorch.
#pragma once

namespace trident::bench {

struct Preset {
  const char* name;
  int n_layers, n_heads, d_model, seq_len, micro_batch, vocab;
};
inline constexpr Preset kPresets[] = {
    {"small", 4, 4, 128, 64, 4, 256},
    {"medium", 6, 6, 384, 256, 4, 256},
};

// Mixture-of-experts models (bench_model --preset moe only; the other benchmarks take the
// dense presets): each the shape of its dense preset with every layer's MLP replaced by
// `experts` GELU experts of hidden width `expert_d_ff`, `top_k` of them per token, so that
// the active FLOPs per token equal the dense model's plus the router (top_k * expert_d_ff
// = 4 * d_model, the dense MLP's width).
struct MoePreset {
  Preset shape;
  int experts, top_k, expert_d_ff;
  const char* dense;  // the kPresets entry it is compared with
};
inline constexpr MoePreset kMoePresets[] = {
    {{"medium_moe", 6, 6, 384, 256, 4, 256}, 8, 2, 768, "medium"},
};

}  // namespace trident::bench
