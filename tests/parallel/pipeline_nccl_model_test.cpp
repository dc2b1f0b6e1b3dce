// The pipeline executor against a model of NCCL's point-to-point semantics, where a lone
// send can deadlock: a send completes only once the matching receive is posted, every
// rank runs its operations in launch order (one stream), and only the operations of one
// group (batch_p2p = ncclGroupStart/End) progress together. Matching is by (sender,
// receiver) in launch order, as NCCL matches (it has no tags; the model checks that the
// tags agree anyway).
//
// Shown here: GPipe and 1F1B complete for every p, m <= 8, and interleaved 1F1B for
// p in 2..4, v in 2..3, m a multiple of p up to 8, with the data of every micro-batch
// and chunk arriving where it belongs; in the same model, so it can tell them apart,
// the lone-send order (send after each action, receive before the next, as the executor
// did before batch_p2p) deadlocks, interleaving with the v == 1 per-action batches
// deadlocks, and at p == 2 a batch that posts its two sends to one peer in the other
// order pairs the wrong messages.
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
  void do_all_to_all(const CommBuf&, std::span<const std::size_t>, const CommBuf&,
                     std::span<const std::size_t>, const CollectiveOptions&) override {
    unused();
  }
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

// A virtual stage (one model chunk of a rank) whose boundary tensors carry
// (micro, virtual stage) stamps, checked on arrival.
class StampStage final : public PipelineStageModel {
 public:
  StampStage(int virtual_stage, int num_virtual, int slots)
      : vs_(virtual_stage), nv_(num_virtual), in_act_(slots), out_act_(slots), out_grad_(slots),
        in_grad_(1) {
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
    if (vs_ > 0) expect(in_act_[static_cast<size_t>(slot)], stamp(micro, vs_ - 1), "activation", micro);
    out_act_[static_cast<size_t>(slot)].assign(kFloats, stamp(micro, vs_));
    ++forwards;
  }
  void backward(int micro, int slot) override {
    if (vs_ < nv_ - 1) expect(out_grad_[static_cast<size_t>(slot)], -stamp(micro, vs_ + 1), "gradient", micro);
    in_grad_[0].assign(kFloats, -stamp(micro, vs_));
    ++backwards;
  }
  std::string errors;
  int forwards = 0, backwards = 0;

 private:
  static constexpr std::size_t kFloats = 3;
  static float stamp(int micro, int vs) { return static_cast<float>(1000 * (micro + 1) + vs); }
  static DevPtr ptr(std::vector<float>& v) { return DevPtr::wrap(v.data(), DType::kF32); }
  void expect(const std::vector<float>& got, float want, const char* what, int micro) {
    for (float x : got) {
      if (x != want) {
        errors += std::string(what) + " of micro " + std::to_string(micro) + " on virtual stage " +
                  std::to_string(vs_) + ": " + std::to_string(x) + ", expected " +
                  std::to_string(want) + "; ";
        return;
      }
    }
  }
  int vs_, nv_;
  std::vector<std::vector<float>> in_act_, out_act_, out_grad_, in_grad_;
};

// The virtual stages before and after chunk c of `stage` (rank, or -1 for none): the
// wiring of the header, written out again so the test does not trust the executor's.
int prev_rank(int stage, int c, int pp) { return stage > 0 ? stage - 1 : (c > 0 ? pp - 1 : -1); }
int next_rank(int stage, int c, int pp, int v) {
  return stage < pp - 1 ? stage + 1 : (c < v - 1 ? 0 : -1);
}
// A tag both ends agree on (the NCCL model checks tags; NCCL itself has none).
int model_tag(int micro, int virtual_stage_from, bool gradient) {
  return (micro * 64 + virtual_stage_from) * 2 + (gradient ? 1 : 0);
}

// Orders the executor does not use, run by hand to show what goes wrong with them.
enum class Posting {
  // Before batch_p2p: a lone receive before each action that needs one, a lone send
  // after each action that produces one.
  kLoneSends,
  // The v == 1 executor's batches, per action: its send with the next action's receive.
  kPerActionBatches,
  // The executor's interleaved steps and order (activation sends, gradient sends, then
  // receives activation first): a by-hand copy, as the control for the next one.
  kSteps,
  // The same steps, but each batch posts its gradient sends before its activation sends
  // while receivers post activation first.
  kStepsGradientSendsFirst,
};

void run_by_hand(Communicator& comm, std::vector<std::unique_ptr<StampStage>>& chunks,
                 PipeSchedule kind, int m, int v, Posting posting) {
  const int stage = comm.rank(), pp = comm.size();
  const size_t n = chunks[0]->boundary_floats();
  const int slots = PipelineExecutor::required_slots(kind, pp, stage, m, v);
  const auto nv = static_cast<size_t>(v);
  std::vector<std::vector<int>> slot_of(nv, std::vector<int>(static_cast<size_t>(m), -1));
  std::vector<std::vector<bool>> busy(nv, std::vector<bool>(static_cast<size_t>(slots)));
  const std::vector<PipeAction> schedule = make_schedule(kind, pp, stage, m, v);
  // Megatron's steps (the k-th forward in step k, the i-th backward in step w + i), or
  // one step per action.
  std::vector<int> steps;
  int forwards = 0, backwards = 0;
  for (size_t k = 0; k < schedule.size(); ++k) {
    if (posting == Posting::kLoneSends || posting == Posting::kPerActionBatches) {
      steps.push_back(static_cast<int>(k));
    } else {
      steps.push_back(schedule[k].kind == PipeAction::kForward
                          ? forwards++
                          : 2 * (pp - stage - 1) + (v - 1) * pp + backwards++);
    }
  }
  std::vector<P2POp> sends, grad_sends, recvs;
  auto flush = [&] {
    std::vector<P2POp> ops = sends;
    ops.insert(posting == Posting::kStepsGradientSendsFirst ? ops.begin() : ops.end(),
               grad_sends.begin(), grad_sends.end());
    ops.insert(ops.end(), recvs.begin(), recvs.end());
    if (posting == Posting::kLoneSends) {
      for (const P2POp& op : ops) {
        if (op.kind == P2POp::kSend) comm.isend(op.buf, op.peer, op.tag);
        else comm.recv(op.buf, op.peer, op.tag);
      }
    } else if (!ops.empty()) {
      comm.batch_p2p(ops);
    }
    sends.clear();
    grad_sends.clear();
    recvs.clear();
  };
  auto post_recv = [&](const PipeAction& a) {
    const auto c = static_cast<size_t>(a.chunk);
    const int vs = a.chunk * pp + stage;
    if (a.kind == PipeAction::kForward) {
      const int slot =
          static_cast<int>(std::find(busy[c].begin(), busy[c].end(), false) - busy[c].begin());
      busy[c][static_cast<size_t>(slot)] = true;
      slot_of[c][static_cast<size_t>(a.micro)] = slot;
      const int prev = prev_rank(stage, a.chunk, pp);
      if (prev >= 0) {
        recvs.push_back({P2POp::kRecv, CommBuf::device(chunks[c]->input_activation(slot), n), prev,
                         model_tag(a.micro, vs - 1, false)});
      }
    } else {
      const int next = next_rank(stage, a.chunk, pp, v);
      if (next >= 0) {
        const int slot = slot_of[c][static_cast<size_t>(a.micro)];
        recvs.push_back({P2POp::kRecv, CommBuf::device(chunks[c]->output_grad(slot), n), next,
                         model_tag(a.micro, vs + 1, true)});
      }
    }
  };
  for (size_t k = 0; k < schedule.size() && steps[k] == steps[0]; ++k) post_recv(schedule[k]);
  flush();
  for (size_t k = 0; k < schedule.size();) {
    const int step = steps[k];
    for (; k < schedule.size() && steps[k] == step; ++k) {
      const PipeAction& a = schedule[k];
      const auto c = static_cast<size_t>(a.chunk);
      PipelineStageModel& model = *chunks[c];
      const int vs = a.chunk * pp + stage;
      const int slot = slot_of[c][static_cast<size_t>(a.micro)];
      if (a.kind == PipeAction::kForward) {
        model.forward(a.micro, slot);
        const int next = next_rank(stage, a.chunk, pp, v);
        if (next >= 0) {
          sends.push_back({P2POp::kSend, CommBuf::device(model.output_activation(slot), n), next,
                           model_tag(a.micro, vs, false)});
        }
      } else {
        model.backward(a.micro, slot);
        const int prev = prev_rank(stage, a.chunk, pp);
        if (prev >= 0) {
          grad_sends.push_back({P2POp::kSend, CommBuf::device(model.input_grad(slot), n), prev,
                                model_tag(a.micro, vs, true)});
        }
        busy[c][static_cast<size_t>(slot)] = false;
      }
    }
    // Lone sends: the send goes out before the next action's receive is posted.
    if (posting == Posting::kLoneSends || (k < schedule.size() && steps[k] - 1 > step)) flush();
    if (k < schedule.size()) {
      for (size_t i = k; i < schedule.size() && steps[i] == steps[k]; ++i) post_recv(schedule[i]);
    }
    flush();
  }
}

struct Outcome {
  bool deadlocked = false;
  std::string errors;
};

// Runs p ranks of v chunks each as threads over one NcclModel; `batched`: the executor,
// else `posting` by hand.
Outcome run_pipeline(PipeSchedule kind, int pp, int m, bool batched, int v = 1,
                     Posting posting = Posting::kLoneSends) {
  NcclModel fabric(pp);
  std::vector<std::vector<std::unique_ptr<StampStage>>> stages(static_cast<size_t>(pp));
  std::vector<std::unique_ptr<NcclModelCommunicator>> comms;
  for (int s = 0; s < pp; ++s) {
    const int slots = PipelineExecutor::required_slots(kind, pp, s, m, v);
    for (int c = 0; c < v; ++c) {
      stages[static_cast<size_t>(s)].push_back(
          std::make_unique<StampStage>(c * pp + s, pp * v, slots));
    }
    comms.push_back(std::make_unique<NcclModelCommunicator>(fabric, s, pp));
  }
  std::vector<std::thread> threads;
  for (int s = 0; s < pp; ++s) {
    threads.emplace_back([&, s] {
      auto& chunks = stages[static_cast<size_t>(s)];
      try {
        if (batched) {
          PipelineExecutor executor(*comms[static_cast<size_t>(s)], kind, m,
                                    PipelineExecutor::required_slots(kind, pp, s, m, v), v);
          std::vector<PipelineStageModel*> models;
          for (auto& c : chunks) models.push_back(c.get());
          executor.run(models);
        } else {
          run_by_hand(*comms[static_cast<size_t>(s)], chunks, kind, m, v, posting);
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
  for (const auto& chunks : stages) {
    for (const auto& st : chunks) {
      out.errors += st->errors;
      if (!out.deadlocked && (st->forwards != m || st->backwards != m)) {
        out.errors += "a chunk ran " + std::to_string(st->forwards) + " forwards and " +
                      std::to_string(st->backwards) + " backwards; ";
      }
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

TEST(PipelineNcclModel, InterleavedCompletesWithEveryMessageWhereItBelongs) {
  // Every chunk's activations and gradients arrive stamped with the right (micro,
  // virtual stage), and on each (sender, receiver) pair the sends and receives pair up
  // in launch order with equal tags: with p == 2 the wrap-around activations and the
  // gradients share the pair 1 -> 0 (and 0 -> 1), so their order matters.
  for (int pp = 2; pp <= 4; ++pp) {
    for (int v = 2; v <= 3; ++v) {
      for (int m = pp; m <= 8; m += pp) {
        const Outcome out = run_pipeline(PipeSchedule::kOneFOneB, pp, m, /*batched=*/true, v);
        EXPECT_FALSE(out.deadlocked) << "p=" << pp << " v=" << v << " m=" << m;
        EXPECT_EQ(out.errors, "") << "p=" << pp << " v=" << v << " m=" << m;
      }
    }
  }
}

TEST(PipelineNcclModel, InterleavedNeedsStepsNotPerActionBatches) {
  // The v == 1 pattern (each action's send with the next action's receive) deadlocks
  // interleaved 1F1B as soon as there is more than one micro-batch group: a send waits
  // until its consumer posts the receive, which the consumer does only right before
  // using it, possibly many actions later, while its own inputs wait on the sender.
  const Outcome out = run_pipeline(PipeSchedule::kOneFOneB, 2, 4, false, 2,
                                   Posting::kPerActionBatches);
  EXPECT_TRUE(out.deadlocked);
  int deadlocks = 0, runs = 0;
  for (int pp = 2; pp <= 4; ++pp) {
    for (int v = 2; v <= 3; ++v) {
      for (int m = 2 * pp; m <= 8; m += pp) {
        ++runs;
        deadlocks +=
            run_pipeline(PipeSchedule::kOneFOneB, pp, m, false, v, Posting::kPerActionBatches)
                .deadlocked;
        // Lone sends deadlock too.
        EXPECT_TRUE(run_pipeline(PipeSchedule::kOneFOneB, pp, m, false, v).deadlocked)
            << "p=" << pp << " v=" << v << " m=" << m;
      }
    }
  }
  EXPECT_EQ(deadlocks, runs);
  // The model is not deadlock-happy: with one group (m == p) the per-action batches
  // happen to finish.
  const Outcome one_group = run_pipeline(PipeSchedule::kOneFOneB, 2, 2, false, 2,
                                         Posting::kPerActionBatches);
  EXPECT_FALSE(one_group.deadlocked);
  EXPECT_EQ(one_group.errors, "");
}

TEST(PipelineNcclModel, InterleavedBatchOrderMattersAtTwoStages) {
  // With p == 2 a stage's next and previous neighbour are the same rank, so one batch
  // can carry an activation and a gradient to the same peer; NCCL pairs them in posting
  // order, without tags. Posting the gradient first on the sending side only pairs the
  // wrong messages (the model reports the tag mismatch and the stamps come out wrong).
  const Outcome swapped = run_pipeline(PipeSchedule::kOneFOneB, 2, 4, false, 2,
                                       Posting::kStepsGradientSendsFirst);
  EXPECT_NE(swapped.errors.find("mismatched pair"), std::string::npos) << swapped.errors;
  const Outcome control = run_pipeline(PipeSchedule::kOneFOneB, 2, 4, false, 2, Posting::kSteps);
  EXPECT_FALSE(control.deadlocked);
  EXPECT_EQ(control.errors, "");
  // With three or more stages every (sender, receiver) pair carries one direction only,
  // so the same order is harmless there; the executor's order is right for both.
  const Outcome three = run_pipeline(PipeSchedule::kOneFOneB, 3, 6, false, 2,
                                     Posting::kStepsGradientSendsFirst);
  EXPECT_FALSE(three.deadlocked);
  EXPECT_EQ(three.errors, "");
}

}  // namespace
}  // namespace trident

