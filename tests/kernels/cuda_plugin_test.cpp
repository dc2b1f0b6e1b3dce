// The CUDA backend plugin's loader (kernels/cuda_plugin.h): where it looks, and every way a
// library is refused, each naming the path and the reason. The fakes
// (fake_cuda_plugin.cpp) claim another ABI, another interface stamp, or this build's.
#include "kernels/cuda_plugin.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace trident {
namespace {

std::string fake(const char* name) {
  return std::string(TRIDENT_BINARY_DIR) + "/tests/libfake_cuda_plugin_" + name + ".so";
}

std::string open_error(const std::string& path) {
  Result<CudaPluginLibrary> library = open_cuda_plugin(path);
  EXPECT_FALSE(library.is_ok()) << path << " was accepted";
  return library.is_ok() ? "" : library.status().message();
}

TEST(CudaPlugin, IsLookedForBesideTheExecutableUnlessTheEnvironmentNamesOne) {
  const char* saved = std::getenv(kCudaPluginEnv);
  const std::string keep = saved != nullptr ? saved : "";
  unsetenv(kCudaPluginEnv);
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
  EXPECT_EQ(cuda_plugin_path(), (exe.parent_path() / "libtrident_cuda.so").string());
  setenv(kCudaPluginEnv, "/somewhere/else/libtrident_cuda.so", 1);
  EXPECT_EQ(cuda_plugin_path(), "/somewhere/else/libtrident_cuda.so");
  EXPECT_FALSE(cuda_plugin_file_exists());
  setenv(kCudaPluginEnv, "", 1);  // empty is unset
  EXPECT_EQ(cuda_plugin_path(), (exe.parent_path() / "libtrident_cuda.so").string());
  if (saved != nullptr) {
    setenv(kCudaPluginEnv, keep.c_str(), 1);
  } else {
    unsetenv(kCudaPluginEnv);
  }
}

TEST(CudaPlugin, AMissingFileNamesThePathAndDlerror) {
  const std::string m = open_error("/nonexistent/libtrident_cuda.so");
  EXPECT_NE(m.find("cannot load /nonexistent/libtrident_cuda.so: "), std::string::npos) << m;
  EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
}

TEST(CudaPlugin, ALibraryWithoutTheEntryPointIsRefused) {
  // Any shared library that is not a plugin: the C library's math library.
  const std::string m = open_error("libm.so.6");
  EXPECT_NE(m.find("libm.so.6 has no trident_cuda_plugin_v1"), std::string::npos) << m;
}

TEST(CudaPlugin, AnotherAbiIsRefusedNamingBothVersions) {
  const std::string m = open_error(fake("abi"));
  EXPECT_NE(m.find(fake("abi") + " has plugin ABI 999, this trident expects " +
                   std::to_string(kCudaPluginAbiVersion)),
            std::string::npos)
      << m;
}

TEST(CudaPlugin, OtherHeadersAreRefusedNamingBothStamps) {
  const std::string m = open_error(fake("stamp"));
  EXPECT_NE(m.find(fake("stamp") + " was built from other Trident headers (interface "
                                   "0123456789abcdef, this trident " +
                   cuda_plugin_interface_stamp() + ")"),
            std::string::npos)
      << m;
  EXPECT_EQ(std::string(cuda_plugin_interface_stamp()).size(), 16u);
}

TEST(CudaPlugin, AMatchingPluginLoadsAndItsTableIsCalled) {
  Result<CudaPluginLibrary> library = open_cuda_plugin(fake("good"));
  ASSERT_TRUE(library.is_ok()) << library.status().message();
  EXPECT_EQ(library->path, fake("good"));
  EXPECT_NE(cuda_plugin_symbol(*library, kCudaPluginEntry), nullptr);
  EXPECT_EQ(cuda_plugin_symbol(*library, "no_such_entry"), nullptr);
  Result<int> count = library->table->device_count();
  ASSERT_FALSE(count.is_ok());
  EXPECT_EQ(count.status().message(), "cudaGetDeviceCount: fake plugin, no device");
}

}  // namespace
}  // namespace trident
