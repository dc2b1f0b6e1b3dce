// Pipeline parallelism: micro-batch schedules (GPipe, 1F1B, interleaved 1F1B) and the
// executor that walks one on a stage, moving activations and their gradients between
// the stages of the pp group (docs/ARCHITECTURE.md "Pipeline parallelism"). Independent of the
// transformer: the model plugs in through PipelineStageModel, one per model chunk.
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
// - Interleaved 1F1B (Megatron's forward_backward_pipelining_with_interleaving,
//   parallel.virtual_stages v > 1; 1F1B and p > 1 only): each rank holds v model
//   chunks; chunk c of rank s is virtual stage c*p + s of a p*v-stage pipeline (chunks
//   round-robin, see chunk_layer_ranges). The v*m (micro, chunk) forwards run in groups
//   of p micro-batches: group g does chunk 0 for micro-batches g*p .. g*p+p-1, then
//   chunk 1 for the same micro-batches, ..., then chunk v-1. The k-th backward is the k-th
//   forward's micro-batch on chunk v-1-chunk (the gradient flows back through the chunks).
//   Warmup w = min(2*(p - stage - 1) + (v-1)*p, v*m) forwards, then (v*m - w) pairs
//   "F(w+i) B(i)", then the remaining w backwards. Needs m % p == 0: with groups of p,
//   the wrap-around input of (micro, chunk c+1) on stage 0 leaves stage p-1 just as
//   stage 0 needs it; a shorter group would make stage 0 wait (Megatron's "dependency
//   bubbles"). Bubble (p-1)/(v*m+p-1): each chunk takes 1/v of a stage's time, so the
//   fill and drain shrink v-fold.
//
// Executor contract (PipelineExecutor::run):
// - Collective over the pp group: every stage calls run() with the same schedule kind,
//   number of micro-batches and of chunks. Stage = pp_group.rank().
// - Data, by virtual stage: F(i) on chunk c of stage s needs micro-batch i's activation
//   from the virtual stage before it (stage s-1 chunk c, or for s == 0 stage p-1 chunk
//   c-1: the wrap-around) in input_activation(slot), and sends output_activation(slot)
//   to the virtual stage after it (stage s+1 chunk c, or for s == p-1 stage 0 chunk c+1).
//   B(i) receives the gradient from the virtual stage after it into output_grad(slot)
//   and sends input_grad(slot) to the one before. At most one gradient per chunk is in
//   flight, so output_grad and input_grad may be one buffer per chunk for all slots.
//   The first virtual stage (stage 0 chunk 0) embeds and receives no activation; the
//   last (stage p-1 chunk v-1) computes the loss and receives no gradient. Tags name
//   the micro-batch, the boundary's chunk and the direction (mod 32768); on one
//   (sender, receiver) pair the messages of every tag are sent in the order the
//   receiver posts them (tests/parallel/pipeline_nccl_model_test.cpp checks it), as
//   NCCL, which has no tags, needs.
// - Communication (Megatron's send_forward_recv_backward pattern): the first action's
//   receive is posted alone; after each action, its send and the next action's receive
//   go out together in one Communicator::batch_p2p. On NCCL, where a send completes only
//   once its receive is posted and a communicator runs its operations in launch order,
//   neighbours that send to each other in the same step would deadlock with lone sends;
//   in one batch they cannot. With v > 1 the unit is Megatron's step instead of the
//   action: a step is one forward, one forward then one backward (steady state), or one
//   backward, and after it its sends go out with the next step's receives (pipeline.cpp
//   action_steps says why every exchange then meets its peers' at the same time; per
//   action, interleaving deadlocks). So within a steady step the forward's output is
//   sent after the backward has run: output_activation(slot) must survive it (it does
//   when it is per slot). tests/parallel/pipeline_nccl_model_test.cpp runs GPipe and
//   1F1B for every p, m <= 8, and interleaved 1F1B for p <= 4, v <= 3, against a model
//   of those semantics, and shows the other orders deadlocking there. On MPI a batch's
//   sends are copied out as isends and only receives block. run() returns after all its
//   sends have completed.
// - Slots, one pool per stage shared by its chunks: a (micro, chunk) pair gets the lowest
//   free slot of the pool at its forward and keeps it until its backward returns, so no
//   two live pairs of the stage share a slot id (CHECKed); a chunk's model indexes what
//   it saves for backward by that id (the trainer's chunks share one activation buffer,
//   model/transformer.h share_activations). num_slots must be >= required_slots(kind, p,
//   stage, m, v).
// - Threads: one thread (the training thread) calls run(); the model's hooks are called
//   from it.
// Misuse (too few slots, m < 1, a null boundary buffer, v > 1 with GPipe, p == 1 or m
// not a multiple of p, a chunk count that is not v) aborts through TRIDENT_CHECK; the
// config checks the same conditions first with interleave_problem / layer_split_problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "core/status.h"

namespace trident {

// The schedule kind; also the config's parallel.pipeline_schedule (config/config.h).
enum class PipeSchedule { kGPipe, kOneFOneB };

// "gpipe" / "1f1b", the config's spellings (parallel.pipeline_schedule).
const char* pipe_schedule_name(PipeSchedule kind);

struct PipeAction {
  enum Kind : std::uint8_t { kForward, kBackward };
  Kind kind = kForward;
  int micro = 0;  // micro-batch index, 0..m-1
  int chunk = 0;  // model chunk on this stage, 0..v-1; virtual stage chunk * pp + stage
  bool operator==(const PipeAction&) const = default;
};

// The action order of `stage` (0 <= stage < pp) for num_micro >= 1 micro-batches and
// virtual_stages model chunks per stage (v > 1: interleaved 1F1B; CHECKs
// interleave_problem). v == 1 gives the GPipe / 1F1B schedules above, every chunk 0.
std::vector<PipeAction> make_schedule(PipeSchedule kind, int pp, int stage, int num_micro,
                                      int virtual_stages = 1);

// "F0 F1 B0 ..." for messages and tests; "F0.0 F1.0 F0.1 ..." (micro.chunk) when some
// action is on a chunk other than 0, so v == 1 schedules print as they always did.
std::string schedule_to_string(const std::vector<PipeAction>& schedule);

// Why `virtual_stages` model chunks per stage cannot run with this schedule, pp and
// number of micro-batches per step (per data-parallel rank, the gradient accumulation
// steps), or "" when they can. The message names parallel.virtual_stages and the values;
// the config validation returns it as its Status.
std::string interleave_problem(PipeSchedule kind, int pp, int virtual_stages, int num_micro);

// Why n_layers cannot be split into pp * virtual_stages chunks (fewer layers than
// chunks), or "". The message names parallel.virtual_stages and model.n_layers.
std::string layer_split_problem(int n_layers, int pp, int virtual_stages);

// Layers [begin, end) of one model chunk.
struct LayerRange {
  int begin = 0;
  int end = 0;
  bool operator==(const LayerRange&) const = default;
};

// [stage][chunk]: the layers of each model chunk. The n_layers layers are cut into
// pp * v contiguous, balanced ranges (earlier ranges take the remainder, as
// stage_layer_counts does for v == 1); virtual stage k = chunk * pp + stage holds the
// k-th, so the chunks of a stage are round-robin over the model, as in Megatron. CHECKs
// layer_split_problem.
std::vector<std::vector<LayerRange>> chunk_layer_ranges(int n_layers, int pp,
                                                        int virtual_stages = 1);

// The analytic bubble (p-1)/(v*m+p-1): the idle share of a stage's step time when every
// stage takes the same time per micro-batch (each chunk 1/v of it) and communication is
// free.
double pipeline_bubble_fraction(int pp, int num_micro, int virtual_stages = 1);

// The most micro-batches live at once in any one chunk of `stage`, in closed form (tests
// check it against a walk of the schedule for p <= 8, v <= 4, m <= 8p):
// - GPipe, p > 1: m.  1F1B, and either schedule with p == 1: min(p - stage, m).
// - Interleaved (v > 1): min(m, 2p, (v+1)p - 1 - 2*stage). Chunk 0 holds the most: its
//   forwards run a group ahead of its backwards, which wait for the gradient to come
//   back through every later chunk; with v == 2 the late stages' shorter warmup trims it.
// v chunks with this many slots each would hold several times what is live on the stage
// (pipeline_stage_slots), hence the pool.
int pipeline_chunk_slots(PipeSchedule kind, int pp, int stage, int num_micro,
                         int virtual_stages = 1);

// Activation slots `stage` needs, its chunks sharing one pool: the most (micro, chunk)
// pairs live at once summed over the chunks, in closed form (PipelineExecutor::
// required_slots walks the schedule; tests check the two agree), so the memory plan can
// use it. v == 1: pipeline_chunk_slots. Interleaved: min(v*m, w + 1), w = 2*(p - stage - 1)
// + (v-1)*p the uncapped warmup (Megatron's in-flight count): the warmup's forwards, then
// one more in each steady step before its backward frees one.
int pipeline_stage_slots(PipeSchedule kind, int pp, int stage, int num_micro,
                         int virtual_stages = 1);

// What the executor needs from one stage of the model, or with v > 1 from one model chunk
// of a stage ("stage" below: the virtual stage). Buffers are the model's f32 device
// buffers, one per slot, each boundary_floats() long (the same for every chunk);
// pointers must stay valid during run().
class PipelineStageModel {
 public:
  virtual ~PipelineStageModel() = default;
  // Floats in one activation crossing a stage boundary: (micro_batch * seq_len * d_model).
  virtual std::size_t boundary_floats() const = 0;
  // Not the first (virtual) stage: where the activation received from the one before
  // goes; forward reads it.
  virtual DevPtr input_activation(int slot) = 0;
  // Not the last: the activation forward produced, sent to the next (copied at once).
  virtual DevPtr output_activation(int slot) = 0;
  // Not the last: where the gradient received from the next goes; backward reads it.
  virtual DevPtr output_grad(int slot) = 0;
  // Not the first: the gradient w.r.t. the input that backward produced, sent to the one
  // before. It must not alias any slot's input_activation (of any chunk): it is sent
  // while the next forward's input is being received.
  virtual DevPtr input_grad(int slot) = 0;
  // Runs the stage's layers on micro-batch `micro`, saving what backward needs in
  // `slot`. The first stage embeds the micro-batch's tokens; the last computes the loss.
  virtual void forward(int micro, int slot) = 0;
  // Backward of micro-batch `micro` from what forward saved in `slot`; accumulates the
  // stage's parameter gradients. The slot is reused after this returns.
  virtual void backward(int micro, int slot) = 0;
};

class PipelineExecutor {
 public:
  struct Stats {
    int peak_live_slots = 0;       // most (micro, chunk) pairs holding activations at once
    std::vector<int> peak_live_per_chunk;  // (v) the same per chunk
    double total_seconds = 0;      // run() wall time, entry to return
    double compute_seconds = 0;    // inside forward()/backward()
    double idle_seconds = 0;       // in batch_p2p (waiting for a neighbour)
    double send_wait_seconds = 0;  // in the final wait for sends to complete
    // (schedule().size()) per action: when its forward()/backward() started (seconds
    // since run() was entered) and how long it took; the bubble is measured from these.
    std::vector<double> action_start_seconds;
    std::vector<double> action_seconds;
    std::int64_t sends = 0;
    std::int64_t recvs = 0;
    std::int64_t bytes_sent = 0;
    std::int64_t bytes_received = 0;
  };

  // pp_group is borrowed and must outlive the executor. num_slots: the slot ids the
  // chunks' models can index (the stage's pool; CHECKed >= required_slots).
  // virtual_stages: model chunks per stage (CHECKs interleave_problem).
  PipelineExecutor(Communicator& pp_group, PipeSchedule kind, int num_micro, int num_slots,
                   int virtual_stages = 1);

  // One step's forwards and backwards of every micro-batch on this stage; chunks[c] is
  // model chunk c (virtual stage c * pp + stage), exactly virtual_stages of them, none
  // null, borrowed for the call.
  Stats run(std::span<PipelineStageModel* const> chunks);
  // The same with one chunk (virtual_stages == 1).
  Stats run(PipelineStageModel& model);

  int stage() const { return stage_; }
  int num_stages() const { return num_stages_; }
  int virtual_stages() const { return virtual_stages_; }
  const std::vector<PipeAction>& schedule() const { return schedule_; }

  // Slots the pool of a stage needs: the most (micro, chunk) pairs live at once summed
  // over its chunks, from a walk of the schedule (pipeline_stage_slots is the closed
  // form).
  static int required_slots(PipeSchedule kind, int pp, int stage, int num_micro,
                            int virtual_stages = 1);

 private:
  Communicator& pp_group_;
  PipeSchedule kind_;
  int num_micro_;
  int num_slots_;
  int virtual_stages_;
  int stage_;
  int num_stages_;
  std::vector<PipeAction> schedule_;
};

}  // namespace trident
