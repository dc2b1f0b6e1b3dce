// `trident plan --config FILE --devices N [--gpu NAME] [--gpus-per-node K] [--cores N] [--json]
//  [--rows R] [--hardware FILE] [--selective-reruns WHAT] [--set section.key=value ...]`: the memory, traffic and
// time of every layout of the config's model and batch on N devices (plan/plan.h;
// docs/PLAN.md). Prints the ranked table and the recommendation, or with --json the one
// object of docs/PLAN.md "JSON". Exit 0; 2 for bad usage, a config that does not load, an unknown
// GPU, or a configured layout that does not fit (the table is printed first).
// `trident plan --calibrate METRICS [--calibrate-set k=v ...] [--calibrate METRICS2 ...]
//  --config FILE --write-hardware OUT [--gpu NAME] [--hardware IN]`: fits the hardware table
// to one or more runs' metrics files (plan/calibrate.h; each run's layout: --config, --set,
// then its own --calibrate-set) and writes the fitted table (docs/PLAN.md "Calibration").
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "config/config.h"
#include "config/dp_auto.h"
#include "kernels/ops.h"
#include "plan/calibrate.h"
#include "plan/hardware.h"
#include "plan/memory_plan.h"
#include "plan/plan.h"

namespace trident {

namespace {

void print_plan_usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: trident plan --config FILE --devices N [--gpu NAME] [--gpus-per-node K] [--json]\n"
      "  --config FILE            the run's YAML config (model, batch, precision, layout)\n"
      "  --devices N              devices to plan for (N >= 1)\n"
      "  --gpu NAME               a GPU of the hardware file (h100, h200, a100, b200) or cpu\n"
      "                           (this machine: its measured sgemm peak); default h100\n"
      "  --gpus-per-node K        GPUs per node (default 8; cpu: N, one machine)\n"
      "  --cores N                with --gpu cpu: the cores the ranks share (default: this\n"
      "                           machine's), so that the plan does not depend on the machine\n"
      "  --json                   print one JSON object instead of the table\n"
      "  --rows R                 table rows besides the configured layout (default 20)\n"
      "  --hardware FILE          the hardware table (default configs/hardware.yaml)\n"
      "  --set section.key=value  overrides one config key, as for train\n"
      "  --configured-only        evaluate the config's layout only (no search, no ranking)\n"
      "  --selective-reruns WHAT  what training.recompute selective reruns: attention-core\n"
      "                           (Trident's, the default) or torchtitan-op (torchtitan's\n"
      "                           op-level policy: every other matmul and the elementwise ops)\n"
      "calibration: trident plan --calibrate METRICS.jsonl [--calibrate-set k=v ...]\n"
      "             [--calibrate METRICS2.jsonl [--calibrate-set k=v ...] ...]\n"
      "             --config FILE --write-hardware OUT [--gpu NAME] [--hardware IN]\n"
      "             [--devices N] [--set ...]\n"
      "  --calibrate METRICS      fit the hardware table's compute efficiencies and the tp/dp\n"
      "                           links' bandwidth to the run that wrote METRICS (trident train's\n"
      "                           logging.metrics file; --config: the config it trained with).\n"
      "                           Repeat it for several runs on the same devices: with runs\n"
      "                           whose calls per byte on a link differ, the link's per-call\n"
      "                           latency is fitted too (least squares), else its bandwidth alone\n"
      "  --calibrate-set k=v      a config override of the preceding --calibrate's run only (its\n"
      "                           layout: parallel.zero_stage=3, ...), applied after every --set\n"
      "  --write-hardware OUT     where the fitted table goes (YAML, for --hardware; with\n"
      "                           --gpu cpu it holds a cpu entry that --gpu cpu then uses)\n"
      "exit codes: 0 done, 2 bad usage/config/input or the configured layout does not fit\n");
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "trident plan: %s\n", message.c_str());
  print_plan_usage(stderr);
  return 2;
}

int fail(const Status& st) {
  std::fprintf(stderr, "trident plan: %s\n", st.message().c_str());
  return st.exit_code();
}

bool parse_positive(const std::string& text, int* out) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1 || v > (1 << 30)) return false;
  *out = static_cast<int>(v);
  return true;
}

// One --calibrate METRICS and the --calibrate-set overrides that follow it.
struct CalibrateSpec {
  std::string metrics;
  std::vector<std::string> overrides;
};

// The run's measured times against the plan's before and after the fit.
void print_run_rows(const MeasuredRun& m, const PlanResult& before, const PlanResult& after) {
  std::printf("# %-22s %12s %12s %12s\n", "ms per step", "measured", "plan before", "plan after");
  struct Row {
    const char* what;
    double measured, before, after;
  };
  std::vector<Row> rows = {
      {"step", m.step_s, before.step_time_s, after.step_time_s},
      {"tp exposed", m.exposed.tp, before.tp_s, after.tp_s},
      {"pp exposed", m.exposed.pp, before.pp_s + before.bubble_s, after.pp_s + after.bubble_s},
      {"dp exposed", m.exposed.dp + m.exposed.embedding, before.dp_s, after.dp_s},
      {"dp all (exp + hidden)", m.exposed.dp + m.hidden.dp + m.exposed.embedding + m.hidden.embedding,
       before.dp_comm_s, after.dp_comm_s}};
  if (m.has_least) {  // the least over each group's ranks (what the fit uses; above: rank 0's)
    const GroupSeconds& e = m.exposed_least;
    const GroupSeconds& t = m.total_least;
    rows.push_back({"tp exposed, least rank", e.tp, before.tp_s, after.tp_s});
    rows.push_back({"dp exposed, least rank", e.dp + e.embedding, before.dp_s, after.dp_s});
    rows.push_back({"dp all, least rank", t.dp + t.embedding, before.dp_comm_s, after.dp_comm_s});
  }
  // Each collective kind's least time where the file has it (comm_kind_least_ms), against
  // the plan's time of that kind.
  static const char* const kTp[kRingKinds] = {"tp all_reduce", "tp reduce_scatter", "tp all_gather"};
  static const char* const kDp[kRingKinds] = {"dp all_reduce", "dp reduce_scatter", "dp all_gather"};
  for (int k = 0; m.has_kinds && k < kRingKinds; ++k) {
    const size_t i = static_cast<size_t>(k);
    if (m.tp_kinds[i] > 0 || before.tp_terms.of(i) > 0) {
      rows.push_back({kTp[k], m.tp_kinds[i], before.tp_terms.of(i), after.tp_terms.of(i)});
    }
    if (m.dp_kinds[i] > 0 || before.dp_terms.of(i) > 0) {
      rows.push_back({kDp[k], m.dp_kinds[i], before.dp_terms.of(i), after.dp_terms.of(i)});
    }
  }
  for (const Row& r : rows) {
    std::printf("  %-22s %12.2f %12.2f %12.2f\n", r.what, 1e3 * r.measured, 1e3 * r.before, 1e3 * r.after);
  }
}

// --calibrate: fit, report measured against predicted before and after, write the table
// with the fitted entry (the GPU's efficiencies and its links', or the cpu entry).
int calibrate_and_write(const std::vector<CalibrationRun>& runs, const PlanOptions& options,
                        HardwareTable table, const std::string& out_path) {
  auto fit = calibrate_runs(runs, options);
  if (!fit.is_ok()) return fail(fit.status());
  const Calibration& c = fit.value();
  std::string sources;
  for (size_t i = 0; i < runs.size(); ++i) {
    const MeasuredRun& m = runs[i].run;
    const std::string layout = layout_name(config_layout(runs[i].config));
    if (runs.size() == 1) {
      std::printf("# calibration of %s from %s (%d steps, %d used), layout %s\n",
                  options.hardware.name.c_str(), m.path.c_str(), m.steps, m.steps_used, layout.c_str());
    } else {
      std::printf("# calibration of %s, run %zu of %zu: %s (%d steps, %d used), layout %s\n",
                  options.hardware.name.c_str(), i + 1, runs.size(), m.path.c_str(), m.steps,
                  m.steps_used, layout.c_str());
    }
    print_run_rows(m, c.runs_before[i], c.runs_after[i]);
    sources += (i ? "\n" : "") + m.path + " --config <the run's config> (layout " + layout + ", " +
               std::to_string(options.devices) + " x " + c.hardware.name + ")";
  }
  std::printf("%s", c.notes.c_str());
  const Hardware& hw = c.hardware;
  if (hw.is_cpu) {
    table.cpu = hw;
    table.has_cpu = true;
  } else {
    for (Hardware& g : table.gpus) {
      if (g.name == hw.name) g = hw;
    }
    for (LinkSpec& l : table.links) {
      if (l.name == hw.intra_node.name) l = hw.intra_node;
      if (l.name == hw.inter_node.name) l = hw.inter_node;
    }
    // Every GPU on a fitted link sees the fitted figure.
    for (Hardware& g : table.gpus) {
      for (LinkSpec* l : {&g.intra_node, &g.inter_node}) {
        for (const LinkSpec& t : table.links) {
          if (t.name == l->name) *l = t;
        }
      }
    }
  }
  const std::string header =
      "Hardware for `trident plan` (docs/PLAN.md), calibrated by trident plan --calibrate\n" +
      sources + ".\n" + c.notes;
  std::ofstream out(out_path, std::ios::binary | std::ios::trunc);
  out << hardware_table_yaml(table, header);
  out.close();
  if (!out) {
    return fail(Status::io_error(out_path + ": cannot write the hardware file: " + std::strerror(errno)));
  }
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  std::string config_path, gpu = "h100", hardware_path, devices_text, per_node_text;
  std::string write_hardware_path, selective_text, cores_text;
  std::vector<CalibrateSpec> calibrations;
  std::vector<std::string> overrides;
  bool json = false, configured_only = false;
  int rows = 20;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&](std::string* dst) {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) return false;
      *dst = args[++i];
      return true;
    };
    std::string v;
    if (flag == "--help" || flag == "-h") {
      print_plan_usage(stdout);
      return 0;
    } else if (flag == "--config") {
      if (!value(&config_path)) return usage_error("--config needs a file");
    } else if (flag == "--devices") {
      if (!value(&devices_text)) return usage_error("--devices needs a number of devices (>= 1)");
    } else if (flag == "--gpu") {
      if (!value(&gpu)) return usage_error("--gpu needs a name");
    } else if (flag == "--cores") {
      if (!value(&cores_text)) return usage_error("--cores needs a number of cores (>= 1)");
    } else if (flag == "--gpus-per-node") {
      if (!value(&per_node_text)) return usage_error("--gpus-per-node needs a number (>= 1)");
    } else if (flag == "--hardware") {
      if (!value(&hardware_path)) return usage_error("--hardware needs a file");
    } else if (flag == "--calibrate") {
      if (!value(&v)) return usage_error("--calibrate needs a metrics file");
      for (const CalibrateSpec& c : calibrations) {
        if (c.metrics == v) return usage_error("--calibrate " + v + ": given twice");
      }
      calibrations.push_back({v, {}});
    } else if (flag == "--calibrate-set") {
      if (!value(&v)) return usage_error("--calibrate-set needs section.key=value");
      if (calibrations.empty()) {
        return usage_error("--calibrate-set " + v + ": goes after the --calibrate METRICS it applies to");
      }
      calibrations.back().overrides.push_back(v);
    } else if (flag == "--write-hardware") {
      if (!value(&write_hardware_path)) return usage_error("--write-hardware needs a file");
    } else if (flag == "--rows") {
      if (!value(&v) || !parse_positive(v, &rows)) return usage_error("--rows needs a number >= 1");
    } else if (flag == "--set") {
      if (!value(&v)) return usage_error("--set needs section.key=value");
      overrides.push_back(v);
    } else if (flag == "--json") {
      json = true;
    } else if (flag == "--configured-only") {
      configured_only = true;
    } else if (flag == "--selective-reruns") {
      if (!value(&selective_text)) return usage_error("--selective-reruns needs attention-core or torchtitan-op");
    } else {
      return usage_error("unknown option '" + flag + "'");
    }
  }
  const bool calibrating = !calibrations.empty();
  if (calibrating != !write_hardware_path.empty()) {
    return usage_error("--calibrate and --write-hardware go together");
  }
  if (config_path.empty()) return usage_error("--config is required");
  if (devices_text.empty() && !calibrating) {
    return usage_error("--devices is required (the number of devices)");
  }
  PlanOptions options;
  if (!devices_text.empty() && !parse_positive(devices_text, &options.devices)) {
    return usage_error("--devices: expected a number >= 1, got '" + devices_text + "'");
  }
  if (!selective_text.empty() && !parse_selective_reruns(selective_text, &options.selective_reruns)) {
    return usage_error("--selective-reruns: expected attention-core or torchtitan-op, got '" +
                       selective_text + "'");
  }
  auto config = load_config(config_path, overrides);
  if (!config.is_ok()) return fail(config.status());
  if (options.selective_reruns == SelectiveReruns::kTorchtitanOp && config->model.moe()) {
    return usage_error("--selective-reruns torchtitan-op: dense models only (" + config_path +
                       " has model.moe_experts > 0)");
  }
  const bool dp_auto = config->parallel.dp == kDpAuto;
  Status auto_error;
  if (dp_auto) {
    // dp: auto on --devices; where it does not resolve, the configured layout cannot run
    // on them (its error is resolve_auto_dp's) and the search runs from dp 1.
    auto_error = resolve_auto_dp(&config.value(), std::max(options.devices, 1));
    if (!auto_error.is_ok()) config->parallel.dp = 1;
  }
  // Each run's config: --set, then its own --calibrate-set (dp: auto on --devices).
  std::vector<Config> run_configs;
  for (const CalibrateSpec& spec : calibrations) {
    if (spec.overrides.empty()) {
      run_configs.push_back(config.value());
      continue;
    }
    std::vector<std::string> all = overrides;
    all.insert(all.end(), spec.overrides.begin(), spec.overrides.end());
    auto own = load_config(config_path, all);
    if (!own.is_ok()) return fail(own.status());
    if (own->parallel.dp == kDpAuto) {
      const Status st = resolve_auto_dp(&own.value(), std::max(options.devices, 1));
      if (!st.is_ok()) return fail(st);
    }
    run_configs.push_back(std::move(own.value()));
  }
  if (calibrating) {
    // The (first) run's own layout on the devices it ran on.
    const int64_t world = run_configs[0].parallel.world_size_wide();
    if (devices_text.empty()) options.devices = static_cast<int>(world);
    if (options.devices != world) {
      return usage_error("--calibrate: --devices " + std::to_string(options.devices) +
                         " is not the config's dp x tp x pp = " + std::to_string(world));
    }
  }

  // The table: needed for a GPU, and for the cpu when --hardware names one (its cpu
  // entry, if calibrated, replaces the measured figures) or a calibration writes it.
  HardwareTable table;
  if (gpu != "cpu" || !hardware_path.empty() || calibrating) {
    auto loaded = load_hardware_table(hardware_path.empty() ? default_hardware_path() : hardware_path);
    if (!loaded.is_ok()) return fail(loaded.status());
    table = std::move(loaded.value());
  }
  if (gpu == "cpu") {
    // This machine: the CPU backend's measured sgemm rate (or the table's calibrated cpu
    // entry) and the memory the ranks share.
    auto memory = available_host_memory();
    if (!memory.is_ok()) return fail(memory.status());
    if (table.has_cpu) {
      options.hardware = table.cpu;
      options.hardware.memory_bytes = memory->bytes;
    } else {
      const std::unique_ptr<Ops> ops = make_cpu_ops(config->runtime.threads);
      const double peak =
          config->runtime.peak_tflops > 0 ? config->runtime.peak_tflops * 1e12 : ops->peak_flops();
      options.hardware = cpu_hardware(peak, memory->bytes);
    }
    options.gpus_per_node = options.devices;
    options.attention_state_bytes = [](int B, int T, int NH, int NKV, int HD, DType dtype) {
      static const std::unique_ptr<Ops> cpu = make_cpu_ops(1);
      return cpu->attention_state_bytes(B, T, NH, NKV, HD, dtype);
    };
  } else {
    auto hw = find_gpu(table, gpu);
    if (!hw.is_ok()) return fail(hw.status());
    options.hardware = hw.value();
    options.attention_state_bytes = gpu_attention_state_bytes;
    // The CUDA backend's TRIDENT_ATTENTION=plain (kernels/cuda/cuda_ops.cpp): the run's
    // attention takes the plain path for every shape, in memory and in time.
    const char* attention = std::getenv("TRIDENT_ATTENTION");
    if (attention != nullptr && std::string(attention) == "plain") {
      options.plain_attention = true;
      options.attention_state_bytes = gpu_plain_attention_state_bytes;
    }
  }
  // The trainer's TRIDENT_RING_OVERLAP (parallel/context_parallel.h): 0 runs the cp ring
  // blocking, and plan then counts all of its exchanges as exposed.
  if (const char* ring = std::getenv("TRIDENT_RING_OVERLAP"); ring != nullptr && *ring != 0) {
    const std::string value = ring;
    if (value != "0" && value != "1") {
      return fail(Status::invalid_input("TRIDENT_RING_OVERLAP='" + value +
                                        "': must be 1 (overlap, the default) or 0"));
    }
    options.ring_overlap = value == "1";
  }
  if (!cores_text.empty()) {
    if (gpu != "cpu") return usage_error("--cores goes with --gpu cpu (a GPU's plan has no cores)");
    if (!parse_positive(cores_text, &options.cpu_cores)) {
      return usage_error("--cores: expected a number >= 1, got '" + cores_text + "'");
    }
  }
  if (!per_node_text.empty() && !parse_positive(per_node_text, &options.gpus_per_node)) {
    return usage_error("--gpus-per-node: expected a number >= 1, got '" + per_node_text + "'");
  }
  if (calibrating) {
    std::vector<CalibrationRun> runs;
    for (size_t i = 0; i < calibrations.size(); ++i) {
      CalibrationRun r;
      r.config = run_configs[i];
      if (r.config.parallel.world_size_wide() != options.devices) {
        return usage_error("--calibrate " + calibrations[i].metrics + ": its layout's dp x tp x pp = " +
                           std::to_string(r.config.parallel.world_size_wide()) + ", not the " +
                           std::to_string(options.devices) +
                           " devices of the first: calibrate from runs on the same devices");
      }
      auto run = read_metrics(calibrations[i].metrics, options.devices, r.config.parallel);
      if (!run.is_ok()) return fail(run.status());
      r.run = std::move(run.value());
      runs.push_back(std::move(r));
    }
    return calibrate_and_write(runs, options, table, write_hardware_path);
  }
  options.configured_only = configured_only;
  auto plan = make_plan(config.value(), options);
  if (!plan.is_ok()) return fail(plan.status());
  plan->dp_auto = dp_auto;
  if (!auto_error.is_ok()) {
    plan->configured_error = auto_error.message();
    plan->configured_note.clear();
  }
  if (dp_auto && plan->configured_error.empty() && plan->configured_note.empty()) {
    plan->configured_note = "parallel.dp: auto is dp " + std::to_string(config->parallel.dp) +
                            " on " + std::to_string(options.devices) + " devices";
  }
  if (json) {
    std::printf("%s\n", plan_json(plan.value()).dump().c_str());
  } else {
    std::printf("%s", plan_table(plan.value(), rows).c_str());
  }
  std::fflush(stdout);
  const std::string misfit = configured_misfit(plan.value());
  if (!misfit.empty()) {
    std::fprintf(stderr, "trident plan: %s\n", misfit.c_str());
    return 2;
  }
  return 0;
}

}  // namespace trident
