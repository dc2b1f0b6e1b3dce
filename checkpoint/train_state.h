// The training state every checkpoint manifest carries in "trainer_state" (next to the
// tensors): where the run stands, how it was laid out, its seeds and config, and its
// lineage — which run it belongs to and which checkpoint it continues (docs/CHECKPOINTS.md,
// "Runs and lineage").
//
// The manifest's checksum proves the text was not damaged, not that its writer was this
// version of Trident, so the state is parsed into a typed struct, never read field by
// field at the point of use: a missing field, a wrong type or an impossible value is a
// Status::corrupt naming the manifest and the field ("trainer state: 'consumed_samples'
// must be a non-negative integer, got -8"). Resume then treats that checkpoint as
// invalid and falls back to the previous one.
//
// Versions: 1 (no "version" field; no lineage) is still read, as a run of its own with an
// empty run_id; 2 adds "version", "run_id", "checkpoint_uid" and "ancestors". A higher
// version is refused ("written by a newer Trident").
//
// Fields the checkpoint layer does not interpret (the data fingerprint, the loss
// window, ...) travel in `extra`, verbatim. Pure data; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace trident {

inline constexpr int kTrainStateVersion = 2;
// How many ancestor checkpoint ids a state remembers (newest first).
inline constexpr size_t kMaxAncestors = 64;

struct TrainLayout {
  int dp = 1, tp = 1, pp = 1, zero_stage = 0, world_size = 1;
  int cp = 1;  // world_size = dp * cp * tp * pp ("cp" in the JSON only when > 1)
};

struct TrainState {
  int version = kTrainStateVersion;
  int64_t step = 0;               // optimizer steps done; equals the manifest's step
  uint64_t consumed_samples = 0;  // global samples consumed (the data position)
  int64_t optimizer_steps = 0;    // AdamW's step counter (bias correction)
  TrainLayout layout;             // the layout that saved it
  uint64_t init_seed = 0, data_seed = 0;
  std::string config_yaml;        // the whole config (config/config.h config_to_yaml)
  // Lineage. run_id names a run: new when training starts from scratch, inherited on
  // every resume. checkpoint_uid is unique per saved checkpoint. ancestors are the uids
  // of the checkpoints this state descends from, newest first (the first is the
  // checkpoint it was resumed from or saved after), at most kMaxAncestors.
  std::string run_id;
  std::string checkpoint_uid;
  std::vector<std::string> ancestors;
  nlohmann::json extra = nlohmann::json::object();  // other fields, kept verbatim

  // True when `uid` is this checkpoint or one of its remembered ancestors.
  bool descends_from(const std::string& uid) const;
};

nlohmann::json train_state_to_json(const TrainState& state);

// Parses and range-checks a manifest's trainer state against the manifest's own step
// and world size. `where` (the manifest path) starts every message.
Result<TrainState> parse_train_state(const nlohmann::json& json, int64_t manifest_step,
                                     int manifest_world_size, const std::string& where);

// A fresh random identifier (16 lowercase hex digits) for runs and checkpoints.
std::string new_lineage_id();

}  // namespace trident
