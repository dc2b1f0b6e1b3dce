// Resume compatibility: what a checkpoint was trained with against what this run asks for.
//
// Resuming loads the checkpoint's tensors into the model the current config describes.
// Tensor shapes catch most architecture changes but not all: model.n_heads changes the
// attention but not the qkv shape, model.vocab_size can change within one padded size.
// So before loading, the trainer compares the config stored in the checkpoint (trainer
// state "config", the text of config_to_yaml) and the fingerprint of the training data
// (trainer state "data") with this run's, key by key (the table in resume_compat.cpp):
//   refuse  a different model (model.arch, vocab_size, n_layers, n_heads, n_kv_heads,
//           d_model, d_ff, tie_embeddings, effective values): errors; the run exits 2;
//   warn    a legitimate change with a consequence worth saying (LR schedule, layout,
//           batch size, optimizer, data, seq_len, ...): each warning names the key, both
//           values and what changes;
//   ignore  keys with no effect on the trajectory (eval, logging, checkpoint, bucket
//           size, timeouts): at most one note.
// Messages read "model.n_heads: the checkpoint was trained with 4, the config says 8 (...)".
// docs/CHECKPOINTS.md ("What may change on resume") has the table.
//
// A stored config that does not parse (written by a future or foreign version) is not an
// error: the comparison says "cannot compare the stored config: <reason>" as a warning
// and compares the data fingerprint only. An old or partial fingerprint is read
// tolerantly: a missing field is "unknown" and is not compared.
//
// Pure functions of their arguments except fingerprint_dataset (reads files); no
// collectives: the trainer compares on rank 0 and broadcasts the verdict.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/status.h"
#include "data/blend.h"
#include "data/dataset.h"

namespace trident {

inline constexpr const char* kUnknown = "unknown";

// The content hash covers the first and the last kFingerprintEdgeBytes of a file and
// its size, not the whole file: training data can be terabytes, read at every start of
// every rank 0, while a re-tokenized, re-shuffled, truncated or appended shard almost
// always differs in its size, its header or its first or last MiB. A change confined to
// the middle of a large file goes unnoticed (a cheap fingerprint, not an integrity check).
inline constexpr uint64_t kFingerprintEdgeBytes = uint64_t{1} << 20;

struct DataFileFingerprint {
  std::string path = kUnknown;    // as data.train resolved it
  std::optional<uint64_t> bytes;  // file size
  std::optional<uint64_t> tokens;
  std::string content_hash = kUnknown;  // XXH3-64(first MiB, last MiB, size), 16 hex digits
};

// A training dataset as this run reads it. nullopt / kUnknown: not recorded (an older
// checkpoint, or a partial record).
struct DataFingerprint {
  std::string spec = kUnknown;                            // data.train (data_train_text)
  std::optional<std::vector<DataFileFingerprint>> files;  // in stream order; a blend's
                                                          // components one after another
  // A blend's schedule: "quota/files" per component ("7/2 3/1": quotas 7 and 3 of
  // data/blend.h, 2 and 1 files); nullopt for one spec (and in checkpoints from before
  // blends, which cannot have had one).
  std::optional<std::string> blend;
  std::optional<uint64_t> total_tokens;
  std::optional<uint64_t> seed;  // data.seed
  std::optional<bool> shuffle;   // data.shuffle
};

// nlohmann conversions (found by ADL: json j = fp; j.get<DataFingerprint>()). to_json
// writes every known field; from_json never throws: a missing or mistyped field reads
// as unknown.
void to_json(nlohmann::json& j, const DataFileFingerprint& f);
void from_json(const nlohmann::json& j, DataFileFingerprint& f);
void to_json(nlohmann::json& j, const DataFingerprint& d);
void from_json(const nlohmann::json& j, DataFingerprint& d);

// Sizes, token counts and content hashes of every file of `dataset`, plus data.seed and
// data.shuffle. Reads 2 MiB per file; io_error naming the file when one cannot be read.
// A Megatron dataset is fingerprinted by its .bin (its stream; the .idx only delimits it).
Result<DataFingerprint> fingerprint_dataset(const TokenDataset& dataset, const DataConfig& data);
// The same over several datasets (a blend's components, in order, with its schedule).
Result<DataFingerprint> fingerprint_datasets(const std::vector<TokenDataset>& datasets,
                                             const std::optional<BlendSchedule>& blend,
                                             const DataConfig& data);
// What a config alone says about its data (spec, seed, shuffle; files unknown).
DataFingerprint fingerprint_from_config(const DataConfig& data);

struct ResumeCompat {
  std::vector<std::string> errors;    // a different model: refuse to resume
  std::vector<std::string> warnings;  // legitimate changes, each with its consequence
  std::vector<std::string> notes;     // changed keys without effect on training (one line)
  // A different dataset (data.train naming other files or another blend schedule, or
  // files whose sizes, tokens or hashes changed): the loss level before the resume is no
  // reference for the steps after it, so the trainer restarts the loss-spike guard's
  // window. A changed LR schedule keeps it: on the same data the old level is still the
  // reference, and a raised LR is what the guard is there to catch.
  bool loss_level_changes = false;
};

// Compares the checkpoint's config and data with this run's, resuming after
// `resume_step` optimizer steps. Both configs must be finalized (parse_config does it).
// saved_data nullopt: only what `saved` says about the data is compared.
ResumeCompat compare_for_resume(const Config& saved, const Config& now, int64_t resume_step,
                                const std::optional<DataFingerprint>& saved_data,
                                const DataFingerprint& now_data);

// The same from a checkpoint's trainer state: parses "config" with parse_config(text, {})
// and reads "data". An unparseable or missing config gives the warning "cannot compare
// the stored config: <reason>" and only the data are compared.
ResumeCompat check_resume_compat(const nlohmann::json& trainer_state, const Config& now,
                                 int64_t resume_step, const DataFingerprint& now_data);

// The keys the rule table knows (tests: every key of config_values must have a rule; a
// key without one is compared with a generic warning).
std::vector<std::string> resume_compat_rule_keys();

// invalid_config "cannot resume from <checkpoint>: <error>; <error>..." (exit 2), or ok
// when there are no errors.
Status resume_compat_status(const ResumeCompat& compat, const std::string& checkpoint);

}  // namespace trident
