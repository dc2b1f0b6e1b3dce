// `trident plan --config FILE --devices N [--gpu NAME] [--gpus-per-node K] [--json]
//  [--rows R] [--hardware FILE] [--set section.key=value ...]`: the memory, traffic and
// time of every layout of the config's model and batch on N devices (plan/plan.h;
// docs/PLAN.md). Prints the ranked table and the recommendation, or with --json the one
// object of docs/PLAN.md "JSON". Exit 0; 2 for bad usage, a config that does not load, an unknown
// GPU, or a configured layout that does not fit (the table is printed first).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "config/config.h"
#include "kernels/ops.h"
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
      "  --json                   print one JSON object instead of the table\n"
      "  --rows R                 table rows besides the configured layout (default 20)\n"
      "  --hardware FILE          the hardware table (default configs/hardware.yaml)\n"
      "  --set section.key=value  overrides one config key, as for train\n"
      "  --configured-only        evaluate the config's layout only (no search, no ranking)\n"
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

}  // namespace

int cmd_plan(const std::vector<std::string>& args) {
  std::string config_path, gpu = "h100", hardware_path, devices_text, per_node_text;
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
    } else if (flag == "--gpus-per-node") {
      if (!value(&per_node_text)) return usage_error("--gpus-per-node needs a number (>= 1)");
    } else if (flag == "--hardware") {
      if (!value(&hardware_path)) return usage_error("--hardware needs a file");
    } else if (flag == "--rows") {
      if (!value(&v) || !parse_positive(v, &rows)) return usage_error("--rows needs a number >= 1");
    } else if (flag == "--set") {
      if (!value(&v)) return usage_error("--set needs section.key=value");
      overrides.push_back(v);
    } else if (flag == "--json") {
      json = true;
    } else if (flag == "--configured-only") {
      configured_only = true;
    } else {
      return usage_error("unknown option '" + flag + "'");
    }
  }
  if (config_path.empty()) return usage_error("--config is required");
  if (devices_text.empty()) return usage_error("--devices is required (the number of devices)");
  PlanOptions options;
  if (!parse_positive(devices_text, &options.devices)) {
    return usage_error("--devices: expected a number >= 1, got '" + devices_text + "'");
  }
  auto config = load_config(config_path, overrides);
  if (!config.is_ok()) return fail(config.status());

  if (gpu == "cpu") {
    // This machine: the CPU backend's measured sgemm rate and the memory the ranks share.
    const std::unique_ptr<Ops> ops = make_cpu_ops(config->runtime.threads);
    auto memory = available_host_memory();
    if (!memory.is_ok()) return fail(memory.status());
    const double peak =
        config->runtime.peak_tflops > 0 ? config->runtime.peak_tflops * 1e12 : ops->peak_flops();
    options.hardware = cpu_hardware(peak, memory->bytes);
    options.gpus_per_node = options.devices;
    options.attention_state_bytes = [](int B, int T, int NH, int NKV, int HD, DType dtype) {
      static const std::unique_ptr<Ops> cpu = make_cpu_ops(1);
      return cpu->attention_state_bytes(B, T, NH, NKV, HD, dtype);
    };
  } else {
    auto table = load_hardware_table(hardware_path.empty() ? default_hardware_path() : hardware_path);
    if (!table.is_ok()) return fail(table.status());
    auto hw = find_gpu(table.value(), gpu);
    if (!hw.is_ok()) return fail(hw.status());
    options.hardware = hw.value();
    options.attention_state_bytes = gpu_attention_state_bytes;
  }
  if (!per_node_text.empty() && !parse_positive(per_node_text, &options.gpus_per_node)) {
    return usage_error("--gpus-per-node: expected a number >= 1, got '" + per_node_text + "'");
  }
  options.configured_only = configured_only;
  auto plan = make_plan(config.value(), options);
  if (!plan.is_ok()) return fail(plan.status());
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
