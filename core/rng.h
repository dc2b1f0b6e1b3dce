// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A value depends only
// on (key, counter), never on call order, so any process can draw any element of a
// global tensor: initial weights depend on (seed, parameter name, element index) and
// not on how the tensor is split across ranks.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace trident {

// Four 32-bit words of randomness for a 128-bit counter under a 64-bit key.
std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// 64-bit hash of a name (xxHash64), for keying streams by parameter name.
uint64_t hash_name(std::string_view name);

// Mixes a seed and a stream id into one Philox key.
uint64_t rng_key(uint64_t seed, uint64_t stream);

// Uniform in (0, 1) for element `index` of stream `key`.
double uniform_at(uint64_t key, uint64_t index);

// Standard normal for element `index` of stream `key` (Box-Muller on one Philox block).
float normal_at(uint64_t key, uint64_t index);

// Uniform integer in [0, bound) for element `index` (bound > 0); bias below 2^-32.
uint64_t uniform_int_at(uint64_t key, uint64_t index, uint64_t bound);

}  // namespace trident
