// Pipeline parallelism: micro-batch schedules (GPipe, 1F1B) and the executor that walks
// one on a stage, moving activations and their gradients between neighbouring stages of
// the pp group (DESIGN.md "Pipeline parallelism"). Independent of the transformer: the
// model plugs in through PipelineStageModel.
//
// Schedules (make_schedule), per stage, for m micro-batches and p stages:
// - GPipe: F0 F1 ... F(m-1), then B0 B1 ... B(m-1): backward in forward order (as
//   Megatron's no-pipelining path and its 1F1B do), so the last stage starts the
//   backward of micro-batch 0 while its gradient is already on the way upstream. Every
//   micro-batch's activations are live at once: m slots.
// - 1F1B (Megatron's non-interleaved schedule): warmup of w = min(p - stage - 1, m)
//   forwards, then m - w pairs "F(w+i) B(i)", then the remaining w backwards. At most
//   min(p - stage, m) micro-batches are live on a stage.
// - p == 1: both schedules are F0 B0 F1 B1 ... (gradient accumulation); one slot. With
//   no pipeline to fill, GPipe's all-forwards-first order would only cost memory.
// Both have the bubble (p-1)/(m+p-1) when every stage takes the same time per micro-batch.
//
// Executor contract (PipelineExecutor::run):
// - Collective over the pp group: every stage calls run() with the same schedule kind and
//   number of micro-batches. Stage = pp_group.rank(); stage s talks to s-1 and s+1 only.
// - Data: F(i) on stage > 0 needs the activation of micro-batch i from stage-1 in
//   input_activation(slot); F(i) on stage < last sends output_activation(slot) to
//   stage+1. B(i) on stage < last needs the gradient from stage+1 in output_grad(slot);
//   B(i) on stage > 0 sends input_grad(slot) to stage-1. Tag = i (mod 32768); the
//   directions differ, and sends of one direction arrive in order, so tags never mix up.
// - Communication (Megatron's send_forward_recv_backward pattern): the first action's
//   receive is posted alone; after each action, its send and the next action's receive
//   go out together in one Communicator::batch_p2p. On NCCL, where a send completes only
//   once its receive is posted and a communicator runs its operations in launch order,
//   neighbours that send to each other in the same step would deadlock with lone sends;
//   in one batch they cannot (tests/parallel/pipeline_nccl_model_test.cpp runs GPipe and
//   1F1B for every p, m <= 8 against a model of those semantics, and shows the lone-send
//   order deadlocking there). On MPI a batch's sends are copied out as isends and only
//   receives block. run() returns after all its sends have completed.
// - Slots: a micro-batch gets the lowest free slot at its forward and keeps it until its
//   backward returns; the model holds num_slots copies of whatever it saves for backward
//   and indexes them by slot. num_slots must be >= required_slots(kind, p, stage, m).
// - Threads: one thread (the training thread) calls run(); the model's hooks are called
//   from it.
// Misuse (too few slots, m < 1, a null boundary buffer) aborts through TRIDENT_CHECK.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "core/status.h"

namespace trident {

// The schedule kind; also the config's parallel.pipeline_schedule (trainer/config.h).
enum class PipeSchedule { kGPipe, kOneFOneB };

// "gpipe" / "1f1b", the config's spellings (parallel.pipeline_schedule).
const char* pipe_schedule_name(PipeSchedule kind);

struct PipeAction {
  enum Kind : std::uint8_t { kForward, kBackward };
  Kind kind = kForward;
  int micro = 0;  // micro-batch index, 0..m-1
  bool operator==(const PipeAction&) const = default;
};

// The action order of `stage` (0 <= stage < pp) for num_micro >= 1 micro-batches.
std::vector<PipeAction> make_schedule(PipeSchedule kind, int pp, int stage, int num_micro);

// "F0 F1 B0 ..." for messages and tests.
std::string schedule_to_string(const std::vector<PipeAction>& schedule);

// The analytic bubble (p-1)/(m+p-1): the idle share of a stage's step time when every
// stage takes the same time per micro-batch and communication is free.
double pipeline_bubble_fraction(int pp, int num_micro);

// What the executor needs from one stage of the model. Buffers are the model's f32 device
// buffers, one per slot, each boundary_floats() long; pointers must stay valid during run().
class PipelineStageModel {
 public:
  virtual ~PipelineStageModel() = default;
  // Floats in one activation crossing a stage boundary: (micro_batch * seq_len * d_model).
  virtual std::size_t boundary_floats() const = 0;
  // Stage > 0: where the activation received from stage-1 goes; forward reads it.
  virtual DevPtr input_activation(int slot) = 0;
  // Stage < last: the activation forward produced, sent to stage+1 (copied at once).
  virtual DevPtr output_activation(int slot) = 0;
  // Stage < last: where the gradient received from stage+1 goes; backward reads it.
  virtual DevPtr output_grad(int slot) = 0;
  // Stage > 0: the gradient w.r.t. the input that backward produced, sent to stage-1. It
  // must not alias any slot's input_activation: it is sent while the next forward's input
  // is being received.
  virtual DevPtr input_grad(int slot) = 0;
  // Runs the stage's layers on micro-batch `micro`, saving what backward needs in
  // `slot`. Stage 0 embeds the micro-batch's tokens; the last stage computes the loss.
  virtual void forward(int micro, int slot) = 0;
  // Backward of micro-batch `micro` from what forward saved in `slot`; accumulates the
  // stage's parameter gradients. The slot is reused after this returns.
  virtual void backward(int micro, int slot) = 0;
};

class PipelineExecutor {
 public:
  struct Stats {
    int peak_live_slots = 0;       // most micro-batches holding activations at once
    double total_seconds = 0;      // run() wall time, entry to return
    double compute_seconds = 0;    // inside forward()/backward()
    double idle_seconds = 0;       // in batch_p2p (waiting for a neighbour)
    double send_wait_seconds = 0;  // in the final wait for sends to complete
    std::int64_t sends = 0;
    std::int64_t recvs = 0;
    std::int64_t bytes_sent = 0;
    std::int64_t bytes_received = 0;
  };

  // pp_group is borrowed and must outlive the executor. num_slots: how many slots the
  // model allocated (CHECKed >= required_slots).
  PipelineExecutor(Communicator& pp_group, PipeSchedule kind, int num_micro, int num_slots);

  // One step's forwards and backwards of every micro-batch on this stage.
  Stats run(PipelineStageModel& model);

  int stage() const { return stage_; }
  int num_stages() const { return num_stages_; }
  const std::vector<PipeAction>& schedule() const { return schedule_; }

  // Slots a stage needs: the most micro-batches live at once in its schedule.
  static int required_slots(PipeSchedule kind, int pp, int stage, int num_micro);

 private:
  Communicator& pp_group_;
  PipeSchedule kind_;
  int num_micro_;
  int num_slots_;
  int stage_;
  int num_stages_;
  std::vector<PipeAction> schedule_;
};

}  // namespace trident
