#include "trainer/metrics.h"

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace trident {

std::string format_progress_line(const StepMetrics& m) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "step %d/%d | loss %.4f | norm %.4f | lr %.2e | %.1f ms | %.0f tok/s | MFU %.1f%%",
                m.step, m.max_steps, m.loss, m.grad_norm, m.lr, m.step_ms, m.tokens_per_s,
                100.0 * m.mfu);
  return buf;
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

Status MetricsWriter::open(const std::string& path) {
  if (path.empty()) return Status::ok();
  std::error_code ec;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) {
    return Status::io_error("logging.metrics: cannot open " + path + ": " + std::strerror(errno));
  }
  return Status::ok();
}

void MetricsWriter::write_line(const std::string& line) {
  if (!file_) return;
  std::fputs(line.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

void to_json(nlohmann::ordered_json& j, const StepMetrics::GroupMs& g) {
  j = {{"tp", g.tp}, {"dp", g.dp}, {"pp", g.pp}, {"embedding", g.embedding}};
}

void MetricsWriter::write_step(const StepMetrics& m) {
  nlohmann::ordered_json j = {{"step", m.step},          {"loss", m.loss},
                      {"lr", m.lr},              {"grad_norm", m.grad_norm},
                      {"step_ms", m.step_ms},    {"tokens_per_s", m.tokens_per_s},
                      {"mfu", m.mfu}};
  j["comm_exposed_ms"] = m.comm_exposed_ms;
  j["comm_hidden_ms"] = m.comm_hidden_ms;
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
