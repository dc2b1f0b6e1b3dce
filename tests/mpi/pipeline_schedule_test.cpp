// Pipeline schedules without communication (runs the same on every rank): each
// micro-batch's forward and backward appear once, backward after forward; the 1F1B
// order equals Megatron's non-interleaved schedule, written out for pp=4, m=8; slots;
// and an event simulation of all stages (recv blocks, send does not) that shows every
// schedule finishes (no cycle of waits) in (m+p-1)(tf+tb), the bubble (p-1)/(m+p-1).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "parallel/pipeline.h"

namespace trident::test {
namespace {

constexpr PipeSchedule kKinds[] = {PipeSchedule::kGPipe, PipeSchedule::kOneFOneB};

std::string where(PipeSchedule kind, int pp, int stage, int m) {
  return std::string(pipe_schedule_name(kind)) + " pp=" + std::to_string(pp) +
         " stage=" + std::to_string(stage) + " m=" + std::to_string(m);
}

TEST(PipelineSchedule, EveryMicroBatchOnceForwardThenBackward) {
  for (PipeSchedule kind : kKinds)
    for (int pp : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 3, 5, 8, 13})
        for (int stage = 0; stage < pp; ++stage) {
          const auto s = make_schedule(kind, pp, stage, m);
          ASSERT_EQ(s.size(), 2u * m) << where(kind, pp, stage, m);
          std::vector<int> f_at(m, -1), b_at(m, -1);
          for (int k = 0; k < static_cast<int>(s.size()); ++k) {
            ASSERT_GE(s[k].micro, 0);
            ASSERT_LT(s[k].micro, m);
            auto& at = s[k].kind == PipeAction::kForward ? f_at : b_at;
            EXPECT_EQ(at[s[k].micro], -1) << where(kind, pp, stage, m) << " repeats " << k;
            at[s[k].micro] = k;
          }
          for (int i = 0; i < m; ++i) {
            EXPECT_GE(f_at[i], 0) << where(kind, pp, stage, m) << " no F" << i;
            EXPECT_GT(b_at[i], f_at[i]) << where(kind, pp, stage, m) << " B" << i;
          }
          // Forwards and backwards each run in micro-batch order on every stage, which
          // is what lets neighbours match messages by order.
          int next_f = 0, next_b = 0;
          for (const PipeAction& a : s) {
            if (a.kind == PipeAction::kForward)
              EXPECT_EQ(a.micro, next_f++);
            else
              EXPECT_EQ(a.micro, next_b++);
          }
        }
}

TEST(PipelineSchedule, OneFOneBMatchesMegatronPp4M8) {
  // Megatron forward_backward_pipelining_without_interleaving: warmup
  // min(pp - stage - 1, m) forwards, steady (F, B) pairs, cooldown backwards.
  const std::vector<std::string> expected = {
      "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
      "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
      "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
      "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
  };
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_EQ(schedule_to_string(make_schedule(PipeSchedule::kOneFOneB, 4, stage, 8)),
              expected[stage])
        << "stage " << stage;
  }
}

TEST(PipelineSchedule, FewerMicroBatchesThanStages) {
  // pp=4, m=2: warmup is capped at m, so the early stages do all forwards first.
  EXPECT_EQ(schedule_to_string(make_schedule(PipeSchedule::kOneFOneB, 4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(schedule_to_string(make_schedule(PipeSchedule::kOneFOneB, 4, 2, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(schedule_to_string(make_schedule(PipeSchedule::kOneFOneB, 4, 3, 2)), "F0 B0 F1 B1");
}

TEST(PipelineSchedule, GPipeAllForwardsThenBackwardsInForwardOrder) {
  for (int stage = 0; stage < 4; ++stage) {
    EXPECT_EQ(schedule_to_string(make_schedule(PipeSchedule::kGPipe, 4, stage, 3)),
              "F0 F1 F2 B0 B1 B2");
  }
}

TEST(PipelineSchedule, SingleStageInterleavesForBothSchedules) {
  for (PipeSchedule kind : kKinds) {
    EXPECT_EQ(schedule_to_string(make_schedule(kind, 1, 0, 4)), "F0 B0 F1 B1 F2 B2 F3 B3")
        << pipe_schedule_name(kind);
    EXPECT_EQ(PipelineExecutor::required_slots(kind, 1, 0, 4), 1);
  }
}

TEST(PipelineSchedule, RequiredSlots) {
  for (int pp : {2, 4, 8})
    for (int m : {1, 3, 8})
      for (int stage = 0; stage < pp; ++stage) {
        EXPECT_EQ(PipelineExecutor::required_slots(PipeSchedule::kGPipe, pp, stage, m), m);
        EXPECT_EQ(PipelineExecutor::required_slots(PipeSchedule::kOneFOneB, pp, stage, m),
                  std::min(pp - stage, m))
            << where(PipeSchedule::kOneFOneB, pp, stage, m);
      }
}

TEST(PipelineSchedule, NamesAreTheConfigSpellings) {
  EXPECT_STREQ(pipe_schedule_name(PipeSchedule::kGPipe), "gpipe");
  EXPECT_STREQ(pipe_schedule_name(PipeSchedule::kOneFOneB), "1f1b");
}

// Runs all stages' schedules against each other: an action starts when its stage is
// free and its input has arrived (F(i) needs F(i) of stage-1, B(i) needs B(i) of
// stage+1); sends are instantaneous and never wait. Returns the makespan, or -1 when
// some stage can never proceed (a cycle of blocked recvs).
double simulate(const std::vector<std::vector<PipeAction>>& s, double tf, double tb) {
  const int pp = static_cast<int>(s.size());
  int m = 0;
  for (const PipeAction& a : s[0]) m = std::max(m, a.micro + 1);
  std::vector<std::vector<double>> f_done(pp, std::vector<double>(m, -1));
  std::vector<std::vector<double>> b_done(pp, std::vector<double>(m, -1));
  std::vector<std::size_t> next(pp, 0);
  std::vector<double> clock(pp, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < pp; ++st) {
      while (next[st] < s[st].size()) {
        const PipeAction a = s[st][next[st]];
        double ready = 0;
        if (a.kind == PipeAction::kForward) {
          if (st > 0 && (ready = f_done[st - 1][a.micro]) < 0) break;
        } else if (st < pp - 1 && (ready = b_done[st + 1][a.micro]) < 0) {
          break;
        }
        const double start = std::max(clock[st], ready);
        clock[st] = start + (a.kind == PipeAction::kForward ? tf : tb);
        (a.kind == PipeAction::kForward ? f_done : b_done)[st][a.micro] = clock[st];
        ++next[st];
        progress = true;
      }
    }
  }
  for (int st = 0; st < pp; ++st)
    if (next[st] != s[st].size()) return -1;
  return *std::max_element(clock.begin(), clock.end());
}

TEST(PipelineSchedule, SimulationFinishesWithTheAnalyticBubble) {
  for (PipeSchedule kind : kKinds)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = 1; m <= 16; ++m)
        for (double tb : {1.0, 2.0}) {
          const double tf = 1.0;
          std::vector<std::vector<PipeAction>> s(pp);
          for (int st = 0; st < pp; ++st) s[st] = make_schedule(kind, pp, st, m);
          const double makespan = simulate(s, tf, tb);
          const std::string w = where(kind, pp, 0, m) + " tb=" + std::to_string(tb);
          ASSERT_GE(makespan, 0) << w << ": deadlock";
          EXPECT_DOUBLE_EQ(makespan, (m + pp - 1) * (tf + tb)) << w;
          const double idle = 1.0 - m * (tf + tb) / makespan;
          EXPECT_NEAR(idle, pipeline_bubble_fraction(pp, m), 1e-12) << w;
        }
}

// The simulator can fail: if stage 0 waited for B0's gradient before sending F0's
// activation, no stage could move.
TEST(PipelineSchedule, SimulatorDetectsDeadlock) {
  const std::vector<std::vector<PipeAction>> bad = {
      {{PipeAction::kBackward, 0}, {PipeAction::kForward, 0}},
      {{PipeAction::kForward, 0}, {PipeAction::kBackward, 0}}};
  EXPECT_EQ(simulate(bad, 1.0, 1.0), -1);
  const std::vector<std::vector<PipeAction>> good = {
      {{PipeAction::kForward, 0}, {PipeAction::kBackward, 0}},
      {{PipeAction::kForward, 0}, {PipeAction::kBackward, 0}}};
  EXPECT_EQ(simulate(good, 1.0, 2.0), 6.0);
}

}  // namespace
}  // namespace trident::test
