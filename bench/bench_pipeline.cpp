// The pipeline bubble, measured: PipelineExecutor over MPI with a synthetic stage model
// whose forward and backward sleep a fixed time per action, against the analytic
// (p-1)/(v*m+p-1) (docs/ARCHITECTURE.md "Pipeline parallelism"; parallel/pipeline.h). The world is
// the pp group: p = the number of ranks.
//
// Each rank holds v chunks; a chunk's forward sleeps tf/v and its backward tb/v, so a
// rank's compute per step (m * (tf + tb)) is the same for every v and only the bubble
// differs. Sleeps, not busy work: the ranks share the machine's cores (np 4 on 2 cores
// oversubscribes), and a sleeping rank leaves its core to the others, so the measured
// idle share is the schedule's, not the CPU scheduler's.
//
// Columns, per (v, m), over --reps steps after one untimed warm-up step:
//   step_ms   median step time: from a barrier to the barrier after run() on every rank
//   ideal_ms  m * (tf + tb) / (1 - analytic): the step a perfect pipeline would take
//   bubble    measured idle share of the worst rank: 1 - compute / step, where compute is
//             the sum of that rank's per-action times (Stats::action_seconds)
//   analytic  (p-1)/(v*m+p-1)
//   slots     activation slots of stage 0, one pool for its chunks (required_slots)
//   wrong     boundary tensors that arrived with the wrong (micro, virtual stage) stamp
//             on any rank, over all steps (must be 0)
// Prints a '#' header and a fixed-width table.
//
//   mpirun -np P build/bench/bench_pipeline [--tf-ms 20] [--tb-ms 40] [--m 4,8,16]
//                                           [--v 1,2] [--reps 3]
// m values that are not a multiple of p are skipped for v > 1 (interleave_problem).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "parallel/pipeline.h"

namespace trident {
namespace {

constexpr std::size_t kFloats = 256;  // one boundary tensor, 1 KB

float stamp(int micro, int virtual_stage) {
  return static_cast<float>(1000 * (micro + 1) + virtual_stage);
}

// One virtual stage: sleeps, and stamps what it sends with (micro, virtual stage) so the
// receiver can tell a misrouted tensor.
class SleepStage final : public PipelineStageModel {
 public:
  SleepStage(int virtual_stage, int num_virtual, int slots, std::chrono::microseconds tf,
             std::chrono::microseconds tb)
      : vs_(virtual_stage),
        nv_(num_virtual),
        tf_(tf),
        tb_(tb),
        in_(slots, std::vector<float>(kFloats)),
        out_(in_),
        out_grad_(in_),
        in_grad_(kFloats) {}
  std::size_t boundary_floats() const override { return kFloats; }
  DevPtr input_activation(int slot) override { return wrap(in_.at(slot)); }
  DevPtr output_activation(int slot) override { return wrap(out_.at(slot)); }
  DevPtr output_grad(int slot) override { return wrap(out_grad_.at(slot)); }
  DevPtr input_grad(int) override { return wrap(in_grad_); }
  void forward(int micro, int slot) override {
    if (vs_ > 0) check(in_[slot], stamp(micro, vs_ - 1));
    std::fill(out_[slot].begin(), out_[slot].end(), stamp(micro, vs_));
    std::this_thread::sleep_for(tf_);
  }
  void backward(int micro, int slot) override {
    if (vs_ < nv_ - 1) check(out_grad_[slot], -stamp(micro, vs_ + 1));
    std::fill(in_grad_.begin(), in_grad_.end(), -stamp(micro, vs_));
    std::this_thread::sleep_for(tb_);
  }
  long wrong = 0;

 private:
  static DevPtr wrap(std::vector<float>& v) { return DevPtr::wrap(v.data(), DType::kF32); }
  void check(const std::vector<float>& got, float want) {
    if (std::any_of(got.begin(), got.end(), [&](float x) { return x != want; })) ++wrong;
  }
  int vs_, nv_;
  std::chrono::microseconds tf_, tb_;
  std::vector<std::vector<float>> in_, out_, out_grad_;  // [slot] -> (kFloats)
  std::vector<float> in_grad_;                           // (kFloats)
};

std::vector<int> parse_list(const char* s) {
  std::vector<int> out;
  for (const char* p = s; *p != '\0';) {
    char* end = nullptr;
    const long x = std::strtol(p, &end, 10);
    if (end == p || x < 1) return {};
    out.push_back(static_cast<int>(x));
    p = *end == ',' ? end + 1 : end;
    if (*end != ',' && *end != '\0') return {};
  }
  return out;
}

int run(int argc, char** argv) {
  double tf_ms = 20, tb_ms = 40;
  std::vector<int> ms = {4, 8, 16}, vs = {1, 2};
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* val = i + 1 < argc ? argv[i + 1] : nullptr;
    if (val == nullptr) {
      std::fprintf(stderr, "bench_pipeline: %s needs a value\n", a.c_str());
      return 2;
    }
    ++i;
    if (a == "--tf-ms") {
      tf_ms = std::atof(val);
    } else if (a == "--tb-ms") {
      tb_ms = std::atof(val);
    } else if (a == "--m") {
      ms = parse_list(val);
    } else if (a == "--v") {
      vs = parse_list(val);
    } else if (a == "--reps") {
      reps = std::atoi(val);
    } else {
      std::fprintf(stderr, "bench_pipeline: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (tf_ms <= 0 || tb_ms <= 0 || ms.empty() || vs.empty() || reps < 1) {
    std::fprintf(stderr, "bench_pipeline: --tf-ms, --tb-ms > 0, --m and --v lists of "
                         "positive integers, --reps >= 1\n");
    return 2;
  }

  std::unique_ptr<Communicator> world = make_world_communicator(&argc, &argv);
  std::unique_ptr<Communicator> pp_group =
      world->split(0, world->rank(), "pp", MemSpace::kDevice);
  const int p = pp_group->size();
  const int stage = pp_group->rank();
  const bool root = world->rank() == 0;
  if (root) {
    std::printf("# bench_pipeline: p=%d, per stage and micro-batch tf=%.1f ms tb=%.1f ms "
                "(each of v chunks sleeps 1/v of it), %d reps, median\n",
                p, tf_ms, tb_ms, reps);
    std::printf("# %3s %3s %4s %10s %10s %8s %9s %6s %6s\n", "p", "v", "m", "step_ms",
                "ideal_ms", "bubble", "analytic", "slots", "wrong");
  }
  for (int v : vs) {
    for (int m : ms) {
      if (!interleave_problem(PipeSchedule::kOneFOneB, p, v, m).empty()) continue;
      const int slots = PipelineExecutor::required_slots(PipeSchedule::kOneFOneB, p, stage, m, v);
      const auto tf = std::chrono::microseconds(static_cast<long>(tf_ms * 1000 / v));
      const auto tb = std::chrono::microseconds(static_cast<long>(tb_ms * 1000 / v));
      std::vector<std::unique_ptr<SleepStage>> chunks;
      std::vector<PipelineStageModel*> models;
      for (int c = 0; c < v; ++c) {
        chunks.push_back(std::make_unique<SleepStage>(c * p + stage, p * v, slots, tf, tb));
        models.push_back(chunks.back().get());
      }
      PipelineExecutor executor(*pp_group, PipeSchedule::kOneFOneB, m, slots, v);
      std::vector<double> steps, bubbles;
      for (int rep = 0; rep <= reps; ++rep) {
        world->barrier();
        const auto start = std::chrono::steady_clock::now();
        const PipelineExecutor::Stats stats = executor.run(models);
        world->barrier();
        double step = std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                          .count();
        double compute = 0;
        for (double s : stats.action_seconds) compute += s;
        double idle = 1.0 - compute / step;
        // The worst rank's idle share; the step is the slowest rank's.
        world->all_reduce(CommBuf::host(std::span<double>(&idle, 1)), ReduceOp::kMax);
        world->all_reduce(CommBuf::host(std::span<double>(&step, 1)), ReduceOp::kMax);
        if (rep == 0) continue;  // warm-up
        steps.push_back(step);
        bubbles.push_back(idle);
      }
      double wrong = 0;
      for (const auto& c : chunks) wrong += static_cast<double>(c->wrong);
      world->all_reduce(CommBuf::host(std::span<double>(&wrong, 1)), ReduceOp::kSum);
      std::sort(steps.begin(), steps.end());
      std::sort(bubbles.begin(), bubbles.end());
      const double analytic = pipeline_bubble_fraction(p, m, v);
      if (root) {
        const int slots0 = PipelineExecutor::required_slots(PipeSchedule::kOneFOneB, p, 0, m, v);
        std::printf("  %3d %3d %4d %10.1f %10.1f %8.3f %9.3f %6d %6.0f\n", p, v, m,
                    steps[steps.size() / 2] * 1e3, m * (tf_ms + tb_ms) / (1.0 - analytic),
                    bubbles[bubbles.size() / 2], analytic, slots0, wrong);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace trident

int main(int argc, char** argv) { return trident::run(argc, argv); }
