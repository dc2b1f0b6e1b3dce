// CheckpointWriter's commit: the agreement among ranks and rank 0's atomic publication
// of a checkpoint (protocol in checkpoint/writer.h).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "checkpoint/durable_io.h"
#include "checkpoint/lineage.h"
#include "checkpoint/retention.h"
#include "checkpoint/writer.h"
#include "core/log.h"
#include "core/timer.h"

namespace trident {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

CollectiveOptions label(const std::string& what, int64_t step) {
  return {std::chrono::milliseconds(0), "checkpoint " + step_dir_name(step) + " " + what};
}

// Rank 0's outcome, sent to every rank: code, message length, message.
Status broadcast_status(Communicator& world, Status st, int64_t step) {
  int64_t head[2] = {static_cast<int64_t>(st.code()), static_cast<int64_t>(st.message().size())};
  world.broadcast(CommBuf::host(std::span<int64_t>(head, 2)), 0, label("outcome", step));
  std::string message = st.message();
  message.resize(static_cast<size_t>(head[1]));
  if (head[1] > 0) {
    world.broadcast(
        CommBuf::host(std::as_writable_bytes(std::span<char>(message.data(), message.size()))), 0,
        label("outcome message", step));
  }
  return Status(static_cast<StatusCode>(head[0]), message);
}

}  // namespace

Status CheckpointWriter::commit() {
  if (thread_.joinable()) thread_.join();
  latest_error_.clear();
  const Timer timer;
  Communicator& world = *world_;
  const Status local = !local_status_.is_ok() ? local_status_ : write_status_;

  // Every rank's outcome and file description, gathered everywhere (equal chunks: pad
  // the JSON text with spaces to the longest one).
  json record;
  record["rank"] = rank_;
  record["ok"] = local.is_ok();
  record["code"] = static_cast<int>(local.code());
  record["error"] = local.message();
  record["bytes"] = kRankFileHeaderBytes + static_cast<int64_t>(staging_.size());
  json boxes = json::array();
  if (local.is_ok()) {
    for (const LocalBox& b : boxes_) {
      boxes.push_back({{"tensor", b.tensor}, {"dtype", dtype_name(b.dtype)}, {"shape", b.global_shape}, {"start", b.start},
                       {"extent", b.extent}, {"offset", b.offset}, {"checksum", b.checksum}});
    }
  }
  record["boxes"] = boxes;
  const std::string text = record.dump();
  int64_t max_len = static_cast<int64_t>(text.size());
  world.all_reduce(CommBuf::host(std::span<int64_t>(&max_len, 1)), ReduceOp::kMax,
                   label("record size", step_));
  std::string mine = text;
  mine.resize(static_cast<size_t>(max_len), ' ');
  std::string all(static_cast<size_t>(max_len) * static_cast<size_t>(world.size()), ' ');
  world.all_gather(CommBuf::host(std::as_bytes(std::span<const char>(mine.data(), mine.size()))),
                   CommBuf::host(std::as_writable_bytes(std::span<char>(all.data(), all.size()))),
                   label("records", step_));

  Status outcome;
  if (rank_ == 0) {
    std::vector<std::string> records;
    for (int r = 0; r < world.size(); ++r) {
      records.push_back(all.substr(static_cast<size_t>(r * max_len), static_cast<size_t>(max_len)));
    }
    outcome = commit_on_root(records);
    if (!outcome.is_ok()) {
      const std::string tmp = options_.dir + "/" + step_dir_name(step_) + ".tmp";
      std::error_code ec;
      fs::remove_all(tmp, ec);  // best effort: the debris of a failed save
    }
  }
  outcome = broadcast_status(world, outcome, step_);

  in_flight_ = false;
  stats_.bytes = kRankFileHeaderBytes + static_cast<int64_t>(staging_.size());
  stats_.write_ms = write_ms_;
  stats_.commit_ms = timer.elapsed_ms();
  if (outcome.is_ok()) last_committed_ = step_;
  return outcome;
}

Status CheckpointWriter::commit_on_root(const std::vector<std::string>& records) {
  const std::string name = step_dir_name(step_);
  const std::string what = "checkpoint " + options_.dir + "/" + name + " not committed";
  Manifest m;
  m.step = step_;
  m.world_size = static_cast<int>(records.size());
  m.trainer_state = state_;
  std::string failures;
  StatusCode first_code = StatusCode::kOk;
  for (size_t r = 0; r < records.size(); ++r) {
    json rec = json::parse(records[r], nullptr, false);
    if (rec.is_discarded()) return Status::internal(what + ": rank " + std::to_string(r) +
                                                    " sent an unreadable description");
    if (!rec.at("ok").get<bool>()) {
      if (first_code == StatusCode::kOk) first_code = static_cast<StatusCode>(rec.at("code").get<int>());
      failures += "; rank " + std::to_string(r) + ": " + rec.at("error").get<std::string>();
      continue;
    }
    const std::string file = rank_file_name(static_cast<int>(r));
    m.files.push_back({file, static_cast<int>(r), rec.at("bytes").get<int64_t>()});
    for (const json& b : rec.at("boxes")) {
      const std::string tensor = b.at("tensor").get<std::string>();
      const auto shape = b.at("shape").get<std::vector<int64_t>>();
      const std::string dtype = b.at("dtype").get<std::string>();
      const std::optional<DType> parsed = checkpoint_dtype(dtype);
      if (!parsed) {
        return Status::internal(what + ": rank " + std::to_string(r) + " sent tensor '" +
                                tensor + "' with dtype '" + dtype + "'");
      }
      auto [it, inserted] = m.tensors.try_emplace(tensor);
      if (inserted) {
        it->second.shape = shape;
        it->second.dtype = *parsed;
      } else if (it->second.shape != shape) {
        return Status::invalid_input(what + ": tensor '" + tensor + "' has global shape " +
                                     dims_to_string(it->second.shape) + " on one rank and " +
                                     dims_to_string(shape) + " on rank " + std::to_string(r));
      } else if (it->second.dtype != *parsed) {
        return Status::invalid_input(what + ": tensor '" + tensor + "' has dtype " +
                                     dtype_name(it->second.dtype) + " in one box and " + dtype +
                                     " in a box of rank " + std::to_string(r));
      }
      it->second.boxes.push_back({file, b.at("offset").get<int64_t>(),
                                  b.at("start").get<std::vector<int64_t>>(),
                                  b.at("extent").get<std::vector<int64_t>>(),
                                  b.at("checksum").get<uint64_t>()});
    }
  }
  if (!failures.empty()) return Status(first_code, what + failures);

  const std::string tmp = options_.dir + "/" + name + ".tmp";
  const std::string final_dir = options_.dir + "/" + name;
  Status valid = validate_manifest(m, tmp + "/" + kManifestName);
  if (!valid.is_ok()) return Status::invalid_input(what + ": " + valid.message());
  TRIDENT_RETURN_IF_ERROR(write_file_atomic(tmp + "/" + kManifestName, manifest_to_text(m)));

  // Saving a step that already exists (a rerun after resuming from an older one):
  // move the old one aside first; rename(2) cannot replace a non-empty directory.
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {
    const std::string aside = final_dir + ".deleting";
    fs::remove_all(aside, ec);
    if (::rename(final_dir.c_str(), aside.c_str()) != 0) {
      return Status::io_error(what + ": cannot move the existing " + final_dir + " aside");
    }
  }
  TRIDENT_RETURN_IF_ERROR(rename_durable(tmp, final_dir));
  fs::remove_all(final_dir + ".deleting", ec);

  // The checkpoint is committed. `latest` lags behind when it cannot be updated (a full
  // disk); resume still finds this step, which descends from the one `latest` names.
  auto text_field = [&](const char* key) {
    auto it = state_.is_object() ? state_.find(key) : state_.end();
    return it != state_.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  Status latest = write_file_atomic(options_.dir + "/" + kLatestName,
                                    latest_text(step_, text_field("run_id"),
                                                text_field("checkpoint_uid")));
  if (!latest.is_ok()) {
    latest_error_ = latest.message();
    log::warn("checkpoint {} committed, but {}/{} could not be updated ({}); --resume auto will "
              "still find {}", final_dir, options_.dir, kLatestName, latest.message(), name);
  }

  // A failed cleanup is worth a warning, not a failure.
  std::vector<std::string> deleted;
  RetentionPolicy policy;
  policy.keep_last = options_.keep_last;
  policy.run_id = options_.run_id;
  policy.protect = options_.protect_steps;
  policy.protect.insert(step_);
  Status kept = apply_retention(options_.dir, policy, &deleted);
  if (!kept.is_ok()) log::warn("checkpoint retention: {}", kept.message());
  for (const std::string& d : deleted) log::info("checkpoint retention: deleted {}", d);
  return Status::ok();
}

}  // namespace trident
