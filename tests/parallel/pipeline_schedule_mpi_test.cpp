// Pipeline schedules without communication (runs the same on every rank): each
// micro-batch's forward and backward appear once, backward after forward; the 1F1B
// order equals Megatron's non-interleaved schedule, written out for pp=4, m=8; slots;
// and an event simulation of all stages (recv blocks, send does not) that shows every
// schedule finishes (no cycle of waits) in (m+p-1)(tf+tb), the bubble (p-1)/(m+p-1).
// Interleaved 1F1B (v chunks per stage): every (micro, chunk) once forward then
// backward, in micro order per chunk; Megatron's order written out for p=2, v=2, m=4;
// v == 1 unchanged from the pre-interleaving generator; the simulation across all
// virtual stages finishes in (v*m+p-1)(tf+tb) per-chunk times, the bubble
// (p-1)/(v*m+p-1); slots against their closed form; the layer split; the messages for
// bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "model/transformer.h"
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
// free and its input has arrived (F(i) of chunk c on stage s needs F(i) of the virtual
// stage before: stage s-1 chunk c, or stage p-1 chunk c-1; B(i) the virtual stage
// after); sends are instantaneous and never wait. Returns the makespan, or -1 when some
// stage can never proceed (a cycle of blocked recvs).
double simulate(const std::vector<std::vector<PipeAction>>& s, double tf, double tb) {
  const int pp = static_cast<int>(s.size());
  int m = 0, v = 1;
  for (const auto& stage : s) {
    for (const PipeAction& a : stage) {
      m = std::max(m, a.micro + 1);
      v = std::max(v, a.chunk + 1);
    }
  }
  const int nv = pp * v;
  // [virtual stage][micro]
  std::vector<std::vector<double>> f_done(nv, std::vector<double>(m, -1)), b_done = f_done;
  std::vector<std::size_t> next(pp, 0);
  std::vector<double> clock(pp, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int st = 0; st < pp; ++st) {
      while (next[st] < s[st].size()) {
        const PipeAction a = s[st][next[st]];
        const int vs = a.chunk * pp + st;
        double ready = 0;
        if (a.kind == PipeAction::kForward) {
          if (vs > 0 && (ready = f_done[vs - 1][a.micro]) < 0) break;
        } else if (vs < nv - 1 && (ready = b_done[vs + 1][a.micro]) < 0) {
          break;
        }
        const double start = std::max(clock[st], ready);
        clock[st] = start + (a.kind == PipeAction::kForward ? tf : tb);
        (a.kind == PipeAction::kForward ? f_done : b_done)[vs][a.micro] = clock[st];
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

// ---- interleaved 1F1B ---------------------------------------------------------------

std::string where_v(int pp, int stage, int m, int v) {
  return "pp=" + std::to_string(pp) + " stage=" + std::to_string(stage) +
         " m=" + std::to_string(m) + " v=" + std::to_string(v);
}

// The generator as it was before interleaving, transcribed, so v == 1 stays bitwise.
std::vector<PipeAction> old_schedule(PipeSchedule kind, int pp, int stage, int m) {
  std::vector<PipeAction> s;
  if (kind == PipeSchedule::kOneFOneB || pp == 1) {
    const int warmup = std::min(pp - stage - 1, m);
    for (int i = 0; i < warmup; ++i) s.push_back({PipeAction::kForward, i});
    for (int i = 0; i < m - warmup; ++i) {
      s.push_back({PipeAction::kForward, warmup + i});
      s.push_back({PipeAction::kBackward, i});
    }
    for (int i = m - warmup; i < m; ++i) s.push_back({PipeAction::kBackward, i});
    return s;
  }
  for (int i = 0; i < m; ++i) s.push_back({PipeAction::kForward, i});
  for (int i = 0; i < m; ++i) s.push_back({PipeAction::kBackward, i});
  return s;
}

TEST(PipelineSchedule, OneVirtualStageIsTheOldScheduleBitwise) {
  for (PipeSchedule kind : kKinds)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = 1; m <= 16; ++m)
        for (int stage = 0; stage < pp; ++stage) {
          const auto old = old_schedule(kind, pp, stage, m);
          EXPECT_EQ(make_schedule(kind, pp, stage, m), old) << where(kind, pp, stage, m);
          EXPECT_EQ(make_schedule(kind, pp, stage, m, 1), old) << where(kind, pp, stage, m);
          EXPECT_EQ(schedule_to_string(make_schedule(kind, pp, stage, m, 1)),
                    schedule_to_string(old));
        }
}

TEST(PipelineSchedule, InterleavedEveryMicroAndChunkOnceForwardThenBackward) {
  for (int pp = 2; pp <= 4; ++pp)
    for (int v = 2; v <= 3; ++v)
      for (int m = pp; m <= 12; m += pp)
        for (int stage = 0; stage < pp; ++stage) {
          const std::string w = where_v(pp, stage, m, v);
          const auto s = make_schedule(PipeSchedule::kOneFOneB, pp, stage, m, v);
          ASSERT_EQ(s.size(), 2u * v * m) << w;
          // [chunk][micro] -> position
          std::vector<std::vector<int>> f_at(v, std::vector<int>(m, -1)), b_at = f_at;
          std::vector<int> next_f(v, 0), next_b(v, 0);
          for (int k = 0; k < static_cast<int>(s.size()); ++k) {
            const PipeAction& a = s[k];
            ASSERT_GE(a.micro, 0) << w;
            ASSERT_LT(a.micro, m) << w;
            ASSERT_GE(a.chunk, 0) << w;
            ASSERT_LT(a.chunk, v) << w;
            auto& at = a.kind == PipeAction::kForward ? f_at : b_at;
            EXPECT_EQ(at[a.chunk][a.micro], -1) << w << " repeats at " << k;
            at[a.chunk][a.micro] = k;
            // Per chunk, forwards and backwards each run in micro-batch order: what lets
            // the neighbours' messages of one chunk match by order.
            auto& next = a.kind == PipeAction::kForward ? next_f : next_b;
            EXPECT_EQ(a.micro, next[a.chunk]++) << w << " at " << k;
          }
          for (int c = 0; c < v; ++c)
            for (int i = 0; i < m; ++i) {
              EXPECT_GE(f_at[c][i], 0) << w << " no F" << i << "." << c;
              EXPECT_GT(b_at[c][i], f_at[c][i]) << w << " B" << i << "." << c;
            }
        }
}

TEST(PipelineSchedule, InterleavedMatchesMegatronPp2V2M4) {
  // Megatron forward_backward_pipelining_with_interleaving, groups of p = 2
  // micro-batches: forwards 0.0 1.0 0.1 1.1 | 2.0 3.0 2.1 3.1, the k-th backward the
  // k-th forward's micro-batch on the other chunk; warmup 2*(p-stage-1) + (v-1)*p =
  // 4 on stage 0 and 2 on stage 1.
  EXPECT_EQ(schedule_to_string(make_schedule(PipeSchedule::kOneFOneB, 2, 0, 4, 2)),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(schedule_to_string(make_schedule(PipeSchedule::kOneFOneB, 2, 1, 4, 2)),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // One group (m == p): the warmup covers every forward on the early stages.
  EXPECT_EQ(schedule_to_string(make_schedule(PipeSchedule::kOneFOneB, 2, 0, 2, 2)),
            "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
}

// simulate() of the interleaved schedules of every stage.
double simulate_interleaved(int pp, int v, int m, double tf, double tb) {
  std::vector<std::vector<PipeAction>> s(pp);
  for (int st = 0; st < pp; ++st) s[st] = make_schedule(PipeSchedule::kOneFOneB, pp, st, m, v);
  return simulate(s, tf, tb);
}

TEST(PipelineSchedule, InterleavedSimulationFinishesWithTheAnalyticBubble) {
  for (int pp = 2; pp <= 8; ++pp)
    for (int v = 2; v <= 4; ++v)
      for (int m = pp; m <= 16; m += pp)
        for (double tb : {1.0, 2.0}) {
          const double tf = 1.0;  // per chunk: a stage's micro-batch takes v * (tf + tb)
          const std::string w = where_v(pp, 0, m, v) + " tb=" + std::to_string(tb);
          const double makespan = simulate_interleaved(pp, v, m, tf, tb);
          ASSERT_GE(makespan, 0) << w << ": deadlock";
          EXPECT_DOUBLE_EQ(makespan, (v * m + pp - 1) * (tf + tb)) << w;
          const double idle = 1.0 - v * m * (tf + tb) / makespan;
          EXPECT_NEAR(idle, pipeline_bubble_fraction(pp, m, v), 1e-12) << w;
          EXPECT_LT(idle, pipeline_bubble_fraction(pp, m) - 1e-9) << w;  // below 1F1B's
        }
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(4, 8, 2), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble_fraction(4, 8), pipeline_bubble_fraction(4, 8, 1));
}

// The most (micro, chunk) pairs live at once in one chunk, by walking the schedule.
int walked_chunk_peak(const std::vector<PipeAction>& schedule, int v) {
  std::vector<int> live(static_cast<std::size_t>(v), 0);
  int peak = 0;
  for (const PipeAction& a : schedule) {
    int& n = live[static_cast<std::size_t>(a.chunk)];
    n += a.kind == PipeAction::kForward ? 1 : -1;
    peak = std::max(peak, n);
  }
  return peak;
}

TEST(PipelineSchedule, InterleavedSlotsWalkAndClosedFormAgree) {
  for (int pp = 2; pp <= 8; ++pp)
    for (int v = 2; v <= 4; ++v)
      for (int m = pp; m <= 8 * pp; m += pp)
        for (int stage = 0; stage < pp; ++stage) {
          // The stage's pool (what the executor checks) and each chunk's own peak.
          const int pool =
              PipelineExecutor::required_slots(PipeSchedule::kOneFOneB, pp, stage, m, v);
          EXPECT_EQ(pool, pipeline_stage_slots(PipeSchedule::kOneFOneB, pp, stage, m, v))
              << where_v(pp, stage, m, v);
          const int chunk = walked_chunk_peak(
              make_schedule(PipeSchedule::kOneFOneB, pp, stage, m, v), v);
          EXPECT_EQ(chunk, pipeline_chunk_slots(PipeSchedule::kOneFOneB, pp, stage, m, v))
              << where_v(pp, stage, m, v);
          EXPECT_LE(chunk, std::min(m, 2 * pp)) << where_v(pp, stage, m, v);
          EXPECT_LE(pool, v * chunk) << where_v(pp, stage, m, v);
          EXPECT_GE(pool, chunk) << where_v(pp, stage, m, v);
        }
  for (PipeSchedule kind : kKinds)
    for (int pp = 1; pp <= 8; ++pp)
      for (int m = 1; m <= 16; ++m)
        for (int stage = 0; stage < pp; ++stage) {
          EXPECT_EQ(PipelineExecutor::required_slots(kind, pp, stage, m),
                    pipeline_chunk_slots(kind, pp, stage, m))
              << where(kind, pp, stage, m);
          EXPECT_EQ(pipeline_stage_slots(kind, pp, stage, m),
                    pipeline_chunk_slots(kind, pp, stage, m))
              << where(kind, pp, stage, m);
        }
  // By hand: p=2, v=2, m=4, stage 1 (warmup 2) runs
  //   F0.0 F1.0 | F0.1 B0.1 | F1.1 B1.1 | F2.0 B0.0 | F3.0 B1.0 | F2.1 B2.1 | F3.1 B3.1 | B2.0 B3.0
  // live on the stage 1 2 3 2 3 2 3 2 3 2 3 2 3 2 1 0: a pool of 3; chunk 0 alone peaks at
  // 3 (F0.0 F1.0 F2.0 before B0.0), chunk 1 at 1, so one pool per chunk would be 6.
  const auto hand = make_schedule(PipeSchedule::kOneFOneB, 2, 1, 4, 2);
  EXPECT_EQ(schedule_to_string(hand),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(PipelineExecutor::required_slots(PipeSchedule::kOneFOneB, 2, 1, 4, 2), 3);
  EXPECT_EQ(pipeline_stage_slots(PipeSchedule::kOneFOneB, 2, 1, 4, 2), 3);
  EXPECT_EQ(pipeline_chunk_slots(PipeSchedule::kOneFOneB, 2, 1, 4, 2), 3);
  // Megatron's in-flight count, (p - stage - 1)*2 + (v-1)*p + 1, at p=4, v=5, m=64.
  EXPECT_EQ(pipeline_stage_slots(PipeSchedule::kOneFOneB, 4, 0, 64, 5), 23);
  EXPECT_EQ(pipeline_stage_slots(PipeSchedule::kOneFOneB, 4, 3, 64, 5), 17);
  // Written out: p=4, v=2, m=8 (Megatron's memory picture: stage 0 keeps the most).
  EXPECT_EQ(pipeline_chunk_slots(PipeSchedule::kOneFOneB, 4, 0, 8, 2), 8);
  EXPECT_EQ(pipeline_chunk_slots(PipeSchedule::kOneFOneB, 4, 2, 8, 2), 7);
  EXPECT_EQ(pipeline_chunk_slots(PipeSchedule::kOneFOneB, 4, 3, 8, 2), 5);
}

TEST(PipelineSchedule, ChunkLayerRangesRoundRobin) {
  // 8 layers, p=2, v=2: virtual stages 0..3 hold [0,2) [2,4) [4,6) [6,8); stage 0 holds
  // virtual stages 0 and 2, stage 1 holds 1 and 3.
  using R = LayerRange;
  EXPECT_EQ(chunk_layer_ranges(8, 2, 2),
            (std::vector<std::vector<R>>{{R{0, 2}, R{4, 6}}, {R{2, 4}, R{6, 8}}}));
  // 10 layers into 4 chunks: the earlier chunks take the remainder (3 3 2 2).
  EXPECT_EQ(chunk_layer_ranges(10, 2, 2),
            (std::vector<std::vector<R>>{{R{0, 3}, R{6, 8}}, {R{3, 6}, R{8, 10}}}));
  for (int n : {4, 7, 12, 13, 24})
    for (int pp = 1; pp <= 4; ++pp)
      for (int v = 1; v <= 3; ++v) {
        if (n < pp * v) continue;
        const auto r = chunk_layer_ranges(n, pp, v);
        ASSERT_EQ(r.size(), static_cast<std::size_t>(pp));
        int next = 0, smallest = n, largest = 0;
        for (int k = 0; k < pp * v; ++k) {  // virtual stage order covers 0..n-1 once
          const R range = r[k % pp][k / pp];
          EXPECT_EQ(range.begin, next) << n << " " << pp << " " << v << " k=" << k;
          EXPECT_GT(range.end, range.begin);
          smallest = std::min(smallest, range.end - range.begin);
          largest = std::max(largest, range.end - range.begin);
          next = range.end;
        }
        EXPECT_EQ(next, n);
        EXPECT_LE(largest - smallest, 1);
        if (v == 1) {  // the same split as the model's stage_layer_counts
          const auto counts = stage_layer_counts(n, pp, {});
          for (int s = 0; s < pp; ++s) EXPECT_EQ(r[s][0].end - r[s][0].begin, counts[s]);
        }
      }
}

TEST(PipelineSchedule, InterleavingProblemsNameTheKeyAndValues) {
  EXPECT_EQ(interleave_problem(PipeSchedule::kOneFOneB, 4, 2, 8), "");
  EXPECT_EQ(interleave_problem(PipeSchedule::kGPipe, 4, 1, 7), "");  // v == 1: anything goes
  EXPECT_EQ(interleave_problem(PipeSchedule::kOneFOneB, 4, 2, 6),
            "parallel.virtual_stages 2 (interleaved 1F1B) needs the number of micro-batches "
            "per step (6 = training.global_batch_size / (parallel.micro_batch_size * "
            "parallel.dp)) to be a multiple of parallel.pp (4)");
  EXPECT_EQ(interleave_problem(PipeSchedule::kGPipe, 2, 2, 4),
            "parallel.virtual_stages 2 (interleaved) needs parallel.pipeline_schedule 1f1b, "
            "got gpipe");
  EXPECT_EQ(interleave_problem(PipeSchedule::kOneFOneB, 1, 2, 4),
            "parallel.virtual_stages 2 (interleaved 1F1B) needs parallel.pp > 1, got 1");
  EXPECT_EQ(interleave_problem(PipeSchedule::kOneFOneB, 2, 0, 4),
            "parallel.virtual_stages must be >= 1, got 0");
  EXPECT_EQ(layer_split_problem(8, 4, 2), "");
  EXPECT_EQ(layer_split_problem(6, 4, 2),
            "parallel.virtual_stages 2 with parallel.pp 4 cuts the model into 8 chunks of at "
            "least one layer each, but model.n_layers is 6");
}

TEST(PipelineSchedule, BadInterleavingAbortsWithTheMessage) {
  GTEST_FLAG_SET(death_test_style, "fast");  // no re-exec: main() would start MPI again
  EXPECT_DEATH(make_schedule(PipeSchedule::kOneFOneB, 4, 0, 6, 2),
               "make_schedule: parallel.virtual_stages 2 .*multiple of parallel.pp \\(4\\)");
  EXPECT_DEATH(make_schedule(PipeSchedule::kGPipe, 2, 0, 4, 2),
               "parallel.pipeline_schedule 1f1b, got gpipe");
  EXPECT_DEATH(chunk_layer_ranges(6, 4, 2), "model.n_layers is 6");
  SelfCommunicator self("pp");
  EXPECT_DEATH(PipelineExecutor(self, PipeSchedule::kOneFOneB, 2, 1, 2),
               "parallel.pp > 1, got 1");
}

}  // namespace
}  // namespace trident::test
