#include "comm/mpi/mpi_communicator.h"

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/mpi/mpi_check.h"
#include "core/check.h"
#include "core/timer.h"

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

// The bf16 reductions (communicator.h "Reductions"): inout[i] = round(in[i] + inout[i])
// with the sum in fp32 and one round to nearest even per combining step. MPI calls these
// with len elements of the committed 2-byte type.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16_t*>(in);
  auto* b = static_cast<bf16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16_t*>(in);
  auto* b = static_cast<bf16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    if (bf16_to_float(a[i]) > bf16_to_float(b[i])) b[i] = a[i];
  }
}

// One async collective, shared by the caller's work and the communication thread: the
// thread runs `run` (a blocking MPI call), stores its return code, then releases `done`.
struct AsyncTask {
  std::function<int()> run;
  int rc = MPI_SUCCESS;  // written before done is released
  double seconds = 0;    // how long run() took; written before done is released
  std::atomic<bool> done{false};
};

// A communicator's communication thread: runs queued tasks one at a time in submit order
// (the issue order, which MPI's matching rule needs). The destructor finishes the queue
// (empty in practice: the communicator checks its works first) and joins.
class CommThread {
 public:
  CommThread() : thread_([this] { loop(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  void submit(std::shared_ptr<AsyncTask> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::shared_ptr<AsyncTask> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      const Timer timer;
      task->rc = task->run();
      task->seconds = timer.elapsed_s();
      task->done.store(true, std::memory_order_release);
      task->done.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<AsyncTask>> queue_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The caller's side of a task (Communicator::do_i*): completion is the task's flag, so
// the caller never touches an MPI request the thread owns.
class MpiAsyncCollective final : public AsyncCollective {
 public:
  MpiAsyncCollective(const Communicator& comm, const char* call, CollectiveKind kind,
                     CollectiveOptions opts, std::shared_ptr<AsyncTask> task)
      : comm_(comm), call_(call), kind_(kind), opts_(std::move(opts)), task_(std::move(task)) {}
  bool test() override {
    if (!task_->done.load(std::memory_order_acquire)) return false;
    check();
    return true;
  }
  void wait() override {
    task_->done.wait(false, std::memory_order_acquire);
    check();
  }
  double seconds() const override { return task_->seconds; }

 private:
  void check() const {
    if (task_->rc != MPI_SUCCESS) {
      comm_.fail(call_, kind_, opts_, mpi_error_string(task_->rc), __FILE__, __LINE__);
    }
  }
  const Communicator& comm_;
  const char* call_;  // the MPI call, for the message
  CollectiveKind kind_;
  CollectiveOptions opts_;
  std::shared_ptr<AsyncTask> task_;
};

// MPI_Init / MPI_Finalize as RAII. One per process, shared by every communicator, so
// MPI_Finalize runs after the last MPI_Comm_free whatever the destruction order. Also
// owns what the communicators share: the bf16 datatype and its reduction ops, created
// once when the runtime is acquired and freed before MPI_Finalize.
class MpiRuntime {
 public:
  explicit MpiRuntime(bool owns_mpi) : owns_mpi_(owns_mpi) {
    int rc = MPI_Type_contiguous(2, MPI_BYTE, &bf16_type_);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&bf16_type_);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(&bf16_sum, /*commute=*/1, &bf16_sum_);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(&bf16_max, /*commute=*/1, &bf16_max_);
    TRIDENT_CHECK_MSG(rc == MPI_SUCCESS, "creating the bf16 MPI type and ops: " +
                                             mpi_error_string(rc));
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // the caller finalized MPI first: nothing left to free
    MPI_Op_free(&bf16_max_);
    MPI_Op_free(&bf16_sum_);
    MPI_Type_free(&bf16_type_);
    if (owns_mpi_) MPI_Finalize();
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
      // Open MPI's progress loop spins while a blocking collective waits for its peers.
      // Every rank runs a communication thread beside compute threads that fill the cores,
      // so an async collective's spinning takes a core from the compute and from the peer
      // whose progress it waits for. Told to yield when a poll finds nothing, it lets both
      // run: on 2 ranks of 1 thread on 2 cores, dp 2 ZeRO-3 with overlap on measured
      // 344-373 ms a step instead of 374-448 (docs/PERFORMANCE.md "Overlap on shared
      // cores").
      // Read at MPI_Init from the environment: a value the user or the launcher set
      // (mpirun --mca mpi_yield_when_idle 0) is left as it is; other MPIs ignore it.
      // (Before MPI starts its threads; setenv is not thread-safe.)
      setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
      // MULTIPLE for the async collectives' communication threads (mpi_communicator.h).
      const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
      TRIDENT_CHECK_MSG(rc == MPI_SUCCESS, "MPI_Init_thread: " + mpi_error_string(rc));
      TRIDENT_CHECK_MSG(provided >= MPI_THREAD_SERIALIZED,
                        "MPI provides thread level " + std::to_string(provided) +
                            ", Trident needs MPI_THREAD_SERIALIZED");
      owns = true;
    }
    auto runtime = std::make_shared<MpiRuntime>(owns);
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    runtime->thread_multiple_ = level >= MPI_THREAD_MULTIPLE;
    current = runtime;
    return runtime;
  }

  MPI_Datatype type_of(DType dtype) const {
    switch (dtype) {
      case DType::kF32:
        return MPI_FLOAT;
      case DType::kBF16:
        return bf16_type_;
      case DType::kI32:
        return MPI_INT32_T;
      case DType::kF64:
        return MPI_DOUBLE;
      case DType::kI64:
        return MPI_INT64_T;
      case DType::kU8:
        return MPI_BYTE;
    }
    return MPI_BYTE;
  }
  // Whether MPI runs at MPI_THREAD_MULTIPLE (then async collectives get a thread).
  bool thread_multiple() const { return thread_multiple_; }
  MPI_Op op_of(ReduceOp op, DType dtype) const {
    if (dtype == DType::kBF16) return op == ReduceOp::kSum ? bf16_sum_ : bf16_max_;
    return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
  }

 private:
  bool owns_mpi_;
  bool thread_multiple_ = false;
  MPI_Datatype bf16_type_ = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  MPI_Op bf16_max_ = MPI_OP_NULL;
};

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm (freed on destruction).
  MpiCommunicator(std::shared_ptr<MpiRuntime> runtime, MPI_Comm comm, std::string name,
                  MemSpace space)
      : Communicator(std::move(name), space), runtime_(std::move(runtime)), comm_(comm) {
    const CollectiveOptions opts{.label = "setup"};
    TRIDENT_MPI_CHECK(*this, MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN),
                      CollectiveKind::kSplit, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Comm_rank(comm_, &rank_), CollectiveKind::kSplit, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Comm_size(comm_, &size_), CollectiveKind::kSplit, opts);
    // The members' ranks in MPI_COMM_WORLD (the world communicator's ranks), a local
    // lookup in MPI's group tables.
    MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
    TRIDENT_MPI_CHECK(*this, MPI_Comm_group(comm_, &group), CollectiveKind::kSplit, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Comm_group(MPI_COMM_WORLD, &world_group), CollectiveKind::kSplit,
                      opts);
    std::vector<int> members(static_cast<std::size_t>(size_));
    std::iota(members.begin(), members.end(), 0);
    world_ranks_.resize(members.size());
    TRIDENT_MPI_CHECK(*this,
                      MPI_Group_translate_ranks(group, size_, members.data(), world_group,
                                                world_ranks_.data()),
                      CollectiveKind::kSplit, opts);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
  }
  ~MpiCommunicator() override {
    check_no_outstanding_work();
    // An isend's buffer must outlive its request, and MPI_Comm_free does not cancel it.
    if (!pending_requests_.empty()) do_wait_sends({.label = "pending isends at destruction"});
    comm_thread_.reset();  // joins: every task is done (no outstanding work)
    if (async_comm_ != MPI_COMM_NULL) MPI_Comm_free(&async_comm_);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  std::vector<int> world_ranks() const override { return world_ranks_; }

 protected:
  // The MPI call of each reduction and gather on `comm`, as a callable returning its MPI
  // error code: the synchronous hooks run it on comm_, the async ones hand it to the
  // communication thread on async_comm_. One definition for both, so an async call is
  // the synchronous one (hence bitwise its result). Returned by value (no allocation).
  auto all_reduce_call(const CommBuf& data, ReduceOp op, const CollectiveOptions& opts,
                       MPI_Comm comm) const {
    const int n = to_int(data.count, CollectiveKind::kAllReduce, opts);
    const MPI_Datatype type = runtime_->type_of(data.dtype);
    const MPI_Op mpi_op = runtime_->op_of(op, data.dtype);
    void* buf = data.data;
    return [=] { return MPI_Allreduce(MPI_IN_PLACE, buf, n, type, mpi_op, comm); };
  }
  auto reduce_scatter_call(const CommBuf& input, const CommBuf& output,
                           const CollectiveOptions& opts, MPI_Comm comm) const {
    const int n = to_int(output.count, CollectiveKind::kReduceScatter, opts);
    const MPI_Datatype type = runtime_->type_of(input.dtype);
    const MPI_Op mpi_op = runtime_->op_of(ReduceOp::kSum, input.dtype);
    const void* in = input.data;
    void* out = output.data;
    return [=] { return MPI_Reduce_scatter_block(in, out, n, type, mpi_op, comm); };
  }
  auto all_gather_call(const CommBuf& input, const CommBuf& output, const CollectiveOptions& opts,
                       MPI_Comm comm) const {
    const int n = to_int(input.count, CollectiveKind::kAllGather, opts);
    const MPI_Datatype type = runtime_->type_of(input.dtype);
    const void* in = input.data;
    void* out = output.data;
    return [=] { return MPI_Allgather(in, n, type, out, n, type, comm); };
  }

  void do_all_reduce(const CommBuf& data, ReduceOp op, const CollectiveOptions& opts) override {
    TRIDENT_MPI_CHECK(*this, all_reduce_call(data, op, opts, comm_)(), CollectiveKind::kAllReduce,
                      opts);
  }

  void do_reduce_scatter(const CommBuf& input, const CommBuf& output,
                         const CollectiveOptions& opts) override {
    TRIDENT_MPI_CHECK(*this, reduce_scatter_call(input, output, opts, comm_)(),
                      CollectiveKind::kReduceScatter, opts);
  }

  void do_all_gather(const CommBuf& input, const CommBuf& output,
                     const CollectiveOptions& opts) override {
    TRIDENT_MPI_CHECK(*this, all_gather_call(input, output, opts, comm_)(),
                      CollectiveKind::kAllGather, opts);
  }

  void do_broadcast(const CommBuf& data, int root, const CollectiveOptions& opts) override {
    const int n = to_int(data.count, CollectiveKind::kBroadcast, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Bcast(data.data, n, runtime_->type_of(data.dtype), root, comm_),
                      CollectiveKind::kBroadcast, opts);
  }

  void do_send(const CommBuf& data, int dst, int tag, const CollectiveOptions& opts) override {
    const int n = to_int(data.count, CollectiveKind::kSend, opts);
    TRIDENT_MPI_CHECK(*this, MPI_Send(data.data, n, runtime_->type_of(data.dtype), dst, tag, comm_),
                      CollectiveKind::kSend, opts);
  }

  void do_recv(const CommBuf& data, int src, int tag, const CollectiveOptions& opts) override {
    const int n = to_int(data.count, CollectiveKind::kRecv, opts);
    const MPI_Datatype type = runtime_->type_of(data.dtype);
    MPI_Status status;
    TRIDENT_MPI_CHECK(*this, MPI_Recv(data.data, n, type, src, tag, comm_, &status),
                      CollectiveKind::kRecv, opts);
    // A shorter message than expected is not an MPI error, but it is a broken pairing.
    int received = 0;
    MPI_Get_count(&status, type, &received);
    TRIDENT_COMM_CHECK(*this, received == n, CollectiveKind::kRecv, opts,
                       "received " + std::to_string(received) + " " + dtype_name(data.dtype) +
                           " elements from rank " + std::to_string(src) + ", expected " +
                           std::to_string(n));
  }

  // The payload copy reads the caller's memory: for a device buffer it is device work,
  // inside the DeviceAccessScope the public isend opened (a device-to-device copy on a
  // GPU backend). It goes to a pooled staging buffer, so a warm isend allocates nothing.
  void do_isend(const CommBuf& data, int dst, int tag, const CollectiveOptions& opts) override {
    const int n = to_int(data.count, CollectiveKind::kSend, opts);
    reap_completed_sends(opts);
    const std::size_t slot = take_staging(data.bytes());
    std::memcpy(staging_[slot].data.get(), data.data, data.bytes());
    MPI_Request request = MPI_REQUEST_NULL;
    TRIDENT_MPI_CHECK(*this,
                      MPI_Isend(staging_[slot].data.get(), n, runtime_->type_of(data.dtype), dst,
                                tag, comm_, &request),
                      CollectiveKind::kSend, opts);
    pending_requests_.push_back(request);
    pending_staging_.push_back(slot);
  }

  void do_wait_sends(const CollectiveOptions& opts) override {
    TRIDENT_MPI_CHECK(*this,
                      MPI_Waitall(static_cast<int>(pending_requests_.size()),
                                  pending_requests_.data(), MPI_STATUSES_IGNORE),
                      CollectiveKind::kSend, opts);
    for (std::size_t slot : pending_staging_) free_staging_.push_back(slot);
    pending_requests_.clear();
    pending_staging_.clear();
  }

  std::size_t pending_sends() const override { return pending_requests_.size(); }

  std::size_t isend_staging_bytes() const override {
    std::size_t total = 0;
    for (const StagingBuffer& b : staging_) total += b.capacity;
    return total;
  }

  // Async: the same blocking call as the synchronous hook, with the same arguments, on
  // async_comm_, run by the communication thread (see mpi_communicator.h).
  std::unique_ptr<AsyncCollective> do_iall_reduce(const CommBuf& data, ReduceOp op,
                                                  const CollectiveOptions& opts) override {
    constexpr CollectiveKind kind = CollectiveKind::kAllReduce;
    if (!runtime_->thread_multiple()) return Communicator::do_iall_reduce(data, op, opts);
    return submit("MPI_Allreduce (async)", kind, opts,
                  all_reduce_call(data, op, opts, async_comm(kind, opts)));
  }

  std::unique_ptr<AsyncCollective> do_ireduce_scatter(const CommBuf& input, const CommBuf& output,
                                                      const CollectiveOptions& opts) override {
    constexpr CollectiveKind kind = CollectiveKind::kReduceScatter;
    if (!runtime_->thread_multiple()) return Communicator::do_ireduce_scatter(input, output, opts);
    return submit("MPI_Reduce_scatter_block (async)", kind, opts,
                  reduce_scatter_call(input, output, opts, async_comm(kind, opts)));
  }

  std::unique_ptr<AsyncCollective> do_iall_gather(const CommBuf& input, const CommBuf& output,
                                                  const CollectiveOptions& opts) override {
    constexpr CollectiveKind kind = CollectiveKind::kAllGather;
    if (!runtime_->thread_multiple()) return Communicator::do_iall_gather(input, output, opts);
    return submit("MPI_Allgather (async)", kind, opts,
                  all_gather_call(input, output, opts, async_comm(kind, opts)));
  }

  // Async batch: every operation as MPI_Isend / MPI_Irecv on async_comm_, then
  // MPI_Waitall, as one task of the communication thread (the sends read the caller's
  // buffers directly, so they complete in the task, unlike isend's staged copies). A
  // receive shorter than its buffer is a broken pairing: MPI_ERR_COUNT.
  std::unique_ptr<AsyncCollective> do_ibatch_p2p(std::span<const P2POp> ops,
                                                 const CollectiveOptions& opts) override {
    const CollectiveKind kind =
        ops.front().kind == P2POp::kSend ? CollectiveKind::kSend : CollectiveKind::kRecv;
    if (!runtime_->thread_multiple()) return Communicator::do_ibatch_p2p(ops, opts);
    struct Op {
      bool send;
      void* data;
      int n;
      MPI_Datatype type;
      int peer, tag;
    };
    std::vector<Op> list;
    list.reserve(ops.size());
    for (const P2POp& op : ops) {
      list.push_back({op.kind == P2POp::kSend, op.buf.data, to_int(op.buf.count, kind, opts),
                      runtime_->type_of(op.buf.dtype), op.peer, op.tag});
    }
    const MPI_Comm comm = async_comm(kind, opts);
    return submit("MPI_Isend/MPI_Irecv/MPI_Waitall (async batch_p2p)", kind, opts,
                  [list = std::move(list), comm] {
                    std::vector<MPI_Request> requests(list.size(), MPI_REQUEST_NULL);
                    std::vector<MPI_Status> statuses(list.size());
                    for (std::size_t i = 0; i < list.size(); ++i) {
                      const Op& o = list[i];
                      const int rc =
                          o.send ? MPI_Isend(o.data, o.n, o.type, o.peer, o.tag, comm, &requests[i])
                                 : MPI_Irecv(o.data, o.n, o.type, o.peer, o.tag, comm, &requests[i]);
                      if (rc != MPI_SUCCESS) {
                        MPI_Waitall(static_cast<int>(i), requests.data(), MPI_STATUSES_IGNORE);
                        return rc;
                      }
                    }
                    int rc = MPI_Waitall(static_cast<int>(list.size()), requests.data(),
                                         statuses.data());
                    for (std::size_t i = 0; rc == MPI_SUCCESS && i < list.size(); ++i) {
                      int received = 0;
                      if (list[i].send) continue;
                      MPI_Get_count(&statuses[i], list[i].type, &received);
                      if (received != list[i].n) rc = MPI_ERR_COUNT;
                    }
                    return rc;
                  });
  }

  void do_barrier(const CollectiveOptions& opts) override {
    TRIDENT_MPI_CHECK(*this, MPI_Barrier(comm_), CollectiveKind::kBarrier, opts);
  }

  // MPI_Alltoallv on the group's own communicator (synchronous only). Counts and
  // displacements are ints in MPI: the totals must fit, which bounds every offset too.
  void do_all_to_all(const CommBuf& input, std::span<const std::size_t> send_counts,
                     const CommBuf& output, std::span<const std::size_t> recv_counts,
                     const CollectiveOptions& opts) override {
    constexpr CollectiveKind kind = CollectiveKind::kAllToAll;
    to_int(input.count, kind, opts);
    to_int(output.count, kind, opts);
    const std::size_t p = send_counts.size();
    std::vector<int> counts(4 * p);
    int* sc = counts.data();
    int* sd = sc + p;
    int* rc = sd + p;
    int* rd = rc + p;
    int send_offset = 0, recv_offset = 0;
    for (std::size_t r = 0; r < p; ++r) {
      sc[r] = static_cast<int>(send_counts[r]);
      rc[r] = static_cast<int>(recv_counts[r]);
      sd[r] = send_offset;
      rd[r] = recv_offset;
      send_offset += sc[r];
      recv_offset += rc[r];
    }
    const MPI_Datatype type = runtime_->type_of(input.dtype);
    TRIDENT_MPI_CHECK(*this,
                      MPI_Alltoallv(input.data, sc, sd, type, output.data, rc, rd, type, comm_),
                      kind, opts);
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name, MemSpace space,
                                         const CollectiveOptions& opts) override {
    MPI_Comm child = MPI_COMM_NULL;
    TRIDENT_MPI_CHECK(*this,
                      MPI_Comm_split(comm_, color == kNoGroup ? MPI_UNDEFINED : color, key, &child),
                      CollectiveKind::kSplit, opts);
    if (child == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(runtime_, child, std::move(name), space);
  }

 private:
  int to_int(std::size_t count, CollectiveKind kind, const CollectiveOptions& opts) const {
    TRIDENT_COMM_CHECK(*this, count <= static_cast<std::size_t>(INT_MAX), kind, opts,
                       std::to_string(count) + " elements exceed MPI's int count; split the call");
    return static_cast<int>(count);
  }

  // The duplicate the async calls run on, and its thread; made by the first async call
  // (a collective of this group, issued in call order like any other).
  MPI_Comm async_comm(CollectiveKind kind, const CollectiveOptions& opts) {
    if (async_comm_ == MPI_COMM_NULL) {
      TRIDENT_MPI_CHECK(*this, MPI_Comm_dup(comm_, &async_comm_), kind, opts);
      TRIDENT_MPI_CHECK(*this, MPI_Comm_set_errhandler(async_comm_, MPI_ERRORS_RETURN), kind,
                        opts);
      comm_thread_ = std::make_unique<CommThread>();
    }
    return async_comm_;
  }

  std::unique_ptr<AsyncCollective> submit(const char* call, CollectiveKind kind,
                                          const CollectiveOptions& opts, std::function<int()> run) {
    auto task = std::make_shared<AsyncTask>();
    task->run = std::move(run);
    comm_thread_->submit(task);
    return std::make_unique<MpiAsyncCollective>(*this, call, kind, opts, std::move(task));
  }

  // Returns the staging buffers of completed isends to the pool, keeping call order for
  // the rest (in place: no allocation).
  void reap_completed_sends(const CollectiveOptions& opts) {
    std::size_t kept = 0;
    for (std::size_t i = 0; i < pending_requests_.size(); ++i) {
      int done = 0;
      TRIDENT_MPI_CHECK(*this, MPI_Test(&pending_requests_[i], &done, MPI_STATUS_IGNORE),
                        CollectiveKind::kSend, opts);
      if (done) {
        free_staging_.push_back(pending_staging_[i]);
      } else {
        pending_requests_[kept] = pending_requests_[i];
        pending_staging_[kept] = pending_staging_[i];
        ++kept;
      }
    }
    pending_requests_.resize(kept);
    pending_staging_.resize(kept);
  }

  // A free staging buffer of at least `bytes`: the smallest free one that fits; else the
  // largest free one, grown; else a new one. Buffers never shrink, so once the sizes and
  // the number in flight repeat, this allocates nothing.
  std::size_t take_staging(std::size_t bytes) {
    const std::size_t none = free_staging_.size();
    std::size_t fitting = none, largest = none;  // indices into free_staging_
    for (std::size_t i = 0; i < free_staging_.size(); ++i) {
      const std::size_t cap = staging_[free_staging_[i]].capacity;
      if (cap >= bytes && (fitting == none || cap < staging_[free_staging_[fitting]].capacity)) {
        fitting = i;
      }
      if (largest == none || cap > staging_[free_staging_[largest]].capacity) largest = i;
    }
    const std::size_t best = fitting != none ? fitting : largest;
    std::size_t slot;
    if (best == free_staging_.size()) {
      slot = staging_.size();
      staging_.emplace_back();
      free_staging_.reserve(staging_.size());  // every slot may be free at once
    } else {
      slot = free_staging_[best];
      free_staging_[best] = free_staging_.back();
      free_staging_.pop_back();
    }
    StagingBuffer& buffer = staging_[slot];
    if (buffer.capacity < bytes) {
      buffer.data = std::make_unique_for_overwrite<std::byte[]>(bytes);
      buffer.capacity = bytes;
    }
    return slot;
  }

  // Grow-only isend payload storage; the heap block stays put when staging_ grows, so MPI
  // may keep pointing at it.
  struct StagingBuffer {
    std::unique_ptr<std::byte[]> data;  // (capacity)
    std::size_t capacity = 0;
  };

  std::shared_ptr<MpiRuntime> runtime_;  // first member: outlives comm_'s MPI_Comm_free
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;  // by rank of comm_, in MPI_COMM_WORLD
  std::vector<MPI_Request> pending_requests_;  // isends in flight, in call order
  std::vector<std::size_t> pending_staging_;   // (pending_requests_) their staging slots
  std::vector<StagingBuffer> staging_;          // the pool
  std::vector<std::size_t> free_staging_;       // slots not in flight
  MPI_Comm async_comm_ = MPI_COMM_NULL;         // the async calls' duplicate of comm_
  std::unique_ptr<CommThread> comm_thread_;     // runs them; joined before the frees
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_world_communicator(int* argc, char*** argv) {
  auto runtime = MpiRuntime::acquire(argc, argv);
  // A private duplicate: our traffic never matches the caller's own MPI_COMM_WORLD
  // messages, and our error handler does not change theirs.
  MPI_Comm world = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  TRIDENT_CHECK_MSG(rc == MPI_SUCCESS, "MPI_Comm_dup(MPI_COMM_WORLD): " + mpi_error_string(rc));
  return std::make_unique<MpiCommunicator>(std::move(runtime), world, "world", MemSpace::kHost);
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "MPI (version unknown)";
  std::string version(text, static_cast<size_t>(length));
  const size_t comma = version.find(',');
  if (comma != std::string::npos) version.resize(comma);
  while (!version.empty() && (version.back() == '\n' || version.back() == ' ')) version.pop_back();
  return version;
}

}  // namespace trident
