// Typed communicator buffers (comm/communicator.h): CommBuf, bf16 reductions, memory
// spaces and the DeviceAccessScope around device work. Single-process tests use
// SelfCommunicator; the others run on the MPI world at every launched size (1, 2, 4, 8).
// A fake device (ProtectedDeviceMemory) makes device memory fault outside a scope, as the
// checked backend does, so a call that forgets its scope crashes the test.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "tests/common/alloc_counter.h"
#include "core/device_access.h"
#include "tests/common/mpi_test_util.h"
#include "tests/common/protected_device_memory.h"

namespace trident::test {
namespace {


std::vector<bf16_t> seeded_bf16(int rank, std::size_t n, std::uint64_t seed) {
  std::vector<bf16_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float_to_bf16(8.0f * seeded_value(seed, rank, i));
  return v;
}

float f(bf16_t h) { return bf16_to_float(h); }

// Every rank's seeded_bf16 input, [rank][index].
std::vector<std::vector<bf16_t>> everyones_bf16(int ranks, std::size_t n, std::uint64_t seed) {
  std::vector<std::vector<bf16_t>> all;
  for (int r = 0; r < ranks; ++r) all.push_back(seeded_bf16(r, n, seed));
  return all;
}

// Whether `got` is the bf16 sum of column j of `inputs` as the contract states it: for one
// or two ranks exactly round(a0 [+ a1]) (a single combining step, order-free); for more,
// within p-1 roundings, each at most 2^-8 of a partial sum no larger than sum |a_r|.
bool is_bf16_sum(bf16_t got, const std::vector<std::vector<bf16_t>>& inputs, std::size_t j) {
  const int p = static_cast<int>(inputs.size());
  if (p <= 2) {
    float sum = f(inputs[0][j]);
    if (p == 2) sum += f(inputs[1][j]);
    return got == float_to_bf16(sum);
  }
  double exact = 0, magnitude = 0;
  for (int r = 0; r < p; ++r) {
    exact += f(inputs[r][j]);
    magnitude += std::fabs(f(inputs[r][j]));
  }
  return std::fabs(f(got) - exact) <= (p - 1) * std::ldexp(magnitude, -8) * 1.0001;
}

// A device-space group over the whole world (collective).
std::unique_ptr<Communicator> device_world() {
  Communicator& w = world();
  return w.split(0, w.rank(), "dev", MemSpace::kDevice, {.label = "device world"});
}

// ---- CommBuf and the self backend ----------------------------------------------------

TEST(CommBuf, FactoriesCarryDtypeAndSpace) {
  const std::vector<float> a(5);
  const CommBuf h = CommBuf::host(std::span<const float>(a));
  EXPECT_EQ(h.data, a.data());
  EXPECT_EQ(h.count, 5u);
  EXPECT_EQ(h.dtype, DType::kF32);
  EXPECT_EQ(h.space, MemSpace::kHost);
  EXPECT_EQ(h.bytes(), 20u);
  std::vector<bf16_t> b(6);
  const CommBuf d = CommBuf::device(DevPtr::wrap(b.data(), DType::kBF16), 6);
  EXPECT_EQ(d.dtype, DType::kBF16);
  EXPECT_EQ(d.space, MemSpace::kDevice);
  EXPECT_EQ(d.bytes(), 12u);
  std::byte raw[3];
  EXPECT_EQ(CommBuf::host(std::span<std::byte>(raw)).dtype, DType::kU8);
}

TEST(SelfCommunicator, ServesEitherSpaceAndCountsBytesOfTheDtype) {
  SelfCommunicator dev("tp", MemSpace::kDevice);
  EXPECT_EQ(dev.space(), MemSpace::kDevice);
  EXPECT_EQ(SelfCommunicator().space(), MemSpace::kHost);
  auto child = dev.split(0, 0, "child");
  EXPECT_EQ(child->space(), MemSpace::kDevice);  // the parent's space by default
  EXPECT_EQ(dev.split(0, 0, "host twin", MemSpace::kHost)->space(), MemSpace::kHost);

  std::vector<bf16_t> a = seeded_bf16(0, 10, 3), out(10), gathered(10);
  const std::vector<bf16_t> original = a;
  auto dbuf = [](std::vector<bf16_t>& v) {
    return CommBuf::device(DevPtr::wrap(v.data(), DType::kBF16), v.size());
  };
  dev.all_reduce(dbuf(a), ReduceOp::kSum);
  dev.reduce_scatter(dbuf(a), dbuf(out));
  dev.all_gather(dbuf(a), dbuf(gathered));
  dev.broadcast(dbuf(a), 0);
  EXPECT_EQ(a, original);
  EXPECT_EQ(out, original);
  EXPECT_EQ(gathered, original);
  // bf16 counts 2 bytes an element: half of the same call in f32.
  EXPECT_EQ(dev.traffic().bytes_of(CollectiveKind::kAllReduce), 20);
  EXPECT_EQ(dev.traffic().bytes_of(CollectiveKind::kReduceScatter), 20);
  EXPECT_EQ(dev.traffic().bytes_of(CollectiveKind::kAllGather), 20);
  EXPECT_EQ(dev.traffic().bytes_of(CollectiveKind::kBroadcast), 20);
}

TEST(CommSpaceDeathTest, SelfRefusesABufferOfTheOtherSpace) {
  GTEST_FLAG_SET(death_test_style, "fast");  // no re-exec: main() would start MPI again
  std::vector<float> v(4);
  SelfCommunicator dev("tp", MemSpace::kDevice);
  EXPECT_DEATH(dev.all_reduce(CommBuf::host(std::span<float>(v)), ReduceOp::kSum,
                              {.label = "attn.o"}),
               "CHECK failed: buf.space == space_ in group 'tp' \\(rank 0/1, self\\) all_reduce "
               "'attn.o' .*: host buffer passed to a device communicator");
  SelfCommunicator host;
  EXPECT_DEATH(host.broadcast(CommBuf::device(DevPtr::wrap(v.data(), DType::kF32), 4), 0,
                              {.label = "stop flag"}),
               "in group 'world' \\(rank 0/1, self\\) broadcast 'stop flag' .*: device buffer "
               "passed to a host communicator");
}

TEST(CommSpaceDeathTest, UnsupportedDtypesAbort) {
  GTEST_FLAG_SET(death_test_style, "fast");
  SelfCommunicator host;
  std::vector<std::int32_t> i(4);
  EXPECT_DEATH(host.all_reduce(CommBuf::host(std::span<std::int32_t>(i)), ReduceOp::kSum),
               "all_reduce .*: dtype i32 cannot be reduced \\(f32, bf16, f64 and i64 can\\)");
  std::vector<float> a(4);
  std::vector<bf16_t> b(4);
  EXPECT_DEATH(host.reduce_scatter(CommBuf::host(std::span<float>(a)),
                                   CommBuf::host(std::span<bf16_t>(b))),
               "reduce_scatter .*: input is f32, output bf16; they must match");
  std::vector<double> d(4);
  EXPECT_DEATH(host.reduce_scatter(CommBuf::host(std::span<double>(d)),
                                   CommBuf::host(std::span<double>(d))),
               "dtype f64 cannot be reduce-scattered \\(f32 and bf16 can\\)");
}

// ---- the DeviceAccessScope and the hook's verification --------------------------------

TEST(DeviceAccess, SelfDeviceCallsRunInsideTheScope) {
  ProtectedDeviceMemory device(4096);
  SelfCommunicator dev("tp", MemSpace::kDevice);
  const std::vector<float> want = {1.5f, -2.0f, 3.25f, 8.0f};
  const DevPtr in = device.at(0, DType::kF32), out = device.at(1024, DType::kF32);
  device.upload(in, want);
  const int before = device.opens();
  // The copy reads and writes protected memory: it faults unless the call opened a scope.
  dev.all_gather(CommBuf::device(in, 4), CommBuf::device(out, 4), {.label = "gather"});
  dev.reduce_scatter(CommBuf::device(in, 4), CommBuf::device(out, 4));
  EXPECT_EQ(device.opens() - before, 2);
  EXPECT_EQ(device.download<float>(out, 4), want);
  // Host calls do not open a scope.
  SelfCommunicator host;
  std::vector<float> h = want;
  const int host_before = device.opens();
  host.all_reduce(CommBuf::host(std::span<float>(h)), ReduceOp::kSum);
  EXPECT_EQ(device.opens(), host_before);
}

TEST(DeviceAccessDeathTest, AMisclaimedRangeIsRefused) {
  GTEST_FLAG_SET(death_test_style, "fast");
  ProtectedDeviceMemory device(4096);
  std::vector<float> h(4);
  SelfCommunicator dev("tp", MemSpace::kDevice);
  EXPECT_DEATH(dev.all_reduce(CommBuf::device(DevPtr::wrap(h.data(), DType::kF32), 4),
                              ReduceOp::kSum, {.label = "grads"}),
               "group 'tp' .*all_reduce 'grads' .*: buffer claimed as device memory is not "
               "device memory");
  SelfCommunicator host;
  EXPECT_DEATH(
      host.all_gather(CommBuf::host(std::span<float>(h)),
                      CommBuf(device.at(0, DType::kF32).raw(), 4, DType::kF32, MemSpace::kHost)),
      "group 'world' .*all_gather .*: buffer claimed as host memory is device memory");
  // Without a hook nothing can be verified, so the same device claim passes.
}

// ---- MPI: bf16 ------------------------------------------------------------------------

TEST(Bf16, AllReduceSumIsFp32AddThenRoundPerStep) {
  Communicator& w = world();
  auto dev = device_world();
  const int p = w.size();
  const std::size_t n = 1031;
  std::vector<bf16_t> data = seeded_bf16(w.rank(), n, 41);
  dev->all_reduce(CommBuf::device(DevPtr::wrap(data.data(), DType::kBF16), n), ReduceOp::kSum,
                  {.label = "bf16 sum"});
  const auto inputs = everyones_bf16(p, n, 41);
  int wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += !is_bf16_sum(data[i], inputs, i);
  EXPECT_EQ(wrong, 0) << "of " << n << " at p=" << p;

  // Identical on every rank, and run to run.
  std::vector<bf16_t> again = seeded_bf16(w.rank(), n, 41);
  dev->all_reduce(CommBuf::device(DevPtr::wrap(again.data(), DType::kBF16), n), ReduceOp::kSum);
  EXPECT_EQ(again, data);
  std::vector<bf16_t> everyone(n * p);
  w.all_gather(CommBuf::host(std::span<const bf16_t>(data)), CommBuf::host(std::span(everyone)));
  int differ = 0;
  for (int r = 0; r < p; ++r)
    differ += !std::equal(data.begin(), data.end(), everyone.begin() + r * n);
  EXPECT_EQ(differ, 0);
}

TEST(Bf16, AllReduceMaxIsExact) {
  Communicator& w = world();
  auto dev = device_world();
  const std::size_t n = 100;
  std::vector<bf16_t> data = seeded_bf16(w.rank(), n, 42);
  dev->all_reduce(CommBuf::device(DevPtr::wrap(data.data(), DType::kBF16), n), ReduceOp::kMax);
  const auto inputs = everyones_bf16(w.size(), n, 42);
  int wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float best = -INFINITY;
    for (const auto& in : inputs) best = std::max(best, f(in[i]));
    wrong += f(data[i]) != best;
  }
  EXPECT_EQ(wrong, 0);
}

TEST(Bf16, ReduceScatterAllGatherSendRecvKeepBits) {
  Communicator& w = world();
  auto dev = device_world();
  const int p = w.size(), me = w.rank();
  const std::size_t chunk = 37;
  auto dbuf = [](std::vector<bf16_t>& v) {
    return CommBuf::device(DevPtr::wrap(v.data(), DType::kBF16), v.size());
  };

  std::vector<bf16_t> in = seeded_bf16(me, chunk * p, 43), out(chunk);
  dev->reduce_scatter(dbuf(in), dbuf(out), {.label = "bf16 rs"});
  const auto inputs = everyones_bf16(p, chunk * p, 43);
  int wrong = 0;
  for (std::size_t i = 0; i < chunk; ++i) wrong += !is_bf16_sum(out[i], inputs, me * chunk + i);
  EXPECT_EQ(wrong, 0) << "reduce_scatter";

  std::vector<bf16_t> mine = seeded_bf16(me, chunk, 44), gathered(chunk * p);
  dev->all_gather(dbuf(mine), dbuf(gathered));
  wrong = 0;
  for (int r = 0; r < p; ++r)
    wrong += !std::equal(gathered.begin() + r * chunk, gathered.begin() + (r + 1) * chunk,
                         seeded_bf16(r, chunk, 44).begin());
  EXPECT_EQ(wrong, 0) << "all_gather";

  if (p == 1) return;
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  std::vector<bf16_t> msg = seeded_bf16(me, chunk, 45), got(chunk), got2(chunk);
  dev->isend(dbuf(msg), next, 1);  // isend first: nobody blocks in a cycle of sends
  dev->recv(dbuf(got), prev, 1);
  dev->wait_sends();
  if (me % 2 == 0) {
    dev->send(dbuf(msg), next, 2);
    dev->recv(dbuf(got2), prev, 2);
  } else {
    dev->recv(dbuf(got2), prev, 2);
    dev->send(dbuf(msg), next, 2);
  }
  EXPECT_EQ(got, seeded_bf16(prev, chunk, 45)) << "isend/recv";
  EXPECT_EQ(got2, seeded_bf16(prev, chunk, 45)) << "send/recv";
}

TEST(Bf16, TrafficCountsBf16BytesHalfOfF32) {
  Communicator& w = world();
  auto dev = device_world();
  const std::int64_t p = w.size();
  std::vector<bf16_t> b(64 * p);
  std::vector<float> a(64 * p);
  auto bb = [&](std::size_t n) { return CommBuf::device(DevPtr::wrap(b.data(), DType::kBF16), n); };
  auto ab = [&](std::size_t n) { return CommBuf::device(DevPtr::wrap(a.data(), DType::kF32), n); };
  std::vector<bf16_t> b_out(64 * p);
  std::vector<float> a_out(64 * p);
  auto bo = [&](std::size_t n) {
    return CommBuf::device(DevPtr::wrap(b_out.data(), DType::kBF16), n);
  };
  auto ao = [&](std::size_t n) {
    return CommBuf::device(DevPtr::wrap(a_out.data(), DType::kF32), n);
  };

  dev->reset_traffic();
  dev->all_reduce(bb(64), ReduceOp::kSum);
  dev->reduce_scatter(bb(64 * p), bo(64));
  dev->all_gather(bb(64), bo(64 * p));
  const TrafficCounters half = dev->traffic();
  dev->reset_traffic();
  dev->all_reduce(ab(64), ReduceOp::kSum);
  dev->reduce_scatter(ab(64 * p), ao(64));
  dev->all_gather(ab(64), ao(64 * p));
  const TrafficCounters full = dev->traffic();
  EXPECT_EQ(half.bytes_of(CollectiveKind::kAllReduce), 64 * 2);
  EXPECT_EQ(half.bytes_of(CollectiveKind::kReduceScatter), 64 * p * 2);
  EXPECT_EQ(half.bytes_of(CollectiveKind::kAllGather), 64 * p * 2);
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                           CollectiveKind::kAllGather}) {
    EXPECT_EQ(2 * half.bytes_of(k), full.bytes_of(k)) << collective_name(k);
  }
}

// ---- MPI: memory spaces ---------------------------------------------------------------

TEST(MemorySpace, WorldIsHostAndProcessGroupsAreDevice) {
  Communicator& w = world();
  EXPECT_EQ(w.space(), MemSpace::kHost);
  const int p = w.size();
  auto groups = make_process_groups(w, ParallelLayout{1, 1, p}, /*tied_embeddings=*/true);
  ASSERT_TRUE(groups.is_ok()) << groups.status().message();
  EXPECT_EQ(groups->world->space(), MemSpace::kHost);
  EXPECT_EQ(groups->dp->space(), MemSpace::kDevice);
  EXPECT_EQ(groups->tp->space(), MemSpace::kDevice);
  EXPECT_EQ(groups->pp->space(), MemSpace::kDevice);
  if (groups->embedding) {
    EXPECT_EQ(groups->embedding->space(), MemSpace::kDevice);
  }
}

TEST(MemorySpaceDeathTest, MpiRefusesABufferOfTheOtherSpace) {
  GTEST_FLAG_SET(death_test_style, "fast");
  Communicator& w = world();
  auto dev = device_world();  // collective: before the forks
  std::vector<float> v(4);
  const std::string where = "\\(rank " + std::to_string(w.rank()) + "/" +
                            std::to_string(w.size()) + ", mpi\\) ";
  // The checks come before any MPI call, so the forked child never talks to the peers.
  EXPECT_DEATH(dev->all_reduce(CommBuf::host(std::span<float>(v)), ReduceOp::kSum,
                               {.label = "grads"}),
               "group 'dev' " + where + "all_reduce 'grads' .*: host buffer passed to a device "
               "communicator");
  EXPECT_DEATH(w.all_reduce(CommBuf::device(DevPtr::wrap(v.data(), DType::kF32), 4),
                            ReduceOp::kSum, {.label = "loss"}),
               "group 'world' " + where + "all_reduce 'loss' .*: device buffer passed to a host "
               "communicator");
}

TEST(DeviceAccess, MpiDeviceCallsRunInsideTheScope) {
  Communicator& w = world();
  auto dev = device_world();
  const int p = w.size(), me = w.rank();
  const std::size_t n = 128;
  ProtectedDeviceMemory device(16 * n * p * sizeof(float));
  const DevPtr a = device.at(0, DType::kF32);
  const DevPtr b = device.at(4 * n * p * sizeof(float), DType::kF32);
  const DevPtr h = device.at(8 * n * p * sizeof(float), DType::kBF16);
  std::vector<float> ones(n * p, 1.0f);
  device.upload(a, ones);
  const int before = device.opens();
  // Every call touches protected memory: a call without its scope faults.
  dev->all_reduce(CommBuf::device(a, n), ReduceOp::kSum);
  dev->reduce_scatter(CommBuf::device(a, n * p), CommBuf::device(b, n));
  dev->all_gather(CommBuf::device(b, n), CommBuf::device(a, n * p));
  dev->broadcast(CommBuf::device(a, n), 0);
  device.upload(h, std::vector<bf16_t>(n * p, float_to_bf16(1.0f)));
  dev->all_reduce(CommBuf::device(h, n * p), ReduceOp::kSum);
  int calls = 5;
  if (p > 1) {
    const int next = (me + 1) % p, prev = (me + p - 1) % p;
    dev->isend(CommBuf::device(a, n), next, 3);  // the staging copy reads device memory
    dev->recv(CommBuf::device(b, n), prev, 3);   // MPI writes device memory
    dev->wait_sends();
    calls += 2;
  }
  EXPECT_EQ(device.opens() - before, calls + 1);  // + the upload
  // all_reduce: p; reduce_scatter: p * p; all_gather + broadcast keep it; ring: the same.
  const std::vector<float> got = device.download<float>(a, n);
  const std::vector<bf16_t> got_h = device.download<bf16_t>(h, n * p);
  EXPECT_EQ(got[0], static_cast<float>(p) * p);
  EXPECT_EQ(got[n - 1], static_cast<float>(p) * p);
  EXPECT_EQ(f(got_h[0]), static_cast<float>(p));  // small integers: exact in bf16
}

// Three payloads of different sizes and dtypes in flight at once, like a pipeline's
// activations and gradients, then the matching recvs, then wait_sends, round after round.
// The payloads are above the shared-memory eager limit (4 KiB), so an isend stays in
// flight until its recv is posted: in the warm-up rounds every rank posts its recvs only
// after a barrier that follows all isends, so the pool reaches its full depth (three
// buffers) there; afterwards, in any order of completion, it must serve from the pool.
TEST(Isend, WarmIsendAllocatesNothing) {
  Communicator& w = world();
  if (w.size() == 1) GTEST_SKIP() << "no peer in a 1-rank world";
  auto dev = device_world();
  const int p = w.size(), me = w.rank();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  std::vector<float> big(8192, 1.0f), small(4096, 2.0f), got_big(8192), got_small(4096);
  std::vector<bf16_t> half(8192, float_to_bf16(3.0f)), got_half(8192);
  auto fbuf = [](std::vector<float>& v) {
    return CommBuf::device(DevPtr::wrap(v.data(), DType::kF32), v.size());
  };
  const CommBuf hbuf = CommBuf::device(DevPtr::wrap(half.data(), DType::kBF16), half.size());
  const CommBuf got_hbuf =
      CommBuf::device(DevPtr::wrap(got_half.data(), DType::kBF16), got_half.size());
  long isend_allocations = 0;
  std::size_t warm_bytes = 0;
  const int warm_rounds = 2, rounds = 12;
  for (int round = 0; round < warm_rounds + rounds; ++round) {
    if (round == warm_rounds) warm_bytes = dev->isend_staging_bytes();
    const long a = allocations_in([&] {
      dev->isend(fbuf(big), next, 1);
      dev->isend(hbuf, next, 2);
      dev->isend(fbuf(small), next, 3);
    });
    if (round >= warm_rounds) isend_allocations += a;
    if (round < warm_rounds) w.barrier();
    dev->recv(fbuf(got_big), prev, 1);
    dev->recv(got_hbuf, prev, 2);
    dev->recv(fbuf(got_small), prev, 3);
    dev->wait_sends();
  }
  EXPECT_EQ(isend_allocations, 0) << "heap allocations in " << 3 * rounds << " warm isends";
  EXPECT_EQ(warm_bytes, (8192 + 4096) * sizeof(float) + 8192 * sizeof(bf16_t));
  EXPECT_EQ(dev->isend_staging_bytes(), warm_bytes);
  EXPECT_EQ(got_big, big);
  EXPECT_EQ(got_small, small);
  EXPECT_EQ(got_half, half);
}

}  // namespace
}  // namespace trident::test
