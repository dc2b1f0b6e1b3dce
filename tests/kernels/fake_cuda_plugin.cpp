// Stand-ins for libtrident_cuda.so, for tests/kernels/cuda_plugin_test.cpp: the same
// entry point and table, with no CUDA inside. Built three times (CMakeLists.txt):
// FAKE_PLUGIN_ABI and FAKE_PLUGIN_STAMP pick what the table claims; the "good" one claims
// this build's ABI and stamp, so the loader accepts it. Its device_count says there is no
// device, and make_ops must never be called.
#include <cstdlib>

#include "core/status.h"
#include "kernels/cuda_plugin.h"
#include "trident_plugin_stamp.h"

namespace {

trident::Result<int> no_device() {
  return trident::Status::internal("cudaGetDeviceCount: fake plugin, no device");
}

trident::Result<std::unique_ptr<trident::Ops>> never(int) { std::abort(); }

const trident::TridentCudaPlugin kTable{
    .abi_version = FAKE_PLUGIN_ABI,
    .interface_stamp = FAKE_PLUGIN_STAMP,
    .device_count = no_device,
    .make_ops = never,
};

}  // namespace

extern "C" const trident::TridentCudaPlugin* trident_cuda_plugin_v1() { return &kTable; }
