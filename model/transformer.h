// Transformer: a decoder-only language model with explicit forward and backward,
// for the gpt2 and llama families of model/config.h.
//
// Parameters live in ONE contiguous buffer (and gradients in a second one of the
// same layout) described by a table of (name, global shape, offset). The names are
// the contract with checkpoints, the llm.c loader and the PyTorch reference
// (tests/reference/make_fixtures.py):
//
//   wte                     (Vp, C)      token embedding; also the LM head when tied
//   wpe                     (maxT, C)    gpt2 only: learned positions
//   layers.{i}.ln1.weight   (C)          gpt2 LayerNorm / llama RMSNorm before attention
//   layers.{i}.ln1.bias     (C)          gpt2 only
//   layers.{i}.attn.q.weight (NH*HD, C)  layers.{i}.attn.q.bias (NH*HD)   [bias: gpt2]
//   layers.{i}.attn.k.weight (NKV*HD, C) layers.{i}.attn.k.bias (NKV*HD)  [bias: gpt2]
//   layers.{i}.attn.v.weight (NKV*HD, C) layers.{i}.attn.v.bias (NKV*HD)  [bias: gpt2]
//   layers.{i}.attn.o.weight (C, NH*HD)  layers.{i}.attn.o.bias (C)       [bias: gpt2]
//   layers.{i}.ln2.weight   (C)          layers.{i}.ln2.bias (C)           [bias: gpt2]
//   gpt2:  layers.{i}.mlp.fc.weight (F, C), mlp.fc.bias (F), mlp.proj.weight (C, F),
//          mlp.proj.bias (C)
//   llama: layers.{i}.mlp.gate.weight (F, C), mlp.up.weight (F, C), mlp.down.weight (C, F)
//   lnf.weight (C), lnf.bias (C, gpt2 only)   final norm
//   lm_head.weight          (Vp, C)      untied models only
//
// Initialisation (init_weights): every matrix and embedding ~ N(0, init_std), the
// residual output projections (attn.o, mlp.proj, mlp.down) ~ N(0, init_std/sqrt(2L)),
// biases 0, norm weights 1, padded vocabulary rows 0. Element i of parameter P is drawn
// from Philox keyed by (seed, hash(P)) at counter i: the same global weights for every
// layout. Weight decay applies to 2-D parameters only (param_decays()).
//
// Threading: one Transformer per thread of control; all compute goes through the Ops.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/config.h"

namespace trident {

struct ParamInfo {
  std::string name;
  Shape shape;        // global shape
  size_t offset = 0;  // in floats, into the parameter (and gradient) buffer
  bool decay = false; // AdamW weight decay applies (2-D tensors)
  int64_t numel() const { return shape.numel(); }
};

class Transformer {
 public:
  // Allocates parameters, gradients and activations for micro-batches of up to
  // `micro_batch_size` sequences of config.seq_len tokens. config must be finalized.
  Transformer(const TransformerConfig& config, Ops& ops, int micro_batch_size);
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const TransformerConfig& config() const { return config_; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo* find_param(std::string_view name) const;
  size_t num_param_floats() const { return num_param_floats_; }
  size_t activation_bytes() const { return activations_.bytes(); }

  float* param_data() { return param_buffer_.as<float>(); }  // device memory
  float* grad_data() { return grad_buffer_.as<float>(); }    // device memory

  void init_weights(uint64_t seed);
  // Copies one parameter from / to host memory (numel floats, row-major global shape).
  void set_param(const ParamInfo& param, const float* host);
  void get_param(const ParamInfo& param, float* host) const;
  // Whole buffers to and from the host, in params() layout.
  std::vector<float> params_to_host() const;
  std::vector<float> grads_to_host() const;
  void params_from_host(const std::vector<float>& host);

  // Forward of B sequences of T tokens (host arrays of B*T token ids; B <= the
  // micro-batch size, T <= seq_len). With targets, computes per-token losses and
  // returns their mean; without (nullptr), only the logits and returns 0.
  float forward(const int32_t* tokens, const int32_t* targets, int B, int T);
  // Backward of the last forward (which must have had targets): accumulates into the
  // gradient buffer the gradient of loss_scale * mean(token losses).
  void backward(float loss_scale);
  void zero_grads();

  // Logits of the last forward, [B, T, Vp] on the host (padded columns included).
  std::vector<float> logits_to_host() const;

 private:
  struct LayerParams;
  struct LayerActs;
  void build_param_table();
  void plan_activations();
  LayerParams layer_params(int layer, float* base) const;
  LayerActs layer_acts(int layer) const;
  void layer_forward(int layer, const float* x_in, float* x_out, int B, int T);
  void layer_backward(int layer, const float* x_in, float* dx, int B, int T);

  TransformerConfig config_;
  Ops& ops_;
  int micro_batch_size_;
  std::vector<ParamInfo> params_;
  size_t num_param_floats_ = 0;
  DeviceBuffer param_buffer_;
  DeviceBuffer grad_buffer_;
  DeviceBuffer activations_;
  Arena act_arena_;
  std::vector<size_t> act_offsets_;  // see plan_activations()
  int last_B_ = 0;
  int last_T_ = 0;
  bool last_had_targets_ = false;
};

}  // namespace trident
