// Tensor vocabulary: element types, shapes (row-major, contiguous), bf16 storage, and
// the Arena that plans slices of one allocation. Storage is owned elsewhere: an Arena
// slice (parameters, gradients, activations) or a backend buffer (kernels/ops.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

namespace trident {

// The element types of docs/ARCHITECTURE.md "Memory, dtypes and streams" (the checkpoint manifest's
// spellings: dtype_name). f32, bf16 and i32 are tensor types; f64 is the device
// accumulators' (loss, sum of squares), i64 a host counter's, u8 raw bytes (opaque state,
// strings, records).
enum class DType : uint8_t { kF32, kBF16, kI32, kF64, kI64, kU8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
// f32 or bf16: the types a compute argument ("F" in kernels/ops.h) may have.
inline bool is_float_dtype(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t numel() const;
  std::string str() const;  // "(768, 3072)"
  bool operator==(const Shape& other) const = default;

 private:
  std::vector<int64_t> dims_;
};

// bfloat16 storage: the upper 16 bits of an fp32, rounded to nearest even.
using bf16_t = uint16_t;
inline bf16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<bf16_t>((bits >> 16) | 0x40u);  // keep NaN a NaN
  }
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<bf16_t>((bits + rounding) >> 16);
}
inline float bf16_to_float(bf16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <class T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::kF32; }
template <> constexpr DType dtype_of<bf16_t>() { return DType::kBF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::kI32; }
template <> constexpr DType dtype_of<double>() { return DType::kF64; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kI64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::kU8; }
template <> constexpr DType dtype_of<std::byte>() { return DType::kU8; }

// Plans slices of one contiguous allocation: reserve() hands out aligned offsets,
// the owner allocates total_bytes() once (on any device) and resolves offsets to
// pointers with at(). Parameters, gradients and activations each live in one arena,
// so a whole group can be zeroed, copied or reduced as one buffer.
class Arena {
 public:
  static constexpr size_t kAlignment = 64;
  // Returns the byte offset of a new slice of `bytes`.
  size_t reserve(size_t bytes);
  size_t total_bytes() const { return total_; }
  void bind(void* base) { base_ = static_cast<char*>(base); }
  void* base() const { return base_; }
  template <typename T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(base_ + offset);
  }

 private:
  size_t total_ = 0;
  char* base_ = nullptr;
};

}  // namespace trident
