// The model presets of the CPU benchmarks (bench_model, bench_gemm, bench_checkpoint):
// GPT-2 shapes, byte vocabulary, and the micro-batch of one training step.
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

}  // namespace trident::bench
