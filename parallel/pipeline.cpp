#include "parallel/pipeline.h"

#include <algorithm>
#include <span>
#include <string>

#include "core/check.h"
#include "core/timer.h"

namespace trident {

namespace {

// Communicator tags stop at 32767 (MPI's guaranteed minimum); order, not the tag, keeps
// messages of one direction apart (see the header).
int tag_of(int micro) { return micro % 32768; }

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

}  // namespace

const char* pipe_schedule_name(PipeSchedule kind) {
  return kind == PipeSchedule::kGPipe ? "gpipe" : "1f1b";
}

std::vector<PipeAction> make_schedule(PipeSchedule kind, int pp, int stage, int num_micro) {
  TRIDENT_CHECK_MSG(pp >= 1 && stage >= 0 && stage < pp && num_micro >= 1,
                    "make_schedule: pp=" + std::to_string(pp) + " stage=" + std::to_string(stage) +
                        " num_micro=" + std::to_string(num_micro));
  if (kind == PipeSchedule::kOneFOneB || pp == 1) return one_f_one_b(pp, stage, num_micro);
  std::vector<PipeAction> s;
  s.reserve(2 * static_cast<std::size_t>(num_micro));
  for (int i = 0; i < num_micro; ++i) s.push_back({PipeAction::kForward, i});
  for (int i = 0; i < num_micro; ++i) s.push_back({PipeAction::kBackward, i});
  return s;
}

std::string schedule_to_string(const std::vector<PipeAction>& schedule) {
  std::string out;
  for (const PipeAction& a : schedule) {
    if (!out.empty()) out += ' ';
    out += a.kind == PipeAction::kForward ? 'F' : 'B';
    out += std::to_string(a.micro);
  }
  return out;
}

double pipeline_bubble_fraction(int pp, int num_micro) {
  return static_cast<double>(pp - 1) / static_cast<double>(num_micro + pp - 1);
}

int PipelineExecutor::required_slots(PipeSchedule kind, int pp, int stage, int num_micro) {
  int live = 0;
  int peak = 0;
  for (const PipeAction& a : make_schedule(kind, pp, stage, num_micro)) {
    live += a.kind == PipeAction::kForward ? 1 : -1;
    peak = std::max(peak, live);
  }
  return peak;
}

PipelineExecutor::PipelineExecutor(Communicator& pp_group, PipeSchedule kind, int num_micro,
                                   int num_slots)
    : pp_group_(pp_group),
      kind_(kind),
      num_micro_(num_micro),
      num_slots_(num_slots),
      stage_(pp_group.rank()),
      num_stages_(pp_group.size()),
      schedule_(make_schedule(kind, num_stages_, stage_, num_micro)) {
  const int needed = required_slots(kind, num_stages_, stage_, num_micro);
  TRIDENT_CHECK_MSG(num_slots >= needed,
                    std::string("pipeline ") + pipe_schedule_name(kind) + " stage " +
                        std::to_string(stage_) + "/" + std::to_string(num_stages_) + " with " +
                        std::to_string(num_micro) + " micro-batches needs " +
                        std::to_string(needed) + " activation slots, the model has " +
                        std::to_string(num_slots));
}

PipelineExecutor::Stats PipelineExecutor::run(PipelineStageModel& model) {
  const Timer total;
  Stats stats;
  const bool first = stage_ == 0;
  const bool last = stage_ == num_stages_ - 1;
  const std::size_t n = model.boundary_floats();
  const auto bytes = static_cast<std::int64_t>(n * sizeof(float));

  std::vector<int> slot_of(num_micro_, -1);
  std::vector<bool> slot_busy(num_slots_, false);
  int live = 0;

  auto label = [&](const char* what, int micro) {
    return std::string("pipeline ") + what + " micro " + std::to_string(micro) + " stage " +
           std::to_string(stage_);
  };
  auto op = [&](P2POp::Kind kind, DevPtr buf, int peer, int micro, const char* what) {
    TRIDENT_CHECK_MSG(!buf.is_null(), std::string("pipeline: null ") + what + " buffer");
    if (kind == P2POp::kSend) {
      stats.sends += 1;
      stats.bytes_sent += bytes;
    } else {
      stats.recvs += 1;
      stats.bytes_received += bytes;
    }
    return P2POp{kind, CommBuf::device(buf, n), peer, tag_of(micro)};
  };
  // The receive action `a` needs before it runs, if any. A forward's slot is taken here,
  // when its input is posted.
  auto add_recv = [&](const PipeAction& a, std::vector<P2POp>& ops, std::string& what) {
    if (a.kind == PipeAction::kForward) {
      const auto free_slot = std::find(slot_busy.begin(), slot_busy.end(), false);
      TRIDENT_CHECK(free_slot != slot_busy.end());  // required_slots was checked
      const int slot = static_cast<int>(free_slot - slot_busy.begin());
      *free_slot = true;
      slot_of[a.micro] = slot;
      stats.peak_live_slots = std::max(stats.peak_live_slots, ++live);
      if (first) return;
      ops.push_back(op(P2POp::kRecv, model.input_activation(slot), stage_ - 1, a.micro,
                       "activation"));
      what += (what.empty() ? "" : ", ") + label("recv activation", a.micro);
    } else {
      const int slot = slot_of[a.micro];
      TRIDENT_CHECK(slot >= 0);  // every schedule runs F(i) before B(i)
      if (last) return;
      ops.push_back(op(P2POp::kRecv, model.output_grad(slot), stage_ + 1, a.micro, "gradient"));
      what += (what.empty() ? "" : ", ") + label("recv gradient", a.micro);
    }
  };
  auto exchange = [&](std::vector<P2POp>& ops, const std::string& what) {
    if (!ops.empty()) {
      const Timer t;
      pp_group_.batch_p2p(ops, {.label = what});
      stats.idle_seconds += t.elapsed_s();
    }
    ops.clear();
  };

  // Megatron's p2p pattern (send_forward_recv_backward and its kin): the first action's
  // receive alone, then after each action its send together with the next action's
  // receive, in one batch_p2p, so neighbours that send to each other at the same time
  // cannot deadlock on NCCL (comm/communicator.h).
  std::vector<P2POp> ops;
  std::string what;
  add_recv(schedule_.front(), ops, what);
  exchange(ops, what);
  for (std::size_t k = 0; k < schedule_.size(); ++k) {
    const PipeAction& a = schedule_[k];
    const int slot = slot_of[a.micro];
    what.clear();
    const Timer t;
    if (a.kind == PipeAction::kForward) {
      model.forward(a.micro, slot);
      stats.compute_seconds += t.elapsed_s();
      if (!last) {
        ops.push_back(op(P2POp::kSend, model.output_activation(slot), stage_ + 1, a.micro,
                         "activation"));
        what = label("send activation", a.micro);
      }
    } else {
      model.backward(a.micro, slot);
      stats.compute_seconds += t.elapsed_s();
      if (!first) {
        ops.push_back(op(P2POp::kSend, model.input_grad(slot), stage_ - 1, a.micro, "gradient"));
        what = label("send gradient", a.micro);
      }
      // The slot is free for the next forward: its input (input_activation) and the
      // gradient sent from input_grad are different buffers (PipelineStageModel).
      slot_busy[slot] = false;
      slot_of[a.micro] = -1;
      --live;
    }
    if (k + 1 < schedule_.size()) add_recv(schedule_[k + 1], ops, what);
    exchange(ops, what);
  }

  const Timer t;
  pp_group_.wait_sends({.label = "pipeline end of step, stage " + std::to_string(stage_)});
  stats.send_wait_seconds = t.elapsed_s();
  stats.total_seconds = total.elapsed_s();
  return stats;
}

}  // namespace trident
