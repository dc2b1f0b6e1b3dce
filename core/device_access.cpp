#include "core/device_access.h"

#include <atomic>

namespace trident {
namespace {
std::atomic<DeviceAccessHook*> g_hook{nullptr};
}  // namespace

void set_device_access_hook(DeviceAccessHook* hook) { g_hook.store(hook); }
DeviceAccessHook* device_access_hook() { return g_hook.load(std::memory_order_acquire); }

}  // namespace trident
