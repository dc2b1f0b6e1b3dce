// The pipeline executor against a model of NCCL's point-to-point semantics, where a lone
// send can deadlock: a send completes only once the matching receive is posted, every
// rank runs its operations in launch order (one stream), and only the operations of one
// group (batch_p2p = ncclGroupStart/End) progress together. Matching is by (sender,
// receiver) in launch order, as NCCL matches (it has no tags; the model checks that the
// tags agree anyway).
//
// Shown here: GPipe and 1F1B complete for every p, m <= 8 with the data of every
// micro-batch arriving where it belongs; the lone-send order (send after each action,
// receive before the next, as the executor did before batch_p2p) deadlocks in the same
// model, so the model can tell the two apart.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/check.h"
#include "parallel/pipeline.h"

namespace trident {
namespace {

struct Deadlock : std::runtime_error {
  Deadlock() : std::runtime_error("deadlock") {}
};

// The p ranks' shared fabric.
class NcclModel {
 public:
  explicit NcclModel(int p) : p_(p), live_(p), queues_(static_cast<size_t>(p * p)), waiting_(p) {}

  // Posts the group's operations, matches what can be matched, and blocks until every
  // operation of the group has completed; throws Deadlock when every rank still running
  // waits on an unfinished group.
  void run_group(int rank, std::span<const P2POp> ops) {
    std::unique_lock lock(mu_);
    std::vector<char> done(ops.size(), 0);
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& op = ops[i];
      Posted posted{op.buf, op.tag, &done[i]};
      if (op.kind == P2POp::kSend) {
        queue(rank, op.peer).sends.push_back(posted);
      } else {
        queue(op.peer, rank).recvs.push_back(posted);
      }
    }
    for (const P2POp& op : ops) {
      match(op.kind == P2POp::kSend ? queue(rank, op.peer) : queue(op.peer, rank));
    }
    cv_.notify_all();
    waiting_[static_cast<size_t>(rank)] = &done;
    check_deadlock();
    cv_.wait(lock, [&] { return all_done(done) || deadlock_; });
    waiting_[static_cast<size_t>(rank)] = nullptr;
    if (!all_done(done)) throw Deadlock();
  }

  // A rank's run ended (normally or by Deadlock): the others may now be stuck.
  void finished() {
    std::unique_lock lock(mu_);
    --live_;
    check_deadlock();
  }

  bool deadlocked() const { return deadlock_; }
  const std::string& error() const { return error_; }

 private:
  struct Posted {
    CommBuf buf;
    int tag;
    char* done;
  };
  struct Queue {
    std::deque<Posted> sends, recvs;
  };
  Queue& queue(int src, int dst) { return queues_[static_cast<size_t>(src * p_ + dst)]; }

  void match(Queue& q) {
    while (!q.sends.empty() && !q.recvs.empty()) {
      Posted s = q.sends.front(), r = q.recvs.front();
      q.sends.pop_front();
      q.recvs.pop_front();
      if (s.tag != r.tag || s.buf.bytes() != r.buf.bytes()) {
        error_ += "mismatched pair: send tag " + std::to_string(s.tag) + " (" +
                  std::to_string(s.buf.bytes()) + " bytes) with recv tag " +
                  std::to_string(r.tag) + " (" + std::to_string(r.buf.bytes()) + " bytes); ";
      }
      std::memcpy(r.buf.data, s.buf.data, std::min(s.buf.bytes(), r.buf.bytes()));
      *s.done = 1;
      *r.done = 1;
    }
  }

  static bool all_done(const std::vector<char>& done) {
    return std::all_of(done.begin(), done.end(), [](char c) { return c != 0; });
  }

  void check_deadlock() {
    if (live_ == 0) return;
    int stuck = 0;
    for (const std::vector<char>* w : waiting_) {
      if (w != nullptr && !all_done(*w)) ++stuck;
    }
    if (stuck == live_) {
      deadlock_ = true;
      cv_.notify_all();
    }
  }

  const int p_;
  int live_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Queue> queues_;
  std::vector<std::vector<char>*> waiting_;  // per rank: its group while it waits
  bool deadlock_ = false;
  std::string error_;
};

// One rank's view of the model. Lone sends (send, isend) are groups of one: on NCCL an
// isend has no copy semantics, it is a send on the stream.
class NcclModelCommunicator final : public Communicator {
 public:
  NcclModelCommunicator(NcclModel& model, int rank, int size)
      : Communicator("pp", MemSpace::kDevice), model_(model), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl-model"; }

 protected:
  void do_send(const CommBuf& data, int dst, int tag, const CollectiveOptions&) override {
    const P2POp op{P2POp::kSend, data, dst, tag};
    model_.run_group(rank_, std::span<const P2POp>(&op, 1));
  }
  void do_recv(const CommBuf& data, int src, int tag, const CollectiveOptions&) override {
    const P2POp op{P2POp::kRecv, data, src, tag};
    model_.run_group(rank_, std::span<const P2POp>(&op, 1));
  }
  void do_isend(const CommBuf& data, int dst, int tag, const CollectiveOptions& opts) override {
    do_send(data, dst, tag, opts);
  }
  void do_batch_p2p(std::span<const P2POp> ops, const CollectiveOptions&) override {
    model_.run_group(rank_, ops);
  }
  void do_all_reduce(const CommBuf&, ReduceOp, const CollectiveOptions&) override { unused(); }
  void do_reduce_scatter(const CommBuf&, const CommBuf&, const CollectiveOptions&) override {
    unused();
  }
  void do_all_gather(const CommBuf&, const CommBuf&, const CollectiveOptions&) override {
    unused();
  }
  void do_broadcast(const CommBuf&, int, const CollectiveOptions&) override { unused(); }
  void do_barrier(const CollectiveOptions&) override { unused(); }
  std::unique_ptr<Communicator> do_split(int, int, std::string, MemSpace,
                                         const CollectiveOptions&) override {
    unused();
  }

 private:
  [[noreturn]] static void unused() {
    TRIDENT_CHECK_MSG(false, "the NCCL model has point-to-point only");
    std::abort();
  }
  NcclModel& model_;
  int rank_, size_;
};

// A stage whose boundary tensors carry (micro, stage) stamps, checked on arrival.
class StampStage final : public PipelineStageModel {
 public:
  StampStage(int stage, int pp, int slots)
      : stage_(stage), pp_(pp), in_act_(slots), out_act_(slots), out_grad_(slots), in_grad_(1) {
    for (auto* v : {&in_act_, &out_act_, &out_grad_, &in_grad_}) {
      for (auto& b : *v) b.assign(kFloats, 0.0f);
    }
  }
  std::size_t boundary_floats() const override { return kFloats; }
  DevPtr input_activation(int slot) override { return ptr(in_act_[static_cast<size_t>(slot)]); }
  DevPtr output_activation(int slot) override { return ptr(out_act_[static_cast<size_t>(slot)]); }
  DevPtr output_grad(int slot) override { return ptr(out_grad_[static_cast<size_t>(slot)]); }
  DevPtr input_grad(int) override { return ptr(in_grad_[0]); }
  void forward(int micro, int slot) override {
    if (stage_ > 0) expect(in_act_[static_cast<size_t>(slot)], stamp(micro, stage_ - 1), "activation", micro);
    out_act_[static_cast<size_t>(slot)].assign(kFloats, stamp(micro, stage_));
    ++forwards;
  }
  void backward(int micro, int slot) override {
    if (stage_ < pp_ - 1) expect(out_grad_[static_cast<size_t>(slot)], -stamp(micro, stage_ + 1), "gradient", micro);
    in_grad_[0].assign(kFloats, -stamp(micro, stage_));
    ++backwards;
  }
  std::string errors;
  int forwards = 0, backwards = 0;

 private:
  static constexpr std::size_t kFloats = 3;
  static float stamp(int micro, int stage) { return static_cast<float>(1000 * (micro + 1) + stage); }
  static DevPtr ptr(std::vector<float>& v) { return DevPtr::wrap(v.data(), DType::kF32); }
  void expect(const std::vector<float>& got, float want, const char* what, int micro) {
    for (float x : got) {
      if (x != want) {
        errors += std::string(what) + " of micro " + std::to_string(micro) + " on stage " +
                  std::to_string(stage_) + ": " + std::to_string(x) + ", expected " +
                  std::to_string(want) + "; ";
        return;
      }
    }
  }
  int stage_, pp_;
  std::vector<std::vector<float>> in_act_, out_act_, out_grad_, in_grad_;
};

// The order the executor used before batch_p2p: a lone receive before each action that
// needs one, a lone send after each action that produces one.
void run_with_lone_sends(Communicator& comm, PipelineStageModel& model, PipeSchedule kind,
                         int m) {
  const int stage = comm.rank(), pp = comm.size();
  const bool first = stage == 0, last = stage == pp - 1;
  const size_t n = model.boundary_floats();
  std::vector<int> slot_of(static_cast<size_t>(m), -1);
  std::vector<bool> busy(static_cast<size_t>(PipelineExecutor::required_slots(kind, pp, stage, m)));
  for (const PipeAction& a : make_schedule(kind, pp, stage, m)) {
    if (a.kind == PipeAction::kForward) {
      const int slot = static_cast<int>(std::find(busy.begin(), busy.end(), false) - busy.begin());
      busy[static_cast<size_t>(slot)] = true;
      slot_of[static_cast<size_t>(a.micro)] = slot;
      if (!first) comm.recv(CommBuf::device(model.input_activation(slot), n), stage - 1, a.micro);
      model.forward(a.micro, slot);
      if (!last) comm.isend(CommBuf::device(model.output_activation(slot), n), stage + 1, a.micro);
    } else {
      const int slot = slot_of[static_cast<size_t>(a.micro)];
      if (!last) comm.recv(CommBuf::device(model.output_grad(slot), n), stage + 1, a.micro);
      model.backward(a.micro, slot);
      if (!first) comm.isend(CommBuf::device(model.input_grad(slot), n), stage - 1, a.micro);
      busy[static_cast<size_t>(slot)] = false;
    }
  }
}

struct Outcome {
  bool deadlocked = false;
  std::string errors;
};

// Runs p ranks as threads over one NcclModel; `batched`: the executor, else lone sends.
Outcome run_pipeline(PipeSchedule kind, int pp, int m, bool batched) {
  NcclModel fabric(pp);
  std::vector<std::unique_ptr<StampStage>> stages;
  std::vector<std::unique_ptr<NcclModelCommunicator>> comms;
  for (int s = 0; s < pp; ++s) {
    stages.push_back(
        std::make_unique<StampStage>(s, pp, PipelineExecutor::required_slots(kind, pp, s, m)));
    comms.push_back(std::make_unique<NcclModelCommunicator>(fabric, s, pp));
  }
  std::vector<std::thread> threads;
  for (int s = 0; s < pp; ++s) {
    threads.emplace_back([&, s] {
      try {
        if (batched) {
          PipelineExecutor executor(*comms[static_cast<size_t>(s)], kind, m,
                                    PipelineExecutor::required_slots(kind, pp, s, m));
          executor.run(*stages[static_cast<size_t>(s)]);
        } else {
          run_with_lone_sends(*comms[static_cast<size_t>(s)], *stages[static_cast<size_t>(s)],
                              kind, m);
        }
      } catch (const Deadlock&) {
      }
      fabric.finished();
    });
  }
  for (auto& t : threads) t.join();
  Outcome out;
  out.deadlocked = fabric.deadlocked();
  out.errors = fabric.error();
  for (const auto& st : stages) {
    out.errors += st->errors;
    if (!out.deadlocked && (st->forwards != m || st->backwards != m)) {
      out.errors += "a stage ran " + std::to_string(st->forwards) + " forwards and " +
                    std::to_string(st->backwards) + " backwards; ";
    }
  }
  return out;
}

TEST(PipelineNcclModel, BatchedExchangesCompleteForEveryScheduleUpTo8) {
  for (PipeSchedule kind : {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB}) {
    for (int pp = 1; pp <= 8; ++pp) {
      for (int m = 1; m <= 8; ++m) {
        const Outcome out = run_pipeline(kind, pp, m, /*batched=*/true);
        EXPECT_FALSE(out.deadlocked) << pipe_schedule_name(kind) << " p=" << pp << " m=" << m;
        EXPECT_EQ(out.errors, "") << pipe_schedule_name(kind) << " p=" << pp << " m=" << m;
      }
    }
  }
}

TEST(PipelineNcclModel, LoneSendsDeadlockInTheSameModel) {
  // 1F1B, p = 2, m = 2: stage 0 sends the activation of micro 1 while stage 1 sends the
  // gradient of micro 0; each send waits for a receive its peer only posts after its own
  // send: the cycle Megatron's batched p2p avoids.
  const Outcome out = run_pipeline(PipeSchedule::kOneFOneB, 2, 2, /*batched=*/false);
  EXPECT_TRUE(out.deadlocked);
  // The model is not deadlock-happy: lone sends do finish where no two neighbours send at
  // once (GPipe with one micro-batch).
  const Outcome gpipe = run_pipeline(PipeSchedule::kGPipe, 2, 1, /*batched=*/false);
  EXPECT_FALSE(gpipe.deadlocked);
  EXPECT_EQ(gpipe.errors, "");
  int deadlocks = 0;
  for (int pp = 2; pp <= 8; ++pp) {
    for (int m = 2; m <= 8; ++m) deadlocks += run_pipeline(PipeSchedule::kOneFOneB, pp, m, false).deadlocked;
  }
  EXPECT_GT(deadlocks, 0);
}

}  // namespace
}  // namespace trident
