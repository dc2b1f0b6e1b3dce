#include "checkpoint/latest.h"

#include <filesystem>
#include <sstream>

#include "checkpoint/durable_io.h"
#include "checkpoint/manifest.h"

namespace trident {

namespace fs = std::filesystem;

std::string latest_text(int64_t step, const std::string& run_id, const std::string& uid) {
  std::string text = step_dir_name(step) + "\n";
  if (!run_id.empty()) text += "run " + run_id + "\n";
  if (!uid.empty()) text += "uid " + uid + "\n";
  return text;
}

std::optional<LatestPointer> read_latest(const std::string& root, std::string* problem) {
  const std::string path = root + "/" + kLatestName;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::string text;
  Status st = read_whole_file(path, &text);
  if (!st.is_ok()) {
    if (problem) *problem = st.message();
    return std::nullopt;
  }
  std::istringstream in(text);
  std::string line;
  LatestPointer p;
  bool first = true;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    if (first) {
      auto step = parse_step_dir_name(line);
      if (!step) {
        if (problem) *problem = path + ": first line '" + line + "' is not step_<N>";
        return std::nullopt;
      }
      p.step = *step;
      first = false;
    } else if (line.rfind("run ", 0) == 0) {
      p.run_id = line.substr(4);
    } else if (line.rfind("uid ", 0) == 0) {
      p.uid = line.substr(4);
    }
  }
  if (first) {
    if (problem) *problem = path + ": empty";
    return std::nullopt;
  }
  return p;
}

}  // namespace trident
