#include "plan/hardware.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace trident {
namespace {

// MPI between processes of one machine goes through shared memory: a copy in, a copy
// out. Rough figures of a two-socket server (docs/PLAN.md); --gpu cpu plans are for
// checking the memory model, their times are indicative only.
constexpr double kCpuMemoryBandwidth = 20e9;  // bytes/s one rank streams
constexpr double kCpuLinkBandwidth = 5e9;     // bytes/s per rank through shared memory
constexpr double kCpuLinkLatency = 5e-6;      // s per MPI call

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The keys of one mapping entry, each exactly once; positive numbers and names.
class Entry {
 public:
  Entry(const YAML::Node& node, std::string where) : node_(node), where_(std::move(where)) {}
  Status check_keys(const std::set<std::string>& allowed) const {
    if (!node_.IsMap()) return Status::invalid_config(where_ + ": expected a mapping");
    for (auto kv = node_.begin(); kv != node_.end(); ++kv) {
      const std::string key = kv->first.Scalar();
      if (!allowed.count(key)) {
        std::string names;
        for (const auto& a : allowed) names += (names.empty() ? "" : ", ") + a;
        return Status::invalid_config(where_ + ": unknown key '" + key + "'; allowed: " + names);
      }
    }
    return Status::ok();
  }
  Result<double> positive(const std::string& key) const { return number(key, false); }
  // A positive number that may be left out (then `fallback`).
  Result<double> positive_or(const std::string& key, double fallback) const {
    if (!node_[key]) return fallback;
    return number(key, false);
  }
  Result<double> non_negative(const std::string& key) const { return number(key, true); }
  // A number >= 0 that may be left out (then `fallback`).
  Result<double> non_negative_or(const std::string& key, double fallback) const {
    if (!node_[key]) return fallback;
    return number(key, true);
  }
  Result<std::string> name(const std::string& key) const {
    const YAML::Node v = node_[key];
    if (!v || !v.IsScalar() || v.Scalar().empty()) {
      return Status::invalid_config(where_ + "." + key + ": expected a name");
    }
    return lower(v.Scalar());
  }

 private:
  Result<double> number(const std::string& key, bool zero_ok) const {
    const YAML::Node v = node_[key];
    if (!v) return Status::invalid_config(where_ + "." + key + ": missing");
    double x = 0;
    try {
      x = v.as<double>();
    } catch (const YAML::Exception&) {
      return Status::invalid_config(where_ + "." + key + ": expected a number, got '" +
                                    (v.IsScalar() ? v.Scalar() : std::string("a collection")) +
                                    "'");
    }
    if (zero_ok ? !(x >= 0) : !(x > 0)) {
      return Status::invalid_config(where_ + "." + key + (zero_ok ? ": must be >= 0, got " : ": must be > 0, got ") +
                                    v.Scalar());
    }
    return x;
  }
  YAML::Node node_;
  std::string where_;
};

// The names of a link's per-kind shares in the table, in LinkSpec::share's order.
constexpr const char* kShareKeys[kRingKinds] = {"all_reduce_share", "reduce_scatter_share",
                                                "all_gather_share"};

// A link's optional per-kind shares (`prefix`: "link_" in the cpu entry).
Status read_shares(const Entry& e, const std::string& prefix, LinkSpec* link) {
  for (int k = 0; k < kRingKinds; ++k) {
    TRIDENT_ASSIGN_OR_RETURN(link->share[static_cast<size_t>(k)],
                             e.positive_or(prefix + kShareKeys[k], 1.0));
  }
  return Status::ok();
}

}  // namespace

Result<HardwareTable> parse_hardware_table(const std::string& yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return Status::invalid_config(source + ":" + std::to_string(e.mark.line + 1) +
                                  ": YAML syntax error: " + e.msg);
  }
  if (!root.IsMap() || !root["gpus"] || !root["gpus"].IsSequence() || !root["interconnects"] ||
      !root["interconnects"].IsSequence()) {
    return Status::invalid_config(source + ": expected lists 'gpus' and 'interconnects'");
  }
  HardwareTable table;
  std::map<std::string, LinkSpec> links;
  for (size_t i = 0; i < root["interconnects"].size(); ++i) {
    const Entry e(root["interconnects"][i], source + ": interconnects[" + std::to_string(i) + "]");
    TRIDENT_RETURN_IF_ERROR(e.check_keys({"name", "gbytes_per_s", "latency_us", "efficiency",
                                          "all_reduce_share", "reduce_scatter_share",
                                          "all_gather_share"}));
    LinkSpec link;
    TRIDENT_ASSIGN_OR_RETURN(link.name, e.name("name"));
    TRIDENT_ASSIGN_OR_RETURN(const double gbytes, e.positive("gbytes_per_s"));
    TRIDENT_ASSIGN_OR_RETURN(const double latency_us, e.positive("latency_us"));
    TRIDENT_ASSIGN_OR_RETURN(link.efficiency, e.positive_or("efficiency", kLinkEfficiency));
    TRIDENT_RETURN_IF_ERROR(read_shares(e, "", &link));
    link.bytes_per_s = gbytes * 1e9;
    link.latency_s = latency_us * 1e-6;
    links[link.name] = link;
    table.links.push_back(link);
  }
  for (size_t i = 0; i < root["gpus"].size(); ++i) {
    const std::string where = source + ": gpus[" + std::to_string(i) + "]";
    const Entry e(root["gpus"][i], where);
    TRIDENT_RETURN_IF_ERROR(e.check_keys(
        {"name", "peak_bf16_tflops", "memory_gib", "memory_tbps", "interconnect", "network",
         "reserved_gib", "fragmentation", "gemm_efficiency", "attention_efficiency",
         "memory_efficiency"}));
    Hardware hw;
    TRIDENT_ASSIGN_OR_RETURN(hw.name, e.name("name"));
    if (hw.name == "cpu") return Status::invalid_config(where + ".name: 'cpu' is reserved");
    TRIDENT_ASSIGN_OR_RETURN(const double tflops, e.positive("peak_bf16_tflops"));
    TRIDENT_ASSIGN_OR_RETURN(const double gib, e.positive("memory_gib"));
    TRIDENT_ASSIGN_OR_RETURN(const double tbps, e.positive("memory_tbps"));
    hw.peak_flops = tflops * 1e12;
    hw.memory_bytes = gib * 1073741824.0;
    hw.memory_bandwidth = tbps * 1e12;
    for (const char* key : {"interconnect", "network"}) {
      TRIDENT_ASSIGN_OR_RETURN(const std::string link, e.name(key));
      auto it = links.find(link);
      if (it == links.end()) {
        return Status::invalid_config(where + "." + key + ": '" + link +
                                      "' is not in interconnects");
      }
      (std::string(key) == "network" ? hw.inter_node : hw.intra_node) = it->second;
    }
    TRIDENT_ASSIGN_OR_RETURN(const double reserved_gib, e.non_negative("reserved_gib"));
    TRIDENT_ASSIGN_OR_RETURN(hw.fragmentation, e.non_negative("fragmentation"));
    if (hw.fragmentation >= 1) {
      return Status::invalid_config(where + ".fragmentation: must be < 1 (a share), got " +
                                    std::to_string(hw.fragmentation));
    }
    hw.reserved_bytes = reserved_gib * 1073741824.0;
    TRIDENT_ASSIGN_OR_RETURN(hw.gemm_efficiency, e.positive_or("gemm_efficiency", kGemmEfficiency));
    TRIDENT_ASSIGN_OR_RETURN(hw.attention_efficiency,
                             e.positive_or("attention_efficiency", kAttentionEfficiency));
    TRIDENT_ASSIGN_OR_RETURN(hw.memory_efficiency,
                             e.positive_or("memory_efficiency", kMemoryEfficiency));
    table.gpus.push_back(hw);
  }
  if (root["cpu"]) {
    // A calibrated `--gpu cpu`: every figure stated, none measured at plan time.
    const Entry e(root["cpu"], source + ": cpu");
    TRIDENT_RETURN_IF_ERROR(e.check_keys({"peak_gflops", "memory_gbps", "link_gbytes_per_s",
                                          "link_latency_us", "gemm_efficiency",
                                          "attention_efficiency", "link_all_reduce_share",
                                          "link_reduce_scatter_share", "link_all_gather_share",
                                          "overlap_comm_rate", "overlap_compute_rate",
                                          "arrival_skew"}));
    TRIDENT_ASSIGN_OR_RETURN(const double gflops, e.positive("peak_gflops"));
    TRIDENT_ASSIGN_OR_RETURN(const double gbps, e.positive("memory_gbps"));
    TRIDENT_ASSIGN_OR_RETURN(const double link_gbytes, e.positive("link_gbytes_per_s"));
    TRIDENT_ASSIGN_OR_RETURN(const double link_us, e.positive("link_latency_us"));
    table.cpu = cpu_hardware(gflops * 1e9, 0);
    table.cpu.memory_bandwidth = gbps * 1e9;
    table.cpu.intra_node.bytes_per_s = table.cpu.inter_node.bytes_per_s = link_gbytes * 1e9;
    table.cpu.intra_node.latency_s = table.cpu.inter_node.latency_s = link_us * 1e-6;
    TRIDENT_RETURN_IF_ERROR(read_shares(e, "link_", &table.cpu.intra_node));
    table.cpu.inter_node.share = table.cpu.intra_node.share;
    TRIDENT_ASSIGN_OR_RETURN(table.cpu.gemm_efficiency, e.positive("gemm_efficiency"));
    TRIDENT_ASSIGN_OR_RETURN(table.cpu.attention_efficiency, e.positive("attention_efficiency"));
    for (const auto& [key, rate] : {std::pair{"overlap_comm_rate", &table.cpu.overlap_comm_rate},
                                    std::pair{"overlap_compute_rate", &table.cpu.overlap_compute_rate}}) {
      TRIDENT_ASSIGN_OR_RETURN(*rate, e.positive_or(key, 0.0));
      if (*rate > 1) {
        return Status::invalid_config(source + ": cpu." + key + ": a share of a speed, at most 1, got " +
                                      std::to_string(*rate));
      }
    }
    TRIDENT_ASSIGN_OR_RETURN(table.cpu.arrival_skew, e.non_negative_or("arrival_skew", 0.0));
    if (table.cpu.arrival_skew >= 1) {
      return Status::invalid_config(source + ": cpu.arrival_skew: seconds waited per second of "
                                    "compute, below 1, got " + std::to_string(table.cpu.arrival_skew));
    }
    table.has_cpu = true;
  }
  return table;
}

Result<HardwareTable> load_hardware_table(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::invalid_input(path + ": cannot open hardware file: " + std::strerror(errno));
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_hardware_table(text.str(), path);
}

std::string default_hardware_path() {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& p : {exe.parent_path().parent_path() / "configs/hardware.yaml",
                              exe.parent_path() / "configs/hardware.yaml"}) {
      if (fs::is_regular_file(p, ec)) return p.string();
    }
  }
  return "configs/hardware.yaml";  // relative to the working directory
}

Result<Hardware> find_gpu(const HardwareTable& table, const std::string& name) {
  const std::string want = lower(name);
  std::string known;
  for (const Hardware& hw : table.gpus) {
    if (hw.name == want) return hw;
    known += hw.name + ", ";
  }
  return Status::invalid_input("--gpu: unknown GPU '" + name + "'; known: " + known + "cpu");
}

Hardware cpu_hardware(double peak_flops, double memory_bytes) {
  Hardware hw;
  hw.name = "cpu";
  hw.peak_flops = peak_flops;
  hw.memory_bytes = memory_bytes;
  hw.memory_bandwidth = kCpuMemoryBandwidth;
  // MPI's shared-memory copies reach the stated rate (no NCCL busbw factor), and the
  // elementwise figure is already what one rank streams.
  hw.intra_node = hw.inter_node = {"shared memory", kCpuLinkBandwidth, kCpuLinkLatency, 1.0};
  hw.gemm_efficiency = hw.attention_efficiency = kCpuEfficiency;
  hw.memory_efficiency = 1.0;
  hw.is_cpu = true;
  return hw;
}

std::string hardware_table_yaml(const HardwareTable& table, const std::string& header) {
  // %.6g keeps every figure to 6 significant digits: the table reads back to within 1e-6.
  auto num = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.6g", x);
    return std::string(buf);
  };
  // A link's per-kind shares, where one is not 1 (", all_reduce_share: x, ...").
  auto shares = [&](const LinkSpec& l, const std::string& prefix) {
    std::string text;
    for (int k = 0; k < kRingKinds; ++k) {
      const double x = l.share[static_cast<size_t>(k)];
      if (x != 1) text += ", " + prefix + kShareKeys[k] + ": " + num(x);
    }
    return text;
  };
  std::string out;
  std::istringstream lines(header);
  for (std::string line; std::getline(lines, line);) out += "# " + line + "\n";
  out += "gpus:\n";
  for (const Hardware& g : table.gpus) {
    out += "  - {name: " + g.name + ", peak_bf16_tflops: " + num(g.peak_flops / 1e12) +
           ", memory_gib: " + num(g.memory_bytes / 1073741824.0) + ", memory_tbps: " +
           num(g.memory_bandwidth / 1e12) + ",\n     interconnect: " + g.intra_node.name +
           ", network: " + g.inter_node.name + ", reserved_gib: " +
           num(g.reserved_bytes / 1073741824.0) + ", fragmentation: " + num(g.fragmentation) +
           ",\n     gemm_efficiency: " + num(g.gemm_efficiency) + ", attention_efficiency: " +
           num(g.attention_efficiency) + ", memory_efficiency: " + num(g.memory_efficiency) +
           "}\n";
  }
  out += "interconnects:\n";
  for (const LinkSpec& l : table.links) {
    out += "  - {name: " + l.name + ", gbytes_per_s: " + num(l.bytes_per_s / 1e9) +
           ", latency_us: " + num(l.latency_s * 1e6) + ", efficiency: " + num(l.efficiency) +
           shares(l, "") + "}\n";
  }
  if (table.has_cpu) {
    const Hardware& c = table.cpu;
    // The cpu's memory figure is what a rank streams (its efficiency is folded in).
    out += "cpu: {peak_gflops: " + num(c.peak_flops / 1e9) + ", memory_gbps: " +
           num(c.memory_bandwidth * c.memory_efficiency / 1e9) + ", link_gbytes_per_s: " +
           num(c.intra_node.bytes_per_s * c.intra_node.efficiency / 1e9) + ", link_latency_us: " +
           num(c.intra_node.latency_s * 1e6) + ",\n      gemm_efficiency: " +
           num(c.gemm_efficiency) + ", attention_efficiency: " + num(c.attention_efficiency) +
           shares(c.intra_node, "link_") +
           (c.overlap_comm_rate > 0 ? ", overlap_comm_rate: " + num(c.overlap_comm_rate) : "") +
           (c.overlap_compute_rate > 0 ? ", overlap_compute_rate: " + num(c.overlap_compute_rate) : "") +
           (c.arrival_skew > 0 ? ", arrival_skew: " + num(c.arrival_skew) : "") + "}\n";
  }
  return out;
}

}  // namespace trident
