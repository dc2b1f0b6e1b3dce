#include "trainer/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <utility>
#include <nlohmann/json.hpp>

#include "core/log.h"

namespace trident {

std::string format_progress_line(const StepMetrics& m) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "step %d/%d | loss %.4f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | MFU %.1f%%",
                m.step, m.max_steps, m.loss, m.grad_norm, m.lr, m.step_ms, m.tokens_per_s,
                100.0 * m.mfu);
  std::string line = buf;
  if (m.moe) {
    std::snprintf(buf, sizeof(buf), " | moe aux %.4f z %.4f", m.moe_aux_loss, m.moe_z_loss);
    line += buf;
  }
  return line;
}

MetricsWriter::~MetricsWriter() {
  if (fd_ < 0) return;
  if (failed_ > 0) {
    log::warn("logging.metrics: {} of {} records were not written to {}", failed_, records_,
              path_);
  }
  ::close(fd_);
}

// True when the regular file at `path` is non-empty and its last byte is not '\n': the
// last record of an earlier launch was cut off (a full disk, a kill mid-write).
static bool ends_mid_line(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  char last = '\n';
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    if (::pread(fd, &last, 1, st.st_size - 1) != 1) last = '\n';
  }
  ::close(fd);
  return last != '\n';
}

Status MetricsWriter::open(const std::string& path) {
  if (path.empty()) return Status::ok();
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    return Status::io_error("logging.metrics: cannot open " + path + ": " + std::strerror(errno));
  }
  path_ = path;
  mid_line_ = ends_mid_line(path);
  return Status::ok();
}

void MetricsWriter::write_line(const std::string& line) {
  if (fd_ < 0) return;
  ++records_;
  // The whole record in one write(2) (O_APPEND): a reader never sees half of it unless
  // the file system refuses the rest, and after a torn record the next starts on a
  // fresh line.
  const std::string text = (mid_line_ ? "\n" : "") + line + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      const int err = n < 0 ? errno : EIO;
      ++failed_;
      if (failed_ == 1) {
        log::warn("logging.metrics: cannot write {}: {}; training continues, later records may "
                  "be missing",
                  path_, std::strerror(err));
      }
      break;
    }
  }
  // A refused write leaves the file as it was; a partial one ends where it stopped.
  if (done > 0) mid_line_ = text[done - 1] != '\n';
}

void to_json(nlohmann::ordered_json& j, const StepMetrics::GroupMs& g) {
  j = {{"tp", g.tp}, {"dp", g.dp}, {"pp", g.pp}, {"embedding", g.embedding}, {"cp", g.cp},
       {"ep", g.ep}, {"expert_dp", g.expert_dp}};
}

void to_json(nlohmann::ordered_json& j, const StepMetrics::KindMs& k) {
  j = {{"all_reduce", k.all_reduce}, {"reduce_scatter", k.reduce_scatter},
       {"all_gather", k.all_gather}};
}

void MetricsWriter::write_step(const StepMetrics& m) {
  nlohmann::ordered_json j = {{"step", m.step},          {"loss", m.loss},
                      {"lr", m.lr},              {"grad_norm", m.grad_norm},
                      {"step_ms", m.step_ms},    {"tokens_per_s", m.tokens_per_s},
                      {"mfu", m.mfu}};
  j["comm_exposed_ms"] = m.comm_exposed_ms;
  j["comm_hidden_ms"] = m.comm_hidden_ms;
  if (m.has_least) {
    j["comm_exposed_least_ms"] = m.comm_exposed_least_ms;
    j["comm_total_least_ms"] = m.comm_total_least_ms;
    // GroupMs' JSON form gives the seven group names in order; each gets its KindMs.
    nlohmann::ordered_json kinds = StepMetrics::GroupMs{};
    size_t g = 0;
    for (nlohmann::ordered_json& value : kinds) value = m.comm_kind_least_ms[g++];
    j["comm_kind_least_ms"] = std::move(kinds);
  }
  if (m.has_slowest) {
    j["slowest"] = {{"rank", m.slowest_rank},
                    {"host", m.slowest_host},
                    {"busy_ms", m.slowest_busy_ms},
                    {"median_busy_ms", m.median_busy_ms},
                    {"ratio", m.slowest_ratio}};
  }
  if (m.moe) {
    j["moe_aux_loss"] = m.moe_aux_loss;
    j["moe_z_loss"] = m.moe_z_loss;
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const std::vector<double>& f : m.moe_fractions) {
      double lo = f.empty() ? 0 : f[0], hi = lo, mean = 0, var = 0;
      for (double x : f) {
        lo = std::min(lo, x);
        hi = std::max(hi, x);
        mean += x / static_cast<double>(f.size());
      }
      for (double x : f) var += (x - mean) * (x - mean) / static_cast<double>(f.size());
      nlohmann::ordered_json layer = {
          {"min", lo}, {"max", hi}, {"cv", mean > 0 ? std::sqrt(var) / mean : 0.0}};
      if (m.moe_histogram) layer["fractions"] = f;
      layers.push_back(layer);
    }
    j["moe_layers"] = layers;
  }
  write_line(j.dump());
}

void MetricsWriter::write_segment(const std::string& run_id, int start_step,
                                  const std::string& resumed_from, int world_size) {
  char when[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  nlohmann::ordered_json seg = {{"run_id", run_id},
                                {"start_step", start_step},
                                {"resumed_from", nullptr},
                                {"time", when},
                                {"world_size", world_size}};
  if (!resumed_from.empty()) seg["resumed_from"] = resumed_from;
  nlohmann::ordered_json j = {{"segment", seg}};
  write_line(j.dump());
}

void MetricsWriter::write_eval(int step, double val_loss) {
  nlohmann::ordered_json j = {{"step", step}, {"val_loss", val_loss}};
  write_line(j.dump());
}

}  // namespace trident
