// CheckpointWriter: saves one sharded checkpoint at a time, optionally in the
// background, and commits it atomically (docs/CHECKPOINTS.md).
//
// Protocol for save(step) on every rank of `world`:
//   1. save(): (a previous save in flight is finished first: wait()); the rank's boxes
//      are validated and copied into a host staging buffer the writer owns — host boxes
//      by memcpy, device boxes by one Ops::download each, on the caller's thread — so
//      the caller may change its tensors as soon as save() returns. The staging buffer
//      is kept between saves (no allocation once warm if the sizes do not grow).
//      Rank 0 clears a stale
//      <dir>/step_<N>.tmp left by a crash and creates it; barrier.
//   2. The rank file <dir>/step_<N>.tmp/rank_<r>.bin is written and fsync'ed — on a
//      background thread when async, else inline. The background thread never touches
//      the communicator.
//   3. Commit, on the caller's thread in save() (sync) or poll()/wait() (async): the
//      ranks all_gather a description of their file (ok or the error, boxes, offsets,
//      checksums); if every rank succeeded, rank 0 checks that the boxes tile every
//      tensor exactly, writes manifest.json (temp + fsync + rename), renames step_<N>.tmp
//      to step_<N>, fsyncs <dir> — from here on the checkpoint is committed —, replaces
//      <dir>/latest atomically (naming the step, and the run_id and checkpoint_uid of
//      the trainer state when it has them: checkpoint/lineage.h), and applies retention;
//      it then broadcasts the outcome, so every rank returns the same Status.
//      On any failure before the rename nothing is committed, rank 0 removes
//      step_<N>.tmp, and `latest` still names the previous good checkpoint. A failure to
//      update `latest` after the rename (a full disk) does not undo the commit: save()
//      returns ok, last_latest_error() says what failed, and --resume auto still finds
//      the step (it descends from the one `latest` names).
//
// Collectives contract (comm/communicator.h): all ranks call save(), poll() and
// wait() at the same points, with the same step and async flag. poll() is a collective
// (one all_reduce) while a save is in flight and free otherwise. `world` must outlive
// the save. Errors are returned, never thrown or aborted on; an error from a save is
// returned by the call that commits it (save() when sync, poll()/wait() when async, or
// the next save(), which then does not start its own save).
//
// Threads: one caller thread (it alone uses options.ops); the writer owns one background
// thread while a save is in flight, which reads only the host staging buffer. Destroying a writer with a save in flight joins the thread but does not
// commit (no collectives in a destructor): call wait() first.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/box.h"
#include "checkpoint/manifest.h"
#include "comm/communicator.h"
#include "core/status.h"

namespace trident {

class Ops;

struct CheckpointWriterOptions {
  std::string dir;            // the checkpoint root; created when missing
  // Downloads the boxes in device memory (the Ops that allocated them, used on the
  // caller's thread in save()); must outlive the writer. Null: every box must be on the
  // host, else save() returns invalid_input naming the tensor.
  Ops* ops = nullptr;
  int keep_last = 0;          // retention after each commit; <= 0 keeps everything
  // Retention deletes only checkpoints of this run (nullopt: of any run) and never the
  // protected steps (the one the run resumed from); see checkpoint/retention.h.
  std::optional<std::string> run_id;
  std::set<int64_t> protect_steps;
  int64_t chunk_bytes = 8 << 20;  // the rank file is written in chunks of this size
  // Test hook, called on the writing thread after each chunk with (bytes written so
  // far, total bytes): a test slows the writer with a sleep here, or fails the write by
  // returning an error.
  std::function<Status(int64_t written, int64_t total)> on_chunk;
};

// Timings of the last committed or failed save, for logs and metrics.
struct SaveStats {
  int64_t step = -1;
  int64_t bytes = 0;          // this rank's file
  double snapshot_ms = 0;     // copy / download into host memory (blocks the training step)
  double write_ms = 0;        // write + fsync (in the background when async)
  double commit_ms = 0;       // agreement, manifest, renames (rank 0 does the I/O)
};

class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointWriterOptions options);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective over `world`. See the protocol above. trainer_state must be a JSON object
  // (null means {}); it is stored verbatim in the manifest (rank 0's copy). A tensor that
  // no rank mentions is simply not in the checkpoint: coverage is checked per tensor
  // named by some box.
  Status save(int64_t step, std::span<const BoxRef> boxes, const nlohmann::json& trainer_state,
              Communicator& world, bool async);

  // Collective while a save is in flight: commits it when every rank has written its
  // file, else returns ok at once. *committed (optional) tells whether this call
  // committed. Ok and no-op when nothing is in flight.
  Status poll(bool* committed = nullptr);
  // Collective while a save is in flight: blocks until this rank's file is written,
  // then commits. Ok and no-op when nothing is in flight.
  Status wait();

  bool in_flight() const { return in_flight_; }
  // The step of the save in flight (meaningful while in_flight()).
  int64_t in_flight_step() const { return step_; }
  // The step of the newest save this writer committed.
  std::optional<int64_t> last_committed_step() const { return last_committed_; }
  const SaveStats& last_stats() const { return stats_; }
  // Why the last commit could not update `latest` (empty when it could).
  const std::string& last_latest_error() const { return latest_error_; }
  const CheckpointWriterOptions& options() const { return options_; }
  void set_keep_last(int keep_last) { options_.keep_last = keep_last; }

 private:
  struct LocalBox {
    std::string tensor;
    std::vector<int64_t> global_shape, start, extent;
    DType dtype = DType::kF32;
    int64_t bytes = 0;      // volume(extent) * dtype_size(dtype)
    int64_t offset = 0;     // byte offset in the rank file
    uint64_t checksum = 0;  // filled by the writing thread
  };

  Status snapshot(int64_t step, std::span<const BoxRef> boxes, const nlohmann::json& state);
  void write_rank_file();  // runs on the writing thread (or inline); sets write_status_
  Status commit();         // collective; ends the save in flight
  Status commit_on_root(const std::vector<std::string>& records);  // rank 0's publication

  CheckpointWriterOptions options_;
  Communicator* world_ = nullptr;
  bool in_flight_ = false;
  std::optional<int64_t> last_committed_;
  SaveStats stats_;
  std::string latest_error_;

  // The save in flight.
  int64_t step_ = 0;
  int rank_ = 0;
  nlohmann::json state_;
  std::vector<LocalBox> boxes_;
  std::vector<std::byte> staging_;  // every box back to back (host memory; kept between saves)
  Status local_status_;        // snapshot/setup errors, carried to the agreement
  Status write_status_;        // set by the writing thread before done_
  double write_ms_ = 0;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace trident
