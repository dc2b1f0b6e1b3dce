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

// What a group's measured figure is, for the notes.
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


// One measurement of a link: the plan's bytes term (bytes / bandwidth) and latency term
// (calls x latency) at the table's figures for a group's collectives of one kind (kind
// 0..2, LinkSpec::share's index) or for all its communication (kAllKinds), and what the
// run measured of it.
constexpr int kAllKinds = kRingKinds;
struct LinkRow {
  int kind = kAllKinds;
  double bytes_s = 0, latency_s = 0, measured_s = 0;
};

const char* kind_label(int kind) {
  return kind == kAllKinds ? "all" : collective_name(static_cast<CollectiveKind>(kind));
}

// The link (0: intra, 1: inter; the cpu's one link is intra) a dimension's groups use.
int link_index(const PlanResult& plan, ParallelDim dim, const Hardware& hw) {
  return plan.crosses_nodes[dim] && !hw.is_cpu ? 1 : 0;
}

// The rows of one run on the two links, and a note line per group (`file`: name the run's
// file and the calls and bytes, as a fit over several runs does). The tp and dp groups
// give a row per collective kind where the file has comm_kind_least_ms, else one in all;
// the cp ring's sends one in all (its whole time, exposed + hidden: the plan's exposed
// part is what the block attention does not hide). `fast`: the plan with every link's
// bandwidth doubled, whose saving is the ring's bytes term.
void add_rows(const PlanResult& plan, const PlanResult& fast, const MeasuredRun& run, const Hardware& hw,
              bool file, std::vector<LinkRow> rows[2], std::string* notes) {
  GroupSeconds all = run.total_least;
  if (!run.has_least) {
    all = {run.exposed.tp + run.hidden.tp, run.exposed.dp + run.hidden.dp, run.exposed.pp + run.hidden.pp,
           run.exposed.embedding + run.hidden.embedding, run.exposed.cp + run.hidden.cp};
  }
  const double ring_bytes_s = 2 * (plan.cp_comm_s - fast.cp_comm_s);
  struct Group {
    const char* name;
    ParallelDim dim;
    CollectiveTerms terms;  // tp, dp
    const std::array<double, kRingKinds>* kinds;  // measured per kind (tp, dp), else null
    double bytes_s, latency_s, measured_s;  // in all
  };
  const Group groups[] = {
      {"tp", ParallelDim::kTp, plan.tp_terms, &run.tp_kinds, plan.tp_terms.bytes(), plan.tp_terms.latency(),
       all.tp},
      {"dp", ParallelDim::kDp, plan.dp_terms, &run.dp_kinds, plan.dp_terms.bytes(), plan.dp_terms.latency(),
       all.dp + all.embedding},
      {"cp", ParallelDim::kCp, {}, nullptr, ring_bytes_s, plan.cp_comm_s - ring_bytes_s, all.cp}};
  for (const Group& g : groups) {
    const double predicted = g.bytes_s + g.latency_s;
    if (predicted <= 0 || g.measured_s <= 0) continue;
    const int k = link_index(plan, g.dim, hw);
    const LinkSpec& l = k == 1 ? hw.inter_node : hw.intra_node;
    *notes += std::string(g.name) + (file ? " (" + run.path + ")" : "") + ": measured " +
              fmt("%.4g", g.measured_s * 1e3) + " ms/step of communication (" + measured_what(run) +
              "), predicted " + fmt("%.4g", predicted * 1e3) + " ms over " + l.name;
    if (file) {
      *notes += " (" + fmt("%.4g", g.latency_s / l.latency_s) + " calls, " +
                fmt("%.4g", g.bytes_s * l.bytes_per_s * l.efficiency / 1e6) + " MB on the link)";
    }
    *notes += "\n";
    if (!run.has_kinds || g.kinds == nullptr) {
      rows[k].push_back({kAllKinds, g.bytes_s, g.latency_s, g.measured_s});
      continue;
    }
    for (int kind = 0; kind < kRingKinds; ++kind) {
      const size_t i = static_cast<size_t>(kind);
      const LinkRow row{kind, g.terms.bytes_s[i], g.terms.latency_s[i], (*g.kinds)[i]};
      if (row.bytes_s <= 0 && row.measured_s <= 0) continue;
      *notes += "  " + std::string(g.name) + " " + kind_label(kind) + ": measured " +
                fmt("%.4g", row.measured_s * 1e3) + " ms (each call's least over the group's ranks), predicted " +
                fmt("%.4g", g.terms.of(i) * 1e3) + " ms\n";
      // A kind the plan has no bytes of (or the run did not time) identifies nothing.
      if (row.bytes_s > 0 && row.measured_s > 0) rows[k].push_back(row);
    }
  }
}

// What one link's rows fit: factors on its effective bandwidth (everything without a
// kind of its own: sends, the kinds not measured apart) and its per-call latency, and on
// each kind's share.
struct LinkFit {
  double bandwidth = 1, latency = 1;
  std::array<double, kRingKinds> kind = {1, 1, 1};
};

// Fits `l` to `rows`: the bandwidth alone (latency kept), or with `latency_allowed` and
// rows whose calls per byte within one kind are kLatencySeparation apart, both by least
// squares: measured = bytes term x a[kind] + latency term x z, one a per kind measured (and
// one for the rows in all), z shared. A kind's share factor is its bandwidth over the
// link's, the link's being the rows in all's where there are any, else all the measured
// bytes together. `runs`, `files`: for the notes and errors; `notes`: the groups' lines so
// far (an error repeats them), to which the fit's lines are added.
Result<LinkFit> fit_link(const std::vector<LinkRow>& rows, const LinkSpec& l, bool latency_allowed, size_t runs,
                         const std::string& files, std::string* notes) {
  LinkFit fit;
  struct Sums {
    double bb = 0, bl = 0, ll = 0, by = 0, ly = 0, b = 0, l = 0, y = 0;
    double lo = INFINITY, hi = 0;  // calls per byte, as latency term / bytes term
    int n = 0;
  } s[kAllKinds + 1], total;
  for (const LinkRow& r : rows) {
    for (Sums* t : {&s[r.kind], &total}) {
      t->bb += r.bytes_s * r.bytes_s;
      t->bl += r.bytes_s * r.latency_s;
      t->ll += r.latency_s * r.latency_s;
      t->by += r.bytes_s * r.measured_s;
      t->ly += r.latency_s * r.measured_s;
      t->b += r.bytes_s;
      t->l += r.latency_s;
      t->y += r.measured_s;
      ++t->n;
      if (r.bytes_s > 0) {
        t->lo = std::min(t->lo, r.latency_s / r.bytes_s);
        t->hi = std::max(t->hi, r.latency_s / r.bytes_s);
      }
    }
  }
  if (total.b <= 0) return fit;
  auto spread = [](const Sums& t) { return t.lo > 0 ? t.hi / t.lo : INFINITY; };
  // Latency separates where some kind's own rows differ in calls per byte (each kind has
  // its own bandwidth: rows of different kinds do not tell the two apart).
  double widest = 0;
  for (const Sums& t : s) {
    if (t.n >= 2) widest = std::max(widest, spread(t));
  }
  bool kinds = false;  // rows per kind
  for (int k = 0; k < kRingKinds; ++k) kinds = kinds || s[k].n > 0;
  const std::string over = std::to_string(rows.size()) +
                           (kinds ? " measurements (a group's collective kind each) of " : " groups of ") +
                           std::to_string(runs) + " runs";
  double a[kAllKinds + 1] = {1, 1, 1, 1};  // 1 / each bandwidth factor
  if (latency_allowed && widest >= kLatencySeparation) {
    // The normal equations: a[j] = (by_j - bl_j z) / bb_j for each j, and into z's.
    double zz = total.ll, zy = total.ly;
    for (const Sums& t : s) {
      if (t.n == 0 || t.bb <= 0) continue;
      zz -= t.bl * t.bl / t.bb;
      zy -= t.bl * t.by / t.bb;
    }
    const double z = zy / zz;
    int bad = -1;
    for (int j = 0; j <= kAllKinds; ++j) {
      if (s[j].n == 0 || s[j].bb <= 0) continue;
      a[j] = (s[j].by - s[j].bl * z) / s[j].bb;
      if (!(a[j] > 0) && bad < 0) bad = j;
    }
    if (bad >= 0 || !(z > 0)) {
      return Status::invalid_input(
          files + ": the least-squares fit of " + l.name + " over " + over + " gives " +
          (bad < 0 ? "a per-call latency of " + fmt("%.4g", z * l.latency_s * 1e6) + " us"
                   : "a bandwidth of " + fmt("%.4g", l.bytes_per_s * l.efficiency / a[bad] / 1e9) + " GB/s" +
                         (kinds ? " for " + std::string(kind_label(bad)) : "")) +
          ": their communication times are not bytes / bandwidth + calls x latency (a noisy or "
          "loaded run?); rerun them, or calibrate from one run. The groups:\n" + *notes);
    }
    fit.latency = z;
    fit.bandwidth = s[kAllKinds].n > 0 ? 1 / a[kAllKinds] : total.b / (total.y - z * total.l);
    if (!(fit.bandwidth > 0)) {
      return Status::invalid_input(files + ": the least-squares fit of " + l.name + " over " + over +
                                   " gives a per-call latency of " + fmt("%.4g", z * l.latency_s * 1e6) +
                                   " us, more than the groups' measured time: rerun them, or calibrate "
                                   "from one run. The groups:\n" + *notes);
    }
    *notes += bandwidth_note(l, fit.bandwidth) + ", per-call latency x " + fmt("%.4g", z) + " (" +
              fmt("%.4g", l.latency_s * 1e6) + " -> " + fmt("%.4g", l.latency_s * z * 1e6) +
              " us), least squares over " + over + " (calls per byte " + fmt("%.3g", widest) + "x apart)\n";
  } else {
    // Bandwidth only: the pooled figure of all the rows; a kind's own where its bytes,
    // not its calls' fixed costs, make most of its time.
    const std::string why = runs < 2          ? ""
                            : rows.size() < 2 ? "one group measured it"
                            : widest == 0     ? "no collective kind was measured by two groups"
                                              : "the runs' calls per byte are within " + fmt("%.3g", widest) +
                                                    "x of each other";
    const double bytes_measured = total.y - total.l;
    if (bytes_measured < 0.1 * total.y) {
      *notes += l.name + ": not fitted (the per-call latency accounts for " +
                fmt("%.0f", 100 * total.l / total.y) + "% of the measured time" +
                (why.empty() ? "" : ", and " + why) + ")\n";
      return fit;
    }
    fit.bandwidth = total.b / bytes_measured;
    for (int j = 0; j < kRingKinds; ++j) {
      const double bm = s[j].y - s[j].l;
      if (s[j].n > 0 && bm < 0.1 * s[j].y) {
        *notes += l.name + " " + kind_label(j) + ": not fitted apart (the per-call latency accounts for " +
                  fmt("%.0f", 100 * s[j].l / s[j].y) + "% of its measured time)\n";
        s[j].n = 0;  // keeps its share
      }
      a[j] = s[j].n > 0 ? bm / s[j].b : 1 / fit.bandwidth;
    }
    *notes += bandwidth_note(l, fit.bandwidth) +
              (why.empty() ? "" : ", bandwidth only over " + over + ": " + why +
                                      ", which does not separate a per-call latency (kept at " +
                                      fmt("%.4g", l.latency_s * 1e6) + " us)") +
              (kinds ? " (all the measured bytes together)" : "") + "\n";
  }
  for (int j = 0; j < kRingKinds; ++j) {
    if (s[j].n == 0) continue;
    const size_t i = static_cast<size_t>(j);
    fit.kind[i] = 1 / a[j] / fit.bandwidth;
    *notes += l.name + " " + kind_label(j) + ": " +
              fmt("%.4g", l.kind_bytes_per_s(static_cast<CollectiveKind>(j)) * fit.bandwidth * fit.kind[i] / 1e9) +
              " GB/s, its share of the link's " + fmt("%.4g", l.share[i]) + " -> " +
              fmt("%.4g", l.share[i] * fit.kind[i]) + " (from " + std::to_string(s[j].n) +
              (s[j].n == 1 ? " measurement)\n" : " measurements)\n");
  }
  return fit;
}

// `hw` with both links fitted (the cpu's one link stands for both).
Hardware apply_links(Hardware hw, const LinkFit fit[2]) {
  for (int k = 0; k < kRingKinds; ++k) {
    hw.intra_node.share[static_cast<size_t>(k)] *= fit[0].kind[static_cast<size_t>(k)];
    hw.inter_node.share[static_cast<size_t>(k)] *= fit[1].kind[static_cast<size_t>(k)];
  }
  return scale_latency(scale_links(hw, fit[0].bandwidth, fit[1].bandwidth), fit[0].latency, fit[1].latency);
}

// The fitted links' factors into `c` (each dimension's from the first run's plan).
void record_links(const PlanResult& first, const Hardware& hw, const LinkFit fit[2], Calibration* c) {
  c->tp_link_factor = fit[link_index(first, ParallelDim::kTp, hw)].bandwidth;
  c->dp_link_factor = fit[link_index(first, ParallelDim::kDp, hw)].bandwidth;
  c->cp_link_factor = fit[link_index(first, ParallelDim::kCp, hw)].bandwidth;
  c->intra_latency_factor = fit[0].latency;
  c->inter_latency_factor = hw.is_cpu ? fit[0].latency : fit[1].latency;
  c->intra_kind_factor = fit[0].kind;
  c->inter_kind_factor = hw.is_cpu ? fit[0].kind : fit[1].kind;
}

Hardware doubled_links(Hardware hw) {
  hw.intra_node.bytes_per_s *= 2;
  hw.inter_node.bytes_per_s *= 2;
  return hw;
}

// The root in [lo, hi] of a quantity that falls as x grows, by `halvings` bisections in
// log space: `above(x)` says whether the quantity at x is still above its target.
template <typename Above>
double bisect_log(double lo, double hi, int halvings, Above above) {
  for (int i = 0; i < halvings; ++i) {
    const double mid = std::sqrt(lo * hi);
    (above(mid) ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

std::string file_list(const std::vector<CalibrationRun>& runs) {
  std::string out;
  for (const CalibrationRun& r : runs) out += (out.empty() ? "" : ", ") + r.run.path;
  return out;
}

// The ranks' arrival skew (Hardware::arrival_skew) that `hw` (its links and compute
// fitted) needs for the runs' measured skew: per run whose file gives each collective's
// least time and the least totals (has_kinds, has_least), and per group (tp; dp with the
// tied embedding, with overlap off) whose plan waits between compute, the least total
// less the sum of each collective's least (what the ranks waited for each other beyond
// the transfers), against the plan's skew at arrival_skew 1; the ratio of the sums (the
// plan's skew is proportional to it), in [0, kMaxSkew]. Returns whether some run measured
// it (else `*skew` is left); `*note` says what it was fitted from.
bool fit_arrival_skew(const std::vector<CalibrationRun>& runs, const PlanOptions& options,
                      const Hardware& hw, double* skew, std::string* note) {
  constexpr double kMaxSkew = 0.5;
  Hardware unit = hw;
  unit.arrival_skew = 1;
  double measured = 0, planned = 0;
  std::string files;
  for (const CalibrationRun& r : runs) {
    const MeasuredRun& m = r.run;
    if (!m.has_kinds || !m.has_least) continue;
    const PlanResult p = evaluate_on(r.config, options, unit);
    double sum_tp = 0, sum_dp = 0;
    for (size_t k = 0; k < kRingKinds; ++k) {
      sum_tp += m.tp_kinds[k];
      sum_dp += m.dp_kinds[k];
    }
    bool used = false;
    if (p.tp_skew_s > 0) {
      measured += std::max(0.0, m.total_least.tp - sum_tp);
      planned += p.tp_skew_s;
      used = true;
    }
    // dp with overlap on: its hidden time includes the communication threads' skew, which
    // the compute thread does not wait for; only blocking dp measures the compute's.
    const bool dp_blocking = !r.config.parallel.overlap_grad_reduce &&
                             !(r.config.parallel.zero_stage == 3 && r.config.parallel.overlap_param_gather);
    if (dp_blocking && p.dp_skew_s > 0) {
      measured += std::max(0.0, m.total_least.dp + m.total_least.embedding - sum_dp);
      planned += p.dp_skew_s;
      used = true;
    }
    if (used) files += (files.empty() ? "" : ", ") + m.path;
  }
  if (planned <= 0) return false;
  *skew = std::min(kMaxSkew, measured / planned);
  *note = "arrival skew (" + files + "): " + fmt("%.4g", *skew) +
          " s waited per s of compute between a group's waits (the least totals less "
          "each collective's least: " + fmt("%.4g", measured * 1e3) + " ms, against " +
          fmt("%.4g", planned * 1e3) + " ms planned at 1, summed over the runs)\n";
  return true;
}

// The compute factor and the arrival skew fitted together: the skew at the compute
// `factor` gave, the factor again with it (`fit_compute` at *base), three times (the step
// holds the skew, the skew is in proportion to the compute's seconds). Without a run that
// measures the skew, `factor` and *base as they are.
template <typename FitCompute>
Result<double> with_arrival_skew(const std::vector<CalibrationRun>& runs, const PlanOptions& options,
                                 FitCompute fit_compute, double factor, Hardware* base,
                                 std::string* notes) {
  std::string note;
  for (int pass = 0; pass < 3; ++pass) {
    double skew = base->arrival_skew;
    if (!fit_arrival_skew(runs, options, scale_compute(*base, factor), &skew, &note)) return factor;
    base->arrival_skew = skew;
    TRIDENT_ASSIGN_OR_RETURN(factor, fit_compute());
  }
  *notes += note;
  return factor;
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
  run.has_kinds = std::all_of(steps.begin(), steps.end(), [](const nlohmann::json& s) {
    return s.contains("comm_kind_least_ms") && s["comm_kind_least_ms"].is_object();
  });
  std::vector<double> tp_kinds[kRingKinds], dp_kinds[kRingKinds];
  for (const nlohmann::json& s : steps) {
    step_s.push_back(s["step_ms"].get<double>() / 1e3);
    if (run.has_kinds) {
      // Seconds of `kind` in `group`'s entry (0 where the entry or the kind is absent).
      const nlohmann::json& kinds = s["comm_kind_least_ms"];
      auto ms = [&](const char* group, int kind) {
        if (!kinds.contains(group) || !kinds[group].is_object()) return 0.0;
        return kinds[group].value(collective_name(static_cast<CollectiveKind>(kind)), 0.0) / 1e3;
      };
      for (int k = 0; k < kRingKinds; ++k) {
        tp_kinds[k].push_back(ms("tp", k));
        dp_kinds[k].push_back(ms("dp", k) + ms("embedding", k));
      }
    }
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
  if (run.has_kinds) {
    for (int k = 0; k < kRingKinds; ++k) {
      run.tp_kinds[static_cast<size_t>(k)] = median(tp_kinds[k]);
      run.dp_kinds[static_cast<size_t>(k)] = median(dp_kinds[k]);
    }
  }
  return run;
}

Result<Calibration> calibrate(const Config& config, const PlanOptions& options,
                              const MeasuredRun& run) {
  Calibration c;
  c.before = evaluate_layout(config, options);
  const Hardware& hw = options.hardware;
  // Links: each group's bytes and latency terms (per kind where the file has them),
  // pooled per link, against what the group measured.
  const PlanResult fast = evaluate_on(config, options, doubled_links(hw));
  std::vector<LinkRow> rows[2];  // intra, inter
  add_rows(c.before, fast, run, hw, false, rows, &c.notes);
  LinkFit fit[2];
  for (int k = 0; k < 2; ++k) {
    TRIDENT_ASSIGN_OR_RETURN(fit[k], fit_link(rows[k], k == 1 ? hw.inter_node : hw.intra_node, false, 1,
                                              run.path, &c.notes));
  }
  record_links(c.before, hw, fit, &c);
  const Hardware linked = apply_links(hw, fit);
  // Compute: the one factor whose predicted step is the measured one (the step falls as
  // the factor grows; bisection in log space).
  Hardware base = linked;
  auto fit_compute = [&]() -> Result<double> {
    auto step = [&](double f) { return evaluate_on(config, options, scale_compute(base, f)).step_time_s; };
    double lo = 1e-4, hi = 1e4;
    TRIDENT_RETURN_IF_ERROR(compute_reachable(run, step(hi), step(lo)));
    return bisect_log(lo, hi, 80, [&](double f) { return step(f) > run.step_s; });
  };
  TRIDENT_ASSIGN_OR_RETURN(c.compute_factor, fit_compute());
  TRIDENT_ASSIGN_OR_RETURN(c.compute_factor,
                           with_arrival_skew({CalibrationRun{config, run}}, options, fit_compute,
                                             c.compute_factor, &base, &c.notes));
  c.hardware = scale_compute(base, c.compute_factor);
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

// The links and the compute factor fitted to `runs` (calibrate_runs without the overlap
// rates).
Result<Calibration> fit_links_and_compute(const std::vector<CalibrationRun>& runs,
                                          const PlanOptions& options) {
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
  const Hardware doubled = doubled_links(hw);
  std::vector<LinkRow> rows[2];  // intra, inter
  for (const CalibrationRun& r : runs) {
    const PlanResult before = evaluate_layout(r.config, options);
    c.runs_before.push_back(before);
    add_rows(before, evaluate_on(r.config, options, doubled), r.run, hw, true, rows, &c.notes);
  }
  LinkFit fit[2];
  for (int k = 0; k < 2; ++k) {
    TRIDENT_ASSIGN_OR_RETURN(fit[k], fit_link(rows[k], k == 1 ? hw.inter_node : hw.intra_node, true,
                                              runs.size(), file_list(runs), &c.notes));
  }
  record_links(c.runs_before[0], hw, fit, &c);
  Hardware base = apply_links(hw, fit);
  // Compute: every run's step must be reachable by some factor; then the factor with
  // the least sum of squared step errors. Each step falls as the factor grows, so the
  // sum is unimodal in log f: golden-section search.
  auto fit_compute = [&]() -> Result<double> {
    auto step = [&](const CalibrationRun& r, double f) {
      return evaluate_on(r.config, options, scale_compute(base, f)).step_time_s;
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
    return std::exp(0.5 * (a + b));
  };
  TRIDENT_ASSIGN_OR_RETURN(c.compute_factor, fit_compute());
  TRIDENT_ASSIGN_OR_RETURN(c.compute_factor,
                           with_arrival_skew(runs, options, fit_compute, c.compute_factor, &base, &c.notes));
  c.hardware = scale_compute(base, c.compute_factor);
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

// CPU ranks on shared cores: whether `r`'s plan depends on the overlap rates (a run with
// overlap on whose threads outnumber the cores; plan.cpp cpu_comm_rate_in_compute).
bool rates_matter(const CalibrationRun& r, const PlanOptions& options) {
  if (!options.hardware.is_cpu) return false;
  Hardware slow = options.hardware, fast = options.hardware;
  slow.overlap_comm_rate = slow.overlap_compute_rate = 0.01;
  fast.overlap_comm_rate = fast.overlap_compute_rate = 1;
  const PlanResult a = evaluate_on(r.config, options, slow), b = evaluate_on(r.config, options, fast);
  return a.dp_s != b.dp_s || a.step_time_s != b.step_time_s;
}

// The run's measured dp waits (the least of the group's ranks where the file has it).
double measured_dp_waits(const MeasuredRun& m) {
  const GroupSeconds& e = m.has_least ? m.exposed_least : m.exposed;
  return e.dp + e.embedding;
}

}  // namespace

Result<Calibration> calibrate_runs(const std::vector<CalibrationRun>& runs, const PlanOptions& options) {
  if (runs.empty()) return Status::invalid_input("calibration: no metrics file given");
  // Runs with overlap on CPU ranks on shared cores time the overlap rates; the others the
  // links and the compute. Where runs of both kinds are given and a run with overlap off
  // has a dp group (so that the dp link is fitted without the overlapped runs), each kind
  // fits its own figures; else every run fits the links and the compute, and the rates
  // keep the table's.
  std::vector<CalibrationRun> blocking, overlapped;
  bool blocking_dp = false;
  for (const CalibrationRun& r : runs) {
    const bool rates = rates_matter(r, options);
    (rates ? overlapped : blocking).push_back(r);
    blocking_dp |= !rates && r.config.parallel.dp * r.config.parallel.cp > 1;
  }
  if (!blocking_dp || overlapped.empty()) return fit_links_and_compute(runs, options);
  TRIDENT_ASSIGN_OR_RETURN(Calibration c, fit_links_and_compute(blocking, options));
  // The overlapped runs' summed waits and steps against the plan's, at the links and
  // compute just fitted: for a compute rate r, the collective's rate x whose planned waits
  // are the measured ones (the waits fall as x grows); then the r whose planned step is the
  // measured one (the slowdown falls as r grows). Bisection in log space for both.
  double waits = 0, steps = 0;
  for (const CalibrationRun& r : overlapped) {
    waits += measured_dp_waits(r.run);
    steps += r.run.step_s;
  }
  auto planned = [&](double comm, double compute) {
    Hardware hw = c.hardware;
    hw.overlap_comm_rate = comm;
    hw.overlap_compute_rate = compute;
    std::pair<double, double> sum{0, 0};
    for (const CalibrationRun& r : overlapped) {
      const PlanResult p = evaluate_on(r.config, options, hw);
      sum.first += p.dp_s;
      sum.second += p.step_time_s;
    }
    return sum;
  };
  constexpr double kLeast = 1e-3;  // the slowest collective's rate fitted
  constexpr int kHalvings = 30;
  // The compute keeps at least the threads' share of the cores while a collective is in
  // flight (a communication thread that took a whole core would leave it that): a step
  // longer than the plan's at that share is not the overlap's, and the rate stops there.
  double least_compute = 1;
  for (const CalibrationRun& r : overlapped) {
    least_compute = std::min(least_compute, cpu_thread_share_in_flight(r.config, options));
  }
  auto comm_rate = [&](double compute) {
    if (planned(1, compute).first >= waits) return 1.0;
    if (planned(kLeast, compute).first <= waits) return kLeast;
    return bisect_log(kLeast, 1, kHalvings, [&](double x) { return planned(x, compute).first > waits; });
  };
  auto step_above = [&](double compute) { return planned(comm_rate(compute), compute).second > steps; };
  double compute = 1;
  if (planned(comm_rate(1), 1).second < steps) {
    compute = step_above(least_compute) ? bisect_log(least_compute, 1, kHalvings, step_above)
                                        : least_compute;
  }
  c.hardware.overlap_comm_rate = comm_rate(compute);
  c.hardware.overlap_compute_rate = compute;
  const auto fitted = planned(c.hardware.overlap_comm_rate, compute);
  c.notes += "overlap on shared cores (" + file_list(overlapped) + "): a dp collective beside compute at " +
             fmt("%.4g", c.hardware.overlap_comm_rate) + " of its speed, the compute at " +
             fmt("%.4g", compute) + " of its speed while one is in flight; dp waits measured " +
             fmt("%.4g", waits * 1e3) + " ms, planned " + fmt("%.4g", fitted.first * 1e3) +
             " ms; step measured " + fmt("%.4g", steps * 1e3) + " ms, planned " +
             fmt("%.4g", fitted.second * 1e3) + " ms (summed over the runs)\n";
  // Every run's plan before and after, in the order given.
  c.runs_before.clear();
  c.runs_after.clear();
  for (const CalibrationRun& r : runs) {
    c.runs_before.push_back(evaluate_layout(r.config, options));
    c.runs_after.push_back(evaluate_on(r.config, options, c.hardware));
  }
  c.before = c.runs_before[0];
  c.after = c.runs_after[0];
  return c;
}

}  // namespace trident
