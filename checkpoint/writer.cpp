#include "checkpoint/writer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "checkpoint/durable_io.h"
#include "checkpoint/retention.h"
#include "core/log.h"
#include "core/timer.h"
#include "kernels/ops.h"

namespace trident {

namespace fs = std::filesystem;
using nlohmann::json;

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options) : options_(std::move(options)) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
  if (in_flight_) {
    log::warn("checkpoint {} was never committed (writer destroyed before wait())",
              step_dir_name(step_));
  }
}

Status CheckpointWriter::snapshot(int64_t step, std::span<const BoxRef> boxes,
                                  const json& state) {
  if (!state.is_object() && !state.is_null()) {
    return Status::invalid_input("checkpoint " + step_dir_name(step) +
                                 ": trainer state must be a JSON object");
  }
  state_ = state.is_null() ? json::object() : state;
  boxes_.clear();
  int64_t payload = 0;
  for (const BoxRef& b : boxes) {
    TRIDENT_RETURN_IF_ERROR(check_box_in_shape(b.tensor, b.global_shape, b.start, b.extent));
    if (b.tensor.empty()) return Status::invalid_input("checkpoint box with an empty tensor name");
    const DType dtype = b.data.dtype();
    if (!checkpoint_dtype(dtype_name(dtype))) {
      return Status::invalid_input("tensor '" + b.tensor + "': dtype " + dtype_name(dtype) +
                                   " cannot be checkpointed (f32, bf16, i32)");
    }
    const int64_t n = volume(b.extent);
    if (n > 0 && b.data.is_null()) {
      return Status::invalid_input("tensor '" + b.tensor + "': box has no data");
    }
    if (n > 0 && b.data.space() == MemSpace::kDevice && options_.ops == nullptr) {
      return Status::invalid_input("tensor '" + b.tensor +
                                   "': box is in device memory and the checkpoint writer has "
                                   "no Ops to download it (CheckpointWriterOptions::ops)");
    }
    LocalBox box;
    box.tensor = b.tensor;
    box.global_shape = b.global_shape;
    box.start = b.start;
    box.extent = b.extent;
    box.dtype = dtype;
    box.bytes = n * static_cast<int64_t>(dtype_size(dtype));
    box.offset = kRankFileHeaderBytes + payload;
    boxes_.push_back(std::move(box));
    payload += boxes_.back().bytes;
  }
  staging_.resize(static_cast<size_t>(payload));  // keeps its capacity between saves
  for (size_t i = 0; i < boxes_.size(); ++i) {
    const BoxData& data = boxes[i].data;
    const size_t bytes = static_cast<size_t>(boxes_[i].bytes);
    std::byte* dst = staging_.data() + (boxes_[i].offset - kRankFileHeaderBytes);
    if (bytes == 0) continue;
    if (data.space() == MemSpace::kHost) {
      std::memcpy(dst, data.host(), bytes);
    } else {
      options_.ops->download(dst, data.device(), bytes);
    }
  }
  return Status::ok();
}

Status CheckpointWriter::save(int64_t step, std::span<const BoxRef> boxes, const json& state,
                              Communicator& world, bool async) {
  if (in_flight_) {
    Status previous = wait();
    if (!previous.is_ok()) {
      return previous.with_context(step_dir_name(step) + " not started");
    }
  }
  const Timer timer;
  world_ = &world;
  rank_ = world.rank();
  step_ = step;
  in_flight_ = true;
  done_.store(false);
  write_status_ = Status::ok();
  write_ms_ = 0;
  stats_ = SaveStats{};
  stats_.step = step;
  local_status_ = snapshot(step, boxes, state);
  stats_.snapshot_ms = timer.elapsed_ms();

  // Rank 0 clears what a crashed earlier attempt at this step left behind, so no stale
  // rank file (say, of a larger world) is committed with this one.
  const std::string tmp = options_.dir + "/" + step_dir_name(step) + ".tmp";
  if (rank_ == 0) {
    Status st = make_dirs(options_.dir);
    if (st.is_ok()) st = remove_tree(tmp);
    if (st.is_ok()) st = make_dirs(tmp);
    if (st.is_ok()) st = fsync_dir(options_.dir);
    if (local_status_.is_ok()) local_status_ = st;
  }
  world.barrier({std::chrono::milliseconds(0), "checkpoint " + step_dir_name(step) + " setup"});
  if (rank_ != 0 && local_status_.is_ok()) local_status_ = make_dirs(tmp);

  if (async) {
    thread_ = std::thread([this] { write_rank_file(); });
    return Status::ok();
  }
  write_rank_file();
  return commit();
}

void CheckpointWriter::write_rank_file() {
  const Timer timer;
  auto finish = [&](Status st) {
    write_status_ = std::move(st);
    write_ms_ = timer.elapsed_ms();
    done_.store(true, std::memory_order_release);
  };
  if (!local_status_.is_ok()) return finish(Status::ok());
  for (LocalBox& b : boxes_) {
    b.checksum = checksum_bytes(staging_.data() + (b.offset - kRankFileHeaderBytes),
                                static_cast<size_t>(b.bytes));
  }
  const std::string path =
      options_.dir + "/" + step_dir_name(step_) + ".tmp/" + rank_file_name(rank_);
  const int64_t payload = static_cast<int64_t>(staging_.size());
  const int64_t total = kRankFileHeaderBytes + payload;
  FileHandle f;
  Status st = FileHandle::open_write(path, &f);
  if (!st.is_ok()) return finish(st);
  const std::string header = encode_rank_header(rank_, step_, payload);
  st = f.write_all(header.data(), header.size(), path);
  int64_t written = kRankFileHeaderBytes;
  const char* data = reinterpret_cast<const char*>(staging_.data());
  const int64_t chunk = std::max<int64_t>(options_.chunk_bytes, 4096);
  while (st.is_ok() && written < total) {
    const int64_t n = std::min(chunk, total - written);
    st = f.write_all(data + (written - kRankFileHeaderBytes), static_cast<size_t>(n), path);
    written += n;
    if (st.is_ok() && options_.on_chunk) st = options_.on_chunk(written, total);
  }
  if (st.is_ok() && options_.on_chunk && payload == 0) st = options_.on_chunk(written, total);
  if (st.is_ok()) st = f.sync(path);
  finish(st);
}

Status CheckpointWriter::poll(bool* committed) {
  if (committed) *committed = false;
  if (!in_flight_) return Status::ok();
  int64_t not_done = done_.load(std::memory_order_acquire) ? 0 : 1;
  world_->all_reduce(CommBuf::host(std::span<int64_t>(&not_done, 1)), ReduceOp::kMax,
                     {std::chrono::milliseconds(0), "checkpoint poll"});
  if (not_done) return Status::ok();
  if (committed) *committed = true;
  return commit();
}

Status CheckpointWriter::wait() {
  if (!in_flight_) return Status::ok();
  return commit();
}

}  // namespace trident
