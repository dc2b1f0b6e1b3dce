// Communicator: the only way model, parallel and trainer code talks to other ranks.
// One Communicator per process group ("world", "dp", "tp", "pp", "embedding"), in the
// style of PyTorch c10d. Backends: SelfCommunicator (a group of one: a process without a
// launcher, or any group of size 1; this file), the MPI one (comm/mpi/) and the NCCL one
// (comm/nccl/). No MPI, NCCL or CUDA header is visible through this file.
//
// Contract (every backend, every group):
// - Ordering. Every rank of a group calls the same collectives, in the same order, with
//   the same sizes, the same reduce op and the same root. Point-to-point send/recv pairs
//   must match (peer, tag, size). split() is a collective of the parent group. A rank
//   that breaks this hangs or corrupts the group; nothing can detect it cheaply, which is
//   why every call carries CollectiveOptions (timeout + label): the hang watchdog
//   (comm/watchdog.h), when one is running, ends a rank blocked in a call past its
//   timeout and names the call.
// - Threads. A process calls into its communicators from one thread at a time; in
//   practice the training thread. The traffic counters are plain integers owned by that
//   thread. (The MPI backend asks for MPI_THREAD_MULTIPLE because its asynchronous
//   collectives run on a communication thread of their own; see "Asynchronous
//   collectives". The public calls, CommWork's included, stay single-threaded.)
// - Buffers. Every call takes CommBuf values (address, count, dtype, memory space; see
//   below). Collectives are in place or write to caller-owned buffers; chunked
//   collectives (reduce_scatter, all_gather) take equal chunks: input/output count =
//   size() * chunk. Input and output of one call share dtype and space. Ranks are group
//   ranks (0..size()-1), not world ranks.
// - Memory space (docs/ARCHITECTURE.md "Memory, dtypes and streams"). Every communicator serves one
//   space, space(): world and its host twins carry host values (flags, losses, agreement,
//   stats, strings); dp, tp, pp and embedding carry device memory (comm/topology.h). A
//   buffer of the other space aborts the call ("host buffer passed to a device
//   communicator", or the reverse). When a DeviceAccessHook is installed
//   (core/device_access.h: the checked backend) the claim is verified too: a device buffer
//   must lie in one device allocation, a host buffer must not. A call on device memory
//   runs its backend work (MPI call, copy, isend staging copy) inside a
//   DeviceAccessScope: a communicator serving device memory is device code, like NCCL.
//   On CPU both spaces are host RAM, so the MPI and self backends serve either.
// - Errors. Misuse (wrong buffer sizes, an unsupported dtype, a buffer of the other memory
//   space, a bad root or peer, send to self) and transport
//   errors are programming or system errors, not expected failures: they abort through
//   check_failed (core/check.h) with a message naming rank, group, collective and label,
//   e.g. "[rank 3 on host] CHECK failed: MPI_Allreduce ... group 'tp' (rank 1/2)
//   all_reduce 'layer 4 attn out': MPI_ERR_TRUNCATE". Under mpirun/srun an aborting rank
//   takes the job down. Expected failures (a layout that does not fit the world) are
//   Status values returned by comm/topology.h.
// - Determinism. For a fixed group size and fixed buffer sizes, results are bitwise
//   identical run to run and on every rank of the group (MPI picks its algorithm from
//   size and count only; tests/comm checks both). Float sums across different group
//   sizes differ in rounding, as everywhere.
//
// Traffic counters (bytes, per kind, since reset_traffic()): the algorithm-independent
// payload of nccl-tests' "size" column, so tests can compare with analytic volumes:
//   all_reduce      n bytes of the buffer
//   reduce_scatter  size() * chunk bytes (the input)
//   all_gather      size() * chunk bytes (the output)
//   broadcast       n bytes, counted on every rank, root included
//   send            n bytes sent;  recv: n bytes received (counted apart, under kRecv)
//   all_to_all      sum(send_counts) elements of input, this rank's own chunk included
//                   (nccl-tests' alltoall "size"; the bytes received are the caller's
//                   recv_counts, the same total over the group)
// Bytes are those of the payload in its dtype (a bf16 buffer counts 2 per element, half
// of f32). Counted even when size() == 1. Bytes on the wire for a ring algorithm are payload *
// bus_factor(kind, size()): 2(p-1)/p for all_reduce, (p-1)/p for reduce_scatter and
// all_gather, 1 for broadcast and send (nccl-tests' busbw convention), (p-1)/p for all_to_all
// (exact for equal chunks; with uneven counts the wire carries the input less its own chunk).
//
// Reductions: all_reduce takes f32, bf16, f64 and i64 (sum, max); reduce_scatter f32 and
// bf16 (sum). A bf16 sum is computed in fp32 and rounded to bf16 (nearest even) once per
// combining step: the backend combines two bf16 vectors at a time (MPI: a user-defined
// commutative op on a 2-byte type; the wire carries bf16), so a p-rank sum rounds p-1
// times, in the backend's order. That is NOT fp32-sum-then-round-once (for 2 ranks the two
// agree exactly; for more they differ within bf16 rounding per step), and it is as
// deterministic as any reduction here (fixed by group size and count). A bf16 max is exact.
//
// Asynchronous collectives (iall_reduce, ireduce_scatter, iall_gather -> CommWork), for
// overlapping communication with compute (docs/ARCHITECTURE.md "Data parallelism, ZeRO and
// overlap"):
// - Same arguments, checks, messages, dtype rules and traffic counting as the synchronous
//   call (counted at issue). The result is bitwise equal to the synchronous call's for the
//   same inputs (same group, sizes and op), so overlap on and off train identically.
// - The caller must neither read nor write the call's buffers until the work is finished
//   (wait() returned, or test() returned true); the communicator must outlive the work.
// - Ordering. The issue counts as the collective's call for the ordering rule: every rank
//   issues the same sequence of collectives on a communicator, sync and async mixed, in
//   the same order (MPI requires matching order; NCCL runs in launch order). Works may be
//   waited in any order. Async calls on one communicator execute one at a time in issue
//   order; they may run concurrently with later synchronous calls of the same group.
// - Progress (MPI). A per-communicator communication thread (started at the first async
//   call, which also duplicates the MPI communicator, collectively) runs the very same
//   blocking MPI_Allreduce / MPI_Reduce_scatter_block / MPI_Allgather on that duplicate,
//   in issue order, while the caller computes: the transfer really progresses without the
//   caller entering MPI, and bitwise equality holds by construction (same call, same
//   algorithm choice). MPI's own non-blocking collectives (libnbc) were not used: their
//   MPI_Ireduce_scatter_block sums in another order than MPI_Reduce_scatter_block at 4 and
//   8 ranks (measured, Open MPI 4.1), and they progress only inside MPI calls. Needs
//   MPI_THREAD_MULTIPLE (requested at init); where MPI provides less (a caller that
//   initialized MPI itself at a lower level), the async calls run synchronously at issue
//   and return a finished work. The self backend also completes at issue (its device
//   copies are stream-ordered where its DeviceCopy is: a later kernel on that stream sees
//   them), and it is never staged (below): it works inside the call's scope.
// - Device memory (the checked backend, core/device_access.h). When a DeviceAccessHook is
//   installed, device buffers of an async call are staged (every backend but the self
//   one): at issue the inputs are copied
//   into a host buffer owned by the work (inside a DeviceAccessScope), the backend works on
//   the host copy outside any scope, and at completion (wait/test, on the caller's thread)
//   the result is copied back inside a scope. Without a hook device memory is host RAM on
//   CPU and the backend works on the caller's buffers directly (NCCL: device memory,
//   the comm stream; never a hook).
// - Watchdog. A wait that blocks is a blocking call: reported to the CallObserver as
//   "all_reduce (wait)", "reduce_scatter (wait)" or "all_gather (wait)" with the issue's
//   options (timeout, label). The issue is reported under the collective's own name (it
//   blocks only on backends that complete at issue).
// - Lifetime. A CommWork must be finished before it is destroyed or assigned over: an
//   unfinished one CHECK-fails ("... destroyed before wait()"), so a forgotten wait cannot
//   silently leave a buffer half-written. Destroying a communicator with unfinished works
//   CHECK-fails too, naming how many (every backend destructor calls
//   check_no_outstanding_work() first).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/memory.h"

namespace trident {

enum class ReduceOp { kSum, kMax };

// What a call is, for counters and messages. kCount is the number of kinds.
enum class CollectiveKind {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kBarrier,
  kSplit,
  kAllToAll,
  kCount
};
const char* collective_name(CollectiveKind kind);  // "all_reduce", "send", ...

// A buffer handed to a communicator: address, element count, dtype, memory space. Does
// not own the memory. Not an aggregate on purpose: a buffer is made by device() or host()
// (or the four-value constructor), so every call states its dtype and memory space and a
// braced {pointer, size} does not compile.
struct CommBuf {
  void* data = nullptr;  // (count) elements of dtype
  std::size_t count = 0;
  DType dtype = DType::kU8;
  MemSpace space = MemSpace::kHost;

  CommBuf() = default;
  CommBuf(void* data_, std::size_t count_, DType dtype_, MemSpace space_)
      : data(data_), count(count_), dtype(dtype_), space(space_) {}
  std::size_t bytes() const { return count * dtype_size(dtype); }
  // count elements of p's dtype, in device memory.
  static CommBuf device(DevPtr p, std::size_t count) {
    return CommBuf(p.raw(), count, p.dtype(), MemSpace::kDevice);
  }
  // Host memory; dtype_of<T> (std::byte and uint8_t: u8). Inputs may be spans of const.
  template <class T>
  static CommBuf host(std::span<T> s) {
    using E = std::remove_cv_t<T>;
    return CommBuf(const_cast<E*>(s.data()), s.size(), dtype_of<E>(), MemSpace::kHost);
  }
};

// One point-to-point operation of a batch (Communicator::batch_p2p).
struct P2POp {
  enum Kind : std::uint8_t { kSend, kRecv };
  Kind kind = kSend;
  CommBuf buf;
  int peer = -1;  // group rank at the other end
  int tag = 0;
};

// Per-call options. A default-constructed value means "communicator defaults".
struct CollectiveOptions {
  // How long this call may block before the hang watchdog (comm/watchdog.h), if one
  // is running, declares it hung; 0 = the communicator's default_timeout().
  std::chrono::milliseconds timeout{0};
  // Names the call in error and watchdog messages, e.g. "grad bucket 3".
  std::string label;
};

// Bytes and calls per kind since the last reset (see the payload convention above).
struct TrafficCounters {
  std::array<std::int64_t, static_cast<int>(CollectiveKind::kCount)> bytes{};
  std::array<std::int64_t, static_cast<int>(CollectiveKind::kCount)> calls{};
  std::int64_t bytes_of(CollectiveKind k) const { return bytes[static_cast<int>(k)]; }
  std::int64_t calls_of(CollectiveKind k) const { return calls[static_cast<int>(k)]; }
};

// Where the calling thread's communication time went, in seconds since reset_traffic()
// (the overlap instrumentation, docs/ARCHITECTURE.md "Observability"):
//   exposed_s  time the caller was blocked inside this communicator's calls: synchronous
//              collectives and point-to-point calls, async issues (they block only where
//              the backend completes at issue) and CommWork::wait. The compute waited.
//   async_s    the asynchronous collectives' own running time (AsyncCollective::seconds:
//              MPI, the communication thread's call; 0 where a backend cannot tell).
//   hidden_s   per work, max(0, its running time - the time the caller waited for it):
//              communication that ran while the caller computed.
// Both are also split by the kind of the call, so each collective kind's cost can be read
// apart (a reduce-scatter and an all-gather of the same bytes need not take as long).
// A call counts under its collective's kind; a CommWork's wait and hidden time under the
// kind of the collective it was issued for; send and isend under kSend, recv under kRecv,
// wait_sends under kSend (what it waits for), a batch_p2p or ibatch_p2p under its first
// operation's kind (the kind an ibatch_p2p's CommWork carries).
struct CommTimes {
  double exposed_s = 0, async_s = 0, hidden_s = 0;
  // exposed_s by the kind of the blocking call (the rule above); sums to exposed_s.
  std::array<double, static_cast<int>(CollectiveKind::kCount)> exposed_by_kind{};
  // hidden_s by the kind of the work's collective; sums to hidden_s.
  std::array<double, static_cast<int>(CollectiveKind::kCount)> hidden_by_kind{};
  double exposed_of(CollectiveKind k) const { return exposed_by_kind[static_cast<int>(k)]; }
  double hidden_of(CollectiveKind k) const { return hidden_by_kind[static_cast<int>(k)]; }
  // With Communicator::record_calls on (off by default: the list grows by one entry a
  // call until reset_traffic), each all-reduce, reduce-scatter and all-gather call, in
  // issue order, with its own exposed + hidden seconds (a blocking call's; an
  // asynchronous one's issue, wait and hidden time, added as they happen). A collective is issued by every rank of the group
  // in the same order, so the i-th entries of its ranks are one call, and the least of
  // them is that call without the ranks' arrival skew: the rank that arrived last waited
  // for the transfer alone (the trainer's comm_kind_least_ms).
  struct Call {
    CollectiveKind kind = CollectiveKind::kAllReduce;
    double seconds = 0;
  };
  std::vector<Call> calls;
};

// Ring-algorithm wire bytes per payload byte for a group of group_size ranks.
double bus_factor(CollectiveKind kind, int group_size);

// Passed as split()'s color by ranks that join no group; they get nullptr back.
inline constexpr int kNoGroup = -1;

class Communicator;
namespace detail {
class WatchedCall;  // comm/communicator.cpp: watchdog reporting and CommTimes of a call
}  // namespace detail

// The backend's side of one asynchronous collective (Communicator::do_i*). Called only from
// the caller's thread, through CommWork.
class AsyncCollective {
 public:
  virtual ~AsyncCollective() = default;
  // Non-blocking: whether the collective has completed (aborts on a transport error).
  virtual bool test() = 0;
  // Blocks until it has completed (aborts on a transport error).
  virtual void wait() = 0;
  // Once completed: how long the collective itself ran (seconds), for CommTimes; 0 when
  // the backend does not measure it.
  virtual double seconds() const { return 0; }
};

// A handle on an asynchronous collective (Communicator::iall_reduce, ireduce_scatter,
// iall_gather; contract: "Asynchronous collectives" above). Movable, not copyable. An
// empty work (default-constructed or moved-from) is finished.
class CommWork {
 public:
  CommWork() = default;
  CommWork(CommWork&& other) noexcept;
  CommWork& operator=(CommWork&& other);  // CHECK-fails if *this is unfinished
  CommWork(const CommWork&) = delete;
  CommWork& operator=(const CommWork&) = delete;
  ~CommWork();  // CHECK-fails if unfinished

  // Blocks until the collective has completed and its result is in the caller's buffers;
  // reported to the watchdog. No-op once finished.
  void wait();
  // Non-blocking: true once the collective has completed and its result is in the
  // caller's buffers (the work is then finished).
  bool test();
  bool finished() const { return comm_ == nullptr; }

 private:
  friend class Communicator;
  void finish();  // copy-out (staged), then release from the communicator

  Communicator* comm_ = nullptr;  // null = finished
  CollectiveKind kind_ = CollectiveKind::kAllReduce;
  CollectiveOptions opts_;
  std::unique_ptr<AsyncCollective> backend_;  // null: completed at issue
  // Staging (device buffers under a DeviceAccessHook): the backend's host copy and where
  // its result goes back to.
  std::unique_ptr<std::byte[]> staging_;
  struct CopyOut {
    const std::byte* src;  // in staging_
    void* dst;
    std::size_t bytes;
  };
  std::vector<CopyOut> copy_outs_;  // one per output buffer (ibatch_p2p: per receive)
  int peer_ = -1;        // the watchdog's peer of a blocking wait (ibatch_p2p)
  double waited_s_ = 0;  // time wait() blocked, for CommTimes::hidden_s
  // Its CommTimes::calls entry (-1: none), valid while the communicator's times_epoch_ is
  // `epoch_`.
  int call_ = -1;
  std::uint64_t epoch_ = 0;
};

// Sees every blocking call of every communicator of the process, for the hang watchdog
// (comm/watchdog.h), which implements it; this layer does not depend on it. The
// public calls report the backend hook's extent: call_started right before do_*,
// call_ended right after (argument checks and counting are outside). Calls may come
// from any thread that uses a communicator; the observer synchronizes itself.
class CallObserver {
 public:
  virtual ~CallObserver() = default;
  // call: collective_name(kind), or "wait_sends". peer: the group rank at the other end
  // of a send/isend/recv, else -1. Returns a token handed back to call_ended.
  virtual std::uint64_t call_started(const Communicator& comm, const char* call, int peer,
                                     const CollectiveOptions& opts) = 0;
  virtual void call_ended(std::uint64_t token) = 0;
};

// The process's observer; nullptr (the default) = none, and then a call costs one atomic
// load more. Replace it only while no communicator call is in flight (the observer seen
// on a call's entry is the one told of its end).
void set_call_observer(CallObserver* observer);
CallObserver* call_observer();

// The public calls check arguments (sizes, dtypes, memory space), count traffic, open a
// DeviceAccessScope for device buffers, then call the backend's do_* (non-virtual
// interface: checking, counting and scoping are the same for every backend).
class Communicator {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{10 * 60 * 1000};

  explicit Communicator(std::string name, MemSpace space = MemSpace::kHost)
      : name_(std::move(name)), space_(space) {}
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name for messages: "world", "dp", "tp", "pp", "embedding".
  const std::string& name() const { return name_; }
  // "mpi" or "self".
  virtual const char* backend() const = 0;
  // The world rank (process_identity().rank, core/check.h) of each rank of this group, by
  // group rank; empty when the backend cannot tell. Fixed when the group is made (no
  // communication; safe from any thread): the watchdog names hosts with it.
  virtual std::vector<int> world_ranks() const { return {}; }
  // The memory space of every buffer this communicator accepts (see the contract).
  MemSpace space() const { return space_; }

  // The watchdog timeout of calls whose opts.timeout is 0. split() children copy it, so
  // set it on the world before splitting (the trainer sets it from the config).
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }
  void set_default_timeout(std::chrono::milliseconds t) { default_timeout_ = t; }
  // opts.timeout, or the default when it is 0.
  std::chrono::milliseconds effective_timeout(const CollectiveOptions& opts) const;

  // In place; every rank ends with the element-wise reduction over the group.
  // f32, bf16, f64, i64; sum or max (bf16 sum: see "Reductions" above).
  void all_reduce(CommBuf data, ReduceOp op, const CollectiveOptions& opts = {});

  // Sum; f32 or bf16. input: (size() * chunk), output: (chunk) = this rank's chunk of
  // the sum.
  void reduce_scatter(CommBuf input, CommBuf output, const CollectiveOptions& opts = {});

  // Any dtype. input: (chunk), output: (size() * chunk); rank r's input lands at
  // [r*chunk, (r+1)*chunk).
  void all_gather(CommBuf input, CommBuf output, const CollectiveOptions& opts = {});

  // Any dtype, in place: every rank ends with root's elements.
  void broadcast(CommBuf data, int root, const CollectiveOptions& opts = {});

  // Blocking point-to-point, any dtype; peer != rank(). A recv must match a send's
  // (peer, tag, dtype, count). A large send may wait until its recv is posted: order
  // pairs so no cycle of ranks all send first (e.g. even stages send first, odd stages
  // receive first).
  void send(CommBuf data, int dst, int tag, const CollectiveOptions& opts = {});
  void recv(CommBuf data, int src, int tag, const CollectiveOptions& opts = {});

  // Non-blocking send with copy semantics: data is copied into a staging buffer the
  // communicator owns and the call returns at once, so the caller may reuse data
  // immediately and a send never waits for its recv (pipeline stages send with this and
  // block only in recv). Same checks and pairing rules as send; counted under kSend like
  // send. Sends to one peer with one tag arrive in call order (MPI's non-overtaking
  // rule). The send completes in wait_sends() or when the communicator is destroyed
  // (which blocks until the peers have received; so post every matching recv); its
  // staging buffer is then reused by a later isend (a grow-only pool: once warm, an
  // isend allocates nothing). Backends without a non-blocking path fall back to the
  // blocking send.
  void isend(CommBuf data, int dst, int tag, const CollectiveOptions& opts = {});
  // Blocks until every isend of this communicator has completed.
  void wait_sends(const CollectiveOptions& opts = {});

  // Sends and receives issued as one group (NCCL's ncclGroupStart/End): they progress
  // together, so ranks that send to each other at the same time cannot deadlock. A lone
  // send can: on NCCL a send completes only once its receive is posted, and a
  // communicator runs its operations in launch order, so two neighbours that both send
  // first wait for each other forever. Returns when every receive has completed and every
  // send's buffer may be reused: the send has completed, or (backends with isend's copy
  // semantics, like MPI) its payload has been copied and it completes by wait_sends().
  // Each operation has the pairing, checks and counting of send / recv. The default
  // (MPI, self) copies the sends out as isends, then receives in order; a backend whose
  // isend blocks must override it.
  void batch_p2p(std::span<const P2POp> ops, const CollectiveOptions& opts = {});
  // Asynchronous batch_p2p (ring attention's exchanges, overlapped with the block's
  // attention): the same operations, checks, counting (at issue) and NCCL-safe grouping,
  // and bitwise the same received data; the rules of "Asynchronous collectives" above,
  // with one relaxation: the caller may READ a send's buffer while the work runs (never
  // write it), and neither reads nor writes a receive's. Under a protecting hook the
  // sends are staged at issue and the receives copied back at completion. The watchdog
  // sees the issue as "batch_p2p" and a blocking wait as "batch_p2p (wait)", both naming
  // the peer batch_p2p names. MPI: the batch (MPI_Isend/MPI_Irecv of every operation,
  // then MPI_Waitall) runs on the communication thread; NCCL: the group on the
  // communicator's own stream between events; self and host-synchronous NCCL: complete at
  // issue (the blocking batch).
  [[nodiscard]] CommWork ibatch_p2p(std::span<const P2POp> ops,
                                    const CollectiveOptions& opts = {});
  // isends not yet known to be complete (completed ones are reaped on the next isend).
  virtual std::size_t pending_sends() const { return 0; }
  // Bytes held by isend staging buffers: grow-only, so constant once the sizes and the
  // depth of in-flight isends repeat (tests check that a warm isend allocates nothing).
  virtual std::size_t isend_staging_bytes() const { return 0; }

  void barrier(const CollectiveOptions& opts = {});

  // Personalised exchange with per-peer counts (MPI_Alltoallv), any dtype, the token
  // dispatch of expert parallelism. input: this rank's chunks for ranks 0..size()-1 back
  // to back, send_counts[r] elements for rank r; output: the chunks from ranks
  // 0..size()-1 back to back, recv_counts[r] elements from rank r. Both span size()
  // counts, input.count = sum(send_counts), output.count = sum(recv_counts), and the two
  // buffers do not overlap. recv_counts[r] must equal rank r's send_counts[rank()] (the
  // caller knows them, e.g. from a first all_to_all of the counts); the own chunk is
  // checked (send_counts[rank()] == recv_counts[rank()]), the others cannot be cheaply.
  // Zero counts are fine; every rank calls, even one with all counts zero.
  void all_to_all(CommBuf input, std::span<const std::size_t> send_counts, CommBuf output,
                  std::span<const std::size_t> recv_counts, const CollectiveOptions& opts = {});

  // Asynchronous all_reduce, reduce_scatter and all_gather: same arguments and rules as
  // the synchronous calls; see "Asynchronous collectives" above.
  [[nodiscard]] CommWork iall_reduce(CommBuf data, ReduceOp op, const CollectiveOptions& opts = {});
  [[nodiscard]] CommWork ireduce_scatter(CommBuf input, CommBuf output,
                                         const CollectiveOptions& opts = {});
  [[nodiscard]] CommWork iall_gather(CommBuf input, CommBuf output,
                                     const CollectiveOptions& opts = {});
  // Works issued by this communicator and not yet finished.
  std::size_t outstanding_work() const { return outstanding_work_; }

  // Collective over this group. Ranks with the same color form a new group named
  // `name`, ordered by (key, parent rank), serving `space` (default: this group's).
  // color == kNoGroup: this rank joins none and gets nullptr. The child inherits the
  // default timeout.
  std::unique_ptr<Communicator> split(int color, int key, std::string name,
                                      const CollectiveOptions& opts = {});
  std::unique_ptr<Communicator> split(int color, int key, std::string name, MemSpace space,
                                      const CollectiveOptions& opts = {});

  const TrafficCounters& traffic() const { return traffic_; }
  // Also resets times().
  void reset_traffic() {
    traffic_ = {};
    times_ = {};
    ++times_epoch_;  // a work issued before keeps its call out of the new times
  }
  const CommTimes& times() const { return times_; }
  // Whether times().calls records each ring collective (CommTimes::calls); off by default.
  // Turn it on only where reset_traffic() runs regularly (the trainer's groups: each step).
  void record_calls(bool on) { record_calls_ = on; }

  // Aborts with a message naming rank, group, collective and label; for backends.
  [[noreturn]] void fail(const char* statement, CollectiveKind kind, const CollectiveOptions& opts,
                         const std::string& detail, const char* file, int line) const;

 protected:
  // Backend hooks. Arguments are already checked (sizes, dtype, space: every buffer has
  // space()); counts are in elements of the buffer's dtype; a device buffer's call runs
  // inside a DeviceAccessScope. reduce_scatter: output.count is the chunk.
  virtual void do_all_reduce(const CommBuf& data, ReduceOp op, const CollectiveOptions& opts) = 0;
  virtual void do_reduce_scatter(const CommBuf& input, const CommBuf& output,
                                 const CollectiveOptions& opts) = 0;
  virtual void do_all_gather(const CommBuf& input, const CommBuf& output,
                             const CollectiveOptions& opts) = 0;
  virtual void do_broadcast(const CommBuf& data, int root, const CollectiveOptions& opts) = 0;
  virtual void do_send(const CommBuf& data, int dst, int tag, const CollectiveOptions& opts) = 0;
  virtual void do_recv(const CommBuf& data, int src, int tag, const CollectiveOptions& opts) = 0;
  // Must copy data before returning. Default: the blocking do_send.
  virtual void do_isend(const CommBuf& data, int dst, int tag, const CollectiveOptions& opts) {
    do_send(data, dst, tag, opts);
  }
  virtual void do_wait_sends(const CollectiveOptions& opts) {}
  virtual void do_batch_p2p(std::span<const P2POp> ops, const CollectiveOptions& opts);
  // ibatch_p2p's hook: ops already checked and counted (staged buffers in place of device
  // ones under a hook). Default: do_batch_p2p, then nullptr (completed at issue).
  virtual std::unique_ptr<AsyncCollective> do_ibatch_p2p(std::span<const P2POp> ops,
                                                         const CollectiveOptions& opts);
  virtual void do_barrier(const CollectiveOptions& opts) = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key, std::string name,
                                                 MemSpace space,
                                                 const CollectiveOptions& opts) = 0;
  // Async hooks: same arguments as the synchronous hooks (buffers already staged where the
  // contract says so; no DeviceAccessScope is open when the buffers are staged). Return
  // the backend's work, or nullptr when the collective has already completed. The
  // default runs the synchronous hook and returns nullptr (backends without async).
  virtual std::unique_ptr<AsyncCollective> do_iall_reduce(const CommBuf& data, ReduceOp op,
                                                          const CollectiveOptions& opts);
  virtual std::unique_ptr<AsyncCollective> do_ireduce_scatter(const CommBuf& input,
                                                              const CommBuf& output,
                                                              const CollectiveOptions& opts);
  virtual std::unique_ptr<AsyncCollective> do_iall_gather(const CommBuf& input,
                                                          const CommBuf& output,
                                                          const CollectiveOptions& opts);
  // Counts already checked against size() and the buffers; offsets are the prefix sums.
  virtual void do_all_to_all(const CommBuf& input, std::span<const std::size_t> send_counts,
                             const CommBuf& output, std::span<const std::size_t> recv_counts,
                             const CollectiveOptions& opts) = 0;
  // Aborts, naming the group and the count, if works are unfinished. Every backend's
  // destructor calls it first (the base destructor cannot: rank() is virtual).
  void check_no_outstanding_work() const;
  // Whether the async calls stage device buffers on the host under a DeviceAccessHook
  // (the contract's "Device memory"): true for backends that work outside the call's
  // DeviceAccessScope; false for one that completes at issue inside it (self).
  virtual bool stages_async_device_buffers() const { return true; }

 private:
  friend class CommWork;
  friend class detail::WatchedCall;
  // The argument checks of all_reduce / reduce_scatter / all_gather, shared by the
  // synchronous and asynchronous calls.
  void check_all_reduce(const CommBuf& data, const CollectiveOptions& opts) const;
  void check_reduce_scatter(const CommBuf& input, const CommBuf& output,
                            const CollectiveOptions& opts) const;
  void check_all_gather(const CommBuf& input, const CommBuf& output,
                        const CollectiveOptions& opts) const;
  // The common tail of the three async calls: staging, watching, the backend hook.
  template <class Issue>
  CommWork issue_async(CollectiveKind kind, const CommBuf& input, const CommBuf& output,
                       std::size_t copy_in_bytes, std::size_t copy_out_bytes,
                       const CollectiveOptions& opts, Issue&& issue);

  // batch_p2p's and ibatch_p2p's checks and counting; returns the watchdog's peer and
  // whether any buffer is device memory.
  int check_batch_p2p(std::span<const P2POp> ops, const CollectiveOptions& opts, bool* device);
  void count(CollectiveKind kind, std::size_t bytes);
  // Aborts unless buf is in space() (and, with a hook installed, really is).
  void check_space(const CommBuf& buf, CollectiveKind kind, const CollectiveOptions& opts) const;
  // Aborts unless a and b share dtype (space is checked by check_space).
  void check_same_dtype(const CommBuf& a, const CommBuf& b, CollectiveKind kind,
                        const CollectiveOptions& opts) const;
  // Aborts unless dst/src is another rank of the group and tag is portable.
  void check_peer(int peer, int tag, CollectiveKind kind, const CollectiveOptions& opts) const;
  std::string name_;
  MemSpace space_;
  std::chrono::milliseconds default_timeout_ = kDefaultTimeout;
  TrafficCounters traffic_;
  // Written by the blocking calls' WatchedCall (const calls too) and CommWork::finish.
  mutable CommTimes times_;
  std::uint64_t times_epoch_ = 0;  // reset_traffic()s so far
  bool record_calls_ = false;
  // A new CommTimes::calls entry for a call of `kind`; -1 (none) for the other kinds, or
  // when record_calls is off.
  int open_call(CollectiveKind kind) const;
  std::size_t outstanding_work_ = 0;
};

// Aborts through Communicator::fail when cond is false.
#define TRIDENT_COMM_CHECK(comm, cond, kind, opts, detail)                         \
  do {                                                                             \
    if (!(cond)) (comm).fail(#cond, (kind), (opts), (detail), __FILE__, __LINE__); \
  } while (0)

// Moves `bytes` from device address src to device address dst (the ranges may overlap
// only when equal), ordered after the device work issued before it and before the work
// issued after it: the compute backend's stream-ordered device-to-device copy (the
// trainer passes Ops::copy; the NCCL backend, cudaMemcpyAsync on the compute stream).
// Aborts on a device error. comm/ needs no device header for it.
using DeviceCopy = std::function<void(void* dst, const void* src, std::size_t bytes)>;

// A group of one: size 1; all_reduce, broadcast and barrier are no-ops (a reduction over
// one rank is its input), reduce_scatter, all_gather and all_to_all copy input to output
// (nothing when in place), send/recv abort (there is no peer). Traffic is counted as for any
// backend. Async calls complete at issue. Serves either space:
// - host buffers, and device buffers without a DeviceCopy: memmove (CPU, where device
//   memory is host RAM; a device buffer's copy runs inside the DeviceAccessScope the
//   public call opens);
// - device buffers with a DeviceCopy (`device_copy`): through it, never touched by host
//   code, so device memory a host cannot address (CUDA) works. The trainer uses this for
//   the groups of a world of one (no NCCL), the NCCL backend for its groups of size 1.
// split() children inherit the DeviceCopy.
class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(std::string name = "world", MemSpace space = MemSpace::kHost,
                            DeviceCopy device_copy = {})
      : Communicator(std::move(name), space), device_copy_(std::move(device_copy)) {}
  ~SelfCommunicator() override { check_no_outstanding_work(); }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "self"; }
  std::vector<int> world_ranks() const override;  // this process's world rank
  // Whether device buffers move through a DeviceCopy.
  bool has_device_copy() const { return static_cast<bool>(device_copy_); }

 protected:
  void do_all_reduce(const CommBuf&, ReduceOp, const CollectiveOptions&) override {}
  void do_reduce_scatter(const CommBuf& input, const CommBuf& output,
                         const CollectiveOptions& opts) override;
  void do_all_gather(const CommBuf& input, const CommBuf& output,
                     const CollectiveOptions& opts) override;
  void do_broadcast(const CommBuf&, int, const CollectiveOptions&) override {}
  void do_send(const CommBuf& data, int dst, int tag, const CollectiveOptions& opts) override;
  void do_recv(const CommBuf& data, int src, int tag, const CollectiveOptions& opts) override;
  void do_barrier(const CollectiveOptions&) override {}
  std::unique_ptr<Communicator> do_split(int color, int key, std::string name, MemSpace space,
                                         const CollectiveOptions& opts) override;
  void do_all_to_all(const CommBuf& input, std::span<const std::size_t> send_counts,
                     const CommBuf& output, std::span<const std::size_t> recv_counts,
                     const CollectiveOptions& opts) override;
  bool stages_async_device_buffers() const override { return false; }

 private:
  // input -> output (bytes), through device_copy_ for device buffers when there is one.
  void move(const CommBuf& input, const CommBuf& output, std::size_t bytes) const;

  DeviceCopy device_copy_;
};

// Which launcher started this process, from its environment: the name of the first
// variable found among OMPI_COMM_WORLD_SIZE (Open MPI's mpirun), PMIX_RANK (srun
// --mpi=pmix, prterun), PMI_RANK (MPICH's hydra, srun --mpi=pmi2), and SLURM_STEP_ID
// together with SLURM_STEP_NUM_TASKS > 1 (a multi-task srun step; an sbatch script's
// own environment has no step id); "" when none. env defaults to std::getenv (tests
// pass a fake).
using EnvLookup = const char* (*)(const char*);
std::string detect_launcher(EnvLookup env = nullptr);

// What a process was launched with, for error messages (e.g. NCCL failing to
// initialise): the launcher detect_launcher finds, every rank, size and local-rank
// variable that is set (Open MPI, PMIx, PMI, Slurm, torchrun-style), and
// CUDA_VISIBLE_DEVICES, e.g. "launcher OMPI_COMM_WORLD_SIZE; OMPI_COMM_WORLD_RANK=1
// OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=1; CUDA_VISIBLE_DEVICES=0,1", or
// "no launcher; no rank variables; CUDA_VISIBLE_DEVICES unset" (set but empty:
// CUDA_VISIBLE_DEVICES="" (hides every GPU)). env as for detect_launcher.
std::string launch_environment(EnvLookup env = nullptr);

// The world communicator, serving HOST memory (the trainer's flags, losses, agreement,
// stats and strings; device groups are split from it with MemSpace::kDevice): MPI when
// detect_launcher() finds a launcher, else a SelfCommunicator. Collective over all
// processes of the launch. Initializes MPI if nobody has; MPI_Finalize then runs when the
// last MPI communicator of this process (world or split child, in any order) is
// destroyed, so destroy them all before exit (one leaked communicator means no
// MPI_Finalize, and mpirun reports the rank as failed). When the caller initialized MPI
// itself, finalizing stays the caller's job. Also records rank and size for CHECK
// messages (core/check.h). argc/argv may be null.
std::unique_ptr<Communicator> make_world_communicator(int* argc, char*** argv);

}  // namespace trident
