// Calibration from a run's metrics file (plan/calibrate.h).
#include "plan/calibrate.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

namespace trident {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, x);
  return buf;
}

// Every link of `hw` (both for the cpu, whose one link stands for both) with its
// effective bandwidth scaled by `intra` and `inter`: a GPU link's efficiency, the cpu's
// bandwidth (its efficiency is 1 by definition: MPI's copies reach what they reach).
Hardware scale_links(Hardware hw, double intra, double inter) {
  auto scale = [&](LinkSpec& l, double f) {
    if (hw.is_cpu) {
      l.bytes_per_s *= f;
    } else {
      l.efficiency *= f;
    }
  };
  scale(hw.intra_node, intra);
  if (hw.is_cpu) {
    hw.inter_node = hw.intra_node;
  } else {
    scale(hw.inter_node, inter);
  }
  return hw;
}

// Every link's per-call latency scaled by `intra` and `inter` (the cpu's one link: intra).
Hardware scale_latency(Hardware hw, double intra, double inter) {
  hw.intra_node.latency_s *= intra;
  hw.inter_node.latency_s = hw.is_cpu ? hw.intra_node.latency_s : hw.inter_node.latency_s * inter;
  return hw;
}

Hardware scale_compute(Hardware hw, double f) {
  hw.gemm_efficiency *= f;
  hw.attention_efficiency *= f;
  hw.memory_efficiency *= f;
  return hw;
}

PlanResult evaluate_on(const Config& config, PlanOptions o, const Hardware& hw) {
  o.hardware = hw;
  return evaluate_layout(config, o);
}

// A group whose link is fitted: the plan's communication time at the table's figures and
// with every link's bandwidth doubled, and what the run measured (exposed + hidden: the
// least over the group's ranks where the file has it, else rank 0's).
struct Group {
  const char* name;
  ParallelDim dim;
  double predicted, predicted_fast, measured;
};
std::vector<Group> fitted_groups(const PlanResult& before, const PlanResult& fast, const MeasuredRun& run) {
  GroupSeconds all = run.total_least;
  if (!run.has_least) {
    all = {run.exposed.tp + run.hidden.tp, run.exposed.dp + run.hidden.dp, run.exposed.pp + run.hidden.pp,
           run.exposed.embedding + run.hidden.embedding, run.exposed.cp + run.hidden.cp};
  }
  return {{"tp", ParallelDim::kTp, before.tp_s, fast.tp_s, all.tp},
          {"dp", ParallelDim::kDp, before.dp_comm_s, fast.dp_comm_s, all.dp + all.embedding},
          // The ring's whole time (the plan's exposed part is what the block attention does
          // not hide; the metrics' exposed + hidden is all of it).
          {"cp", ParallelDim::kCp, before.cp_comm_s, fast.cp_comm_s, all.cp}};
}

// What fitted_groups' measured figure is, for the notes.
std::string measured_what(const MeasuredRun& run) {
  return run.has_least ? "exposed + hidden, the least of the group's ranks" : "exposed + hidden, rank 0's";
}

// Whether a compute factor in [1e-4, 1e4] reaches the run's measured step, given the
// plan's steps at the two ends (at_hi: at 1e4, the step without compute).
Status compute_reachable(const MeasuredRun& run, double at_hi, double at_lo) {
  if (at_hi > run.step_s) {
    return Status::invalid_input(
        run.path + ": the measured step (" + fmt("%.4g", run.step_s * 1e3) +
        " ms) is shorter than the plan's communication, pipeline and optimizer time alone with "
        "the fitted links (" + fmt("%.4g", at_hi * 1e3) + " ms): nothing to fit compute to");
  }
  if (at_lo < run.step_s) {
    return Status::invalid_input(run.path + ": the measured step (" + fmt("%.4g", run.step_s * 1e3) +
                                 " ms) is longer than the plan at 1e-4 of the table's compute "
                                 "efficiencies: not this config's run?");
  }
  return Status::ok();
}

// "NAME: effective bandwidth x F (A -> B GB/s)" for link `l` scaled by `factor`.
std::string bandwidth_note(const LinkSpec& l, double factor) {
  return l.name + ": effective bandwidth x " + fmt("%.4g", factor) + " (" +
         fmt("%.4g", l.bytes_per_s * l.efficiency / 1e9) + " -> " +
         fmt("%.4g", l.bytes_per_s * l.efficiency * factor / 1e9) + " GB/s)";
}

}  // namespace

Result<MeasuredRun> read_metrics(const std::string& path, int expected_world,
                                 const ParallelConfig& layout) {
  std::ifstream in(path);
  if (!in) {
    return Status::invalid_input(path + ": cannot open metrics file: " + std::strerror(errno));
  }
  MeasuredRun run;
  run.path = path;
  bool segment = false;
  std::vector<nlohmann::json> steps;
  nlohmann::json summary;
  for (std::string line; std::getline(in, line);) {
    // A torn line (a killed run) is skipped, as scripts/plot_metrics.py does.
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    if (j.contains("segment")) {
      segment = true;
      steps.clear();
      summary = nullptr;
      run.world_size = j["segment"].value("world_size", 0);
    } else if (j.contains("summary")) {
      summary = j["summary"];
    } else if (j.contains("step_ms") && j["step_ms"].is_number()) {
      steps.push_back(j);
    }
  }
  if (!segment) {
    return Status::invalid_input(path + ": no segment header (not a trident train metrics file?)");
  }
  if (steps.empty()) return Status::invalid_input(path + ": no step records in its last segment");
  const std::string keys = "parallel.dp=" + std::to_string(layout.dp) + ", parallel.tp=" +
                           std::to_string(layout.tp) + ", parallel.pp=" + std::to_string(layout.pp);
  if (run.world_size != expected_world) {
    return Status::invalid_input(path + ": the run's segment header has world_size " +
                                 std::to_string(run.world_size) + ", but the config's layout (" +
                                 keys + ") is for " + std::to_string(expected_world) +
                                 " ranks: calibrate with the config the run trained with");
  }
  if (summary.is_object() && summary.contains("ranks")) {
    int dp = 0, tp = 0, pp = 0;
    for (const nlohmann::json& r : summary["ranks"]) {
      dp = std::max(dp, r.value("dp", 0) + 1);
      tp = std::max(tp, r.value("tp", 0) + 1);
      pp = std::max(pp, r.value("pp", 0) + 1);
    }
    if (dp != layout.dp || tp != layout.tp || pp != layout.pp) {
      return Status::invalid_input(path + ": the run's summary has dp " + std::to_string(dp) +
                                   " x tp " + std::to_string(tp) + " x pp " + std::to_string(pp) +
                                   ", the config " + keys +
                                   ": calibrate with the config the run trained with");
    }
  }
  run.steps = static_cast<int>(steps.size());
  if (steps.size() > 1) steps.erase(steps.begin());  // start-up work
  run.steps_used = static_cast<int>(steps.size());
  std::vector<double> step_s;
  constexpr int kGroups = 5;
  std::vector<double> e[kGroups], h[kGroups], el[kGroups], tl[kGroups];
  const char* groups[kGroups] = {"tp", "dp", "pp", "embedding", "cp"};
  run.has_least = std::all_of(steps.begin(), steps.end(), [](const nlohmann::json& s) {
    return s.contains("comm_exposed_least_ms") && s["comm_exposed_least_ms"].is_object() &&
           s.contains("comm_total_least_ms") && s["comm_total_least_ms"].is_object();
  });
  for (const nlohmann::json& s : steps) {
    step_s.push_back(s["step_ms"].get<double>() / 1e3);
    for (int g = 0; g < kGroups; ++g) {
      auto ms = [&](const char* key) {
        return s.contains(key) && s[key].is_object() ? s[key].value(groups[g], 0.0) / 1e3 : 0.0;
      };
      e[g].push_back(ms("comm_exposed_ms"));
      h[g].push_back(ms("comm_hidden_ms"));
      el[g].push_back(ms("comm_exposed_least_ms"));
      tl[g].push_back(ms("comm_total_least_ms"));
    }
  }
  run.step_s = median(step_s);
  run.exposed = {median(e[0]), median(e[1]), median(e[2]), median(e[3]), median(e[4])};
  run.hidden = {median(h[0]), median(h[1]), median(h[2]), median(h[3]), median(h[4])};
  if (run.has_least) {
    run.exposed_least = {median(el[0]), median(el[1]), median(el[2]), median(el[3]), median(el[4])};
    run.total_least = {median(tl[0]), median(tl[1]), median(tl[2]), median(tl[3]), median(tl[4])};
  }
  return run;
}

Result<Calibration> calibrate(const Config& config, const PlanOptions& options,
                              const MeasuredRun& run) {
  Calibration c;
  c.before = evaluate_layout(config, options);
  const Hardware& hw = options.hardware;
  // Links: each group's bytes term (2 x the time saved by doubling every link's
  // bandwidth) and latency term, pooled per link, against what the group measured.
  Hardware doubled = hw;
  doubled.intra_node.bytes_per_s *= 2;
  doubled.inter_node.bytes_per_s *= 2;
  const PlanResult fast = evaluate_on(config, options, doubled);
  struct Pool {
    double bytes_s = 0, latency_s = 0, measured_s = 0;
  } pools[2];  // intra, inter
  for (const Group& g : fitted_groups(c.before, fast, run)) {
    if (g.predicted <= 0 || g.measured <= 0) continue;
    const double bytes_s = 2 * (g.predicted - g.predicted_fast);
    Pool& p = pools[c.before.crosses_nodes[g.dim] && !hw.is_cpu ? 1 : 0];
    p.bytes_s += bytes_s;
    p.latency_s += g.predicted - bytes_s;
    p.measured_s += g.measured;
    c.notes += std::string(g.name) + ": measured " + fmt("%.4g", g.measured * 1e3) +
               " ms/step of communication (" + measured_what(run) + "), predicted " +
               fmt("%.4g", g.predicted * 1e3) + " ms over " +
               (c.before.crosses_nodes[g.dim] && !hw.is_cpu ? hw.inter_node.name
                                                             : hw.intra_node.name) +
               "\n";
  }
  double factor[2] = {1, 1};
  for (int k = 0; k < 2; ++k) {
    const Pool& p = pools[k];
    if (p.bytes_s <= 0) continue;
    const LinkSpec& l = k == 1 ? hw.inter_node : hw.intra_node;
    // What the bytes took: the measured time less the fixed cost per call. When the
    // fixed costs are most of it (small messages), the bandwidth is not identified and
    // the link keeps its figure.
    const double bytes_measured = p.measured_s - p.latency_s;
    if (bytes_measured < 0.1 * p.measured_s) {
      c.notes += l.name + ": not fitted (the per-call latency accounts for " +
                 fmt("%.0f", 100 * p.latency_s / p.measured_s) + "% of the measured time)\n";
      continue;
    }
    factor[k] = p.bytes_s / bytes_measured;
    c.notes += bandwidth_note(l, factor[k]) + "\n";
  }
  c.tp_link_factor = factor[c.before.crosses_nodes[ParallelDim::kTp] && !hw.is_cpu ? 1 : 0];
  c.dp_link_factor = factor[c.before.crosses_nodes[ParallelDim::kDp] && !hw.is_cpu ? 1 : 0];
  c.cp_link_factor = factor[c.before.crosses_nodes[ParallelDim::kCp] && !hw.is_cpu ? 1 : 0];
  const Hardware linked = scale_links(hw, factor[0], factor[1]);
  // Compute: the one factor whose predicted step is the measured one (the step falls as
  // the factor grows; bisection in log space).
  auto step = [&](double f) { return evaluate_on(config, options, scale_compute(linked, f)).step_time_s; };
  double lo = 1e-4, hi = 1e4;
  TRIDENT_RETURN_IF_ERROR(compute_reachable(run, step(hi), step(lo)));
  for (int i = 0; i < 80; ++i) {
    const double mid = std::sqrt(lo * hi);
    (step(mid) > run.step_s ? lo : hi) = mid;
  }
  c.compute_factor = std::sqrt(lo * hi);
  c.hardware = scale_compute(linked, c.compute_factor);
  c.after = evaluate_on(config, options, c.hardware);
  c.notes += "step: measured " + fmt("%.4g", run.step_s * 1e3) + " ms (median of " +
             std::to_string(run.steps_used) + " steps), predicted " +
             fmt("%.4g", c.before.step_time_s * 1e3) + " ms before, " +
             fmt("%.4g", c.after.step_time_s * 1e3) + " ms after\n";
  c.notes += "compute efficiencies x " + fmt("%.4g", c.compute_factor) + ": gemm " +
             fmt("%.4g", c.hardware.gemm_efficiency) + ", attention " +
             fmt("%.4g", c.hardware.attention_efficiency) + ", memory " +
             fmt("%.4g", c.hardware.memory_efficiency) + "\n";
  return c;
}

namespace {

// One group of one run on a link: the plan's bytes term (bytes / bandwidth) and latency
// term (calls x latency) at the table's figures, and what the run measured.
struct LinkPoint {
  double bytes_s = 0, latency_s = 0, measured_s = 0;
};

std::string file_list(const std::vector<CalibrationRun>& runs) {
  std::string out;
  for (const CalibrationRun& r : runs) out += (out.empty() ? "" : ", ") + r.run.path;
  return out;
}

}  // namespace

Result<Calibration> calibrate_runs(const std::vector<CalibrationRun>& runs, const PlanOptions& options) {
  if (runs.empty()) return Status::invalid_input("calibration: no metrics file given");
  if (runs.size() == 1) {
    auto one = calibrate(runs[0].config, options, runs[0].run);
    if (!one.is_ok()) return one.status();
    Calibration c = std::move(one.value());
    c.runs_before = {c.before};
    c.runs_after = {c.after};
    return c;
  }
  Calibration c;
  const Hardware& hw = options.hardware;
  Hardware doubled = hw;
  doubled.intra_node.bytes_per_s *= 2;
  doubled.inter_node.bytes_per_s *= 2;
  std::vector<LinkPoint> points[2];  // intra, inter
  for (const CalibrationRun& r : runs) {
    const PlanResult before = evaluate_layout(r.config, options);
    const PlanResult fast = evaluate_on(r.config, options, doubled);
    c.runs_before.push_back(before);
    const MeasuredRun& m = r.run;
    for (const Group& g : fitted_groups(before, fast, m)) {
      if (g.predicted <= 0 || g.measured <= 0) continue;
      const int k = before.crosses_nodes[g.dim] && !hw.is_cpu ? 1 : 0;
      const LinkSpec& l = k == 1 ? hw.inter_node : hw.intra_node;
      const double bytes_s = 2 * (g.predicted - g.predicted_fast);
      const LinkPoint p{bytes_s, g.predicted - bytes_s, g.measured};
      points[k].push_back(p);
      c.notes += std::string(g.name) + " (" + m.path + "): measured " + fmt("%.4g", g.measured * 1e3) +
                 " ms/step of communication (" + measured_what(m) + "), predicted " +
                 fmt("%.4g", g.predicted * 1e3) + " ms over " + l.name + " (" +
                 fmt("%.4g", p.latency_s / l.latency_s) + " calls, " +
                 fmt("%.4g", p.bytes_s * l.bytes_per_s * l.efficiency / 1e6) + " MB on the link)\n";
    }
  }
  double bandwidth[2] = {1, 1}, latency[2] = {1, 1};
  for (int k = 0; k < 2; ++k) {
    const std::vector<LinkPoint>& ps = points[k];
    const LinkSpec& l = k == 1 ? hw.inter_node : hw.intra_node;
    double sbb = 0, sbl = 0, sll = 0, sby = 0, sly = 0, sb = 0, sl = 0, sy = 0;
    double lo = INFINITY, hi = 0;  // calls per byte, as latency term / bytes term
    for (const LinkPoint& p : ps) {
      sbb += p.bytes_s * p.bytes_s;
      sbl += p.bytes_s * p.latency_s;
      sll += p.latency_s * p.latency_s;
      sby += p.bytes_s * p.measured_s;
      sly += p.latency_s * p.measured_s;
      sb += p.bytes_s;
      sl += p.latency_s;
      sy += p.measured_s;
      if (p.bytes_s > 0) {
        lo = std::min(lo, p.latency_s / p.bytes_s);
        hi = std::max(hi, p.latency_s / p.bytes_s);
      }
    }
    if (sb <= 0) continue;
    const double spread = lo > 0 ? hi / lo : INFINITY;
    const std::string over = std::to_string(ps.size()) + " groups of " + std::to_string(runs.size()) + " runs";
    if (ps.size() >= 2 && spread >= kLatencySeparation) {
      // measured = a * bytes term + z * latency term: a = 1 / the bandwidth's factor, z the
      // latency's (the normal equations of the two-parameter least squares).
      const double det = sbb * sll - sbl * sbl;
      const double a = (sll * sby - sbl * sly) / det;
      const double z = (sbb * sly - sbl * sby) / det;
      if (!(a > 0) || !(z > 0)) {
        return Status::invalid_input(
            file_list(runs) + ": the least-squares fit of " + l.name + " over " + over + " gives " +
            (a > 0 ? "a per-call latency of " + fmt("%.4g", z * l.latency_s * 1e6) + " us"
                   : "a bandwidth of " + fmt("%.4g", l.bytes_per_s * l.efficiency / a / 1e9) + " GB/s") +
            ": their communication times are not bytes / bandwidth + calls x latency (a noisy or "
            "loaded run?); rerun them, or calibrate from one run. The groups:\n" + c.notes);
      }
      bandwidth[k] = 1 / a;
      latency[k] = z;
      c.notes += bandwidth_note(l, bandwidth[k]) + ", per-call latency x " + fmt("%.4g", z) + " (" + fmt("%.4g", l.latency_s * 1e6) +
                 " -> " + fmt("%.4g", l.latency_s * z * 1e6) + " us), least squares over " + over +
                 " (calls per byte " + fmt("%.3g", spread) + "x apart)\n";
      continue;
    }
    // Bandwidth only: the pooled figure calibrate() fits from one run, over all of them.
    const std::string why = ps.size() < 2 ? "one group measured it"
                                          : "the runs' calls per byte are within " + fmt("%.3g", spread) +
                                                "x of each other";
    const double bytes_measured = sy - sl;
    if (bytes_measured < 0.1 * sy) {
      c.notes += l.name + ": not fitted (the per-call latency accounts for " + fmt("%.0f", 100 * sl / sy) +
                 "% of the measured time, and " + why + ")\n";
      continue;
    }
    bandwidth[k] = sb / bytes_measured;
    c.notes += bandwidth_note(l, bandwidth[k]) + ", bandwidth only over " +
               over + ": " + why + ", which does not separate a per-call latency (kept at " +
               fmt("%.4g", l.latency_s * 1e6) + " us)\n";
  }
  const PlanResult& first = c.runs_before[0];
  c.tp_link_factor = bandwidth[first.crosses_nodes[ParallelDim::kTp] && !hw.is_cpu ? 1 : 0];
  c.dp_link_factor = bandwidth[first.crosses_nodes[ParallelDim::kDp] && !hw.is_cpu ? 1 : 0];
  c.cp_link_factor = bandwidth[first.crosses_nodes[ParallelDim::kCp] && !hw.is_cpu ? 1 : 0];
  c.intra_latency_factor = latency[0];
  c.inter_latency_factor = hw.is_cpu ? latency[0] : latency[1];
  const Hardware linked = scale_latency(scale_links(hw, bandwidth[0], bandwidth[1]), latency[0], latency[1]);
  // Compute: every run's step must be reachable by some factor; then the factor with
  // the least sum of squared step errors. Each step falls as the factor grows, so the
  // sum is unimodal in log f: golden-section search.
  auto step = [&](const CalibrationRun& r, double f) {
    return evaluate_on(r.config, options, scale_compute(linked, f)).step_time_s;
  };
  constexpr double kLo = 1e-4, kHi = 1e4;
  for (const CalibrationRun& r : runs) {
    TRIDENT_RETURN_IF_ERROR(compute_reachable(r.run, step(r, kHi), step(r, kLo)));
  }
  auto cost = [&](double log_f) {
    double sum = 0;
    for (const CalibrationRun& r : runs) {
      const double e = step(r, std::exp(log_f)) - r.run.step_s;
      sum += e * e;
    }
    return sum;
  };
  const double golden = (std::sqrt(5.0) - 1) / 2;
  double a = std::log(kLo), b = std::log(kHi);
  double x1 = b - golden * (b - a), x2 = a + golden * (b - a);
  double f1 = cost(x1), f2 = cost(x2);
  for (int i = 0; i < 100; ++i) {
    if (f1 <= f2) {
      b = x2, x2 = x1, f2 = f1;
      x1 = b - golden * (b - a), f1 = cost(x1);
    } else {
      a = x1, x1 = x2, f1 = f2;
      x2 = a + golden * (b - a), f2 = cost(x2);
    }
  }
  c.compute_factor = std::exp(0.5 * (a + b));
  c.hardware = scale_compute(linked, c.compute_factor);
  for (size_t i = 0; i < runs.size(); ++i) {
    const MeasuredRun& m = runs[i].run;
    c.runs_after.push_back(evaluate_on(runs[i].config, options, c.hardware));
    c.notes += "step (" + m.path + "): measured " + fmt("%.4g", m.step_s * 1e3) + " ms (median of " +
               std::to_string(m.steps_used) + " steps), predicted " +
               fmt("%.4g", c.runs_before[i].step_time_s * 1e3) + " ms before, " +
               fmt("%.4g", c.runs_after[i].step_time_s * 1e3) + " ms after\n";
  }
  c.before = c.runs_before[0];
  c.after = c.runs_after[0];
  c.notes += "compute efficiencies x " + fmt("%.4g", c.compute_factor) +
             " (least squares over the runs' steps): gemm " + fmt("%.4g", c.hardware.gemm_efficiency) +
             ", attention " + fmt("%.4g", c.hardware.attention_efficiency) + ", memory " +
             fmt("%.4g", c.hardware.memory_efficiency) + "\n";
  return c;
}

}  // namespace trident
