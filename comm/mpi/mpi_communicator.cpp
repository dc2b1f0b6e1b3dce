#include "comm/mpi/mpi_communicator.h"

#include <climits>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_check.h"
#include "core/check.h"

namespace trident {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) {
    return "MPI error " + std::to_string(code);
  }
  return "MPI error " + std::to_string(code) + ": " + std::string(text, length);
}

namespace {

// MPI_Init / MPI_Finalize as RAII. One per process, shared by every communicator, so
// MPI_Finalize runs after the last MPI_Comm_free whatever the destruction order.
class MpiRuntime {
 public:
  explicit MpiRuntime(bool owns_mpi) : owns_mpi_(owns_mpi) {}
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && !finalized) MPI_Finalize();
  }
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  // The process's runtime: initializes MPI unless the caller already did.
  static std::shared_ptr<MpiRuntime> acquire(int* argc, char*** argv) {
    // MPI state is process-wide, so its handle is too; written only by the one thread
    // that may call MPI (communicator.h's thread contract).
    static std::weak_ptr<MpiRuntime> current;
    if (auto runtime = current.lock()) return runtime;
    int initialized = 0;
    int finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    TRIDENT_CHECK_MSG(!finalized, "MPI was already finalized; it cannot be initialized again");
    bool owns = false;
    if (!initialized) {
      int provided = 0;
      const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
      TRIDENT_CHECK_MSG(rc == MPI_SUCCESS, "MPI_Init_thread: " + mpi_error_string(rc));
      TRIDENT_CHECK_MSG(provided >= MPI_THREAD_SERIALIZED,
                        "MPI provides thread level " + std::to_string(provided) +
                            ", Trident needs MPI_THREAD_SERIALIZED");
      owns = true;
    }
    auto runtime = std::make_shared<MpiRuntime>(owns);
    current = runtime;
    return runtime;
  }

 private:
  bool owns_mpi_;
};

MPI_Datatype mpi_type(CommDtype dtype) {
  switch (dtype) {
    case CommDtype::kF32:
      return MPI_FLOAT;
    case CommDtype::kF64:
      return MPI_DOUBLE;
    case CommDtype::kI64:
      return MPI_INT64_T;
    case CommDtype::kByte:
      return MPI_BYTE;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX; }

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm (freed on destruction).
  MpiCommunicator(std::shared_ptr<MpiRuntime> runtime, MPI_Comm comm, std::string name)
      : Communicator(std::move(name)), runtime_(std::move(runtime)), comm_(comm) {
    const CollectiveOptions opts{.label = "setup"};
    TRIDENT_MPI_CHECK(*this, MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN),
                      CollectiveKind::kSplit, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Comm_rank(comm_, &rank_), CollectiveKind::kSplit, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Comm_size(comm_, &size_), CollectiveKind::kSplit, opts);
  }
  ~MpiCommunicator() override {
    // An isend's buffer must outlive its request, and MPI_Comm_free does not cancel it.
    if (!pending_.empty()) do_wait_sends({.label = "pending isends at destruction"});
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

 protected:
  void do_all_reduce(void* data, std::size_t count, CommDtype dtype, ReduceOp op,
                     const CollectiveOptions& opts) override {
    const int n = to_int(count, CollectiveKind::kAllReduce, opts);
    TRIDENT_MPI_CHECK(*this,
                      MPI_Allreduce(MPI_IN_PLACE, data, n, mpi_type(dtype), mpi_op(op), comm_),
                      CollectiveKind::kAllReduce, opts);
  }

  void do_reduce_scatter(const float* input, float* output, std::size_t chunk,
                         const CollectiveOptions& opts) override {
    const int n = to_int(chunk, CollectiveKind::kReduceScatter, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Reduce_scatter_block(input, output, n, MPI_FLOAT, MPI_SUM, comm_),
                      CollectiveKind::kReduceScatter, opts);
  }

  void do_all_gather(const void* input, void* output, std::size_t chunk_bytes, CommDtype dtype,
                     const CollectiveOptions& opts) override {
    const int n = to_int(chunk_bytes / comm_dtype_size(dtype), CollectiveKind::kAllGather, opts);
    const MPI_Datatype type = mpi_type(dtype);
    TRIDENT_MPI_CHECK(*this, MPI_Allgather(input, n, type, output, n, type, comm_),
                      CollectiveKind::kAllGather, opts);
  }

  void do_broadcast(void* data, std::size_t bytes, int root,
                    const CollectiveOptions& opts) override {
    const int n = to_int(bytes, CollectiveKind::kBroadcast, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Bcast(data, n, MPI_BYTE, root, comm_), CollectiveKind::kBroadcast,
                      opts);
  }

  void do_send(const float* data, std::size_t count, int dst, int tag,
               const CollectiveOptions& opts) override {
    const int n = to_int(count, CollectiveKind::kSend, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Send(data, n, MPI_FLOAT, dst, tag, comm_), CollectiveKind::kSend,
                      opts);
  }

  void do_recv(float* data, std::size_t count, int src, int tag,
               const CollectiveOptions& opts) override {
    const int n = to_int(count, CollectiveKind::kRecv, opts);
    MPI_Status status;
    TRIDENT_MPI_CHECK(*this, MPI_Recv(data, n, MPI_FLOAT, src, tag, comm_, &status),
                      CollectiveKind::kRecv, opts);
    // A shorter message than expected is not an MPI error, but it is a broken pairing.
    int received = 0;
    MPI_Get_count(&status, MPI_FLOAT, &received);
    TRIDENT_COMM_CHECK(*this, received == n, CollectiveKind::kRecv, opts,
                       "received " + std::to_string(received) + " floats from rank " +
                           std::to_string(src) + ", expected " + std::to_string(n));
  }

  void do_isend(const float* data, std::size_t count, int dst, int tag,
                const CollectiveOptions& opts) override {
    const int n = to_int(count, CollectiveKind::kSend, opts);
    reap_completed_sends(opts);
    // The vector's heap block stays put when pending_ grows, so MPI may keep pointing at it.
    PendingSend& pending = pending_.emplace_back();
    pending.payload.assign(data, data + count);
    TRIDENT_MPI_CHECK(*this,
                      MPI_Isend(pending.payload.data(), n, MPI_FLOAT, dst, tag, comm_,
                                &pending.request),
                      CollectiveKind::kSend, opts);
  }

  void do_wait_sends(const CollectiveOptions& opts) override {
    std::vector<MPI_Request> requests;
    requests.reserve(pending_.size());
    for (const PendingSend& p : pending_) requests.push_back(p.request);
    TRIDENT_MPI_CHECK(*this,
                      MPI_Waitall(static_cast<int>(requests.size()), requests.data(),
                                  MPI_STATUSES_IGNORE),
                      CollectiveKind::kSend, opts);
    pending_.clear();
  }

  std::size_t pending_sends() const override { return pending_.size(); }

  void do_barrier(const CollectiveOptions& opts) override {
    TRIDENT_MPI_CHECK(*this, MPI_Barrier(comm_), CollectiveKind::kBarrier, opts);
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name,
                                         const CollectiveOptions& opts) override {
    MPI_Comm child = MPI_COMM_NULL;
    TRIDENT_MPI_CHECK(*this,
                      MPI_Comm_split(comm_, color == kNoGroup ? MPI_UNDEFINED : color, key, &child),
                      CollectiveKind::kSplit, opts);
    if (child == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(runtime_, child, std::move(name));
  }

 private:
  int to_int(std::size_t count, CollectiveKind kind, const CollectiveOptions& opts) const {
    TRIDENT_COMM_CHECK(*this, count <= static_cast<std::size_t>(INT_MAX), kind, opts,
                       std::to_string(count) + " elements exceed MPI's int count; split the call");
    return static_cast<int>(count);
  }

  // Frees the buffers of completed isends, so a long pipeline does not hold them all.
  void reap_completed_sends(const CollectiveOptions& opts) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      int done = 0;
      TRIDENT_MPI_CHECK(*this, MPI_Test(&pending_[i].request, &done, MPI_STATUS_IGNORE),
                        CollectiveKind::kSend, opts);
      if (!done) {
        if (kept != i) pending_[kept] = std::move(pending_[i]);
        ++kept;
      }
    }
    pending_.resize(kept);
  }

  struct PendingSend {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<float> payload;  // (count) the copy MPI sends from
  };

  std::shared_ptr<MpiRuntime> runtime_;  // first member: outlives comm_'s MPI_Comm_free
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<PendingSend> pending_;  // isends in flight, in call order
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator(int* argc, char*** argv) {
  auto runtime = MpiRuntime::acquire(argc, argv);
  // A private duplicate: our traffic never matches the caller's own MPI_COMM_WORLD
  // messages, and our error handler does not change theirs.
  MPI_Comm world = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  TRIDENT_CHECK_MSG(rc == MPI_SUCCESS, "MPI_Comm_dup(MPI_COMM_WORLD): " + mpi_error_string(rc));
  return std::make_unique<MpiCommunicator>(std::move(runtime), world, "world");
}

}  // namespace trident
