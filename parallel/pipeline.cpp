#include "parallel/pipeline.h"

#include <algorithm>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/timer.h"

namespace trident {

namespace {

// Communicator tags stop at 32767 (MPI's guaranteed minimum). A tag names the
// micro-batch, the chunk of the boundary's earlier side and the direction; past 32767
// they repeat, and order (see the header) keeps messages apart.
enum Direction { kActivation = 0, kGradient = 1 };
int tag_of(int micro, int lower_chunk, int virtual_stages, Direction dir) {
  const long long id = (static_cast<long long>(micro) * virtual_stages + lower_chunk) * 2 + dir;
  return static_cast<int>(id % 32768);
}

std::vector<PipeAction> one_f_one_b(int pp, int stage, int m) {
  const int warmup = std::min(pp - stage - 1, m);
  const int steady = m - warmup;
  std::vector<PipeAction> s;
  s.reserve(2 * static_cast<std::size_t>(m));
  for (int i = 0; i < warmup; ++i) s.push_back({PipeAction::kForward, i});
  for (int i = 0; i < steady; ++i) {
    s.push_back({PipeAction::kForward, warmup + i});
    s.push_back({PipeAction::kBackward, i});
  }
  for (int i = steady; i < m; ++i) s.push_back({PipeAction::kBackward, i});
  return s;
}

// Megatron's interleaved order: the k-th forward of a stage is micro-batch
// (k / (p*v)) * p + k % p on chunk (k % (p*v)) / p (groups of p micro-batches, each
// through chunk 0, then 1, ...); the k-th backward is the same micro-batch on chunk
// v-1-that (backward runs the chunks in reverse).
PipeAction interleaved_action(PipeAction::Kind kind, int k, int pp, int v) {
  const int group = k / (pp * v);
  const int in_group = k % (pp * v);
  const int chunk = in_group / pp;
  const int micro = group * pp + in_group % pp;
  return {kind, micro, kind == PipeAction::kForward ? chunk : v - 1 - chunk};
}

std::vector<PipeAction> interleaved_one_f_one_b(int pp, int stage, int m, int v) {
  const int total = v * m;
  // Every stage runs (v-1)*p forwards before its first backward (the first micro-batch
  // group through all chunks but the last), plus 2 per later stage: the forward has to
  // reach the last stage and the gradient has to come back.
  const int warmup = std::min(2 * (pp - stage - 1) + (v - 1) * pp, total);
  std::vector<PipeAction> s;
  s.reserve(2 * static_cast<std::size_t>(total));
  for (int k = 0; k < warmup; ++k) s.push_back(interleaved_action(PipeAction::kForward, k, pp, v));
  for (int k = 0; k < total - warmup; ++k) {
    s.push_back(interleaved_action(PipeAction::kForward, warmup + k, pp, v));
    s.push_back(interleaved_action(PipeAction::kBackward, k, pp, v));
  }
  for (int k = total - warmup; k < total; ++k)
    s.push_back(interleaved_action(PipeAction::kBackward, k, pp, v));
  return s;
}

// The communication step of each action of `schedule` (non-decreasing): the executor
// runs a step's actions, then one exchange with their sends and the next step's
// receives. With v == 1 every action is its own step (the pattern above). With v > 1,
// Megatron's interleaved steps: the k-th forward in step k, the i-th backward in step
// w + i, w = 2*(p-1-stage) + (v-1)*p the uncapped warmup; a steady step is "F(w+i) B(i)".
// Why this cannot deadlock: give step j of stage s the global time j + s. Every message
// then leaves its producer and is received by its consumer in exchanges of the same
// global time, the one just before the consumer's step:
// - forward k on stage s-1 (step k, time k+s-1) feeds forward k on stage s (step k);
// - backward i on stage s+1 (step w-2+i, time w+i+s-1) feeds backward i on stage s
//   (step w+i): the warmup shrinks by 2 per stage;
// - around the wrap-around, (micro, chunk c) on stage p-1 (forward k, time k+p-1) feeds
//   (micro, chunk c+1) on stage 0, which is forward k+p there (groups of p micro-batches,
//   hence m % p == 0), step k+p; backward likewise.
// So the exchanges of one global time match only each other: no cycle of waits, on NCCL
// either; and on a (sender, receiver) pair the messages of one time, at most an
// activation then a gradient, are posted in the same order on both sides.
std::vector<int> action_steps(const std::vector<PipeAction>& schedule, int pp, int stage,
                              int v) {
  std::vector<int> steps(schedule.size());
  int forwards = 0, backwards = 0;
  const int warmup = v == 1 ? 0 : 2 * (pp - stage - 1) + (v - 1) * pp;
  for (std::size_t k = 0; k < schedule.size(); ++k) {
    if (v == 1) {
      steps[k] = static_cast<int>(k);
    } else {
      steps[k] = schedule[k].kind == PipeAction::kForward ? forwards++ : warmup + backwards++;
    }
    // A step is at most one forward then one backward (the sends of a step go out
    // after both; the exchange before it receives both inputs).
    TRIDENT_CHECK(k == 0 || steps[k] > steps[k - 1] ||
                  (steps[k] == steps[k - 1] && schedule[k].kind == PipeAction::kBackward &&
                   schedule[k - 1].kind == PipeAction::kForward));
  }
  return steps;
}

}  // namespace

const char* pipe_schedule_name(PipeSchedule kind) {
  return kind == PipeSchedule::kGPipe ? "gpipe" : "1f1b";
}

std::string interleave_problem(PipeSchedule kind, int pp, int virtual_stages, int num_micro) {
  const std::string v = std::to_string(virtual_stages);
  if (virtual_stages < 1) return "parallel.virtual_stages must be >= 1, got " + v;
  if (virtual_stages == 1) return "";
  if (pp == 1) {
    // With one stage there is no bubble to shrink, and the chunks would send to
    // themselves.
    return "parallel.virtual_stages " + v + " (interleaved 1F1B) needs parallel.pp > 1, got 1";
  }
  if (kind != PipeSchedule::kOneFOneB) {
    return "parallel.virtual_stages " + v + " (interleaved) needs parallel.pipeline_schedule " +
           "1f1b, got " + pipe_schedule_name(kind);
  }
  if (num_micro % pp != 0) {
    return "parallel.virtual_stages " + v + " (interleaved 1F1B) needs the number of " +
           "micro-batches per step (" + std::to_string(num_micro) +
           " = training.global_batch_size / (parallel.micro_batch_size * parallel.dp)) to be " +
           "a multiple of parallel.pp (" + std::to_string(pp) + ")";
  }
  return "";
}

std::string layer_split_problem(int n_layers, int pp, int virtual_stages) {
  if (n_layers >= pp * virtual_stages) return "";
  return "parallel.virtual_stages " + std::to_string(virtual_stages) + " with parallel.pp " +
         std::to_string(pp) + " cuts the model into " + std::to_string(pp * virtual_stages) +
         " chunks of at least one layer each, but model.n_layers is " + std::to_string(n_layers);
}

std::vector<std::vector<LayerRange>> chunk_layer_ranges(int n_layers, int pp,
                                                        int virtual_stages) {
  TRIDENT_CHECK_MSG(pp >= 1 && virtual_stages >= 1,
                    "chunk_layer_ranges: pp=" + std::to_string(pp) +
                        " parallel.virtual_stages=" + std::to_string(virtual_stages));
  const std::string problem = layer_split_problem(n_layers, pp, virtual_stages);
  TRIDENT_CHECK_MSG(problem.empty(), problem);
  const int chunks = pp * virtual_stages;
  std::vector<std::vector<LayerRange>> ranges(static_cast<std::size_t>(pp),
                                              std::vector<LayerRange>(virtual_stages));
  int begin = 0;
  for (int k = 0; k < chunks; ++k) {
    const int count = n_layers / chunks + (k < n_layers % chunks ? 1 : 0);
    ranges[static_cast<std::size_t>(k % pp)][static_cast<std::size_t>(k / pp)] = {begin,
                                                                                begin + count};
    begin += count;
  }
  return ranges;
}

std::vector<PipeAction> make_schedule(PipeSchedule kind, int pp, int stage, int num_micro,
                                      int virtual_stages) {
  TRIDENT_CHECK_MSG(pp >= 1 && stage >= 0 && stage < pp && num_micro >= 1,
                    "make_schedule: pp=" + std::to_string(pp) + " stage=" + std::to_string(stage) +
                        " num_micro=" + std::to_string(num_micro));
  const std::string problem = interleave_problem(kind, pp, virtual_stages, num_micro);
  TRIDENT_CHECK_MSG(problem.empty(), "make_schedule: " + problem);
  if (virtual_stages > 1) return interleaved_one_f_one_b(pp, stage, num_micro, virtual_stages);
  if (kind == PipeSchedule::kOneFOneB || pp == 1) return one_f_one_b(pp, stage, num_micro);
  std::vector<PipeAction> s;
  s.reserve(2 * static_cast<std::size_t>(num_micro));
  for (int i = 0; i < num_micro; ++i) s.push_back({PipeAction::kForward, i});
  for (int i = 0; i < num_micro; ++i) s.push_back({PipeAction::kBackward, i});
  return s;
}

std::string schedule_to_string(const std::vector<PipeAction>& schedule) {
  const bool chunks = std::any_of(schedule.begin(), schedule.end(),
                                  [](const PipeAction& a) { return a.chunk != 0; });
  std::string out;
  for (const PipeAction& a : schedule) {
    if (!out.empty()) out += ' ';
    out += a.kind == PipeAction::kForward ? 'F' : 'B';
    out += std::to_string(a.micro);
    if (chunks) out += '.' + std::to_string(a.chunk);
  }
  return out;
}

double pipeline_bubble_fraction(int pp, int num_micro, int virtual_stages) {
  return static_cast<double>(pp - 1) /
         (static_cast<double>(virtual_stages) * num_micro + static_cast<double>(pp - 1));
}

int pipeline_chunk_slots(PipeSchedule kind, int pp, int stage, int num_micro,
                         int virtual_stages) {
  if (virtual_stages > 1) {
    return std::min({num_micro, 2 * pp, (virtual_stages + 1) * pp - 1 - 2 * stage});
  }
  if (kind == PipeSchedule::kGPipe && pp > 1) return num_micro;
  return std::min(pp - stage, num_micro);
}

int pipeline_stage_slots(PipeSchedule kind, int pp, int stage, int num_micro,
                         int virtual_stages) {
  if (virtual_stages > 1) {
    return std::min(virtual_stages * num_micro,
                    2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1);
  }
  return pipeline_chunk_slots(kind, pp, stage, num_micro);
}

int PipelineExecutor::required_slots(PipeSchedule kind, int pp, int stage, int num_micro,
                                     int virtual_stages) {
  int live = 0, peak = 0;  // (micro, chunk) pairs, summed over the chunks
  for (const PipeAction& a : make_schedule(kind, pp, stage, num_micro, virtual_stages)) {
    live += a.kind == PipeAction::kForward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

PipelineExecutor::PipelineExecutor(Communicator& pp_group, PipeSchedule kind, int num_micro,
                                   int num_slots, int virtual_stages)
    : pp_group_(pp_group),
      kind_(kind),
      num_micro_(num_micro),
      num_slots_(num_slots),
      virtual_stages_(virtual_stages),
      stage_(pp_group.rank()),
      num_stages_(pp_group.size()),
      schedule_(make_schedule(kind, num_stages_, stage_, num_micro, virtual_stages)) {
  const int needed = required_slots(kind, num_stages_, stage_, num_micro, virtual_stages);
  TRIDENT_CHECK_MSG(num_slots >= needed,
                    std::string("pipeline ") + pipe_schedule_name(kind) + " stage " +
                        std::to_string(stage_) + "/" + std::to_string(num_stages_) + " with " +
                        std::to_string(num_micro) + " micro-batches" +
                        (virtual_stages > 1
                             ? " and " + std::to_string(virtual_stages) + " chunks"
                             : std::string()) +
                        " needs " + std::to_string(needed) + " activation slots" +
                        (virtual_stages > 1 ? " (one pool for its chunks)" : "") +
                        ", the model has " + std::to_string(num_slots));
}

PipelineExecutor::Stats PipelineExecutor::run(PipelineStageModel& model) {
  PipelineStageModel* const chunks[] = {&model};
  return run(chunks);
}

namespace {

// The virtual stages around chunk c of a stage (see the header): the activation comes from
// `prev` and goes to `next`; gradients the other way. The first virtual stage has no prev,
// the last no next.
struct Peer {
  bool exists;
  int rank;
};

// One call of PipelineExecutor::run: the slots each (micro, chunk) pair holds, the batch of
// point-to-point ops being gathered, and the Stats being filled.
class StepRun {
 public:
  StepRun(Communicator& pp_group, const std::vector<PipeAction>& schedule,
          std::span<PipelineStageModel* const> chunks, int num_micro, int num_slots)
      : pp_group_(pp_group),
        schedule_(schedule),
        chunks_(chunks),
        v_(static_cast<int>(chunks.size())),
        p_(pp_group.size()),
        stage_(pp_group.rank()),
        n_(chunks[0]->boundary_floats()),
        bytes_(static_cast<std::int64_t>(n_ * sizeof(float))),
        steps_(action_steps(schedule, p_, stage_, v_)),
        slot_of_(static_cast<std::size_t>(v_),
                 std::vector<int>(static_cast<std::size_t>(num_micro), -1)),
        slot_busy_(static_cast<std::size_t>(num_slots)),
        live_per_chunk_(static_cast<std::size_t>(v_), 0) {
    stats_.peak_live_per_chunk.assign(static_cast<std::size_t>(v_), 0);
    stats_.action_start_seconds.reserve(schedule_.size());
    stats_.action_seconds.reserve(schedule_.size());
  }

  // Megatron's p2p pattern (send_forward_recv_backward and its kin), by step (see
  // action_steps): the first step's receives alone, then after each step its sends
  // together with the next step's receives in one batch_p2p (or, when idle steps lie
  // between, the sends now and the receives in the step just before the next one), so
  // neighbours that send to each other at the same time cannot deadlock on NCCL
  // (comm/communicator.h).
  PipelineExecutor::Stats run() {
    add_recvs_of_step(0);
    exchange();
    for (std::size_t k = 0; k < schedule_.size();) {
      const int step = steps_[k];
      what_.clear();
      for (; k < schedule_.size() && steps_[k] == step; ++k) run_action(schedule_[k]);
      if (k < schedule_.size()) {
        if (steps_[k] - 1 > step) {
          exchange();
          what_.clear();
        }
        add_recvs_of_step(k);
      }
      exchange();
    }
    const Timer t;
    pp_group_.wait_sends({.label = "pipeline end of step, stage " + std::to_string(stage_)});
    stats_.send_wait_seconds = t.elapsed_s();
    stats_.total_seconds = total_.elapsed_s();
    return std::move(stats_);
  }

 private:
  Peer prev_of(int c) const {
    if (stage_ > 0) return {true, stage_ - 1};
    return {c > 0, p_ - 1};
  }
  Peer next_of(int c) const {
    if (stage_ < p_ - 1) return {true, stage_ + 1};
    return {c < v_ - 1, 0};
  }
  // The chunk on the earlier side of the boundary between chunk c and its prev / next.
  int prev_boundary_chunk(int c) const { return stage_ > 0 ? c : c - 1; }
  static int next_boundary_chunk(int c) { return c; }

  std::string label(const char* what, const PipeAction& a) const {
    return std::string("pipeline ") + what + " micro " + std::to_string(a.micro) +
           (v_ > 1 ? " chunk " + std::to_string(a.chunk) : std::string()) + " stage " +
           std::to_string(stage_);
  }
  // Adds one send or receive of a boundary buffer to the batch, named `what_label` in the
  // batch's label, and counts it.
  void add_op(P2POp::Kind kind, DevPtr buf, int peer, int tag, const char* what,
              const std::string& what_label) {
    TRIDENT_CHECK_MSG(!buf.is_null(), std::string("pipeline: null ") + what + " buffer");
    if (kind == P2POp::kSend) {
      stats_.sends += 1;
      stats_.bytes_sent += bytes_;
    } else {
      stats_.recvs += 1;
      stats_.bytes_received += bytes_;
    }
    ops_.push_back(P2POp{kind, CommBuf::device(buf, n_), peer, tag});
    what_ += (what_.empty() ? "" : ", ") + what_label;
  }
  // The receive action `a` needs before it runs, if any. A forward's slot is taken here,
  // when its input is posted.
  void add_recv(const PipeAction& a) {
    const auto c = static_cast<std::size_t>(a.chunk);
    PipelineStageModel& model = *chunks_[c];
    if (a.kind == PipeAction::kForward) {
      const int slot = take_slot(a);
      const Peer from = prev_of(a.chunk);
      if (!from.exists) return;
      add_op(P2POp::kRecv, model.input_activation(slot), from.rank,
             tag_of(a.micro, prev_boundary_chunk(a.chunk), v_, kActivation), "activation",
             label("recv activation", a));
    } else {
      const int slot = slot_of_[c][static_cast<std::size_t>(a.micro)];
      TRIDENT_CHECK(slot >= 0);  // every schedule runs F(i) before B(i) on each chunk
      const Peer from = next_of(a.chunk);
      if (!from.exists) return;
      add_op(P2POp::kRecv, model.output_grad(slot), from.rank,
             tag_of(a.micro, next_boundary_chunk(a.chunk), v_, kGradient), "gradient",
             label("recv gradient", a));
    }
  }
  // The lowest free slot of the stage's pool (shared by its chunks) for forward `a`,
  // marked busy and counted live.
  int take_slot(const PipeAction& a) {
    const auto c = static_cast<std::size_t>(a.chunk);
    int& held = slot_of_[c][static_cast<std::size_t>(a.micro)];
    TRIDENT_CHECK_MSG(held < 0, label("second forward of", a));
    const auto free_slot = std::find(slot_busy_.begin(), slot_busy_.end(), false);
    TRIDENT_CHECK(free_slot != slot_busy_.end());  // required_slots was checked
    *free_slot = true;
    held = static_cast<int>(free_slot - slot_busy_.begin());
    stats_.peak_live_slots = std::max(stats_.peak_live_slots, ++live_);
    stats_.peak_live_per_chunk[c] = std::max(stats_.peak_live_per_chunk[c], ++live_per_chunk_[c]);
    return held;
  }
  // The slot backward `a` used is free for the next forward, of any chunk: its input
  // (input_activation) and the gradient sent from input_grad are different buffers
  // (PipelineStageModel).
  void free_slot(const PipeAction& a, int slot) {
    const auto c = static_cast<std::size_t>(a.chunk);
    TRIDENT_CHECK_MSG(slot_busy_[static_cast<std::size_t>(slot)] &&
                          slot_of_[c][static_cast<std::size_t>(a.micro)] == slot,
                      label("freeing a slot not held by", a));
    slot_busy_[static_cast<std::size_t>(slot)] = false;
    slot_of_[c][static_cast<std::size_t>(a.micro)] = -1;
    --live_;
    --live_per_chunk_[c];
  }
  // The receives of every action of the step that schedule_[first] starts.
  void add_recvs_of_step(std::size_t first) {
    for (std::size_t i = first; i < schedule_.size() && steps_[i] == steps_[first]; ++i) {
      add_recv(schedule_[i]);
    }
  }
  // Runs the gathered batch (if any) and starts a new one.
  void exchange() {
    if (!ops_.empty()) {
      const Timer t;
      pp_group_.batch_p2p(ops_, {.label = what_});
      stats_.idle_seconds += t.elapsed_s();
    }
    ops_.clear();
  }
  // Runs forward or backward `a`, timed, and adds the send of its result to the batch.
  void run_action(const PipeAction& a) {
    const auto c = static_cast<std::size_t>(a.chunk);
    PipelineStageModel& model = *chunks_[c];
    const int slot = slot_of_[c][static_cast<std::size_t>(a.micro)];
    stats_.action_start_seconds.push_back(total_.elapsed_s());
    const Timer t;
    if (a.kind == PipeAction::kForward) {
      model.forward(a.micro, slot);
      stats_.action_seconds.push_back(t.elapsed_s());
      const Peer to = next_of(a.chunk);
      if (to.exists) {
        add_op(P2POp::kSend, model.output_activation(slot), to.rank,
               tag_of(a.micro, next_boundary_chunk(a.chunk), v_, kActivation), "activation",
               label("send activation", a));
      }
    } else {
      model.backward(a.micro, slot);
      stats_.action_seconds.push_back(t.elapsed_s());
      const Peer to = prev_of(a.chunk);
      if (to.exists) {
        add_op(P2POp::kSend, model.input_grad(slot), to.rank,
               tag_of(a.micro, prev_boundary_chunk(a.chunk), v_, kGradient), "gradient",
               label("send gradient", a));
      }
      free_slot(a, slot);
    }
    stats_.compute_seconds += stats_.action_seconds.back();
  }

  const Timer total_;
  Communicator& pp_group_;
  const std::vector<PipeAction>& schedule_;
  std::span<PipelineStageModel* const> chunks_;
  const int v_;
  const int p_;
  const int stage_;
  const std::size_t n_;  // boundary_floats of every chunk
  const std::int64_t bytes_;
  const std::vector<int> steps_;  // action_steps of the schedule
  std::vector<std::vector<int>> slot_of_;     // [chunk][micro] -> slot, -1 when none
  std::vector<bool> slot_busy_;               // [slot] of the pool, every chunk's
  std::vector<int> live_per_chunk_;
  int live_ = 0;
  std::vector<P2POp> ops_;  // the batch of sends and receives being gathered
  std::string what_;        // its label
  PipelineExecutor::Stats stats_;
};

// CHECKs that run() got one non-null chunk per virtual stage, all with the same boundary.
void check_chunks(std::span<PipelineStageModel* const> chunks, int virtual_stages, int stage) {
  TRIDENT_CHECK_MSG(static_cast<int>(chunks.size()) == virtual_stages,
                    "pipeline stage " + std::to_string(stage) + ": run() got " +
                        std::to_string(chunks.size()) + " model chunks, the executor has " +
                        std::to_string(virtual_stages) + " virtual stages");
  for (PipelineStageModel* c : chunks) TRIDENT_CHECK_MSG(c != nullptr, "pipeline: null chunk");
  const std::size_t n = chunks[0]->boundary_floats();
  for (PipelineStageModel* c : chunks) {
    TRIDENT_CHECK_MSG(c->boundary_floats() == n,
                      "pipeline: chunks with different boundary sizes: " + std::to_string(n) +
                          " and " + std::to_string(c->boundary_floats()));
  }
}

}  // namespace

PipelineExecutor::Stats PipelineExecutor::run(std::span<PipelineStageModel* const> chunks) {
  check_chunks(chunks, virtual_stages_, stage_);
  return StepRun(pp_group_, schedule_, chunks, num_micro_, num_slots_).run();
}

}  // namespace trident
