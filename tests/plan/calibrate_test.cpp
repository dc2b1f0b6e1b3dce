// Calibration (plan/calibrate.h) and the hardware table it writes (hardware_table_yaml):
// a run "measured" on hardware of known efficiencies and link bandwidths is fitted back
// to those figures from the table's defaults; the written table reads back to the same
// figures; a metrics file that is not the config's run is refused naming the file.
// From several runs (calibrate_runs): a link's bandwidth and per-call latency both, where
// the runs' calls per byte differ; the bandwidth alone where they do not. Measured per
// collective kind (comm_kind_least_ms): each kind's own bandwidth, and one latency where
// a kind's own runs separate it.
// The multi-rank run on this machine is tests/plan/calibrate_cpu_test.py.
#include "plan/calibrate.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tests/model/tiny_config.h"

namespace trident {
namespace {

Config config_for(const PlanCandidate& l, int d_model = 256, int seq_len = 128) {
  Config c;
  c.model = testing::tiny_model(Arch::kLlama, {.d_ff = 128});
  c.model.d_model = d_model;
  c.model.seq_len = seq_len;
  c.model.finalize();
  c.parallel.micro_batch_size = 1;
  c.training.global_batch_size = 8;
  c.data.train = "unused";
  const Config out = apply_layout(c, l);
  EXPECT_TRUE(validate_config(out).is_ok()) << validate_config(out).message();
  return out;
}

PlanOptions cpu_options(int devices, const Hardware& hw) {
  PlanOptions o;
  o.devices = devices;
  o.gpus_per_node = devices;
  o.hardware = hw;
  o.attention_state_bytes = gpu_attention_state_bytes;
  return o;
}

// What the trainer would have measured on `truth`: the plan's step and its communication
// per group (the plan's dp_comm_s and cp_comm_s, split exposed / hidden as it predicts).
MeasuredRun measured_on(const Config& c, const PlanOptions& truth) {
  const PlanResult r = evaluate_layout(c, truth);
  MeasuredRun m;
  m.path = "synthetic.jsonl";
  m.world_size = truth.devices;
  m.steps = m.steps_used = 5;
  m.step_s = r.step_time_s;
  m.exposed.tp = r.tp_s;
  m.exposed.dp = r.dp_s;
  m.hidden.dp = r.dp_comm_s - r.dp_s;
  m.exposed.cp = r.cp_s;
  m.hidden.cp = r.cp_comm_s - r.cp_s;
  return m;
}

// measured_on with each collective kind's time apart, as comm_kind_least_ms gives it.
MeasuredRun measured_by_kind(const Config& c, const PlanOptions& truth) {
  MeasuredRun m = measured_on(c, truth);
  const PlanResult r = evaluate_layout(c, truth);
  m.has_kinds = true;
  for (size_t k = 0; k < 3; ++k) {
    m.tp_kinds[k] = r.tp_terms.of(k);
    m.dp_kinds[k] = r.dp_terms.of(k);
  }
  return m;
}

// Runs of `layouts` on 2 cpu ranks "measured" on `truth` (each kind apart with
// `by_kind`), each file named after its layout.
std::vector<CalibrationRun> runs_on(std::initializer_list<PlanCandidate> layouts, const Hardware& truth,
                                    bool by_kind) {
  std::vector<CalibrationRun> runs;
  for (const PlanCandidate& l : layouts) {
    const Config c = config_for(l);
    MeasuredRun m = by_kind ? measured_by_kind(c, cpu_options(2, truth)) : measured_on(c, cpu_options(2, truth));
    m.path = layout_name(l) + ".jsonl";
    runs.push_back({c, m});
  }
  return runs;
}

// A CPU link whose reduce-scatter reaches a quarter of its bandwidth and all-gather 1.5x,
// as MPI's on these ranks do (docs/PERFORMANCE.md).
Hardware cpu_with_kinds(double bytes_per_s, double latency_s, std::array<double, 3> share) {
  Hardware hw = cpu_hardware(1e11, 64.0 * 1073741824.0);
  hw.gemm_efficiency *= 0.6;  // compute at 0.6 of the table's
  hw.attention_efficiency *= 0.6;
  hw.memory_efficiency *= 0.6;
  hw.intra_node.bytes_per_s = bytes_per_s;
  hw.intra_node.latency_s = latency_s;
  hw.intra_node.share = share;
  hw.inter_node = hw.intra_node;
  return hw;
}

double kind_bandwidth(const Hardware& hw, CollectiveKind kind) { return hw.intra_node.kind_bytes_per_s(kind); }

// ZeRO-3 measured by kind: its reduce-scatters and all-gathers each get their own
// bandwidth back, and with them ZeRO-1's time (half and half of the two, not ZeRO-3's
// two gathers per reduction) is predicted exactly. From the group's total alone one
// bandwidth is fitted to both, and ZeRO-1 is predicted off.
TEST(Calibrate, EachCollectiveKindGetsItsOwnBandwidthWhereTheFileTimesThemApart) {
  const Hardware start = cpu_hardware(1e11, 64.0 * 1073741824.0);
  const Hardware truth = cpu_with_kinds(2e9, start.intra_node.latency_s, {1, 0.25, 1.5});
  const Config z3 = config_for(PlanCandidate{{.dp = 2, .zero_stage = 3}, Recompute::kNone, 1});
  const Config z1 = config_for(PlanCandidate{{.dp = 2, .zero_stage = 1}, Recompute::kNone, 1});
  auto by_kind = calibrate(z3, cpu_options(2, start), measured_by_kind(z3, cpu_options(2, truth)));
  ASSERT_TRUE(by_kind.is_ok()) << by_kind.status().message();
  const Hardware& fitted = by_kind->hardware;
  for (CollectiveKind k : {CollectiveKind::kReduceScatter, CollectiveKind::kAllGather}) {
    EXPECT_NEAR(kind_bandwidth(fitted, k) / kind_bandwidth(truth, k), 1, 1e-6)
        << collective_name(k) << "\n" << by_kind->notes;
  }
  // The link's own figure: all the measured bytes together, between the two kinds'; the
  // all-reduce, not measured, keeps its share of it.
  EXPECT_GT(fitted.intra_node.bytes_per_s, kind_bandwidth(truth, CollectiveKind::kReduceScatter));
  EXPECT_LT(fitted.intra_node.bytes_per_s, kind_bandwidth(truth, CollectiveKind::kAllGather));
  EXPECT_EQ(fitted.intra_node.share[0], 1);
  EXPECT_EQ(fitted.inter_node.share, fitted.intra_node.share);  // the cpu's one link
  EXPECT_NEAR(by_kind->intra_kind_factor[1] / by_kind->intra_kind_factor[2], 0.25 / 1.5, 1e-6);
  EXPECT_NE(by_kind->notes.find("shared memory reduce_scatter: "), std::string::npos) << by_kind->notes;
  const PlanResult z1_truth = evaluate_layout(z1, cpu_options(2, truth));
  PlanOptions o = cpu_options(2, fitted);
  EXPECT_NEAR(evaluate_layout(z1, o).dp_comm_s / z1_truth.dp_comm_s, 1, 1e-6);
  auto total = calibrate(z3, cpu_options(2, start), measured_on(z3, cpu_options(2, truth)));
  ASSERT_TRUE(total.is_ok()) << total.status().message();
  EXPECT_EQ(total->hardware.intra_node.share, (std::array<double, 3>{1, 1, 1}));
  EXPECT_NEAR(total->after.dp_comm_s / evaluate_layout(z3, cpu_options(2, truth)).dp_comm_s, 1, 1e-6);
  o.hardware = total->hardware;
  EXPECT_GT(std::abs(evaluate_layout(z1, o).dp_comm_s / z1_truth.dp_comm_s - 1), 0.1);
}

// Several runs measured by kind: ZeRO-0's few large all-reduces and tp's many small ones
// separate the per-call latency from the all-reduce's bandwidth; ZeRO-3's reduce-scatters
// and all-gathers then get theirs with that latency.
TEST(Calibrate, RunsMeasuredByKindFitEachKindsBandwidthAndOneLatency) {
  const Hardware start = cpu_hardware(1e11, 64.0 * 1073741824.0);
  const Hardware truth = cpu_with_kinds(1.5e9, 60e-6, {0.6, 0.25, 1.5});
  const std::vector<CalibrationRun> runs = runs_on({PlanCandidate{{.dp = 2, .zero_stage = 0}, Recompute::kNone, 1},
                                                    PlanCandidate{{.tp = 2}, Recompute::kNone, 1},
                                                    PlanCandidate{{.dp = 2, .zero_stage = 3}, Recompute::kNone, 1}},
                                                   truth, true);
  auto fit = calibrate_runs(runs, cpu_options(2, start));
  ASSERT_TRUE(fit.is_ok()) << fit.status().message();
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllGather}) {
    EXPECT_NEAR(kind_bandwidth(fit->hardware, k) / kind_bandwidth(truth, k), 1, 1e-3)
        << collective_name(k) << "\n" << fit->notes;
  }
  EXPECT_NEAR(fit->hardware.intra_node.latency_s / 60e-6, 1, 1e-3) << fit->notes;
  EXPECT_NEAR(fit->compute_factor, 0.6, 1e-3);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_NEAR(fit->runs_after[i].step_time_s / runs[i].run.step_s, 1, 1e-3) << runs[i].run.path;
  }
  // tp alone with ZeRO-3: no kind measured twice, so the latency is kept (and said).
  auto no_latency = calibrate_runs({runs[1], runs[2]}, cpu_options(2, start));
  ASSERT_TRUE(no_latency.is_ok()) << no_latency.status().message();
  EXPECT_EQ(no_latency->hardware.intra_node.latency_s, start.intra_node.latency_s);
  EXPECT_NE(no_latency->notes.find("no collective kind was measured by two groups"), std::string::npos)
      << no_latency->notes;
}

TEST(Calibrate, RecoversTheComputeFactorAndTheLinkOfAKnownMachine) {
  Hardware start = cpu_hardware(1e11, 64.0 * 1073741824.0);
  Hardware truth = start;
  truth.gemm_efficiency = truth.attention_efficiency = start.gemm_efficiency * 0.4;
  truth.memory_efficiency = start.memory_efficiency * 0.4;
  truth.intra_node.bytes_per_s = truth.inter_node.bytes_per_s = 0.25e9;  // 5 GB/s -> 0.25
  for (const PlanCandidate& l : {PlanCandidate{{.dp = 2, .zero_stage = 1}, Recompute::kNone, 1},
                                 PlanCandidate{{.dp = 2, .tp = 2}, Recompute::kNone, 1},
                                 PlanCandidate{{.dp = 2, .zero_stage = 3}, Recompute::kFull, 2}}) {
    const Config c = config_for(l);
    const int n = l.dp * l.tp * l.pp;
    const MeasuredRun m = measured_on(c, cpu_options(n, truth));
    auto fit = calibrate(c, cpu_options(n, start), m);
    ASSERT_TRUE(fit.is_ok()) << fit.status().message();
    EXPECT_NEAR(fit->compute_factor, 0.4, 1e-6) << layout_name(l);
    EXPECT_NEAR(fit->hardware.intra_node.bytes_per_s, 0.25e9, 0.25e9 * 1e-6) << layout_name(l);
    EXPECT_NEAR(fit->after.step_time_s, m.step_s, 1e-9 * m.step_s);
    EXPECT_GT(std::abs(fit->before.step_time_s / m.step_s - 1), 0.5);  // the start was off
  }
}

// The hardware table's a100 and a "true" one whose compute runs at 0.8 of it, with the
// given link efficiencies (NVLink inside a node, the network across nodes).
std::pair<Hardware, Hardware> a100_and_truth(double intra_efficiency, double inter_efficiency) {
  Result<HardwareTable> table =
      load_hardware_table(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware.yaml");
  EXPECT_TRUE(table.is_ok());
  const Hardware start = find_gpu(table.value(), "a100").value();
  Hardware truth = start;
  truth.gemm_efficiency *= 0.8;
  truth.attention_efficiency *= 0.8;
  truth.memory_efficiency *= 0.8;
  truth.intra_node.efficiency = intra_efficiency;
  truth.inter_node.efficiency = inter_efficiency;
  return {start, truth};
}

TEST(Calibrate, AGpuLinkIsFittedThroughItsEfficiency) {
  // tp 2 inside a node of 2: NVLink 0.6; dp 2 across the two nodes: the network 0.5.
  const auto [start, truth] = a100_and_truth(0.6, 0.5);
  // Wide and long enough that bandwidth, not NCCL's per-call latency, decides the tp time.
  const Config c =
      config_for(PlanCandidate{{.dp = 2, .tp = 2, .zero_stage = 1}, Recompute::kNone, 1}, 1024, 1024);
  PlanOptions o = cpu_options(4, truth);
  o.gpus_per_node = 2;
  const MeasuredRun m = measured_on(c, o);
  o.hardware = start;
  auto fit = calibrate(c, o, m);
  ASSERT_TRUE(fit.is_ok()) << fit.status().message();
  EXPECT_NEAR(fit->compute_factor, 0.8, 1e-6);
  EXPECT_NEAR(fit->hardware.inter_node.efficiency, 0.5, 1e-6);
  EXPECT_NEAR(fit->hardware.intra_node.efficiency, 0.6, 1e-6);
  EXPECT_EQ(fit->hardware.inter_node.bytes_per_s, start.inter_node.bytes_per_s);  // datasheet kept
}

// A cp run on two nodes of two GPUs: the cp ring inside each node (NVLink), dp across the
// nodes (the network), no tp. Only the ring's measured time (comm_exposed_ms.cp +
// comm_hidden_ms.cp) identifies NVLink; unread, NVLink would keep the table's figure and
// the ring's extra time would be fitted as compute.
TEST(Calibrate, TheCpRingFitsItsLink) {
  const auto [start, truth] = a100_and_truth(0.3, 0.5);  // 0.3: the cp ring's link
  const Config c = config_for(
      PlanCandidate{{.dp = 2, .cp = 2, .zero_stage = 1}, Recompute::kNone, 1}, 1024, 4096);
  PlanOptions o = cpu_options(4, truth);
  o.gpus_per_node = 2;
  const MeasuredRun m = measured_on(c, o);
  ASSERT_GT(m.hidden.cp + m.exposed.cp, 0);
  o.hardware = start;
  auto fit = calibrate(c, o, m);
  ASSERT_TRUE(fit.is_ok()) << fit.status().message();
  EXPECT_FALSE(fit->before.crosses_nodes[ParallelDim::kCp]);
  EXPECT_NEAR(fit->hardware.intra_node.efficiency, 0.3, 1e-6) << fit->notes;
  EXPECT_NEAR(fit->cp_link_factor, 0.3 / start.intra_node.efficiency, 1e-6);
  EXPECT_NEAR(fit->hardware.inter_node.efficiency, 0.5, 1e-6);
  EXPECT_NEAR(fit->compute_factor, 0.8, 1e-6);
  EXPECT_NE(fit->notes.find("cp: measured"), std::string::npos) << fit->notes;
}

TEST(Calibrate, TheWrittenTableReadsBackToTheSameFigures) {
  Result<HardwareTable> table =
      load_hardware_table(std::string(TRIDENT_SOURCE_DIR) + "/configs/hardware.yaml");
  ASSERT_TRUE(table.is_ok());
  HardwareTable t = table.value();
  t.gpus[0].gemm_efficiency = 0.6123456;
  t.links[0].efficiency = 0.43;
  t.cpu = cpu_hardware(123.4e9, 0);
  t.cpu.gemm_efficiency = 0.31;
  t.cpu.attention_efficiency = 0.29;
  t.cpu.memory_efficiency = 0.5;  // folded into memory_gbps on write
  t.cpu.intra_node.bytes_per_s = t.cpu.inter_node.bytes_per_s = 0.7e9;
  t.cpu.intra_node.share = t.cpu.inter_node.share = {0.5, 0.2512345, 1.5};
  t.links[1].share = {1, 0.3, 1};
  t.has_cpu = true;
  const std::string yaml = hardware_table_yaml(t, "a header\nof two lines");
  EXPECT_EQ(yaml.rfind("# a header\n# of two lines\n", 0), 0u) << yaml;
  Result<HardwareTable> back = parse_hardware_table(yaml, "written.yaml");
  ASSERT_TRUE(back.is_ok()) << back.status().message() << "\n" << yaml;
  ASSERT_EQ(back->gpus.size(), t.gpus.size());
  for (size_t i = 0; i < t.gpus.size(); ++i) {
    const Hardware &a = t.gpus[i], &b = back->gpus[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_NEAR(b.peak_flops / a.peak_flops, 1, 1e-6);
    EXPECT_NEAR(b.memory_bytes / a.memory_bytes, 1, 1e-6);
    EXPECT_NEAR(b.gemm_efficiency / a.gemm_efficiency, 1, 1e-6);
    EXPECT_NEAR(b.attention_efficiency, a.attention_efficiency, 1e-6);
    EXPECT_NEAR(b.memory_efficiency, a.memory_efficiency, 1e-6);
    EXPECT_NEAR(b.reserved_bytes, a.reserved_bytes, 1);
    EXPECT_EQ(b.intra_node.name, a.intra_node.name);
    // A GPU names its links: it reads back with the link table's figures.
    for (const LinkSpec& l : t.links) {
      if (l.name == a.intra_node.name) {
        EXPECT_NEAR(b.intra_node.efficiency, l.efficiency, 1e-6);
      }
    }
  }
  EXPECT_NEAR(back->links[0].efficiency, 0.43, 1e-9);
  EXPECT_EQ(back->links[0].share, (std::array<double, 3>{1, 1, 1}));
  EXPECT_EQ(back->links[1].share, (std::array<double, 3>{1, 0.3, 1}));
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_NEAR(back->cpu.intra_node.share[k], t.cpu.intra_node.share[k], 1e-6);
    EXPECT_EQ(back->cpu.inter_node.share[k], back->cpu.intra_node.share[k]);
  }
  ASSERT_TRUE(back->has_cpu);
  EXPECT_NEAR(back->cpu.peak_flops, 123.4e9, 1e3);
  EXPECT_NEAR(back->cpu.gemm_efficiency, 0.31, 1e-9);
  EXPECT_NEAR(back->cpu.memory_bandwidth * back->cpu.memory_efficiency,
              t.cpu.memory_bandwidth * 0.5, 1e3);
  EXPECT_NEAR(back->cpu.intra_node.bytes_per_s, 0.7e9, 1e3);
  EXPECT_TRUE(back->cpu.is_cpu);
  EXPECT_EQ(back->cpu.overlap_comm_rate, 0);  // not written when not calibrated
  EXPECT_EQ(yaml.find("overlap_"), std::string::npos) << yaml;
  t.cpu.overlap_comm_rate = 0.0487658;
  t.cpu.overlap_compute_rate = 0.75;
  Result<HardwareTable> rates = parse_hardware_table(hardware_table_yaml(t, ""), "written.yaml");
  ASSERT_TRUE(rates.is_ok()) << rates.status().message();
  EXPECT_NEAR(rates->cpu.overlap_comm_rate, 0.0487658, 1e-9);
  EXPECT_EQ(rates->cpu.overlap_compute_rate, 0.75);
  EXPECT_EQ(yaml.find("arrival_skew"), std::string::npos) << yaml;  // 0: not written
  t.cpu.arrival_skew = 0.0123457;
  Result<HardwareTable> skewed = parse_hardware_table(hardware_table_yaml(t, ""), "written.yaml");
  ASSERT_TRUE(skewed.is_ok()) << skewed.status().message();
  EXPECT_NEAR(skewed->cpu.arrival_skew, 0.0123457, 1e-12);
  // The shipped table has no cpu entry: --gpu cpu measures this machine.
  EXPECT_FALSE(table->has_cpu);
}

// CPU ranks on shared cores, "measured" on a machine whose collectives keep 5% of their
// speed beside compute and whose compute keeps 80% while one is in flight: the three runs
// with overlap off fit the links by kind and the compute, the ZeRO-2 run with overlap on
// the two rates, and with them the overlapped ZeRO-3 run (not fitted) is predicted to the
// truth's waits and step. The thread-share rates (0.5, 0.5) predict other waits. Without
// a run with overlap off that has a dp group the rates are not fitted.
TEST(Calibrate, RunsWithOverlapOnFitTheOverlapRatesAndTheOthersTheLinks) {
  const Hardware start = cpu_hardware(1e11, 64.0 * 1073741824.0);
  Hardware truth = cpu_with_kinds(1.5e9, start.intra_node.latency_s, {1.7, 0.6, 1.4});
  truth.overlap_comm_rate = 0.05;
  truth.overlap_compute_rate = 0.8;
  auto run = [&](int zero, bool overlap) {
    Config c = config_for(PlanCandidate{{.dp = 2, .zero_stage = zero}, Recompute::kNone, 1});
    c.parallel.overlap_grad_reduce = c.parallel.overlap_param_gather = overlap;
    MeasuredRun m = measured_by_kind(c, cpu_options(2, truth));
    m.path = "z" + std::to_string(zero) + (overlap ? "on" : "off") + ".jsonl";
    return CalibrationRun{c, m};
  };
  const std::vector<CalibrationRun> runs = {run(1, false), run(0, false), run(3, false), run(2, true)};
  auto fit = calibrate_runs(runs, cpu_options(2, start));
  ASSERT_TRUE(fit.is_ok()) << fit.status().message();
  EXPECT_NEAR(fit->hardware.overlap_comm_rate / 0.05, 1, 1e-3) << fit->notes;
  EXPECT_NEAR(fit->hardware.overlap_compute_rate / 0.8, 1, 1e-3) << fit->notes;
  EXPECT_NEAR(fit->compute_factor, 0.6, 1e-3) << fit->notes;
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter, CollectiveKind::kAllGather}) {
    EXPECT_NEAR(kind_bandwidth(fit->hardware, k) / kind_bandwidth(truth, k), 1, 1e-3) << collective_name(k);
  }
  EXPECT_NE(fit->notes.find("overlap on shared cores (z2on.jsonl)"), std::string::npos) << fit->notes;
  ASSERT_EQ(fit->runs_after.size(), runs.size());
  EXPECT_NEAR(fit->runs_after[3].dp_s / runs[3].run.exposed.dp, 1, 1e-3);
  EXPECT_NEAR(fit->runs_after[3].step_time_s / runs[3].run.step_s, 1, 1e-3);
  // ZeRO-3 with overlap on, predicted with the fitted table: the truth's waits and slowdown.
  const CalibrationRun z3 = run(3, true);
  const PlanResult predicted = evaluate_layout(z3.config, cpu_options(2, fit->hardware));
  EXPECT_GT(z3.run.exposed.dp, 0);
  EXPECT_NEAR(predicted.dp_s / z3.run.exposed.dp, 1, 1e-2);
  EXPECT_NEAR(predicted.step_time_s / z3.run.step_s, 1, 1e-3);
  Hardware thread_shares = fit->hardware;
  thread_shares.overlap_comm_rate = thread_shares.overlap_compute_rate = 0;
  const PlanResult shares = evaluate_layout(z3.config, cpu_options(2, thread_shares));
  EXPECT_GT(std::abs(shares.dp_s / z3.run.exposed.dp - 1), 0.2);
  // A ZeRO-2 run that waited less than the plan at full collective speed and stepped 20%
  // longer: its collectives' rate stops at 1, and the compute's at the threads' share of
  // the cores (a longer step is not the overlap's beyond that), not at the search's end.
  std::vector<CalibrationRun> odd = runs;
  odd[3].run.exposed.dp *= 0.1;
  odd[3].run.step_s *= 1.2;
  auto floor = calibrate_runs(odd, cpu_options(2, start));
  ASSERT_TRUE(floor.is_ok()) << floor.status().message();
  EXPECT_EQ(floor->hardware.overlap_comm_rate, 1) << floor->notes;
  const double share = cpu_thread_share_in_flight(odd[3].config, cpu_options(2, start));
  EXPECT_LT(share, 1);
  EXPECT_NEAR(floor->hardware.overlap_compute_rate, share, 1e-6) << floor->notes;
  // The overlapped run with tp 2 only: no dp link fitted apart, every run fits the links.
  auto no_rates = calibrate_runs({runs[3], runs_on({PlanCandidate{{.tp = 2}, Recompute::kNone, 1}}, truth, true)[0]},
                                 cpu_options(2, start));
  ASSERT_TRUE(no_rates.is_ok()) << no_rates.status().message();
  EXPECT_EQ(no_rates->hardware.overlap_comm_rate, 0);
  EXPECT_EQ(no_rates->notes.find("overlap on shared cores"), std::string::npos) << no_rates->notes;
}

// The ranks' arrival skew, "measured" on a machine whose ranks wait 0.02 s per s of the
// compute between a group's waits: the files give each collective's least time (the
// transfers) and the least totals (the transfers and the skew). From ZeRO-1 (no waits
// in the step), ZeRO-0 and ZeRO-3 with overlap off the skew comes back with the links and
// the compute, and tp 2, not fitted, is predicted to the truth's tp time and step. Files
// without the least totals (has_least) leave the table's skew.
TEST(Calibrate, TheArrivalSkewComesFromTheLeastTotalsLessEachCollectivesLeast) {
  const Hardware start = cpu_hardware(1e11, 64.0 * 1073741824.0);
  Hardware truth = cpu_with_kinds(1.5e9, start.intra_node.latency_s, {1.7, 0.6, 1.4});
  truth.arrival_skew = 0.02;
  auto run = [&](const PlanCandidate& l, bool least) {
    Config c = config_for(l);
    c.parallel.overlap_grad_reduce = c.parallel.overlap_param_gather = false;
    MeasuredRun m = measured_by_kind(c, cpu_options(2, truth));
    m.path = layout_name(l) + ".jsonl";
    m.has_least = least;
    m.total_least = m.exposed_least = {m.exposed.tp, m.exposed.dp, 0, 0, 0};
    return CalibrationRun{c, m};
  };
  const std::vector<CalibrationRun> runs = {run(PlanCandidate{{.dp = 2, .zero_stage = 1}, Recompute::kNone, 1}, true),
                                            run(PlanCandidate{{.dp = 2, .zero_stage = 0}, Recompute::kNone, 1}, true),
                                            run(PlanCandidate{{.dp = 2, .zero_stage = 3}, Recompute::kNone, 1}, true)};
  EXPECT_GT(runs[2].run.exposed.dp - (runs[2].run.dp_kinds[0] + runs[2].run.dp_kinds[1] + runs[2].run.dp_kinds[2]), 0);
  auto fit = calibrate_runs(runs, cpu_options(2, start));
  ASSERT_TRUE(fit.is_ok()) << fit.status().message();
  EXPECT_NEAR(fit->hardware.arrival_skew / 0.02, 1, 1e-3) << fit->notes;
  EXPECT_NEAR(fit->compute_factor, 0.6, 1e-3) << fit->notes;
  EXPECT_NE(fit->notes.find("arrival skew (" + runs[2].run.path + "): "), std::string::npos) << fit->notes;
  const CalibrationRun tp = run(PlanCandidate{{.tp = 2}, Recompute::kNone, 1}, true);
  const PlanResult predicted = evaluate_layout(tp.config, cpu_options(2, fit->hardware));
  EXPECT_GT(predicted.tp_skew_s, 0);
  EXPECT_NEAR(predicted.tp_s / tp.run.exposed.tp, 1, 1e-3);
  EXPECT_NEAR(predicted.step_time_s / tp.run.step_s, 1, 1e-3);
  // The same fitted from the tp run alone (one run: calibrate()).
  auto alone = calibrate_runs({tp}, cpu_options(2, start));
  ASSERT_TRUE(alone.is_ok()) << alone.status().message();
  EXPECT_NEAR(alone->hardware.arrival_skew / 0.02, 1, 1e-2) << alone->notes;
  // Without the least totals: no skew measured, none fitted.
  std::vector<CalibrationRun> bare = runs;
  for (CalibrationRun& r : bare) r.run.has_least = false;
  auto none = calibrate_runs(bare, cpu_options(2, start));
  ASSERT_TRUE(none.is_ok()) << none.status().message();
  EXPECT_EQ(none->hardware.arrival_skew, 0);
  EXPECT_EQ(none->notes.find("arrival skew"), std::string::npos) << none->notes;
}

// Two runs on CPU ranks "measured" on a link of known bandwidth and per-call latency:
// dp 2 ZeRO-1 (a few large collectives) and tp 2 (many small all-reduces) share the one
// link, with calls per byte far apart, so both figures come back, and compute with them.
TEST(Calibrate, TwoLayoutsRecoverTheLinksBandwidthAndPerCallLatency) {
  const Hardware start = cpu_hardware(1e11, 64.0 * 1073741824.0);
  Hardware truth = start;
  truth.gemm_efficiency = truth.attention_efficiency = start.gemm_efficiency * 0.7;
  truth.memory_efficiency = start.memory_efficiency * 0.7;
  truth.intra_node.bytes_per_s = truth.inter_node.bytes_per_s = 1.5e9;  // 5 GB/s -> 1.5
  truth.intra_node.latency_s = truth.inter_node.latency_s = 60e-6;      // 5 us -> 60
  const std::vector<CalibrationRun> runs = runs_on({PlanCandidate{{.dp = 2, .zero_stage = 1}, Recompute::kNone, 1},
                                                    PlanCandidate{{.tp = 2}, Recompute::kNone, 1}},
                                                   truth, false);
  auto fit = calibrate_runs(runs, cpu_options(2, start));
  ASSERT_TRUE(fit.is_ok()) << fit.status().message();
  EXPECT_NEAR(fit->hardware.intra_node.bytes_per_s / 1.5e9, 1, 0.01) << fit->notes;
  EXPECT_NEAR(fit->hardware.intra_node.latency_s / 60e-6, 1, 0.01) << fit->notes;
  EXPECT_EQ(fit->hardware.inter_node.latency_s, fit->hardware.intra_node.latency_s);  // one cpu link
  EXPECT_NEAR(fit->intra_latency_factor, 12, 0.12);
  EXPECT_NEAR(fit->compute_factor, 0.7, 0.007);
  ASSERT_EQ(fit->runs_after.size(), 2u);
  for (size_t i = 0; i < runs.size(); ++i) {
    EXPECT_NEAR(fit->runs_after[i].step_time_s / runs[i].run.step_s, 1, 1e-3) << runs[i].run.path;
  }
  EXPECT_NE(fit->notes.find("per-call latency x"), std::string::npos) << fit->notes;
  // The bandwidth-only fit of one run alone misses: the latency it keeps is 12x too small.
  auto one = calibrate(runs[1].config, cpu_options(2, start), runs[1].run);
  ASSERT_TRUE(one.is_ok());
  EXPECT_GT(std::abs(one->hardware.intra_node.bytes_per_s / 1.5e9 - 1), 0.05);
}

// A GPU link through its efficiency and latency_us: tp 2 on NVLink (one node of 2) at two
// sequence lengths, 4x apart in bytes per call; dp 2 across the nodes keeps one group
// per run on the network with the same calls per byte in both: bandwidth only there.
TEST(Calibrate, TwoRunsFitANvlinkLatencyAndEfficiency) {
  auto [start, truth] = a100_and_truth(0.6, 0.5);
  truth.intra_node.latency_s = 3 * start.intra_node.latency_s;
  std::vector<CalibrationRun> runs;
  PlanOptions o = cpu_options(4, truth);
  o.gpus_per_node = 2;
  for (int seq : {1024, 256}) {
    const Config c =
        config_for(PlanCandidate{{.dp = 2, .tp = 2, .zero_stage = 1}, Recompute::kNone, 1}, 1024, seq);
    MeasuredRun m = measured_on(c, o);
    m.path = "seq" + std::to_string(seq) + ".jsonl";
    runs.push_back({c, m});
  }
  o.hardware = start;
  auto fit = calibrate_runs(runs, o);
  ASSERT_TRUE(fit.is_ok()) << fit.status().message();
  EXPECT_NEAR(fit->hardware.intra_node.efficiency / 0.6, 1, 0.01) << fit->notes;
  EXPECT_NEAR(fit->hardware.intra_node.latency_s / truth.intra_node.latency_s, 1, 0.01) << fit->notes;
  EXPECT_EQ(fit->hardware.intra_node.bytes_per_s, start.intra_node.bytes_per_s);  // datasheet kept
  EXPECT_EQ(fit->hardware.inter_node.latency_s, start.inter_node.latency_s);
  EXPECT_NEAR(fit->hardware.inter_node.efficiency / 0.5, 1, 0.01) << fit->notes;
  EXPECT_NEAR(fit->compute_factor, 0.8, 0.008);
}

// One run: calibrate()'s result exactly (the single-file `--calibrate` is unchanged).
TEST(Calibrate, OneRunIsTheSingleRunFitBitForBit) {
  const Hardware start = cpu_hardware(1e11, 64.0 * 1073741824.0);
  Hardware truth = start;
  truth.gemm_efficiency *= 0.4;
  truth.intra_node.bytes_per_s = truth.inter_node.bytes_per_s = 0.3e9;
  const Config c = config_for(PlanCandidate{{.dp = 2, .zero_stage = 1}, Recompute::kNone, 1});
  const MeasuredRun m = measured_on(c, cpu_options(2, truth));
  auto one = calibrate(c, cpu_options(2, start), m);
  auto runs = calibrate_runs({{c, m}}, cpu_options(2, start));
  ASSERT_TRUE(one.is_ok() && runs.is_ok());
  EXPECT_EQ(runs->notes, one->notes);
  EXPECT_EQ(runs->compute_factor, one->compute_factor);
  EXPECT_EQ(runs->hardware.intra_node.bytes_per_s, one->hardware.intra_node.bytes_per_s);
  EXPECT_EQ(runs->hardware.intra_node.latency_s, start.intra_node.latency_s);
  EXPECT_EQ(runs->hardware.gemm_efficiency, one->hardware.gemm_efficiency);
  EXPECT_EQ(runs->after.step_time_s, one->after.step_time_s);
  ASSERT_EQ(runs->runs_after.size(), 1u);
  EXPECT_EQ(runs->runs_after[0].step_time_s, one->after.step_time_s);
}

// Runs whose calls per byte on the link are alike (the same layout twice) do not
// separate latency from bandwidth: the pooled bandwidth-only fit, said so; runs whose
// times no positive latency and bandwidth explain are refused naming their files.
TEST(Calibrate, RunsThatDoNotSeparateTheTwoFallBackAndInconsistentOnesAreRefused) {
  const Hardware start = cpu_hardware(1e11, 64.0 * 1073741824.0);
  Hardware truth = start;
  truth.intra_node.bytes_per_s = truth.inter_node.bytes_per_s = 1e9;
  const Config z1 = config_for(PlanCandidate{{.dp = 2, .zero_stage = 1}, Recompute::kNone, 1});
  MeasuredRun a = measured_on(z1, cpu_options(2, truth)), b = a;
  a.path = "first.jsonl";
  b.path = "second.jsonl";
  b.exposed.dp *= 1.2;  // the second slower: the pooled figure between the two
  auto same = calibrate_runs({{z1, a}, {z1, b}}, cpu_options(2, start));
  ASSERT_TRUE(same.is_ok()) << same.status().message();
  EXPECT_NE(same->notes.find("bandwidth only over 2 groups of 2 runs"), std::string::npos) << same->notes;
  EXPECT_EQ(same->hardware.intra_node.latency_s, start.intra_node.latency_s);
  EXPECT_LT(same->hardware.intra_node.bytes_per_s, 1e9);
  EXPECT_GT(same->hardware.intra_node.bytes_per_s, 1e9 / 1.2);
  // tp's many small calls took less than ZeRO-1's bandwidth alone allows: a negative
  // per-call latency, refused.
  const Config tp = config_for(PlanCandidate{{.tp = 2}, Recompute::kNone, 1});
  MeasuredRun t = measured_on(tp, cpu_options(2, truth));
  t.path = "tp2.jsonl";
  t.exposed.tp *= 0.1;
  auto bad = calibrate_runs({{z1, a}, {tp, t}}, cpu_options(2, start));
  ASSERT_FALSE(bad.is_ok()) << bad->notes;
  EXPECT_EQ(bad.status().exit_code(), 2);
  EXPECT_NE(bad.status().message().find("first.jsonl, tp2.jsonl"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("per-call latency of -"), std::string::npos) << bad.status().message();
  // A run whose step no compute factor reaches is refused naming that run's file.
  MeasuredRun fast = t;
  fast.exposed.tp = t.exposed.tp / 0.1;
  fast.step_s = 1e-6;
  auto unreachable = calibrate_runs({{z1, a}, {tp, fast}}, cpu_options(2, start));
  ASSERT_FALSE(unreachable.is_ok());
  EXPECT_EQ(unreachable.status().message().rfind("tp2.jsonl: the measured step", 0), 0u)
      << unreachable.status().message();
  EXPECT_FALSE(calibrate_runs({}, cpu_options(2, start)).is_ok());
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Calibrate, AMetricsFileThatIsNotTheConfigsRunIsRefusedNamingIt) {
  ParallelConfig layout;
  layout.dp = 2;
  const std::string seg = R"({"segment":{"run_id":"x","start_step":0,"world_size":2}})" "\n";
  const std::string step =
      R"({"step":1,"step_ms":100,"comm_exposed_ms":{"tp":0,"dp":5,"pp":0,"embedding":0},"comm_hidden_ms":{"tp":0,"dp":7,"pp":0,"embedding":0}})" "\n";
  auto err = [&](const std::string& path, int world) {
    auto r = read_metrics(path, world, layout);
    EXPECT_FALSE(r.is_ok()) << path;
    EXPECT_EQ(r.status().exit_code(), 2);
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
    return r.status().message();
  };
  EXPECT_NE(err("/nonexistent/m.jsonl", 2).find("cannot open"), std::string::npos);
  EXPECT_NE(err(write_file("nosegment.jsonl", step), 2).find("no segment header"), std::string::npos);
  EXPECT_NE(err(write_file("nosteps.jsonl", step + seg), 2).find("no step records"), std::string::npos);
  EXPECT_NE(err(write_file("world.jsonl", seg + step), 4).find("world_size 2"), std::string::npos);
  const std::string summary =
      R"({"summary":{"ranks":[{"rank":0,"pp":0,"dp":0,"tp":0},{"rank":1,"pp":0,"dp":0,"tp":1}]}})" "\n";
  EXPECT_NE(err(write_file("summary.jsonl", seg + step + summary), 2).find("tp 2"), std::string::npos);
  // A torn line is skipped; the medians are over the steps after the first.
  const std::string step2 =
      R"({"step":2,"step_ms":300,"comm_exposed_ms":{"tp":0,"dp":1,"pp":0,"embedding":0},"comm_hidden_ms":{"tp":0,"dp":2,"pp":0,"embedding":0}})" "\n";
  const std::string step3 =
      R"({"step":3,"step_ms":500,"comm_exposed_ms":{"tp":0,"dp":3,"pp":0,"embedding":0},"comm_hidden_ms":{"tp":0,"dp":4,"pp":0,"embedding":0}})" "\n";
  auto ok = read_metrics(write_file("ok.jsonl", step + seg + step + "{\"step\":2,\"lo\n" + step2 + step3), 2, layout);
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok->steps, 3);
  EXPECT_EQ(ok->steps_used, 2);
  EXPECT_DOUBLE_EQ(ok->step_s, 0.4);
  EXPECT_DOUBLE_EQ(ok->exposed.dp, 0.002);
  EXPECT_DOUBLE_EQ(ok->hidden.dp, 0.003);
  EXPECT_EQ(ok->exposed.cp, 0);  // no "cp" key: no ring
  // The ring's exposed and hidden times, read like the other groups'.
  const std::string cp_step =
      R"({"step":1,"step_ms":100,"comm_exposed_ms":{"tp":0,"dp":1,"pp":0,"embedding":0,"cp":6},"comm_hidden_ms":{"tp":0,"dp":2,"pp":0,"embedding":0,"cp":9}})" "\n";
  auto cp = read_metrics(write_file("cp.jsonl", seg + cp_step), 2, layout);
  ASSERT_TRUE(cp.is_ok()) << cp.status().message();
  EXPECT_DOUBLE_EQ(cp->exposed.cp, 0.006);
  EXPECT_DOUBLE_EQ(cp->hidden.cp, 0.009);
}

TEST(Calibrate, TheLeastOfTheGroupsRanksIsFittedWhereTheFileHasIt) {
  // Rank 0 reached the collectives first and waited 40 ms a step; the last rank to
  // arrive, the transfer alone: 10 ms exposed + 2 ms hidden.
  ParallelConfig layout;
  layout.dp = 2;
  const std::string seg = R"({"segment":{"run_id":"x","start_step":0,"world_size":2}})" "\n";
  const std::string rank0 =
      R"("step_ms":100,"comm_exposed_ms":{"tp":0,"dp":40,"pp":0,"embedding":0},"comm_hidden_ms":{"tp":0,"dp":0,"pp":0,"embedding":0})";
  const std::string least =
      R"(,"comm_exposed_least_ms":{"tp":0,"dp":10,"pp":0,"embedding":0},"comm_total_least_ms":{"tp":0,"dp":12,"pp":0,"embedding":0})";
  std::string with, without, mixed;
  for (int s = 1; s <= 3; ++s) {
    const std::string head = "{\"step\":" + std::to_string(s) + ",";
    with += head + rank0 + least + "}\n";
    without += head + rank0 + "}\n";
    mixed += head + rank0 + (s == 3 ? "" : least) + "}\n";
  }
  auto w = read_metrics(write_file("least.jsonl", seg + with), 2, layout);
  ASSERT_TRUE(w.is_ok()) << w.status().message();
  EXPECT_TRUE(w->has_least);
  EXPECT_DOUBLE_EQ(w->exposed.dp, 0.040);
  EXPECT_DOUBLE_EQ(w->exposed_least.dp, 0.010);
  EXPECT_DOUBLE_EQ(w->total_least.dp, 0.012);
  auto wo = read_metrics(write_file("noleast.jsonl", seg + without), 2, layout);
  ASSERT_TRUE(wo.is_ok());
  EXPECT_FALSE(wo->has_least);
  auto m = read_metrics(write_file("mixed.jsonl", seg + mixed), 2, layout);
  ASSERT_TRUE(m.is_ok());
  EXPECT_FALSE(m->has_least) << "a step without the figures: rank 0's for all";
  EXPECT_FALSE(w->has_kinds);

  // The fitted link: the plan's dp time scaled to 12 ms (least) or to 40 ms (rank 0's).
  const PlanCandidate l{{.dp = 2, .zero_stage = 1}, Recompute::kNone, 1};
  const Config c = config_for(l);
  const Hardware start = cpu_hardware(1e11, 64.0 * 1073741824.0);
  const PlanOptions o = cpu_options(2, start);
  auto fit_w = calibrate(c, o, w.value());
  auto fit_wo = calibrate(c, o, wo.value());
  ASSERT_TRUE(fit_w.is_ok()) << fit_w.status().message();
  ASSERT_TRUE(fit_wo.is_ok()) << fit_wo.status().message();
  EXPECT_NEAR(fit_w->after.dp_comm_s, 0.012, 0.012 * 0.02);
  EXPECT_NEAR(fit_wo->after.dp_comm_s, 0.040, 0.040 * 0.02);
  EXPECT_NE(fit_w->notes.find("the least of the group's ranks"), std::string::npos) << fit_w->notes;
  EXPECT_NE(fit_wo->notes.find("rank 0's"), std::string::npos) << fit_wo->notes;
}

// comm_kind_least_ms: each kind's medians, tp's and dp's with the tied embedding's
// all-reduce; only where every step has it.
TEST(Calibrate, EachKindsLeastIsReadWhereEveryStepHasIt) {
  ParallelConfig layout;
  layout.dp = 2;
  const std::string seg = R"({"segment":{"run_id":"x","start_step":0,"world_size":2}})" "\n";
  auto step = [](int s, double rs, bool kinds) {
    std::string k = R"(,"comm_kind_least_ms":{"tp":{"all_reduce":1,"reduce_scatter":0,"all_gather":0},)"
                    R"("dp":{"all_reduce":0,"reduce_scatter":)" + std::to_string(rs) + R"(,"all_gather":2},)"
                    R"("embedding":{"all_reduce":3,"reduce_scatter":0,"all_gather":0}})";
    return "{\"step\":" + std::to_string(s) +
           R"(,"step_ms":100,"comm_exposed_ms":{"tp":0,"dp":9,"pp":0,"embedding":0},"comm_hidden_ms":{"tp":0,"dp":0,"pp":0,"embedding":0})" +
           (kinds ? k : "") + "}\n";
  };
  auto r = read_metrics(write_file("kinds.jsonl", seg + step(1, 50, true) + step(2, 4, true) + step(3, 6, true)), 2,
                        layout);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_TRUE(r->has_kinds);
  EXPECT_DOUBLE_EQ(r->dp_kinds[1], 0.005);  // the median of steps 2 and 3
  EXPECT_DOUBLE_EQ(r->dp_kinds[2], 0.002);
  EXPECT_DOUBLE_EQ(r->dp_kinds[0], 0.003);  // the embedding's
  EXPECT_DOUBLE_EQ(r->tp_kinds[0], 0.001);
  auto some = read_metrics(write_file("somekinds.jsonl", seg + step(1, 5, true) + step(2, 5, false)), 2, layout);
  ASSERT_TRUE(some.is_ok());
  EXPECT_FALSE(some->has_kinds);
}

}  // namespace
}  // namespace trident
