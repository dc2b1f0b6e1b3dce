#include "comm/nccl/nccl_bootstrap.h"

#include <nccl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <thread>

#include "core/check.h"
#include "core/timer.h"

namespace trident {

namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "NCCL's unique id is 128 bytes");

std::string nccl_error(ncclResult_t r) {
  return std::string(ncclGetErrorString(r)) + " (" + std::to_string(static_cast<int>(r)) + ")";
}

Result<NcclUniqueId> make_unique_id() {
  ncclUniqueId raw;
  const ncclResult_t r = ncclGetUniqueId(&raw);
  if (r != ncclSuccess) {
    return Status::internal("ncclGetUniqueId failed: " + nccl_error(r) + ": " +
                            ncclGetLastError(nullptr));
  }
  NcclUniqueId id;
  std::memcpy(id.data(), raw.internal, id.size());
  return id;
}

}  // namespace

Result<NcclUniqueId> share_nccl_unique_id(Communicator& host) {
  TRIDENT_CHECK_MSG(host.space() == MemSpace::kHost,
                    "share_nccl_unique_id needs a host communicator, got '" + host.name() + "'");
  NcclUniqueId id{};
  // Rank 0's outcome goes first, so a failure there is every rank's failure, not a hang.
  int ok = 1;
  if (host.rank() == 0) {
    Result<NcclUniqueId> made = make_unique_id();
    ok = made.is_ok() ? 1 : 0;
    host.broadcast(CommBuf::host(std::span<int>(&ok, 1)), 0, {.label = "nccl id status"});
    if (!made.is_ok()) return made.status();
    id = made.value();
  } else {
    host.broadcast(CommBuf::host(std::span<int>(&ok, 1)), 0, {.label = "nccl id status"});
    if (!ok) return Status::internal("rank 0 could not make the NCCL unique id (see its log)");
  }
  host.broadcast(CommBuf::host(std::span<std::byte>(id)), 0, {.label = "nccl unique id"});
  return id;
}

Result<NcclUniqueId> rendezvous_nccl_unique_id(const std::string& dir, const std::string& job,
                                               int rank, std::chrono::milliseconds timeout) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / ("nccl_id." + job);
  if (rank == 0) {
    Result<NcclUniqueId> made = make_unique_id();
    if (!made.is_ok()) return made.status();
    const fs::path tmp = path.string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(made.value().data()),
                static_cast<std::streamsize>(kNcclUniqueIdBytes));
      out.flush();
      if (!out) {
        return Status::io_error("NCCL rendezvous: cannot write " + tmp.string() + ": " +
                                std::strerror(errno));
      }
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) return Status::io_error("NCCL rendezvous: cannot rename to " + path.string() + ": " + ec.message());
    return made;
  }
  const Timer waited;
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      NcclUniqueId id;
      in.read(reinterpret_cast<char*>(id.data()), static_cast<std::streamsize>(id.size()));
      if (in.gcount() == static_cast<std::streamsize>(id.size())) return id;
      return Status::io_error("NCCL rendezvous: " + path.string() + " holds " +
                              std::to_string(in.gcount()) + " bytes, expected " +
                              std::to_string(kNcclUniqueIdBytes));
    }
    if (waited.elapsed_ms() > static_cast<double>(timeout.count())) {
      return Status::io_error("NCCL rendezvous: rank " + std::to_string(rank) + " waited " +
                              std::to_string(timeout.count()) + " ms for " + path.string() +
                              " (rank 0 writes it; is the directory shared by every node?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string nccl_version_string() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z since 2.9.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
         std::to_string(v % 100);
}

Status init_nccl_world(const NcclUniqueId& id, int nranks, int rank) {
  ncclUniqueId raw;
  std::memcpy(raw.internal, id.data(), id.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, raw, rank, &config);
  if (r != ncclSuccess) {
    const char* last = ncclGetLastError(comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return Status::internal("NCCL: rank " + std::to_string(rank) + " of " +
                            std::to_string(nranks) + ": ncclCommInitRankConfig failed: " +
                            nccl_error(r) + (last && *last ? std::string(": ") + last : "") +
                            " (" + launch_environment() + ")");
  }
  ncclCommDestroy(comm);
  return Status::ok();
}

}  // namespace trident
