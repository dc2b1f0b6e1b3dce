#include "checkpoint/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "checkpoint/durable_io.h"

namespace trident {

namespace {

std::string holder_description() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  char when[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return std::string("host ") + host + ", pid " + std::to_string(getpid()) + ", since " + when;
}

}  // namespace

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

DirLock& DirLock::operator=(DirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

Result<DirLock> DirLock::acquire(const std::string& root) {
  TRIDENT_RETURN_IF_ERROR(make_dirs(root));
  DirLock lock;
  lock.path_ = root + "/" + kLockName;
  lock.fd_ = ::open(lock.path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock.fd_ < 0) {
    return Status::io_error(lock.path_ + ": cannot open the lock file: " + std::strerror(errno));
  }
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err != EWOULDBLOCK) {
      return Status::io_error(lock.path_ + ": flock: " + std::strerror(err));
    }
    std::string holder;
    read_whole_file(lock.path_, &holder);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return Status::invalid_config(
        "checkpoint.dir " + root + " is in use by another Trident run (" +
        (holder.empty() ? std::string("holder unknown") : holder) +
        "); two runs writing one checkpoint directory would delete each other's checkpoints. "
        "Wait for it to end, stop it, or use another checkpoint.dir");
  }
  // Describe the holder for the next contender (best effort: the lock is what counts).
  const std::string text = holder_description() + "\n";
  if (::ftruncate(lock.fd_, 0) == 0) {
    ssize_t ignored = ::pwrite(lock.fd_, text.data(), text.size(), 0);
    (void)ignored;
  }
  return lock;
}

}  // namespace trident
