#include "comm/communicator.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "core/check.h"
#include "core/device_access.h"
#include "core/timer.h"

namespace trident {

namespace {

// The smallest tag upper bound MPI guarantees (MPI_TAG_UB >= 32767).
constexpr int kMaxPortableTag = 32767;

// The counters' and times' kind of one point-to-point operation (a batch's: its first's).
CollectiveKind p2p_kind(const P2POp& op) {
  return op.kind == P2POp::kSend ? CollectiveKind::kSend : CollectiveKind::kRecv;
}

std::string rank_range(int value, int size) {
  return std::to_string(value) + " (group size " + std::to_string(size) + ")";
}

// Process-wide by nature: it watches every communicator of the process. Acquire/release
// so an observer's construction is visible to the calls that load it.
std::atomic<CallObserver*> g_call_observer{nullptr};

}  // namespace

namespace detail {
// Tells the observer (if any) that a blocking backend call starts; its destructor, that
// the call has returned. Declared right before the do_* call.
// Also times the call into the communicator's CommTimes::exposed_s and, under `kind` (the
// rule of CommTimes), exposed_by_kind (`seconds`, when given, gets the same figure).
class WatchedCall {
 public:
  // `call`: the CommTimes::calls entry the seconds also add to (-1: none).
  WatchedCall(const Communicator& comm, CollectiveKind kind, const char* call, int peer,
              const CollectiveOptions& opts, double* seconds = nullptr, int call_entry = -1)
      : observer_(g_call_observer.load(std::memory_order_acquire)),
        times_(comm.times_),
        kind_(kind),
        seconds_(seconds),
        call_entry_(call_entry) {
    if (observer_ != nullptr) token_ = observer_->call_started(comm, call, peer, opts);
  }
  ~WatchedCall() {
    if (observer_ != nullptr) observer_->call_ended(token_);
    const double s = timer_.elapsed_s();
    times_.exposed_s += s;
    times_.exposed_by_kind[static_cast<int>(kind_)] += s;
    if (call_entry_ >= 0) times_.calls[static_cast<size_t>(call_entry_)].seconds += s;
    if (seconds_ != nullptr) *seconds_ = s;
  }
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  CallObserver* observer_;
  std::uint64_t token_ = 0;
  CommTimes& times_;
  CollectiveKind kind_;
  double* seconds_;
  int call_entry_;
  Timer timer_;
};
}  // namespace detail

namespace {
using detail::WatchedCall;

// The DeviceAccessScope of a call whose buffers are in `space`: open for device memory
// only, so host calls never touch the hook.
class DeviceWork {
 public:
  explicit DeviceWork(MemSpace space) {
    if (space == MemSpace::kDevice) scope_.emplace();
  }

 private:
  std::optional<DeviceAccessScope> scope_;
};

std::string address_text(const CommBuf& buf) {
  char text[64];
  std::snprintf(text, sizeof(text), "%p, %zu bytes", buf.data, buf.bytes());
  return text;
}

}  // namespace

void set_call_observer(CallObserver* observer) {
  g_call_observer.store(observer, std::memory_order_release);
}
CallObserver* call_observer() { return g_call_observer.load(std::memory_order_acquire); }

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kSend:
      return "send";
    case CollectiveKind::kRecv:
      return "recv";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kSplit:
      return "split";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kCount:
      break;
  }
  return "?";
}

double bus_factor(CollectiveKind kind, int group_size) {
  const double p = group_size;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2.0 * (p - 1) / p;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
      return (p - 1) / p;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv:
      return group_size > 1 ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

std::chrono::milliseconds Communicator::effective_timeout(const CollectiveOptions& opts) const {
  return opts.timeout.count() > 0 ? opts.timeout : default_timeout_;
}

void Communicator::fail(const char* statement, CollectiveKind kind, const CollectiveOptions& opts,
                        const std::string& detail, const char* file, int line) const {
  std::string message = "in group '" + name_ + "' (rank " + std::to_string(rank()) + "/" +
                        std::to_string(size()) + ", " + backend() + ") " + collective_name(kind);
  if (!opts.label.empty()) message += " '" + opts.label + "'";
  message += " (timeout " + std::to_string(effective_timeout(opts).count()) + " ms)";
  if (!detail.empty()) message += ": " + detail;
  check_failed(statement, message, file, line);
}

void Communicator::count(CollectiveKind kind, std::size_t bytes) {
  const int k = static_cast<int>(kind);
  traffic_.bytes[k] += static_cast<std::int64_t>(bytes);
  traffic_.calls[k] += 1;
}

void Communicator::check_space(const CommBuf& buf, CollectiveKind kind,
                               const CollectiveOptions& opts) const {
  TRIDENT_COMM_CHECK(*this, buf.space == space_, kind, opts,
                     std::string(mem_space_name(buf.space)) + " buffer passed to a " +
                         mem_space_name(space_) + " communicator");
  const DeviceAccessHook* hook = device_access_hook();
  if (hook == nullptr || buf.bytes() == 0) return;
  const bool is_device = hook->is_device_range(buf.data, buf.bytes());
  TRIDENT_COMM_CHECK(*this, is_device == (buf.space == MemSpace::kDevice), kind, opts,
                     std::string("buffer claimed as ") + mem_space_name(buf.space) +
                         " memory is " + (is_device ? "" : "not ") + "device memory (" +
                         address_text(buf) + ")");
}

void Communicator::check_same_dtype(const CommBuf& a, const CommBuf& b, CollectiveKind kind,
                                    const CollectiveOptions& opts) const {
  TRIDENT_COMM_CHECK(*this, a.dtype == b.dtype, kind, opts,
                     std::string("input is ") + dtype_name(a.dtype) + ", output " +
                         dtype_name(b.dtype) + "; they must match");
}

void Communicator::check_peer(int peer, int tag, CollectiveKind kind,
                              const CollectiveOptions& opts) const {
  const bool sending = kind == CollectiveKind::kSend;
  TRIDENT_COMM_CHECK(*this, peer >= 0 && peer < size() && peer != rank(), kind, opts,
                     std::string(sending ? "destination " : "source ") + rank_range(peer, size()) +
                         (sending ? " from rank " : " at rank ") + std::to_string(rank()));
  TRIDENT_COMM_CHECK(*this, tag >= 0 && tag <= kMaxPortableTag, kind, opts,
                     "tag " + std::to_string(tag) + " outside [0, 32767]");
}

void Communicator::check_all_reduce(const CommBuf& data, const CollectiveOptions& opts) const {
  constexpr CollectiveKind kind = CollectiveKind::kAllReduce;
  check_space(data, kind, opts);
  const DType t = data.dtype;
  TRIDENT_COMM_CHECK(*this,
                     t == DType::kF32 || t == DType::kBF16 || t == DType::kF64 || t == DType::kI64,
                     kind, opts,
                     std::string("dtype ") + dtype_name(t) +
                         " cannot be reduced (f32, bf16, f64 and i64 can)");
}

void Communicator::check_reduce_scatter(const CommBuf& input, const CommBuf& output,
                                        const CollectiveOptions& opts) const {
  constexpr CollectiveKind kind = CollectiveKind::kReduceScatter;
  check_space(input, kind, opts);
  check_space(output, kind, opts);
  check_same_dtype(input, output, kind, opts);
  TRIDENT_COMM_CHECK(*this, input.dtype == DType::kF32 || input.dtype == DType::kBF16, kind, opts,
                     std::string("dtype ") + dtype_name(input.dtype) +
                         " cannot be reduce-scattered (f32 and bf16 can)");
  TRIDENT_COMM_CHECK(*this, input.count == output.count * static_cast<std::size_t>(size()), kind,
                     opts,
                     "input has " + std::to_string(input.count) + " elements, output " +
                         std::to_string(output.count) + "; need input = size * output");
}

void Communicator::check_all_gather(const CommBuf& input, const CommBuf& output,
                                    const CollectiveOptions& opts) const {
  constexpr CollectiveKind kind = CollectiveKind::kAllGather;
  check_space(input, kind, opts);
  check_space(output, kind, opts);
  check_same_dtype(input, output, kind, opts);
  TRIDENT_COMM_CHECK(*this, output.count == input.count * static_cast<std::size_t>(size()), kind,
                     opts,
                     "input has " + std::to_string(input.count) + " elements, output " +
                         std::to_string(output.count) + "; need output = size * input");
}

int Communicator::open_call(CollectiveKind kind) const {
  if (!record_calls_ || (kind != CollectiveKind::kAllReduce && kind != CollectiveKind::kReduceScatter &&
                         kind != CollectiveKind::kAllGather)) {
    return -1;
  }
  times_.calls.push_back({kind, 0.0});
  return static_cast<int>(times_.calls.size() - 1);
}

void Communicator::all_reduce(CommBuf data, ReduceOp op, const CollectiveOptions& opts) {
  check_all_reduce(data, opts);
  count(CollectiveKind::kAllReduce, data.bytes());
  if (data.count == 0) return;  // every rank has the same size, so every rank skips
  WatchedCall watched(*this, CollectiveKind::kAllReduce, "all_reduce", -1, opts, nullptr,
                      open_call(CollectiveKind::kAllReduce));
  DeviceWork device(data.space);
  do_all_reduce(data, op, opts);
}

void Communicator::reduce_scatter(CommBuf input, CommBuf output, const CollectiveOptions& opts) {
  check_reduce_scatter(input, output, opts);
  count(CollectiveKind::kReduceScatter, input.bytes());
  if (output.count == 0) return;
  WatchedCall watched(*this, CollectiveKind::kReduceScatter, "reduce_scatter", -1, opts, nullptr,
                      open_call(CollectiveKind::kReduceScatter));
  DeviceWork device(input.space);
  do_reduce_scatter(input, output, opts);
}

void Communicator::all_gather(CommBuf input, CommBuf output, const CollectiveOptions& opts) {
  check_all_gather(input, output, opts);
  count(CollectiveKind::kAllGather, output.bytes());
  if (input.count == 0) return;
  WatchedCall watched(*this, CollectiveKind::kAllGather, "all_gather", -1, opts, nullptr,
                      open_call(CollectiveKind::kAllGather));
  DeviceWork device(input.space);
  do_all_gather(input, output, opts);
}

void Communicator::broadcast(CommBuf data, int root, const CollectiveOptions& opts) {
  constexpr CollectiveKind kind = CollectiveKind::kBroadcast;
  check_space(data, kind, opts);
  TRIDENT_COMM_CHECK(*this, root >= 0 && root < size(), kind, opts,
                     "root " + rank_range(root, size()));
  count(kind, data.bytes());
  if (data.count == 0) return;
  WatchedCall watched(*this, kind, "broadcast", -1, opts);
  DeviceWork device(data.space);
  do_broadcast(data, root, opts);
}

void Communicator::send(CommBuf data, int dst, int tag, const CollectiveOptions& opts) {
  check_space(data, CollectiveKind::kSend, opts);
  check_peer(dst, tag, CollectiveKind::kSend, opts);
  count(CollectiveKind::kSend, data.bytes());
  WatchedCall watched(*this, CollectiveKind::kSend, "send", dst, opts);
  DeviceWork device(data.space);
  do_send(data, dst, tag, opts);
}

void Communicator::recv(CommBuf data, int src, int tag, const CollectiveOptions& opts) {
  check_space(data, CollectiveKind::kRecv, opts);
  check_peer(src, tag, CollectiveKind::kRecv, opts);
  count(CollectiveKind::kRecv, data.bytes());
  WatchedCall watched(*this, CollectiveKind::kRecv, "recv", src, opts);
  DeviceWork device(data.space);
  do_recv(data, src, tag, opts);
}

void Communicator::isend(CommBuf data, int dst, int tag, const CollectiveOptions& opts) {
  check_space(data, CollectiveKind::kSend, opts);
  check_peer(dst, tag, CollectiveKind::kSend, opts);
  count(CollectiveKind::kSend, data.bytes());
  // Blocking where a backend falls back to send.
  WatchedCall watched(*this, CollectiveKind::kSend, "isend", dst, opts);
  DeviceWork device(data.space);  // covers the staging copy
  do_isend(data, dst, tag, opts);
}

void Communicator::wait_sends(const CollectiveOptions& opts) {
  WatchedCall watched(*this, CollectiveKind::kSend, "wait_sends", -1, opts);
  do_wait_sends(opts);
}

int Communicator::check_batch_p2p(std::span<const P2POp> ops, const CollectiveOptions& opts,
                                  bool* device) {
  *device = false;
  for (const P2POp& op : ops) {
    const CollectiveKind kind = p2p_kind(op);
    check_space(op.buf, kind, opts);
    check_peer(op.peer, op.tag, kind, opts);
    count(kind, op.buf.bytes());
    *device = *device || op.buf.space == MemSpace::kDevice;
  }
  // The watchdog names one peer: the first receive's when there is one (what a dead peer
  // blocks: the sends are buffered), else the first send's. A batch is one pipeline
  // exchange with neighbours.
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::kRecv) return op.peer;
  }
  return ops.front().peer;
}

void Communicator::batch_p2p(std::span<const P2POp> ops, const CollectiveOptions& opts) {
  if (ops.empty()) return;
  bool device = false;
  const int peer = check_batch_p2p(ops, opts, &device);
  WatchedCall watched(*this, p2p_kind(ops.front()), "batch_p2p", peer, opts);
  DeviceWork work(device ? MemSpace::kDevice : MemSpace::kHost);
  do_batch_p2p(ops, opts);
}

void Communicator::do_batch_p2p(std::span<const P2POp> ops, const CollectiveOptions& opts) {
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::kSend) do_isend(op.buf, op.peer, op.tag, opts);
  }
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::kRecv) do_recv(op.buf, op.peer, op.tag, opts);
  }
}

void Communicator::barrier(const CollectiveOptions& opts) {
  count(CollectiveKind::kBarrier, 0);
  WatchedCall watched(*this, CollectiveKind::kBarrier, "barrier", -1, opts);
  do_barrier(opts);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string name,
                                                  const CollectiveOptions& opts) {
  return split(color, key, std::move(name), space_, opts);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string name,
                                                  MemSpace space, const CollectiveOptions& opts) {
  TRIDENT_COMM_CHECK(*this, color >= 0 || color == kNoGroup, CollectiveKind::kSplit, opts,
                     "color " + std::to_string(color) + " (use kNoGroup to join no group)");
  count(CollectiveKind::kSplit, 0);
  std::unique_ptr<Communicator> child;
  {
    WatchedCall watched(*this, CollectiveKind::kSplit, "split", -1, opts);
    child = do_split(color, key, std::move(name), space, opts);
  }
  if (child) child->set_default_timeout(default_timeout_);
  return child;
}

// ---- asynchronous collectives --------------------------------------------------------

namespace {
// The watchdog's name of a blocking wait (string literals: the observer may keep them).
const char* wait_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce (wait)";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter (wait)";
    case CollectiveKind::kAllGather:
      return "all_gather (wait)";
    case CollectiveKind::kSend:  // ibatch_p2p's works (their kind: the first operation's)
    case CollectiveKind::kRecv:
      return "batch_p2p (wait)";
    default:
      return "? (wait)";
  }
}
}  // namespace

CommWork::CommWork(CommWork&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      kind_(other.kind_),
      opts_(std::move(other.opts_)),
      backend_(std::move(other.backend_)),
      staging_(std::move(other.staging_)),
      copy_outs_(std::move(other.copy_outs_)),
      peer_(other.peer_),
      waited_s_(other.waited_s_),
      call_(other.call_),
      epoch_(other.epoch_) {}

CommWork& CommWork::operator=(CommWork&& other) {
  if (this == &other) return *this;
  if (!finished()) {
    comm_->fail("finished()", kind_, opts_,
                "an unfinished CommWork was assigned over (wait() it first)", __FILE__, __LINE__);
  }
  comm_ = std::exchange(other.comm_, nullptr);
  kind_ = other.kind_;
  opts_ = std::move(other.opts_);
  backend_ = std::move(other.backend_);
  staging_ = std::move(other.staging_);
  copy_outs_ = std::move(other.copy_outs_);
  peer_ = other.peer_;
  waited_s_ = other.waited_s_;
  call_ = other.call_;
  epoch_ = other.epoch_;
  return *this;
}

CommWork::~CommWork() {
  if (!finished()) {
    comm_->fail("finished()", kind_, opts_,
                "CommWork destroyed before wait() (wait or test it to completion first)",
                __FILE__, __LINE__);
  }
}

void CommWork::wait() {
  if (finished()) return;
  if (backend_) {
    WatchedCall watched(*comm_, kind_, wait_name(kind_), peer_, opts_, &waited_s_,
                        epoch_ == comm_->times_epoch_ ? call_ : -1);
    backend_->wait();
  }
  finish();
}

bool CommWork::test() {
  if (finished()) return true;
  if (backend_ && !backend_->test()) return false;
  finish();
  return true;
}

void CommWork::finish() {
  if (backend_) {
    const double ran = backend_->seconds();
    comm_->times_.async_s += ran;
    const double hidden = std::max(0.0, ran - waited_s_);
    comm_->times_.hidden_s += hidden;
    comm_->times_.hidden_by_kind[static_cast<int>(kind_)] += hidden;
    if (call_ >= 0 && epoch_ == comm_->times_epoch_) {
      comm_->times_.calls[static_cast<size_t>(call_)].seconds += hidden;
    }
  }
  if (!copy_outs_.empty()) {
    DeviceAccessScope scope;  // the caller's buffers are device memory under a hook
    for (const CopyOut& c : copy_outs_) std::memcpy(c.dst, c.src, c.bytes);
  }
  backend_.reset();
  staging_.reset();
  copy_outs_.clear();
  --comm_->outstanding_work_;
  comm_ = nullptr;
}

template <class Issue>
CommWork Communicator::issue_async(CollectiveKind kind, const CommBuf& input,
                                   const CommBuf& output, std::size_t copy_in_bytes,
                                   std::size_t copy_out_bytes, const CollectiveOptions& opts,
                                   Issue&& issue) {
  CommWork work;
  work.comm_ = this;
  work.kind_ = kind;
  work.opts_ = opts;
  ++outstanding_work_;
  if (copy_in_bytes == 0) return work;  // empty: every rank skips, as in the sync call
  // A protected device buffer may be touched by the backend only inside a scope, and the
  // backend works outside one (another thread, later MPI calls): stage it on the host.
  const bool staged = input.space == MemSpace::kDevice && device_access_hook() != nullptr &&
                      stages_async_device_buffers();
  CommBuf in = input, out = output;
  if (staged) {
    const bool in_place = input.data == output.data && copy_in_bytes == copy_out_bytes;
    work.staging_ =
        std::make_unique_for_overwrite<std::byte[]>(copy_in_bytes + (in_place ? 0 : copy_out_bytes));
    {
      DeviceAccessScope scope;
      std::memcpy(work.staging_.get(), input.data, copy_in_bytes);
    }
    in.data = work.staging_.get();
    out.data = in_place ? in.data : work.staging_.get() + copy_in_bytes;
    work.copy_outs_.push_back({static_cast<const std::byte*>(out.data), output.data, copy_out_bytes});
  }
  work.call_ = open_call(kind);
  work.epoch_ = times_epoch_;
  WatchedCall watched(*this, kind, collective_name(kind), -1, opts, nullptr, work.call_);
  DeviceWork device(staged ? MemSpace::kHost : input.space);
  work.backend_ = issue(in, out);
  return work;
}

CommWork Communicator::iall_reduce(CommBuf data, ReduceOp op, const CollectiveOptions& opts) {
  check_all_reduce(data, opts);
  count(CollectiveKind::kAllReduce, data.bytes());
  return issue_async(CollectiveKind::kAllReduce, data, data, data.bytes(), data.bytes(), opts,
                     [&](const CommBuf& in, const CommBuf&) { return do_iall_reduce(in, op, opts); });
}

CommWork Communicator::ireduce_scatter(CommBuf input, CommBuf output,
                                       const CollectiveOptions& opts) {
  check_reduce_scatter(input, output, opts);
  count(CollectiveKind::kReduceScatter, input.bytes());
  return issue_async(CollectiveKind::kReduceScatter, input, output,
                     output.count == 0 ? 0 : input.bytes(), output.bytes(), opts,
                     [&](const CommBuf& in, const CommBuf& out) {
                       return do_ireduce_scatter(in, out, opts);
                     });
}

CommWork Communicator::iall_gather(CommBuf input, CommBuf output, const CollectiveOptions& opts) {
  check_all_gather(input, output, opts);
  count(CollectiveKind::kAllGather, output.bytes());
  return issue_async(CollectiveKind::kAllGather, input, output, input.bytes(), output.bytes(),
                     opts, [&](const CommBuf& in, const CommBuf& out) {
                       return do_iall_gather(in, out, opts);
                     });
}

CommWork Communicator::ibatch_p2p(std::span<const P2POp> ops, const CollectiveOptions& opts) {
  CommWork work;
  work.comm_ = this;
  work.opts_ = opts;
  ++outstanding_work_;
  if (ops.empty()) return work;
  work.kind_ = p2p_kind(ops.front());
  bool device = false;
  work.peer_ = check_batch_p2p(ops, opts, &device);
  // Staging (as issue_async): every device buffer gets a host copy owned by the work, the
  // sends' filled now, the receives' copied back at completion.
  const bool staged = device && device_access_hook() != nullptr && stages_async_device_buffers();
  std::vector<P2POp> staged_ops;
  if (staged) {
    std::size_t total = 0;
    for (const P2POp& op : ops) total += op.buf.bytes();
    work.staging_ = std::make_unique_for_overwrite<std::byte[]>(total);
    staged_ops.assign(ops.begin(), ops.end());
    std::byte* at = work.staging_.get();
    DeviceAccessScope scope;
    for (P2POp& op : staged_ops) {
      if (op.kind == P2POp::kSend) {
        std::memcpy(at, op.buf.data, op.buf.bytes());
      } else {
        work.copy_outs_.push_back({at, op.buf.data, op.buf.bytes()});
      }
      op.buf.data = at;
      op.buf.space = MemSpace::kHost;
      at += op.buf.bytes();
    }
    ops = staged_ops;
  }
  WatchedCall watched(*this, work.kind_, "batch_p2p", work.peer_, opts);
  DeviceWork scope(device && !staged ? MemSpace::kDevice : MemSpace::kHost);
  work.backend_ = do_ibatch_p2p(ops, opts);
  return work;
}

std::unique_ptr<AsyncCollective> Communicator::do_ibatch_p2p(std::span<const P2POp> ops,
                                                             const CollectiveOptions& opts) {
  do_batch_p2p(ops, opts);
  return nullptr;
}

std::unique_ptr<AsyncCollective> Communicator::do_iall_reduce(const CommBuf& data, ReduceOp op,
                                                              const CollectiveOptions& opts) {
  do_all_reduce(data, op, opts);
  return nullptr;
}

std::unique_ptr<AsyncCollective> Communicator::do_ireduce_scatter(const CommBuf& input,
                                                                  const CommBuf& output,
                                                                  const CollectiveOptions& opts) {
  do_reduce_scatter(input, output, opts);
  return nullptr;
}

std::unique_ptr<AsyncCollective> Communicator::do_iall_gather(const CommBuf& input,
                                                              const CommBuf& output,
                                                              const CollectiveOptions& opts) {
  do_all_gather(input, output, opts);
  return nullptr;
}

void Communicator::check_no_outstanding_work() const {
  if (outstanding_work_ == 0) return;
  check_failed("outstanding_work() == 0",
               "communicator '" + name_ + "' (rank " + std::to_string(rank()) + "/" +
                   std::to_string(size()) + ", " + backend() + ") destroyed with " +
                   std::to_string(outstanding_work_) +
                   " unfinished async collective(s); wait() every CommWork first",
               __FILE__, __LINE__);
}

// ---- all_to_all ---------------------------------------------------------------------

void Communicator::all_to_all(CommBuf input, std::span<const std::size_t> send_counts,
                              CommBuf output, std::span<const std::size_t> recv_counts,
                              const CollectiveOptions& opts) {
  constexpr CollectiveKind kind = CollectiveKind::kAllToAll;
  check_space(input, kind, opts);
  check_space(output, kind, opts);
  check_same_dtype(input, output, kind, opts);
  const auto p = static_cast<std::size_t>(size());
  TRIDENT_COMM_CHECK(*this, send_counts.size() == p && recv_counts.size() == p, kind, opts,
                     std::to_string(send_counts.size()) + " send counts and " +
                         std::to_string(recv_counts.size()) +
                         " receive counts; need one per rank (" + std::to_string(p) + ")");
  std::size_t sent = 0, received = 0;
  for (std::size_t r = 0; r < p; ++r) {
    sent += send_counts[r];
    received += recv_counts[r];
  }
  TRIDENT_COMM_CHECK(*this, input.count == sent && output.count == received, kind, opts,
                     "input has " + std::to_string(input.count) + " elements, output " +
                         std::to_string(output.count) + "; the counts sum to " +
                         std::to_string(sent) + " sent and " + std::to_string(received) +
                         " received");
  const auto me = static_cast<std::size_t>(rank());
  TRIDENT_COMM_CHECK(*this, send_counts[me] == recv_counts[me], kind, opts,
                     "this rank sends itself " + std::to_string(send_counts[me]) +
                         " elements but expects " + std::to_string(recv_counts[me]));
  const auto* in = static_cast<const std::byte*>(input.data);
  const auto* out = static_cast<const std::byte*>(output.data);
  TRIDENT_COMM_CHECK(*this,
                     input.bytes() == 0 || output.bytes() == 0 || in + input.bytes() <= out ||
                         out + output.bytes() <= in,
                     kind, opts, "input and output overlap");
  count(kind, input.bytes());
  // No early return on empty buffers: unlike the chunked collectives the counts differ
  // per rank, so a rank with nothing to move still takes part in the exchange.
  WatchedCall watched(*this, kind, "all_to_all", -1, opts);
  DeviceWork device(input.space);
  do_all_to_all(input, send_counts, output, recv_counts, opts);
}

// ---- SelfCommunicator ---------------------------------------------------------------

std::vector<int> SelfCommunicator::world_ranks() const { return {process_identity().rank}; }

void SelfCommunicator::move(const CommBuf& input, const CommBuf& output,
                            std::size_t bytes) const {
  if (input.data == output.data) return;
  if (input.space == MemSpace::kDevice && device_copy_) {
    device_copy_(output.data, input.data, bytes);
  } else {
    std::memmove(output.data, input.data, bytes);
  }
}

void SelfCommunicator::do_reduce_scatter(const CommBuf& input, const CommBuf& output,
                                         const CollectiveOptions&) {
  move(input, output, output.bytes());
}

void SelfCommunicator::do_all_gather(const CommBuf& input, const CommBuf& output,
                                     const CollectiveOptions&) {
  move(input, output, input.bytes());
}

// The public call checked send_counts[0] == recv_counts[0]: the input is the output.
void SelfCommunicator::do_all_to_all(const CommBuf& input, std::span<const std::size_t>,
                                     const CommBuf& output, std::span<const std::size_t>,
                                     const CollectiveOptions&) {
  if (input.count > 0) move(input, output, input.bytes());
}

// Unreachable: the public send/recv reject peer == rank() and size() is 1.
void SelfCommunicator::do_send(const CommBuf&, int dst, int, const CollectiveOptions& opts) {
  fail("send in a single-process run", CollectiveKind::kSend, opts,
       "no peer " + std::to_string(dst), __FILE__, __LINE__);
}
void SelfCommunicator::do_recv(const CommBuf&, int src, int, const CollectiveOptions& opts) {
  fail("recv in a single-process run", CollectiveKind::kRecv, opts,
       "no peer " + std::to_string(src), __FILE__, __LINE__);
}

std::unique_ptr<Communicator> SelfCommunicator::do_split(int color, int, std::string name,
                                                         MemSpace space,
                                                         const CollectiveOptions&) {
  if (color == kNoGroup) return nullptr;
  return std::make_unique<SelfCommunicator>(std::move(name), space, device_copy_);
}

// ---- launcher detection and the world ---------------------------------------------------

std::string detect_launcher(EnvLookup env) {
  if (env == nullptr) env = [](const char* key) -> const char* { return std::getenv(key); };
  for (const char* key : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"}) {
    if (env(key) != nullptr) return key;
  }
  const char* step = env("SLURM_STEP_ID");
  const char* tasks = env("SLURM_STEP_NUM_TASKS");
  if (step != nullptr && tasks != nullptr && std::atoi(tasks) > 1) return "SLURM_STEP_ID";
  return "";
}

std::string launch_environment(EnvLookup env) {
  if (env == nullptr) env = [](const char* key) -> const char* { return std::getenv(key); };
  const std::string launcher = detect_launcher(env);
  std::string text = launcher.empty() ? "no launcher" : "launcher " + launcher;
  // The rank, size and local-rank variables of the launchers detect_launcher knows, and
  // of torchrun-style launches (kernels/cuda picks its device from the local rank).
  std::string vars;
  for (const char* key :
       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK",
        "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_STEP_ID",
        "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID", "RANK", "WORLD_SIZE",
        "LOCAL_RANK"}) {
    if (const char* value = env(key)) {
      if (!vars.empty()) vars += ' ';
      vars += std::string(key) + "=" + value;
    }
  }
  text += "; " + (vars.empty() ? std::string("no rank variables") : vars);
  const char* devices = env("CUDA_VISIBLE_DEVICES");
  if (devices == nullptr) {
    text += "; CUDA_VISIBLE_DEVICES unset";
  } else if (*devices == '\0') {
    text += "; CUDA_VISIBLE_DEVICES=\"\" (hides every GPU)";
  } else {
    text += "; CUDA_VISIBLE_DEVICES=" + std::string(devices);
  }
  return text;
}

}  // namespace trident
