// The trainer's lifecycle on a device backend, without a GPU:
// - Teardown order (trainer/trainer.h): the Ops and their compute stream outlive every
//   member that may use them. A fake Ops (the CPU backend underneath) has a
//   non-null native_stream() and records its destruction; the group-world hook makes
//   communicators that, like the NCCL ones, use that stream in every call and in their
//   destructor, recording any use after the Ops died. A real Trainer is built with them,
//   trained, and destroyed.
// - A world of one needs no NCCL: with a device stream and no hook, the groups are
//   SelfCommunicators whose device copies go through the Ops (this build has NCCL and no
//   GPU here, so a world-of-one NCCL init would fail), and training matches a run whose
//   groups memmove.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/forwarding_ops.h"
#include "tests/common/pattern_tokens.h"
#include "tests/common/scratch_dir.h"
#include "tests/common/trainer_fixture.h"
#include "trainer/trainer.h"

namespace trident {
namespace {

// What happened to the fake stream.
struct StreamLog {
  int token = 0;            // &token is the fake stream
  bool ops_alive = false;   // between the fake Ops' construction and destruction
  bool ops_destroyed = false;
  int uses = 0;             // stream uses while the Ops lived
  std::vector<std::string> late;  // uses after the Ops died (must stay empty)
  int device_groups_destroyed = 0;
  uint64_t live_bytes_at_ops_death = ~uint64_t{0};
  uint64_t copies = 0, copy_bytes = 0;  // Ops::copy calls

  void use(void* stream, const std::string& what) {
    if (ops_alive && stream == &token) {
      ++uses;
    } else {
      late.push_back(what);
    }
  }
};

// Owns the inner backend before ForwardingOps refers to it (base-from-member). Not the
// checked backend: its hook, once installed, stays for the process, and the other tests
// of this binary hand communicators plain host memory as device memory.
struct InnerOps {
  std::unique_ptr<Ops> inner = make_cpu_ops(1);
};

// The CPU backend seen as a device backend with a stream.
class StreamOps final : private InnerOps, public testing::ForwardingOps {
 public:
  explicit StreamOps(StreamLog& log) : ForwardingOps(*inner), log_(log) { log_.ops_alive = true; }
  ~StreamOps() override {
    log_.ops_alive = false;
    log_.ops_destroyed = true;
    log_.live_bytes_at_ops_death = allocation_counts().live_bytes;
  }
  void* native_stream() const override { return &log_.token; }
  void copy(DevPtr dst, DevPtr src, size_t bytes) override {
    ++log_.copies;
    log_.copy_bytes += bytes;
    ForwardingOps::copy(dst, src, bytes);
  }

 private:
  StreamLog& log_;
};

// A group of one that, like an NCCL group stream-ordered on the compute stream, uses the
// stream in every call, and synchronises it when destroyed (what ~NcclCommunicator did).
// Its data moves are memmoves (device memory is host RAM on the CPU backend).
class StreamComm final : public Communicator {
 public:
  StreamComm(std::string name, MemSpace space, StreamLog& log, void* stream)
      : Communicator(std::move(name), space), log_(log), stream_(stream) {}
  ~StreamComm() override {
    check_no_outstanding_work();
    if (space() == MemSpace::kDevice) {
      log_.use(stream_, "~" + name() + " synchronises the stream");
      ++log_.device_groups_destroyed;
    }
  }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "stream-test"; }

 protected:
  void do_all_reduce(const CommBuf&, ReduceOp, const CollectiveOptions&) override {
    touch("all_reduce");
  }
  void do_reduce_scatter(const CommBuf& in, const CommBuf& out, const CollectiveOptions&) override {
    touch("reduce_scatter");
    if (in.data != out.data) std::memmove(out.data, in.data, out.bytes());
  }
  void do_all_gather(const CommBuf& in, const CommBuf& out, const CollectiveOptions&) override {
    touch("all_gather");
    if (in.data != out.data) std::memmove(out.data, in.data, in.bytes());
  }
  void do_broadcast(const CommBuf&, int, const CollectiveOptions&) override { touch("broadcast"); }
  void do_send(const CommBuf&, int, int, const CollectiveOptions&) override { std::abort(); }
  void do_recv(const CommBuf&, int, int, const CollectiveOptions&) override { std::abort(); }
  void do_barrier(const CollectiveOptions&) override { touch("barrier"); }
  void do_all_to_all(const CommBuf& in, std::span<const std::size_t>, const CommBuf& out,
                     std::span<const std::size_t>, const CollectiveOptions&) override {
    touch("all_to_all");
    if (in.count > 0) std::memmove(out.data, in.data, in.bytes());
  }
  std::unique_ptr<Communicator> do_split(int color, int, std::string name, MemSpace space,
                                         const CollectiveOptions&) override {
    if (color == kNoGroup) return nullptr;
    return std::make_unique<StreamComm>(std::move(name), space, log_, stream_);
  }

 private:
  void touch(const char* call) {
    if (space() == MemSpace::kDevice) log_.use(stream_, name() + " " + call);
  }
  StreamLog& log_;
  void* stream_;
};

class Lifecycle : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::write_pattern_tokens(dir_.file("train.bin")).is_ok());
  }

  Config make_config(int zero, bool overlap) {
    Config c = testing::small_trainer_config(Arch::kGpt2, dir_.file("train.bin"),
                                             dir_.file("ckpt" + std::to_string(++trainers_)));
    c.parallel.zero_stage = zero;
    c.parallel.overlap_grad_reduce = overlap;
    c.parallel.overlap_param_gather = overlap;
    c.training.global_batch_size = 2 * 2;
    return c;
  }

  testing::ScratchDir dir_;
  int trainers_ = 0;
};

TEST_F(Lifecycle, NothingUsesTheOpsStreamAfterTheOpsAreDestroyed) {
  for (int zero : {0, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    StreamLog log;
    TrainerOptions options = testing::test_trainer_options();
    options.make_ops = [&log]() -> Result<std::unique_ptr<Ops>> {
      return std::unique_ptr<Ops>(new StreamOps(log));
    };
    options.make_group_world = [&log](Communicator&,
                                      Ops& ops) -> Result<std::unique_ptr<Communicator>> {
      return std::unique_ptr<Communicator>(
          new StreamComm("world", MemSpace::kHost, log, ops.native_stream()));
    };
    {
      const Config c = make_config(zero, /*overlap=*/true);
      ASSERT_TRUE(validate_config(c).is_ok()) << validate_config(c).message();
      const auto made = testing::make_test_trainer(c, options);
      ASSERT_NE(made, nullptr);
      Trainer& trainer = *made;
      for (int s = 0; s < 2; ++s) ASSERT_TRUE(trainer.train_step().is_ok());
      // A checkpoint still being written when the trainer goes.
      ASSERT_TRUE(trainer.save_checkpoint(/*async=*/true).is_ok());
      EXPECT_STREQ(trainer.groups().dp->backend(), "stream-test");
      EXPECT_TRUE(log.ops_alive);
    }
    EXPECT_TRUE(log.ops_destroyed);
    // Not vacuous: the groups used the stream while the Ops lived (the dp reductions at
    // least), and every device group (dp, tp, pp) was destroyed, using it.
    EXPECT_GT(log.uses, 0);
    EXPECT_EQ(log.device_groups_destroyed, 3);
    std::string late;
    for (const std::string& what : log.late) late += "\n  " + what;
    EXPECT_TRUE(log.late.empty()) << "the Ops' stream was used after the Ops were destroyed:"
                                  << late;
    // Every device buffer was freed before its Ops went.
    EXPECT_EQ(log.live_bytes_at_ops_death, 0u);
  }
}

TEST_F(Lifecycle, AWorldOfOneOnADeviceBackendNeedsNoNcclAndCopiesThroughTheOps) {
  for (int zero : {0, 1, 2, 3}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    const Config c = make_config(zero, /*overlap=*/true);
    // The reference: the same run on a plain CPU backend whose groups memmove.
    std::vector<double> want;
    {
      TrainerOptions options = testing::test_trainer_options();
      options.make_group_world = [](Communicator&, Ops&) -> Result<std::unique_ptr<Communicator>> {
        return std::unique_ptr<Communicator>(new SelfCommunicator("world"));
      };
      const auto made = testing::make_test_trainer(c, options);
      ASSERT_NE(made, nullptr);
      const auto& dp = dynamic_cast<const SelfCommunicator&>(*made->groups().dp);
      EXPECT_FALSE(dp.has_device_copy());
      for (int s = 0; s < 3; ++s) ASSERT_TRUE(made->train_step().is_ok());
      want = made->losses();
    }
    StreamLog log;
    TrainerOptions options = testing::test_trainer_options();
    options.make_ops = [&log]() -> Result<std::unique_ptr<Ops>> {
      return std::unique_ptr<Ops>(new StreamOps(log));
    };
    // No group-world hook: the trainer's own choice for a world of one.
    auto made = Trainer::create(c, options);
    ASSERT_TRUE(made.is_ok()) << "a world of one must not need NCCL: " << made.status().message();
    Trainer& trainer = *made.value();
    for (const Communicator* g :
         {trainer.groups().dp.get(), trainer.groups().tp.get(), trainer.groups().pp.get()}) {
      ASSERT_NE(g, nullptr);
      EXPECT_STREQ(g->backend(), "self") << g->name();
      EXPECT_EQ(g->space(), MemSpace::kDevice) << g->name();
      EXPECT_TRUE(dynamic_cast<const SelfCommunicator&>(*g).has_device_copy()) << g->name();
    }
    // A group's data moves are Ops copies (device to device, on the Ops' stream).
    {
      const size_t n = 96;
      Ops& ops = trainer.ops();
      DeviceBuffer a(ops, n * sizeof(float)), b(ops, n * sizeof(float));
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = 0.5f * static_cast<float>(i) - 7.0f;
      ops.upload(a.get(), v.data(), n * sizeof(float));
      const uint64_t copies = log.copies, bytes = log.copy_bytes;
      trainer.groups().dp->all_gather(CommBuf::device(a.as(DType::kF32), n),
                                      CommBuf::device(b.as(DType::kF32), n));
      EXPECT_EQ(log.copies, copies + 1);
      EXPECT_EQ(log.copy_bytes, bytes + n * sizeof(float));
      std::vector<float> back(n, 0.0f);
      ops.download(back.data(), b.get(), n * sizeof(float));
      EXPECT_EQ(back, v);
    }
    // Training, async overlap and ZeRO included, follows the memmove run bitwise.
    for (int s = 0; s < 3; ++s) {
      auto m = trainer.train_step();
      ASSERT_TRUE(m.is_ok()) << m.status().message();
    }
    EXPECT_EQ(trainer.losses(), want);
  }
}

}  // namespace
}  // namespace trident
