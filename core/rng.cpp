#include "core/rng.h"

#include <xxhash.h>

#include <cmath>

namespace trident {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u;
constexpr uint32_t kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}
}  // namespace

std::array<uint32_t, 4> philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c0, hi0, lo0);
    mulhilo(kMul1, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

uint64_t hash_name(std::string_view name) { return XXH64(name.data(), name.size(), 0); }

uint64_t rng_key(uint64_t seed, uint64_t stream) {
  uint64_t words[2] = {seed, stream};
  return XXH64(words, sizeof(words), 0x7472696465ull);
}

namespace {
// 53-bit uniform in (0, 1) from two words.
inline double to_unit(uint32_t a, uint32_t b) {
  uint64_t bits = (static_cast<uint64_t>(a) << 21) ^ (b >> 11);
  bits &= (1ull << 53) - 1;
  return (static_cast<double>(bits) + 0.5) / 9007199254740992.0;
}
}  // namespace

double uniform_at(uint64_t key, uint64_t index) {
  auto r = philox4x32(key, 0, index);
  return to_unit(r[0], r[1]);
}

float normal_at(uint64_t key, uint64_t index) {
  auto r = philox4x32(key, 1, index);
  double u1 = to_unit(r[0], r[1]);
  double u2 = to_unit(r[2], r[3]);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint64_t uniform_int_at(uint64_t key, uint64_t index, uint64_t bound) {
  auto r = philox4x32(key, 2, index);
  uint64_t x = (static_cast<uint64_t>(r[0]) << 32) | r[1];
  return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * bound) >> 64);
}

}  // namespace trident
