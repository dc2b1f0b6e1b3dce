#include "core/memory.h"

#include <gtest/gtest.h>

#include "core/device_access.h"

namespace trident {
namespace {

TEST(DevPtr, OffsetsCountElementsOfItsDtype) {
  alignas(8) unsigned char bytes[64] = {};
  const DevPtr f = DevPtr::wrap(bytes, DType::kF32);
  EXPECT_EQ(static_cast<unsigned char*>((f + 3).raw()), bytes + 12);
  EXPECT_EQ(static_cast<unsigned char*>((f.as(DType::kBF16) + 3).raw()), bytes + 6);
  EXPECT_EQ(static_cast<unsigned char*>(f.byte_offset(5).raw()), bytes + 5);
  EXPECT_EQ((f + 3).dtype(), DType::kF32);
  EXPECT_TRUE((DevPtr() + 7).is_null());
  EXPECT_EQ(f.raw_as<float>(), reinterpret_cast<float*>(bytes));
}

TEST(DevPtrDeathTest, ReadingAsTheWrongDtypeFailsNamingBoth) {
  float x = 0;
  const DevPtr p = DevPtr::wrap(&x, DType::kBF16);
  EXPECT_DEATH((void)p.raw_as<float>(), "dtype bf16 used as f32");
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kF64), 8u);
  EXPECT_EQ(dtype_size(DType::kI64), 8u);
  EXPECT_EQ(dtype_size(DType::kU8), 1u);
  EXPECT_STREQ(dtype_name(DType::kBF16), "bf16");
  EXPECT_TRUE(is_float_dtype(DType::kBF16));
  EXPECT_FALSE(is_float_dtype(DType::kI32));
}

struct CountingHook final : DeviceAccessHook {
  int opens = 0, closes = 0;
  void open() override { ++opens; }
  void close() override { ++closes; }
  bool is_device_range(const void*, size_t) const override { return false; }
};

TEST(DeviceAccessScope, OpensAndClosesTheInstalledHookOnly) {
  { DeviceAccessScope none; }  // no hook: nothing happens
  CountingHook hook;
  set_device_access_hook(&hook);
  {
    DeviceAccessScope scope;
    EXPECT_EQ(hook.opens, 1);
    EXPECT_EQ(hook.closes, 0);
  }
  set_device_access_hook(nullptr);
  EXPECT_EQ(hook.closes, 1);
}

}  // namespace
}  // namespace trident
