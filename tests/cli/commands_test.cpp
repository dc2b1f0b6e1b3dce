// run_guarded (cli/commands.h): an exception escaping a command becomes exit 1 with
// a message, never std::terminate's abort.
#include "cli/commands.h"

#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <vector>

namespace trident {
namespace {

TEST(RunGuarded, PassesTheExitCodeThrough) {
  EXPECT_EQ(run_guarded([] { return 0; }), 0);
  EXPECT_EQ(run_guarded([] { return 3; }), 3);
}

TEST(RunGuarded, LibraryExceptionIsExit1WithItsMessage) {
  ::testing::internal::CaptureStderr();
  const int code = run_guarded([]() -> int {
    std::vector<int> v;
    return v.at(5);  // std::out_of_range from the standard library
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err.rfind("trident: internal error: ", 0), 0u) << err;
  EXPECT_NE(err.find("vector"), std::string::npos) << err;  // what() names the container
}

TEST(RunGuarded, BadAllocIsExit1OutOfMemory) {
  ::testing::internal::CaptureStderr();
  const int code = run_guarded([]() -> int { throw std::bad_alloc(); });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err.rfind("trident: out of memory (std::bad_alloc", 0), 0u) << err;
}

TEST(RunGuarded, UnknownExceptionIsExit1) {
  ::testing::internal::CaptureStderr();
  const int code = run_guarded([]() -> int { throw 42; });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_EQ(err, "trident: internal error: unknown exception\n");
}

}  // namespace
}  // namespace trident
