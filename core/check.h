// Always-on checks for programming and device errors. They print the failed statement,
// the rank, the host and file:line, then abort. Expected failures (config, files, data)
// return a Status instead (core/status.h).
#pragma once

#include <string>

namespace trident {

// Who this process is, for messages. Set once at start-up by the launcher code
// (cli/main.cpp, parallel/); read-only afterwards.
struct ProcessIdentity {
  int rank = 0;
  int world_size = 1;
};
void set_process_identity(const ProcessIdentity& identity);
const ProcessIdentity& process_identity();

[[noreturn]] void check_failed(const char* statement, const std::string& message, const char* file,
                               int line);

}  // namespace trident

#define TRIDENT_CHECK(cond)                                             \
  do {                                                                  \
    if (!(cond)) ::trident::check_failed(#cond, "", __FILE__, __LINE__); \
  } while (0)

// TRIDENT_CHECK_MSG(n > 0, "n=" + std::to_string(n))
#define TRIDENT_CHECK_MSG(cond, msg)                                       \
  do {                                                                     \
    if (!(cond)) ::trident::check_failed(#cond, (msg), __FILE__, __LINE__); \
  } while (0)
