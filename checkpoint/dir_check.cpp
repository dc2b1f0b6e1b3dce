#include "checkpoint/dir_check.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace trident {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

Status fail(const std::string& dir, const std::string& reason) {
  return Status::invalid_config("checkpoint.dir " + dir + ": " + reason);
}

// mkdir -p of `path` (no trailing slash), naming the component that is in the way.
Status create_dirs(const std::string& dir, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    return S_ISDIR(st.st_mode) ? Status::ok() : fail(dir, "not a directory");
  }
  for (size_t pos = path.find('/', 1); ; pos = path.find('/', pos + 1)) {
    const std::string prefix = path.substr(0, pos);
    if (prefix.back() != '/') {  // skip the empty component of "a//b"
      if (::stat(prefix.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
          return fail(dir, "cannot create: " + prefix + " is not a directory");
        }
      } else if (errno != ENOENT) {
        return fail(dir, "cannot access " + prefix + ": " + errno_text(errno));
      } else if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) {
        // EEXIST: another rank created it between the stat and the mkdir.
        return fail(dir, "cannot create " + prefix + ": " + errno_text(errno));
      }
    }
    if (pos == std::string::npos) return Status::ok();
  }
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

Status check_checkpoint_dir_writable(const std::string& dir) {
  if (dir.empty()) return Status::invalid_config("checkpoint.dir: must not be empty");
  std::string path = dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  TRIDENT_RETURN_IF_ERROR(create_dirs(dir, path));
  const std::string probe = path + "/" + kCheckpointProbePrefix + host_name() + "-" +
                            std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return fail(dir, "not writable: cannot create " + probe + ": " + errno_text(errno));
  // One byte, so a full filesystem shows up too, not only missing permission.
  const char byte = 0;
  const bool wrote = ::write(fd, &byte, 1) == 1;
  const int write_errno = errno;
  const bool closed = ::close(fd) == 0;
  const int close_errno = errno;
  const bool removed = ::unlink(probe.c_str()) == 0;
  const int unlink_errno = errno;
  auto not_writable = [&](const char* what, int err) {
    return fail(dir, std::string("not writable: cannot ") + what + " " + probe + ": " +
                         errno_text(err));
  };
  if (!wrote) return not_writable("write", write_errno);
  if (!closed) return not_writable("close", close_errno);
  if (!removed) return not_writable("remove", unlink_errno);
  return Status::ok();
}

}  // namespace trident
