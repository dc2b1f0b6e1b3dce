// The CUDA kernels of the mixture-of-experts ops (kernels/ops.h, "Mixture-of-experts
// routing and dispatch"), in moe.cu, with cuda_kernels.h's conventions: launchers enqueue
// on the stream and check the launch, F arguments are widened on load and rounded once
// on store, and every output element is written by one thread in a fixed order (no
// atomics), so results are deterministic. Simple kernels: a thread per token row for the
// router, one thread for the counting sort of the dispatch (a sync-free but serial
// pass; a parallel scan is the later optimisation), a thread per element elsewhere.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"

namespace trident::cuda {

void moe_route_forward(float* weights, int32_t* experts, float* probs, float* lse, float* stats,
                       FArg logits, int N, int E, int K, Stream s);
void moe_route_backward(FArg dlogits, const float* dweights, const float* weights,
                        const float* probs, const float* lse, const int32_t* experts,
                        const float* prob_grad, float z_scale, int N, int E, int K, Stream s);
void moe_dispatch(int32_t* order, int32_t* position, const int32_t* experts, int N, int K,
                  int E, Stream s);
void moe_gather_forward(FArg out, FArg inp, const int32_t* order, int N, int K, int C, Stream s);
void moe_gather_backward(FArg dinp, FArg dout, const int32_t* position, int N, int K, int C,
                         Stream s);
void moe_combine_forward(FArg out, FArg inp, const float* weights, const int32_t* position, int N,
                         int K, int C, Stream s);
void moe_combine_backward(FArg dinp, float* dweights, FArg dout, FArg inp, const float* weights,
                          const int32_t* position, int N, int K, int C, Stream s);

}  // namespace trident::cuda
