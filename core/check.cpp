#include "core/check.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace trident {

namespace {
ProcessIdentity g_identity;  // written once before any worker thread starts
}

void set_process_identity(const ProcessIdentity& identity) { g_identity = identity; }
const ProcessIdentity& process_identity() { return g_identity; }

void check_failed(const char* statement, const std::string& message, const char* file, int line) {
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "[rank %d on %s] CHECK failed: %s %s at %s:%d\n", g_identity.rank, host,
               statement, message.c_str(), file, line);
  std::fflush(stderr);
  std::abort();
}

}  // namespace trident
