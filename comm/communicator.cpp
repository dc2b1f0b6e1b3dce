#include "comm/communicator.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "comm/mpi/mpi_communicator.h"
#include "core/check.h"

namespace trident {

namespace {

// The smallest tag upper bound MPI guarantees (MPI_TAG_UB >= 32767).
constexpr int kMaxPortableTag = 32767;

std::string rank_range(int value, int size) {
  return std::to_string(value) + " (group size " + std::to_string(size) + ")";
}

// Process-wide by nature: it watches every communicator of the process. Acquire/release
// so an observer's construction is visible to the calls that load it.
std::atomic<CallObserver*> g_call_observer{nullptr};

// Tells the observer (if any) that a blocking backend call starts; its destructor, that
// the call has returned. Declared right before the do_* call.
class WatchedCall {
 public:
  WatchedCall(const Communicator& comm, const char* call, int peer, const CollectiveOptions& opts)
      : observer_(g_call_observer.load(std::memory_order_acquire)) {
    if (observer_ != nullptr) token_ = observer_->call_started(comm, call, peer, opts);
  }
  ~WatchedCall() {
    if (observer_ != nullptr) observer_->call_ended(token_);
  }
  WatchedCall(const WatchedCall&) = delete;
  WatchedCall& operator=(const WatchedCall&) = delete;

 private:
  CallObserver* observer_;
  std::uint64_t token_ = 0;
};

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
    case CollectiveKind::kCount:
      break;
  }
  return "?";
}

std::size_t comm_dtype_size(CommDtype dtype) {
  switch (dtype) {
    case CommDtype::kF32:
      return 4;
    case CommDtype::kF64:
      return 8;
    case CommDtype::kI64:
      return 8;
    case CommDtype::kByte:
      return 1;
  }
  return 1;
}

double bus_factor(CollectiveKind kind, int group_size) {
  const double p = group_size;
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return 2.0 * (p - 1) / p;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
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

void Communicator::all_reduce_any(void* data, std::size_t count_elems, CommDtype dtype, ReduceOp op,
                                  const CollectiveOptions& opts) {
  count(CollectiveKind::kAllReduce, count_elems * comm_dtype_size(dtype));
  if (count_elems == 0) return;  // every rank has the same size, so every rank skips
  WatchedCall watched(*this, "all_reduce", -1, opts);
  do_all_reduce(data, count_elems, dtype, op, opts);
}

void Communicator::all_reduce(std::span<float> data, ReduceOp op, const CollectiveOptions& opts) {
  all_reduce_any(data.data(), data.size(), CommDtype::kF32, op, opts);
}
void Communicator::all_reduce(std::span<double> data, ReduceOp op, const CollectiveOptions& opts) {
  all_reduce_any(data.data(), data.size(), CommDtype::kF64, op, opts);
}
void Communicator::all_reduce(std::span<std::int64_t> data, ReduceOp op,
                              const CollectiveOptions& opts) {
  all_reduce_any(data.data(), data.size(), CommDtype::kI64, op, opts);
}

void Communicator::reduce_scatter(std::span<const float> input, std::span<float> output,
                                  const CollectiveOptions& opts) {
  TRIDENT_COMM_CHECK(*this, input.size() == output.size() * static_cast<std::size_t>(size()),
                     CollectiveKind::kReduceScatter, opts,
                     "input has " + std::to_string(input.size()) + " floats, output " +
                         std::to_string(output.size()) + "; need input = size * output");
  count(CollectiveKind::kReduceScatter, input.size_bytes());
  if (output.empty()) return;
  WatchedCall watched(*this, "reduce_scatter", -1, opts);
  do_reduce_scatter(input.data(), output.data(), output.size(), opts);
}

void Communicator::all_gather(std::span<const float> input, std::span<float> output,
                              const CollectiveOptions& opts) {
  TRIDENT_COMM_CHECK(*this, output.size() == input.size() * static_cast<std::size_t>(size()),
                     CollectiveKind::kAllGather, opts,
                     "input has " + std::to_string(input.size()) + " floats, output " +
                         std::to_string(output.size()) + "; need output = size * input");
  count(CollectiveKind::kAllGather, output.size_bytes());
  if (input.empty()) return;
  WatchedCall watched(*this, "all_gather", -1, opts);
  do_all_gather(input.data(), output.data(), input.size_bytes(), CommDtype::kF32, opts);
}

void Communicator::all_gather_bytes(std::span<const std::byte> input, std::span<std::byte> output,
                                    const CollectiveOptions& opts) {
  TRIDENT_COMM_CHECK(*this, output.size() == input.size() * static_cast<std::size_t>(size()),
                     CollectiveKind::kAllGather, opts,
                     "input has " + std::to_string(input.size()) + " bytes, output " +
                         std::to_string(output.size()) + "; need output = size * input");
  count(CollectiveKind::kAllGather, output.size_bytes());
  if (input.empty()) return;
  WatchedCall watched(*this, "all_gather", -1, opts);
  do_all_gather(input.data(), output.data(), input.size(), CommDtype::kByte, opts);
}

void Communicator::broadcast(std::span<std::byte> data, int root, const CollectiveOptions& opts) {
  TRIDENT_COMM_CHECK(*this, root >= 0 && root < size(), CollectiveKind::kBroadcast, opts,
                     "root " + rank_range(root, size()));
  count(CollectiveKind::kBroadcast, data.size());
  if (data.empty()) return;
  WatchedCall watched(*this, "broadcast", -1, opts);
  do_broadcast(data.data(), data.size(), root, opts);
}

void Communicator::send(std::span<const float> data, int dst, int tag,
                        const CollectiveOptions& opts) {
  TRIDENT_COMM_CHECK(
      *this, dst >= 0 && dst < size() && dst != rank(), CollectiveKind::kSend, opts,
      "destination " + rank_range(dst, size()) + " from rank " + std::to_string(rank()));
  TRIDENT_COMM_CHECK(*this, tag >= 0 && tag <= kMaxPortableTag, CollectiveKind::kSend, opts,
                     "tag " + std::to_string(tag) + " outside [0, 32767]");
  count(CollectiveKind::kSend, data.size_bytes());
  WatchedCall watched(*this, "send", dst, opts);
  do_send(data.data(), data.size(), dst, tag, opts);
}

void Communicator::recv(std::span<float> data, int src, int tag, const CollectiveOptions& opts) {
  TRIDENT_COMM_CHECK(*this, src >= 0 && src < size() && src != rank(), CollectiveKind::kRecv, opts,
                     "source " + rank_range(src, size()) + " at rank " + std::to_string(rank()));
  TRIDENT_COMM_CHECK(*this, tag >= 0 && tag <= kMaxPortableTag, CollectiveKind::kRecv, opts,
                     "tag " + std::to_string(tag) + " outside [0, 32767]");
  count(CollectiveKind::kRecv, data.size_bytes());
  WatchedCall watched(*this, "recv", src, opts);
  do_recv(data.data(), data.size(), src, tag, opts);
}

void Communicator::isend(std::span<const float> data, int dst, int tag,
                         const CollectiveOptions& opts) {
  TRIDENT_COMM_CHECK(
      *this, dst >= 0 && dst < size() && dst != rank(), CollectiveKind::kSend, opts,
      "destination " + rank_range(dst, size()) + " from rank " + std::to_string(rank()));
  TRIDENT_COMM_CHECK(*this, tag >= 0 && tag <= kMaxPortableTag, CollectiveKind::kSend, opts,
                     "tag " + std::to_string(tag) + " outside [0, 32767]");
  count(CollectiveKind::kSend, data.size_bytes());
  WatchedCall watched(*this, "isend", dst, opts);  // blocking where a backend falls back
  do_isend(data.data(), data.size(), dst, tag, opts);
}

void Communicator::wait_sends(const CollectiveOptions& opts) {
  WatchedCall watched(*this, "wait_sends", -1, opts);
  do_wait_sends(opts);
}

void Communicator::barrier(const CollectiveOptions& opts) {
  count(CollectiveKind::kBarrier, 0);
  WatchedCall watched(*this, "barrier", -1, opts);
  do_barrier(opts);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, std::string name,
                                                  const CollectiveOptions& opts) {
  TRIDENT_COMM_CHECK(*this, color >= 0 || color == kNoGroup, CollectiveKind::kSplit, opts,
                     "color " + std::to_string(color) + " (use kNoGroup to join no group)");
  count(CollectiveKind::kSplit, 0);
  std::unique_ptr<Communicator> child;
  {
    WatchedCall watched(*this, "split", -1, opts);
    child = do_split(color, key, std::move(name), opts);
  }
  if (child) child->set_default_timeout(default_timeout_);
  return child;
}

// ---- SelfCommunicator ---------------------------------------------------------------

void SelfCommunicator::do_reduce_scatter(const float* input, float* output, std::size_t chunk,
                                         const CollectiveOptions&) {
  if (input != output) std::memmove(output, input, chunk * sizeof(float));
}

void SelfCommunicator::do_all_gather(const void* input, void* output, std::size_t chunk_bytes,
                                     CommDtype, const CollectiveOptions&) {
  if (input != output) std::memmove(output, input, chunk_bytes);
}

// Unreachable: the public send/recv reject peer == rank() and size() is 1.
void SelfCommunicator::do_send(const float*, std::size_t, int dst, int,
                               const CollectiveOptions& opts) {
  fail("send in a single-process run", CollectiveKind::kSend, opts,
       "no peer " + std::to_string(dst), __FILE__, __LINE__);
}
void SelfCommunicator::do_recv(float*, std::size_t, int src, int, const CollectiveOptions& opts) {
  fail("recv in a single-process run", CollectiveKind::kRecv, opts,
       "no peer " + std::to_string(src), __FILE__, __LINE__);
}

std::unique_ptr<Communicator> SelfCommunicator::do_split(int color, int, std::string name,
                                                         const CollectiveOptions&) {
  if (color == kNoGroup) return nullptr;
  return std::make_unique<SelfCommunicator>(std::move(name));
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

std::unique_ptr<Communicator> make_world_communicator(int* argc, char*** argv) {
  std::unique_ptr<Communicator> world;
  if (detect_launcher().empty()) {
    world = std::make_unique<SelfCommunicator>("world");
  } else {
    world = make_mpi_world_communicator(argc, argv);
  }
  set_process_identity({world->rank(), world->size()});
  return world;
}

}  // namespace trident
