// An exclusive lock on a checkpoint root, so that two runs never write one directory (a
// requeued job racing the old job's last step, a run started twice): each would delete
// the other's checkpoints through retention and crash-leftover cleanup.
//
// The lock is flock(2) on <root>/.trident.lock, held for the lifetime of the DirLock by
// the rank that commits (rank 0). The kernel drops it when the holder dies however it
// dies (kill -9, node reboot on a shared file system that supports flock), so a stale
// lock never blocks a requeue; the file itself stays and only describes the last holder
// (host, pid, start time), for the message the next contender prints.
//
// Move-only; not thread-safe (one owner).
#pragma once

#include <string>

#include "core/status.h"

namespace trident {

inline constexpr char kLockName[] = ".trident.lock";

class DirLock {
 public:
  DirLock() = default;
  ~DirLock();
  DirLock(DirLock&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }
  DirLock& operator=(DirLock&& other) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

  // Creates root when missing and takes the lock without waiting. Held by another
  // process: invalid_config naming root and the holder ("host h1, pid 4242, since
  // 2026-12-01T10:00:00Z"); any other failure: io_error naming the lock file.
  static Result<DirLock> acquire(const std::string& root);

  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace trident
