#include "comm/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <span>
#include <thread>
#include <utility>

#include "comm/nccl/nccl_abort.h"
#include "comm/nccl/nccl_bootstrap.h"
#include "core/check.h"

namespace trident {

namespace {

using Clock = std::chrono::steady_clock;

// Extra time past a call's timeout before the backend aborts by itself: a running
// watchdog (which knows the step) reports at the timeout.
constexpr std::chrono::milliseconds kGrace{1000};
// How long a finalize may stay in progress at teardown before the communicator is aborted.
constexpr std::chrono::milliseconds kFinalizeBound{10000};

const char* nccl_result_name(int r) {
  switch (r) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult";
  }
}

// Waits until `comm` leaves ncclInProgress: ncclSuccess, an error, or ncclInProgress when
// the deadline came first. `issued` is what the NCCL call returned.
ncclResult_t settle(ncclComm_t comm, ncclResult_t issued, Clock::time_point deadline) {
  if (issued != ncclSuccess && issued != ncclInProgress) return issued;
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) return ncclInProgress;
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

Clock::time_point deadline_after(std::chrono::milliseconds t) {
  // Cap absurd timeouts so the arithmetic cannot overflow.
  return Clock::now() + std::min<std::chrono::milliseconds>(t, std::chrono::hours(24 * 365));
}

// One NCCL communicator, shared by its Communicator, its children (a child keeps its
// parent alive: children are torn down first) and the abort registry (weakly).
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, std::shared_ptr<NcclComm> parent)
      : comm_(comm), parent_(std::move(parent)) {}
  ~NcclComm() {
    unregister_nccl_abort(abort_id_);
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;  // aborted
    closed_ = true;
    ncclResult_t r = ncclCommFinalize(comm_);
    r = settle(comm_, r, deadline_after(kFinalizeBound));
    if (r == ncclSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);  // a finalize that fails or hangs: free without flushing
    }
  }
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Registers this communicator's abort (call once, right after construction).
  static void register_abort(const std::shared_ptr<NcclComm>& self, std::string what) {
    std::weak_ptr<NcclComm> weak = self;
    self->abort_id_ = register_nccl_abort(std::move(what), [weak] {
      if (std::shared_ptr<NcclComm> c = weak.lock()) c->abort();
    });
  }

  void abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    aborted_.store(true, std::memory_order_release);
    ncclCommAbort(comm_);
  }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }
  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_;
  std::shared_ptr<NcclComm> parent_;  // kept alive until this one is gone
  std::uint64_t abort_id_ = 0;
  std::mutex mutex_;     // orders abort against teardown
  bool closed_ = false;  // guarded by mutex_
  std::atomic<bool> aborted_{false};
};

ncclConfig_t nonblocking_config(const char* name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = name;
  return config;
}

ncclDataType_t to_nccl(DType dtype) { return static_cast<ncclDataType_t>(*nccl_data_type(dtype)); }

// Host memory communicators are plain Communicators (MPI or self); this one is the world
// (space kHost: every call goes to host_) or an NCCL group (space kDevice).
class NcclCommunicator final : public Communicator {
 public:
  // host: the host communicator of the same group (the world: the host world; a group:
  // its twin). nccl: this group's NCCL communicator.
  NcclCommunicator(std::string name, MemSpace space, std::unique_ptr<Communicator> host,
                   std::shared_ptr<NcclComm> nccl, const NcclWorldOptions& options)
      : Communicator(std::move(name), space),
        host_(std::move(host)),
        nccl_(std::move(nccl)),
        options_(options) {
    const CollectiveOptions setup{.label = "setup"};
    int rank = -1, size = -1;
    check_nccl(ncclCommUserRank(nccl_->get(), &rank), "ncclCommUserRank", CollectiveKind::kSplit,
               setup);
    check_nccl(ncclCommCount(nccl_->get(), &size), "ncclCommCount", CollectiveKind::kSplit, setup);
    rank_ = host_->rank();
    size_ = host_->size();
    TRIDENT_COMM_CHECK(*this, rank == rank_ && size == size_, CollectiveKind::kSplit, setup,
                       "NCCL places this rank at " + std::to_string(rank) + "/" +
                           std::to_string(size) + ", its host twin at " + std::to_string(rank_) +
                           "/" + std::to_string(size_) +
                           "; the NCCL and host splits disagree (not the same color/key?)");
    if (space == MemSpace::kDevice) {
      int least = 0, greatest = 0;
      check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                 "cudaDeviceGetStreamPriorityRange", CollectiveKind::kSplit, setup);
      check_cuda(cudaStreamCreateWithPriority(&own_stream_, cudaStreamNonBlocking, greatest),
                 "cudaStreamCreateWithPriority", CollectiveKind::kSplit, setup);
      check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate",
                 CollectiveKind::kSplit, setup);
    }
  }

  ~NcclCommunicator() override {
    // Only what this communicator owns: its communication stream (the async collectives
    // run there), then its event and stream, then NCCL (nccl_ is declared after host_, so
    // it is released first; ncclCommFinalize flushes NCCL's own work), then the twin. Never
    // the compute stream: it belongs to the Ops, which may already be gone.
    check_no_outstanding_work();
    if (own_stream_ != nullptr && !nccl_->aborted()) cudaStreamSynchronize(own_stream_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (own_stream_ != nullptr) cudaStreamDestroy(own_stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  std::vector<int> world_ranks() const override { return host_->world_ranks(); }

 protected:
  void do_all_reduce(const CommBuf& data, ReduceOp op, const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) return host_->all_reduce(data, op, timed(opts));
    run(CollectiveKind::kAllReduce, "ncclAllReduce", opts, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(data.data, data.data, data.count, to_nccl(data.dtype),
                           static_cast<ncclRedOp_t>(nccl_red_op(op)), c, s);
    });
  }

  void do_reduce_scatter(const CommBuf& input, const CommBuf& output,
                         const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) return host_->reduce_scatter(input, output, timed(opts));
    run(CollectiveKind::kReduceScatter, "ncclReduceScatter", opts,
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclReduceScatter(input.data, output.data, output.count, to_nccl(input.dtype),
                                   ncclSum, c, s);
        });
  }

  void do_all_gather(const CommBuf& input, const CommBuf& output,
                     const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) return host_->all_gather(input, output, timed(opts));
    run(CollectiveKind::kAllGather, "ncclAllGather", opts, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(input.data, output.data, input.count, to_nccl(input.dtype), c, s);
    });
  }

  void do_broadcast(const CommBuf& data, int root, const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) return host_->broadcast(data, root, timed(opts));
    run(CollectiveKind::kBroadcast, "ncclBroadcast", opts, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(data.data, data.data, data.count, to_nccl(data.dtype), root, c, s);
    });
  }

  void do_send(const CommBuf& data, int dst, int tag, const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) return host_->send(data, dst, tag, timed(opts));
    run(CollectiveKind::kSend, "ncclSend", opts, [&](ncclComm_t c, cudaStream_t s) {
      return ncclSend(data.data, data.count, to_nccl(data.dtype), dst, c, s);
    });
  }

  void do_recv(const CommBuf& data, int src, int tag, const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) return host_->recv(data, src, tag, timed(opts));
    run(CollectiveKind::kRecv, "ncclRecv", opts, [&](ncclComm_t c, cudaStream_t s) {
      return ncclRecv(data.data, data.count, to_nccl(data.dtype), src, c, s);
    });
  }

  void do_isend(const CommBuf& data, int dst, int tag, const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) return host_->isend(data, dst, tag, timed(opts));
    do_send(data, dst, tag, opts);
  }

  void do_wait_sends(const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) host_->wait_sends(timed(opts));
  }
  std::size_t pending_sends() const override {
    return space() == MemSpace::kHost ? host_->pending_sends() : 0;
  }
  std::size_t isend_staging_bytes() const override {
    return space() == MemSpace::kHost ? host_->isend_staging_bytes() : 0;
  }

  // The batch as one NCCL group on stream s, the operations in their posting order (NCCL
  // matches a pair's operations in the order they are issued); returns ncclGroupEnd's.
  ncclResult_t enqueue_batch(std::span<const P2POp> ops, CollectiveKind kind,
                             const CollectiveOptions& opts, ncclComm_t c, cudaStream_t s) {
    check_nccl(ncclGroupStart(), "ncclGroupStart", kind, opts);
    for (const P2POp& op : ops) {
      const ncclResult_t r =
          op.kind == P2POp::kSend
              ? ncclSend(op.buf.data, op.buf.count, to_nccl(op.buf.dtype), op.peer, c, s)
              : ncclRecv(op.buf.data, op.buf.count, to_nccl(op.buf.dtype), op.peer, c, s);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();  // close the group before failing
        check_nccl(r, op.kind == P2POp::kSend ? "ncclSend" : "ncclRecv", kind, opts);
      }
    }
    return ncclGroupEnd();
  }

  void do_batch_p2p(std::span<const P2POp> ops, const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) return host_->batch_p2p(ops, timed(opts));
    const CollectiveKind kind =
        ops.front().kind == P2POp::kSend ? CollectiveKind::kSend : CollectiveKind::kRecv;
    run(kind, "ncclGroupEnd (batch_p2p)", opts, [&](ncclComm_t c, cudaStream_t s) {
      return enqueue_batch(ops, kind, opts, c, s);
    });
  }

  // Async batch (stream-ordered mode): the group on the communicator's own stream between
  // events, like the async collectives (launch); otherwise completes at issue.
  std::unique_ptr<AsyncCollective> do_ibatch_p2p(std::span<const P2POp> ops,
                                                 const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost || host_synchronous()) {
      return Communicator::do_ibatch_p2p(ops, opts);
    }
    const CollectiveKind kind =
        ops.front().kind == P2POp::kSend ? CollectiveKind::kSend : CollectiveKind::kRecv;
    return launch(kind, "ncclGroupEnd (ibatch_p2p)", opts, [&](ncclComm_t c, cudaStream_t s) {
      return enqueue_batch(ops, kind, opts, c, s);
    });
  }

  // One group of ncclSend/ncclRecv pairs, one per peer with a non-zero count (NCCL has no
  // alltoallv); grouped so that every rank sends and receives at once. The own chunk is a
  // device-to-device copy on the same stream, inside the group's launch order.
  void do_all_to_all(const CommBuf& input, std::span<const std::size_t> send_counts,
                     const CommBuf& output, std::span<const std::size_t> recv_counts,
                     const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost) {
      return host_->all_to_all(input, send_counts, output, recv_counts, timed(opts));
    }
    constexpr CollectiveKind kind = CollectiveKind::kAllToAll;
    const std::size_t esize = dtype_size(input.dtype);
    const ncclDataType_t type = to_nccl(input.dtype);
    run(kind, "ncclGroupEnd (all_to_all)", opts, [&](ncclComm_t c, cudaStream_t s) {
      auto* in = static_cast<char*>(input.data);
      auto* out = static_cast<char*>(output.data);
      check_nccl(ncclGroupStart(), "ncclGroupStart", kind, opts);
      for (int r = 0; r < size_; ++r) {
        const std::size_t sc = send_counts[static_cast<std::size_t>(r)];
        const std::size_t rc = recv_counts[static_cast<std::size_t>(r)];
        ncclResult_t res = ncclSuccess;
        const char* call = "ncclSend";
        if (r == rank_) {
          if (sc > 0) {
            const cudaError_t e =
                cudaMemcpyAsync(out, in, sc * esize, cudaMemcpyDeviceToDevice, s);
            if (e != cudaSuccess) ncclGroupEnd();
            check_cuda(e, "cudaMemcpyAsync (all_to_all own chunk)", kind, opts);
          }
        } else {
          if (sc > 0) res = ncclSend(in, sc, type, r, c, s);
          if ((res == ncclSuccess || res == ncclInProgress) && rc > 0) {
            call = "ncclRecv";
            res = ncclRecv(out, rc, type, r, c, s);
          }
        }
        if (res != ncclSuccess && res != ncclInProgress) {
          ncclGroupEnd();  // close the group before failing
          check_nccl(res, call, kind, opts);
        }
        in += sc * esize;
        out += rc * esize;
      }
      return ncclGroupEnd();
    });
  }

  // Asynchronous collectives (the communicator contract's "Asynchronous collectives"):
  // stream-ordered mode only; host-synchronous mode (no compute stream, or synchronous)
  // and the host world complete at issue (the base class's hooks).
  std::unique_ptr<AsyncCollective> do_iall_reduce(const CommBuf& data, ReduceOp op,
                                                  const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost || host_synchronous()) {
      return Communicator::do_iall_reduce(data, op, opts);
    }
    return launch(CollectiveKind::kAllReduce, "ncclAllReduce", opts,
                  [&](ncclComm_t c, cudaStream_t s) {
                    return ncclAllReduce(data.data, data.data, data.count, to_nccl(data.dtype),
                                         static_cast<ncclRedOp_t>(nccl_red_op(op)), c, s);
                  });
  }
  std::unique_ptr<AsyncCollective> do_ireduce_scatter(const CommBuf& input, const CommBuf& output,
                                                      const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost || host_synchronous()) {
      return Communicator::do_ireduce_scatter(input, output, opts);
    }
    return launch(CollectiveKind::kReduceScatter, "ncclReduceScatter", opts,
                  [&](ncclComm_t c, cudaStream_t s) {
                    return ncclReduceScatter(input.data, output.data, output.count,
                                             to_nccl(input.dtype), ncclSum, c, s);
                  });
  }
  std::unique_ptr<AsyncCollective> do_iall_gather(const CommBuf& input, const CommBuf& output,
                                                  const CollectiveOptions& opts) override {
    if (space() == MemSpace::kHost || host_synchronous()) {
      return Communicator::do_iall_gather(input, output, opts);
    }
    return launch(CollectiveKind::kAllGather, "ncclAllGather", opts,
                  [&](ncclComm_t c, cudaStream_t s) {
                    return ncclAllGather(input.data, output.data, input.count,
                                         to_nccl(input.dtype), c, s);
                  });
  }

  void do_barrier(const CollectiveOptions& opts) override {
    if (space() == MemSpace::kDevice) {
      // This rank's NCCL work has finished, then the host twin's barrier.
      check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", CollectiveKind::kBarrier,
                 opts);
      check_async(CollectiveKind::kBarrier, opts);
    }
    host_->barrier(timed(opts));
  }

  std::unique_ptr<Communicator> do_split(int color, int key, std::string name, MemSpace space,
                                         const CollectiveOptions& opts) override {
    // The host split first: a host child is the answer itself; a device child's twin.
    std::unique_ptr<Communicator> twin =
        host_->split(color, key, name, MemSpace::kHost, timed(opts));
    if (space == MemSpace::kHost) return twin;
    check_alive(CollectiveKind::kSplit, opts);
    // A group of one needs no NCCL: a SelfCommunicator whose device copies are
    // stream-ordered (device_copy). Every member of a group sees the same twin size, so a
    // group is NCCL on all its ranks or on none; ncclCommSplit is collective over the
    // parent, so this rank still takes part, joining no NCCL group.
    const bool alone = twin != nullptr && twin->size() == 1 && !options_.nccl_groups_of_one;
    ncclConfig_t config = nonblocking_config(name.c_str());
    ncclComm_t child = nullptr;
    const Clock::time_point started = Clock::now();
    const ncclResult_t r = ncclCommSplit(nccl_->get(), nccl_split_color(alone ? kNoGroup : color),
                                         key, &child, &config);
    // Non-blocking: the child (when there is one) reports the split's progress.
    if (child != nullptr && (r == ncclSuccess || r == ncclInProgress)) {
      const ncclResult_t state = settle(child, r, started + effective_timeout(opts) + kGrace);
      if (state == ncclInProgress) timed_out(CollectiveKind::kSplit, opts, started);
      if (state != ncclSuccess) {
        const std::string text = nccl_result_text(state, ncclGetLastError(child));
        ncclCommAbort(child);
        fail("ncclCommSplit", CollectiveKind::kSplit, opts, text, __FILE__, __LINE__);
      }
    }
    settle_or_fail(r, "ncclCommSplit", CollectiveKind::kSplit, opts, started);
    if (color == kNoGroup) {
      TRIDENT_COMM_CHECK(*this, twin == nullptr && child == nullptr, CollectiveKind::kSplit, opts,
                         "a rank that joins no group got a communicator back");
      return nullptr;
    }
    if (alone) {
      TRIDENT_COMM_CHECK(*this, child == nullptr, CollectiveKind::kSplit, opts,
                         "ncclCommSplit returned a communicator for a group of one");
      DeviceCopy copy = device_copy(name);
      return std::make_unique<SelfCommunicator>(std::move(name), space, std::move(copy));
    }
    TRIDENT_COMM_CHECK(*this, twin != nullptr && child != nullptr, CollectiveKind::kSplit, opts,
                       "ncclCommSplit or the host split returned no communicator for color " +
                           std::to_string(color));
    auto shared = std::make_shared<NcclComm>(child, nccl_);
    NcclComm::register_abort(shared, "group '" + name + "' (rank " + std::to_string(twin->rank()) +
                                         "/" + std::to_string(twin->size()) + ")");
    return std::make_unique<NcclCommunicator>(std::move(name), space, std::move(twin),
                                              std::move(shared), options_);
  }

 private:
  // opts with this communicator's timeout made explicit: host_ has its own default.
  CollectiveOptions timed(const CollectiveOptions& opts) const {
    CollectiveOptions o = opts;
    o.timeout = effective_timeout(opts);
    return o;
  }
  // The data moves of a group of one (SelfCommunicator): stream-ordered on the compute
  // stream like the NCCL calls; without one (or synchronous), host-synchronous like them.
  DeviceCopy device_copy(const std::string& group) const {
    const auto compute = static_cast<cudaStream_t>(options_.compute_stream);
    const bool synchronous = host_synchronous();
    return [compute, synchronous, group](void* dst, const void* src, std::size_t bytes) {
      auto check = [&group](cudaError_t e, const char* call) {
        if (e == cudaSuccess) return;
        check_failed(call,
                     "group '" + group + "' (a group of one): CUDA error " + cudaGetErrorName(e) +
                         ": " + cudaGetErrorString(e),
                     __FILE__, __LINE__);
      };
      if (compute == nullptr) check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
      check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute),
            "cudaMemcpyAsync");
      if (synchronous) {
        check(compute != nullptr ? cudaStreamSynchronize(compute) : cudaDeviceSynchronize(),
              "cudaStreamSynchronize");
      }
    };
  }
  cudaStream_t stream() const {
    if (options_.compute_stream != nullptr)
      return static_cast<cudaStream_t>(options_.compute_stream);
    return own_stream_;
  }
  bool host_synchronous() const {
    return options_.compute_stream == nullptr || options_.synchronous;
  }

  // Enqueues one NCCL call (or group) and waits as the stream mode says.
  template <class Enqueue>
  void run(CollectiveKind kind, const char* call, const CollectiveOptions& opts, Enqueue enqueue) {
    check_alive(kind, opts);
    if (options_.compute_stream == nullptr) {
      // Without the Ops' stream only a device-wide sync orders the kernels before us.
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize", kind, opts);
    }
    const Clock::time_point started = Clock::now();
    const ncclResult_t r = enqueue(nccl_->get(), stream());
    settle_or_fail(r, call, kind, opts, started);
    if (!host_synchronous()) return;
    check_cuda(cudaEventRecord(done_, stream()), "cudaEventRecord", kind, opts);
    const std::chrono::milliseconds limit = effective_timeout(opts) + kGrace;
    const Clock::time_point deadline = started + limit;
    for (int polls = 0;; ++polls) {
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) check_cuda(e, "cudaEventQuery", kind, opts);
      check_async(kind, opts);
      if (Clock::now() >= deadline) timed_out(kind, opts, started);
      if (polls < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    check_async(kind, opts);
  }

  // One asynchronous collective, stream-ordered: the communication stream (this group's
  // own high-priority stream) waits for the compute stream's work so far (`ready`), runs
  // the collective between the `start` and `done` events, and the work's wait() makes the
  // compute stream wait for `done`: kernels issued after the wait see the result, kernels
  // issued before it run concurrently with the transfer. The host never blocks (the
  // watchdog sees a hang at the next host synchronisation; errors at the next call's poll).
  class NcclAsync final : public AsyncCollective {
   public:
    NcclAsync(NcclCommunicator& comm, CollectiveKind kind, CollectiveOptions opts,
              cudaEvent_t start, cudaEvent_t done)
        : comm_(comm), kind_(kind), opts_(std::move(opts)), start_(start), done_(done) {}
    ~NcclAsync() override {
      cudaEventDestroy(start_);  // released once the events complete
      cudaEventDestroy(done_);
    }
    bool test() override {
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaErrorNotReady) {
        comm_.check_async(kind_, opts_);
        return false;
      }
      comm_.check_cuda(e, "cudaEventQuery", kind_, opts_);
      join();
      return true;
    }
    void wait() override { join(); }
    double seconds() const override {
      // Known once `done` has completed: a work finished by test() has; one finished by
      // wait() (a stream join, not a host wait) usually has not, and counts 0.
      float ms = 0;
      if (cudaEventElapsedTime(&ms, start_, done_) != cudaSuccess) {
        cudaGetLastError();
        return 0;
      }
      return ms / 1e3;
    }

   private:
    void join() {
      comm_.check_cuda(cudaStreamWaitEvent(comm_.stream(), done_, 0), "cudaStreamWaitEvent",
                       kind_, opts_);
      comm_.check_async(kind_, opts_);
    }
    NcclCommunicator& comm_;
    CollectiveKind kind_;
    CollectiveOptions opts_;
    cudaEvent_t start_;
    cudaEvent_t done_;
  };

  template <class Enqueue>
  std::unique_ptr<AsyncCollective> launch(CollectiveKind kind, const char* call,
                                          const CollectiveOptions& opts, Enqueue enqueue) {
    check_alive(kind, opts);
    cudaEvent_t ready = nullptr, start = nullptr, done = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate", kind,
               opts);
    check_cuda(cudaEventCreate(&start), "cudaEventCreate", kind, opts);
    check_cuda(cudaEventCreate(&done), "cudaEventCreate", kind, opts);
    check_cuda(cudaEventRecord(ready, stream()), "cudaEventRecord", kind, opts);
    check_cuda(cudaStreamWaitEvent(own_stream_, ready, 0), "cudaStreamWaitEvent", kind, opts);
    cudaEventDestroy(ready);  // released once recorded work completes
    check_cuda(cudaEventRecord(start, own_stream_), "cudaEventRecord", kind, opts);
    const Clock::time_point started = Clock::now();
    settle_or_fail(enqueue(nccl_->get(), own_stream_), call, kind, opts, started);
    check_cuda(cudaEventRecord(done, own_stream_), "cudaEventRecord", kind, opts);
    return std::make_unique<NcclAsync>(*this, kind, opts, start, done);
  }

  // A call issued at `started` returned r: poll until it leaves ncclInProgress; fail on
  // an error, abort and exit past the timeout.
  void settle_or_fail(ncclResult_t r, const char* call, CollectiveKind kind,
                      const CollectiveOptions& opts, Clock::time_point started = Clock::now()) {
    const Clock::time_point deadline = started + effective_timeout(opts) + kGrace;
    const ncclResult_t state = settle(nccl_->get(), r, deadline);
    if (state == ncclInProgress) timed_out(kind, opts, started);
    check_nccl(state, call, kind, opts);
  }

  // An asynchronous error of an earlier stream-ordered call, or an abort, fails this call.
  void check_alive(CollectiveKind kind, const CollectiveOptions& opts) {
    TRIDENT_COMM_CHECK(*this, !nccl_->aborted(), kind, opts,
                       "the NCCL communicator was aborted (watchdog or an earlier error)");
    check_async(kind, opts);
  }
  void check_async(CollectiveKind kind, const CollectiveOptions& opts) {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(nccl_->get(), &state), "ncclCommGetAsyncError", kind, opts);
    if (state != ncclSuccess && state != ncclInProgress) {
      check_nccl(state, "ncclCommGetAsyncError (an earlier call failed)", kind, opts);
    }
  }

  void check_nccl(ncclResult_t r, const char* call, CollectiveKind kind,
                  const CollectiveOptions& opts) const {
    if (r == ncclSuccess) return;
    fail(call, kind, opts, nccl_result_text(r, ncclGetLastError(nccl_->get())), __FILE__, __LINE__);
  }
  void check_cuda(cudaError_t e, const char* call, CollectiveKind kind,
                  const CollectiveOptions& opts) const {
    if (e == cudaSuccess) return;
    fail(call, kind, opts,
         std::string("CUDA error ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e), __FILE__,
         __LINE__);
  }

  [[noreturn]] void timed_out(CollectiveKind kind, const CollectiveOptions& opts,
                              Clock::time_point started) const {
    const auto waited =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
    abort_nccl_and_exit("[rank " + std::to_string(process_identity().rank) + "] " +
                        nccl_timeout_message(name(), rank_, size_, collective_name(kind),
                                             opts.label, waited, effective_timeout(opts)));
  }

  std::unique_ptr<Communicator> host_;  // destroyed last: after the NCCL teardown
  std::shared_ptr<NcclComm> nccl_;
  NcclWorldOptions options_;
  int rank_ = 0;
  int size_ = 1;
  cudaStream_t own_stream_ = nullptr;  // device groups: high priority, non-blocking
  cudaEvent_t done_ = nullptr;         // device groups: completion of the last call
};

Status world_error(const Communicator& host, const std::string& what) {
  return Status::internal(nccl_world_error_text(host.rank(), host.size(), what,
                                                launch_environment()));
}

// Every rank learns whether any rank failed (an i64 max over the host world), so a rank
// that fails does not leave the others waiting in NCCL.
bool any_rank_failed(Communicator& host, bool failed, const char* label) {
  std::int64_t flag = failed ? 1 : 0;
  host.all_reduce(CommBuf::host(std::span<std::int64_t>(&flag, 1)), ReduceOp::kMax,
                  {.label = label});
  return flag != 0;
}

}  // namespace

std::optional<int> nccl_data_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
  }
  return std::nullopt;
}

const char* nccl_data_type_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "ncclFloat32";
    case DType::kBF16:
      return "ncclBfloat16";
    case DType::kI32:
      return "ncclInt32";
    case DType::kF64:
      return "ncclFloat64";
    case DType::kI64:
      return "ncclInt64";
    case DType::kU8:
      return "ncclUint8";
  }
  return "?";
}

int nccl_red_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

int nccl_split_color(int color) { return color == kNoGroup ? NCCL_SPLIT_NOCOLOR : color; }

std::string nccl_result_text(int result, const char* last) {
  std::string text = std::string(nccl_result_name(result)) + " (" + std::to_string(result) +
                     "): " + ncclGetErrorString(static_cast<ncclResult_t>(result));
  if (last != nullptr && *last != '\0') text += ": " + std::string(last);
  return text;
}

std::string nccl_timeout_message(const std::string& group, int rank, int size, const char* call,
                                 const std::string& label, std::chrono::milliseconds waited,
                                 std::chrono::milliseconds timeout) {
  std::string m = std::string("NCCL: ") + call;
  if (!label.empty()) m += " '" + label + "'";
  m += " in group '" + group + "' (rank " + std::to_string(rank) + "/" + std::to_string(size) +
       ") still in progress after " + std::to_string(waited.count()) + " ms (timeout " +
       std::to_string(timeout.count()) + " ms + " + std::to_string(kGrace.count()) +
       " ms grace); aborting every NCCL communicator";
  return m;
}

std::string nccl_world_error_text(int rank, int size, const std::string& what,
                                  const std::string& environment) {
  return "NCCL world: rank " + std::to_string(rank) + " of " + std::to_string(size) + ": " +
         what + " (" + environment + ")";
}

Result<std::unique_ptr<Communicator>> make_nccl_world_communicator(
    std::unique_ptr<Communicator> host, const NcclWorldOptions& options) {
  TRIDENT_CHECK_MSG(host != nullptr && host->space() == MemSpace::kHost,
                    "make_nccl_world_communicator needs a host-space communicator");
  // 1. A device on every rank (agreed, so no rank enters NCCL alone).
  std::string local;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    cudaGetLastError();
    local = std::string("no usable CUDA device (cudaGetDeviceCount: ") +
            (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")";
  } else if (options.device >= 0) {
    const cudaError_t s = cudaSetDevice(options.device);
    if (s != cudaSuccess) {
      cudaGetLastError();
      local = "cudaSetDevice(" + std::to_string(options.device) + "): " + cudaGetErrorString(s);
    }
  }
  if (any_rank_failed(*host, !local.empty(), "nccl device check")) {
    return world_error(
        *host, local.empty() ? "another rank has no usable CUDA device (see its log)" : local);
  }
  // 2. The unique id over the host world (rank 0's failure is everyone's).
  Result<NcclUniqueId> id = share_nccl_unique_id(*host);
  if (!id.is_ok()) return world_error(*host, id.status().message());
  // 3. Initialise, non-blocking, polled until done or init_timeout.
  ncclUniqueId raw;
  std::memcpy(raw.internal, id.value().data(), kNcclUniqueIdBytes);
  ncclConfig_t config = nonblocking_config("world");
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, host->size(), raw, host->rank(), &config);
  if (comm != nullptr) r = settle(comm, r, deadline_after(options.init_timeout));
  if (r != ncclSuccess) {
    local = "ncclCommInitRankConfig " +
            (r == ncclInProgress
                 ? "still in progress after " + std::to_string(options.init_timeout.count()) + " ms"
                 : "failed: " + nccl_result_text(r, ncclGetLastError(comm)));
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
  }
  if (any_rank_failed(*host, comm == nullptr, "nccl init check")) {
    if (comm != nullptr) ncclCommAbort(comm);
    return world_error(
        *host, local.empty() ? "NCCL failed to initialise on another rank (see its log)" : local);
  }
  auto shared = std::make_shared<NcclComm>(comm, nullptr);
  NcclComm::register_abort(shared, "group 'world' (rank " + std::to_string(host->rank()) + "/" +
                                       std::to_string(host->size()) + ")");
  std::unique_ptr<Communicator> world = std::make_unique<NcclCommunicator>(
      "world", MemSpace::kHost, std::move(host), std::move(shared), options);
  return world;
}

}  // namespace trident
