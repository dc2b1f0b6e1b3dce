// Resume compatibility checks. One table (key_rules) says for every config key whether a
// change refuses the resume, warns (with what changes), joins a group reported as one
// line (the LR schedule, the parallel layout), goes through the data fingerprint, or is
// ignored. Adding a config key is one line here; tests/trainer/resume_compat_test.cpp
// fails for a key of config/config.cpp that has no line.
#include "trainer/resume_compat.h"

#include <fcntl.h>
#include <spdlog/fmt/fmt.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "checkpoint/manifest.h"
#include "comm/parallel_layout.h"
#include "trainer/lr_schedule.h"

namespace trident {
namespace {

using nlohmann::json;

enum class Rule {
  kRefuse,    // a different model: refuse to resume
  kWarn,      // legitimate; the rule's text says what changes
  kSchedule,  // an LR schedule key: the changed ones are reported together
  kLayout,    // a parallel layout key: reported together as one resharding
  kData,      // compared through the data fingerprint (compare_data)
  kIgnore,    // no effect on the training trajectory: one note for all
};

struct KeyRule {
  const char* key;
  Rule rule;
  // kWarn: the consequence; {step} = the resume step, {next} = the step after it,
  // {now} = the new value.
  const char* consequence = "";
};

const char* const kNoEffect = "no effect after resume: the weights come from the checkpoint";
const char* const kAdamW =
    "the AdamW moments carry over; the updates from step {next} on use the new value";

const std::vector<KeyRule>& key_rules() {
  static const std::vector<KeyRule> kRules = {
      {"model.arch", Rule::kRefuse},
      {"model.vocab_size", Rule::kRefuse},
      {"model.seq_len", Rule::kWarn,
       "a context-length change: samples are now {now}+1 tokens, so the global sample order "
       "from step {next} on is not the old one; legitimate for llama (RoPE), but gpt2's "
       "position table (wpe) has seq_len rows (unless model.init_from sized it), so a gpt2 "
       "checkpoint then fails to load on wpe's shape"},
      {"model.n_layers", Rule::kRefuse},
      {"model.n_heads", Rule::kRefuse},
      {"model.n_kv_heads", Rule::kRefuse},
      {"model.d_model", Rule::kRefuse},
      {"model.d_ff", Rule::kRefuse},
      {"model.tie_embeddings", Rule::kRefuse},
      {"model.norm_eps", Rule::kWarn,
       "every normalization computes a slightly different function of the trained weights "
       "from step {next} on"},
      {"model.rope_theta", Rule::kWarn,
       "the RoPE frequencies under the trained weights change (legitimate for context "
       "extension; gpt2 has no RoPE)"},
      {"model.init_std", Rule::kWarn, kNoEffect},
      {"model.moe_experts", Rule::kRefuse},
      {"model.moe_top_k", Rule::kWarn,
       "each token now takes {now} experts: every mixture-of-experts layer computes another "
       "function of the trained weights from step {next} on"},
      {"model.moe_d_ff", Rule::kRefuse},
      {"model.moe_first_dense_layers", Rule::kRefuse},
      {"model.moe_shared_experts", Rule::kRefuse},
      {"model.init_from", Rule::kWarn,
       "no effect after resume: the weights come from the checkpoint (the architecture it "
       "sets is compared key by key)"},
      {"parallel.dp", Rule::kLayout},
      {"parallel.tp", Rule::kLayout},
      {"parallel.pp", Rule::kLayout},
      {"parallel.cp", Rule::kLayout},
      {"parallel.ep", Rule::kLayout},  // reshardable like dp: each expert is stored once
      {"parallel.zero_stage", Rule::kLayout},
      {"parallel.micro_batch_size", Rule::kLayout},
      {"parallel.pipeline_schedule", Rule::kLayout},
      {"parallel.stage_layers", Rule::kLayout},
      {"parallel.sequence_parallel", Rule::kLayout},
      {"parallel.virtual_stages", Rule::kLayout},
      {"parallel.bucket_mb", Rule::kIgnore},
      {"parallel.overlap_grad_reduce", Rule::kIgnore},  // bitwise the same results
      {"parallel.overlap_param_gather", Rule::kIgnore},
      {"parallel.comm_timeout_s", Rule::kIgnore},
      {"runtime.device", Rule::kIgnore},
      {"runtime.threads", Rule::kIgnore},
      {"runtime.peak_tflops", Rule::kIgnore},
      {"training.recompute", Rule::kIgnore},  // recomputation never changes results
      {"data.train", Rule::kData},
      {"data.val", Rule::kIgnore},
      {"data.shuffle", Rule::kData},
      {"data.seed", Rule::kData},
      {"training.global_batch_size", Rule::kWarn,
       "consumed samples carry over (step {next} starts where the old run stopped in the "
       "global sample order); each step now takes {now} sequences"},
      {"training.max_steps", Rule::kSchedule},
      {"training.lr", Rule::kSchedule},
      {"training.min_lr", Rule::kSchedule},
      {"training.warmup_steps", Rule::kSchedule},
      {"training.lr_schedule", Rule::kSchedule},
      {"training.precision", Rule::kWarn,
       "checkpoints hold fp32 masters and moments in either precision: the run continues "
       "from them in {now} (the compute weights are re-derived from the masters)"},
      {"training.weight_decay", Rule::kWarn, kAdamW},
      {"training.beta1", Rule::kWarn, kAdamW},
      {"training.beta2", Rule::kWarn, kAdamW},
      {"training.eps", Rule::kWarn, kAdamW},
      {"training.grad_clip", Rule::kWarn,
       "the gradient norm is clipped to the new value from step {next} on (0 = off)"},
      {"training.seed", Rule::kWarn,
       "no effect after resume: it seeds the initial weights only, and the weights come from "
       "the checkpoint"},
      {"training.loss_spike_factor", Rule::kIgnore},
      {"training.loss_spike_window", Rule::kIgnore},
      {"training.moe_aux_loss_coef", Rule::kWarn,
       "the load-balancing loss weighs {now} in the objective from step {next} on"},
      {"training.moe_z_loss_coef", Rule::kWarn,
       "the router z-loss weighs {now} in the objective from step {next} on"},
      {"training.eval_interval", Rule::kIgnore},
      {"training.eval_batches", Rule::kIgnore},
      {"checkpoint.dir", Rule::kIgnore},
      {"checkpoint.interval", Rule::kIgnore},
      {"checkpoint.keep_last", Rule::kIgnore},
      {"checkpoint.async", Rule::kIgnore},
      {"checkpoint.save_final", Rule::kIgnore},
      {"logging.metrics", Rule::kIgnore},
      {"logging.log_interval", Rule::kIgnore},
      {"logging.straggler_factor", Rule::kIgnore},  // a warning only: no state
      {"logging.straggler_window", Rule::kIgnore},
  };
  return kRules;
}

const KeyRule* find_rule(const std::string& key) {
  for (const KeyRule& r : key_rules()) {
    if (key == r.key) return &r;
  }
  return nullptr;
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::string trained_with(const std::string& key, const std::string& was, const std::string& now) {
  return key + ": the checkpoint was trained with " + was + ", the config says " + now;
}

std::string short_name(const std::string& key) { return key.substr(key.find('.') + 1); }

struct Change {
  std::string key, was, now;
};

// "key: the checkpoint was trained with A, the config says B" for one change; for
// several, "k1, k2: the checkpoint was trained with k1=A k2=B, the config says k1=C k2=D".
std::string describe_changes(const std::vector<Change>& changes) {
  if (changes.size() == 1) return trained_with(changes[0].key, changes[0].was, changes[0].now);
  std::vector<std::string> keys, was, now;
  for (const Change& c : changes) {
    keys.push_back(c.key);
    was.push_back(short_name(c.key) + "=" + c.was);
    now.push_back(short_name(c.key) + "=" + c.now);
  }
  return trained_with(join(keys, ", "), join(was, " "), join(now, " "));
}

std::string lr_text(float lr) { return fmt::format("{:.6g}", lr); }

// ---- the data ----------------------------------------------------------------------

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

bool known(const std::string& s) { return s != kUnknown; }

std::string text_of(const std::optional<uint64_t>& v) {
  return v ? std::to_string(*v) : std::string(kUnknown);
}

// "bytes 100 -> 120, content hash 01.. -> 3f.." for the fields known on both sides that
// differ; empty when none.
std::string file_differences(const DataFileFingerprint& was, const DataFileFingerprint& now) {
  std::vector<std::string> diffs;
  if (was.bytes && now.bytes && *was.bytes != *now.bytes) {
    diffs.push_back("size " + text_of(was.bytes) + " -> " + text_of(now.bytes) + " bytes");
  }
  if (was.tokens && now.tokens && *was.tokens != *now.tokens) {
    diffs.push_back("tokens " + text_of(was.tokens) + " -> " + text_of(now.tokens));
  }
  if (known(was.content_hash) && known(now.content_hash) && was.content_hash != now.content_hash) {
    diffs.push_back("content hash " + was.content_hash + " -> " + now.content_hash);
  }
  return join(diffs, ", ");
}

// True when both file lists are known, equally long, and every file matches in size,
// tokens and content hash (all known).
bool same_files(const DataFingerprint& was, const DataFingerprint& now) {
  if (!was.files || !now.files || was.files->size() != now.files->size()) return false;
  if (was.blend != now.blend) return false;  // the same files mixed differently
  for (size_t i = 0; i < was.files->size(); ++i) {
    const DataFileFingerprint &a = (*was.files)[i], &b = (*now.files)[i];
    if (!a.bytes || !b.bytes || !a.tokens || !b.tokens || !known(a.content_hash) ||
        !known(b.content_hash)) {
      return false;
    }
    if (*a.bytes != *b.bytes || *a.tokens != *b.tokens || a.content_hash != b.content_hash) {
      return false;
    }
  }
  return true;
}

void compare_files(const DataFingerprint& was, const DataFingerprint& now, int64_t step,
                   ResumeCompat* out) {
  if (!was.files || !now.files) return;
  const std::string after = "the samples from step " + std::to_string(step + 1) +
                            " on are not the ones the old run would have read";
  if (was.files->size() != now.files->size()) {
    std::set<std::string> old_paths, new_paths;
    for (const auto& f : *was.files) old_paths.insert(f.path);
    for (const auto& f : *now.files) new_paths.insert(f.path);
    std::vector<std::string> added, removed;
    for (const auto& p : new_paths) {
      if (!old_paths.count(p)) added.push_back(p);
    }
    for (const auto& p : old_paths) {
      if (!new_paths.count(p)) removed.push_back(p);
    }
    std::string detail;
    if (!added.empty()) detail += "; added: " + join(added, ", ");
    if (!removed.empty()) detail += "; removed: " + join(removed, ", ");
    out->warnings.push_back("data.train: the checkpoint was trained on " +
                            std::to_string(was.files->size()) + " files, the config reads " +
                            std::to_string(now.files->size()) + detail + ": " + after);
    return;
  }
  // Equal counts: the lists are in name order, so a moved directory pairs up by index.
  constexpr int kMaxLines = 5;
  int changed = 0;
  for (size_t i = 0; i < now.files->size(); ++i) {
    const DataFileFingerprint &a = (*was.files)[i], &b = (*now.files)[i];
    const std::string diffs = file_differences(a, b);
    if (diffs.empty()) continue;
    if (++changed > kMaxLines) continue;
    const std::string name = a.path == b.path ? b.path : b.path + " (was " + a.path + ")";
    out->warnings.push_back("data file " + name + " changed since the checkpoint (" + diffs +
                            "): the samples read from it differ from the old run's");
  }
  if (changed > kMaxLines) {
    out->warnings.push_back("data: " + std::to_string(changed - kMaxLines) +
                            " more files changed since the checkpoint");
  }
}

const char* const kOrderChanges =
    "the global sample order changes, so the samples after the resume point (step {step}) "
    "are not the ones the old order would have given: in this epoch some samples may repeat "
    "and some may be skipped";

void compare_data(const DataFingerprint& was, const DataFingerprint& now, int64_t step,
                  ResumeCompat* out) {
  auto fill = [&](const char* text) {
    return replace_all(replace_all(text, "{step}", std::to_string(step)), "{next}",
                       std::to_string(step + 1));
  };
  if (known(was.spec) && known(now.spec) && was.spec != now.spec) {
    const std::string change = trained_with("data.train", quoted(was.spec), quoted(now.spec));
    if (same_files(was, now)) {
      out->warnings.push_back(change +
                              ": the files have the same sizes, token counts and content "
                              "hashes, so the sample order is unchanged");
    } else {
      out->warnings.push_back(change + ": " +
                              fill("a different dataset: the samples from step {next} on come "
                                   "from the new one"));
      out->loss_level_changes = true;
    }
  }
  const size_t before = out->warnings.size();
  compare_files(was, now, step, out);
  if (out->warnings.size() != before) out->loss_level_changes = true;
  if (was.total_tokens && now.total_tokens && *was.total_tokens != *now.total_tokens) {
    out->warnings.push_back(
        "data: the checkpoint's dataset held " + text_of(was.total_tokens) +
        " tokens, the config's holds " + text_of(now.total_tokens) +
        fill(": the number of samples per epoch changes, so the global sample order from "
             "step {next} on differs from the old run's (consumed samples carry over as a "
             "counter; some samples may repeat and some may be skipped)"));
  }
  if (was.shuffle && now.shuffle && *was.shuffle != *now.shuffle) {
    out->warnings.push_back(trained_with("data.shuffle", *was.shuffle ? "true" : "false",
                                         *now.shuffle ? "true" : "false") +
                            ": " + fill(kOrderChanges));
  }
  if (was.seed && now.seed && *was.seed != *now.seed) {
    const std::string change = trained_with("data.seed", text_of(was.seed), text_of(now.seed));
    if (was.shuffle.value_or(true) || now.shuffle.value_or(true)) {
      out->warnings.push_back(change + ": " + fill(kOrderChanges));
    } else {
      out->notes.push_back("data.seed " + text_of(was.seed) + " -> " + text_of(now.seed) +
                           " (no effect: data.shuffle is off)");
    }
  }
}

// ---- file hashing ------------------------------------------------------------------

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Status read_exact(int fd, uint64_t offset, size_t count, char* out, const std::string& path) {
  size_t done = 0;
  while (done < count) {
    const ssize_t n = ::pread(fd, out + done, count - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return Status::io_error(path + ": read for the data fingerprint: " + std::strerror(errno));
    }
    if (n == 0) return Status::io_error(path + ": the file shrank while its fingerprint was taken");
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

// XXH3-64 of the first and last kFingerprintEdgeBytes (not overlapping; a small file is
// hashed whole) followed by the size as 8 little-endian bytes.
Result<std::string> edge_hash(const std::string& path, uint64_t* bytes) {
  Fd file;
  file.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file.fd < 0) {
    return Status::io_error(path +
                            ": cannot open for the data fingerprint: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(file.fd, &st) != 0) {
    return Status::io_error(path +
                            ": cannot stat for the data fingerprint: " + std::strerror(errno));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  std::vector<char> buffer(static_cast<size_t>(kFingerprintEdgeBytes));
  const uint64_t head = std::min(size, kFingerprintEdgeBytes);
  const uint64_t tail_start =
      std::max(head, size > kFingerprintEdgeBytes ? size - kFingerprintEdgeBytes : 0);
  const std::pair<uint64_t, uint64_t> ranges[] = {{0, head}, {tail_start, size - tail_start}};
  for (const auto& [offset, count] : ranges) {
    TRIDENT_RETURN_IF_ERROR(
        read_exact(file.fd, offset, static_cast<size_t>(count), buffer.data(), path));
    XXH3_64bits_update(state.get(), buffer.data(), static_cast<size_t>(count));
  }
  unsigned char size_le[8];
  for (int i = 0; i < 8; ++i) size_le[i] = static_cast<unsigned char>(size >> (8 * i));
  XXH3_64bits_update(state.get(), size_le, sizeof(size_le));
  *bytes = size;
  return checksum_to_hex(XXH3_64bits_digest(state.get()));
}

// ---- tolerant JSON reads -----------------------------------------------------------

std::optional<uint64_t> get_u64(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) return std::nullopt;
  const json& v = j.at(key);
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0)
    return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

std::string get_string(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j.at(key).is_string()) return kUnknown;
  return j.at(key).get<std::string>();
}

}  // namespace

void to_json(json& j, const DataFileFingerprint& f) {
  j = json::object();
  j["path"] = f.path;
  if (f.bytes) j["bytes"] = *f.bytes;
  if (f.tokens) j["tokens"] = *f.tokens;
  j["content_hash"] = f.content_hash;
}

void from_json(const json& j, DataFileFingerprint& f) {
  f.path = get_string(j, "path");
  f.bytes = get_u64(j, "bytes");
  f.tokens = get_u64(j, "tokens");
  f.content_hash = get_string(j, "content_hash");
}

void to_json(json& j, const DataFingerprint& d) {
  j = json::object();
  j["spec"] = d.spec;
  if (d.files) j["files"] = *d.files;
  if (d.total_tokens) j["total_tokens"] = *d.total_tokens;
  if (d.seed) j["seed"] = *d.seed;
  if (d.shuffle) j["shuffle"] = *d.shuffle;
  if (d.blend) j["blend"] = *d.blend;
}

void from_json(const json& j, DataFingerprint& d) {
  d = DataFingerprint{};
  d.spec = get_string(j, "spec");
  if (j.is_object() && j.contains("files") && j.at("files").is_array()) {
    std::vector<DataFileFingerprint> files;
    for (const json& f : j.at("files")) {
      DataFileFingerprint file;
      from_json(f, file);
      files.push_back(std::move(file));
    }
    d.files = std::move(files);
  }
  d.total_tokens = get_u64(j, "total_tokens");
  d.seed = get_u64(j, "seed");
  if (j.is_object() && j.contains("shuffle") && j.at("shuffle").is_boolean()) {
    d.shuffle = j.at("shuffle").get<bool>();
  }
  if (j.is_object() && j.contains("blend") && j.at("blend").is_string()) {
    d.blend = j.at("blend").get<std::string>();
  }
}

namespace {

// The fingerprints of `dataset`'s files, appended to `files`.
Status add_file_fingerprints(const TokenDataset& dataset, std::vector<DataFileFingerprint>* files) {
  for (const TokenFile& f : dataset.files()) {
    DataFileFingerprint file;
    file.path = f.path();
    file.tokens = f.num_tokens();
    uint64_t bytes = 0;
    TRIDENT_ASSIGN_OR_RETURN(file.content_hash, edge_hash(f.path(), &bytes));
    file.bytes = bytes;
    files->push_back(std::move(file));
  }
  return Status::ok();
}

}  // namespace

Result<DataFingerprint> fingerprint_datasets(const std::vector<TokenDataset>& datasets,
                                             const std::optional<BlendSchedule>& blend,
                                             const DataConfig& data) {
  DataFingerprint fp = fingerprint_from_config(data);
  std::vector<DataFileFingerprint> files;
  uint64_t total_tokens = 0;
  std::string schedule;
  for (size_t d = 0; d < datasets.size(); ++d) {
    TRIDENT_RETURN_IF_ERROR(add_file_fingerprints(datasets[d], &files));
    total_tokens += datasets[d].num_tokens();
    if (blend) {
      schedule += (schedule.empty() ? "" : " ") + std::to_string(blend->quotas()[d]) + "/" +
                  std::to_string(datasets[d].files().size());
    }
  }
  fp.files = std::move(files);
  fp.total_tokens = total_tokens;
  if (blend) fp.blend = schedule;
  return fp;
}

Result<DataFingerprint> fingerprint_dataset(const TokenDataset& dataset, const DataConfig& data) {
  DataFingerprint fp = fingerprint_from_config(data);
  std::vector<DataFileFingerprint> files;
  TRIDENT_RETURN_IF_ERROR(add_file_fingerprints(dataset, &files));
  fp.files = std::move(files);
  fp.total_tokens = dataset.num_tokens();
  return fp;
}

DataFingerprint fingerprint_from_config(const DataConfig& data) {
  DataFingerprint fp;
  fp.spec = data_train_text(data);
  fp.seed = data.seed;
  fp.shuffle = data.shuffle;
  return fp;
}

ResumeCompat compare_for_resume(const Config& saved, const Config& now, int64_t resume_step,
                                const std::optional<DataFingerprint>& saved_data,
                                const DataFingerprint& now_data) {
  ResumeCompat out;
  const std::string step = std::to_string(resume_step), next = std::to_string(resume_step + 1);
  const auto was_values = config_values(saved);
  const auto now_values = config_values(now);
  std::vector<Change> schedule, layout;
  std::vector<std::string> ignored;
  for (size_t i = 0; i < now_values.size() && i < was_values.size(); ++i) {
    const auto& [key, now_value] = now_values[i];
    const std::string& was_value = was_values[i].second;
    if (was_value == now_value) continue;
    const KeyRule* rule = find_rule(key);
    if (rule == nullptr) {
      out.warnings.push_back(trained_with(key, was_value, now_value) +
                             " (trainer/resume_compat.cpp has no rule for this key; taken as "
                             "a legitimate change)");
      continue;
    }
    switch (rule->rule) {
      case Rule::kRefuse:
        out.errors.push_back(trained_with(key, was_value, now_value) +
                             " (a different model; start a new checkpoint.dir, or use "
                             "model.init_from to start from its weights)");
        break;
      case Rule::kWarn:
        out.warnings.push_back(
            trained_with(key, was_value, now_value) + ": " +
            replace_all(replace_all(replace_all(rule->consequence, "{step}", step), "{next}", next),
                        "{now}", now_value));
        break;
      case Rule::kSchedule:
        schedule.push_back({key, was_value, now_value});
        break;
      case Rule::kLayout:
        layout.push_back({key, was_value, now_value});
        break;
      case Rule::kData:
        break;  // compare_data below, with the files
      case Rule::kIgnore:
        ignored.push_back(key + " " + was_value + " -> " + now_value);
        break;
    }
  }
  if (!schedule.empty()) {
    const int s = static_cast<int>(resume_step);
    out.warnings.push_back(
        describe_changes(schedule) +
        ": the LR schedule is a function of training.max_steps (and lr, min_lr, warmup_steps, "
        "lr_schedule); from step " +
        step + " the curve follows the new one (the LR of step " + next + ": " +
        lr_text(learning_rate_at(saved.training, s)) + " before, " +
        lr_text(learning_rate_at(now.training, s)) + " now)");
  }
  if (!layout.empty()) {
    // Always the dp x tp x pp triple, plus whichever other layout keys changed.
    std::vector<std::string> keys, was, now_text;
    std::set<std::string> changed;
    for (const Change& c : layout) {
      keys.push_back(c.key);
      changed.insert(c.key);
    }
    for (size_t i = 0; i < now_values.size() && i < was_values.size(); ++i) {
      const std::string& key = now_values[i].first;
      const KeyRule* rule = find_rule(key);
      if (rule == nullptr || rule->rule != Rule::kLayout) continue;
      // The degrees (comm/parallel_layout.h kDimensions): parallel.dp, .cp, .tp, .pp.
      const bool triple = std::any_of(
          std::begin(kDimensions), std::end(kDimensions),
          [&](const DimensionInfo& d) { return key == std::string("parallel.") + d.name; });
      if (!triple && !changed.count(key)) continue;
      // cp and ep are shown only where used (the message of the layouts without them
      // unchanged).
      if ((key == "parallel.cp" || key == "parallel.ep") && was_values[i].second == "1" &&
          now_values[i].second == "1") {
        continue;
      }
      was.push_back(short_name(key) + "=" + was_values[i].second);
      now_text.push_back(short_name(key) + "=" + now_values[i].second);
    }
    out.warnings.push_back(join(keys, ", ") + ": resharded from " + join(was, " ") + " to " +
                           join(now_text, " ") + "; results equal within fp32 rounding");
  }
  // The data: the stored fingerprint, completed by what the stored config says.
  DataFingerprint was_data = saved_data.value_or(fingerprint_from_config(saved.data));
  if (!known(was_data.spec)) was_data.spec = data_train_text(saved.data);
  if (!was_data.seed) was_data.seed = saved.data.seed;
  if (!was_data.shuffle) was_data.shuffle = saved.data.shuffle;
  compare_data(was_data, now_data, resume_step, &out);
  if (!ignored.empty()) {
    out.notes.push_back("changed without effect on training: " + join(ignored, ", "));
  }
  return out;
}

ResumeCompat check_resume_compat(const json& trainer_state, const Config& now, int64_t resume_step,
                                 const DataFingerprint& now_data) {
  std::optional<DataFingerprint> saved_data;
  if (trainer_state.is_object() && trainer_state.contains("data") &&
      trainer_state.at("data").is_object()) {
    saved_data = trainer_state.at("data").get<DataFingerprint>();
  }
  std::string reason;
  if (!trainer_state.is_object() || !trainer_state.contains("config")) {
    reason = "the checkpoint's trainer state has no \"config\"";
  } else if (!trainer_state.at("config").is_string()) {
    reason = "the checkpoint's \"config\" is not a string";
  } else {
    Result<Config> saved =
        parse_config(trainer_state.at("config").get<std::string>(), {}, "the stored config");
    if (saved.is_ok())
      return compare_for_resume(saved.value(), now, resume_step, saved_data, now_data);
    reason = saved.status().message();
  }
  ResumeCompat out;
  out.warnings.push_back("cannot compare the stored config: " + reason);
  if (saved_data) compare_data(*saved_data, now_data, resume_step, &out);
  return out;
}

std::vector<std::string> resume_compat_rule_keys() {
  std::vector<std::string> keys;
  for (const KeyRule& r : key_rules()) keys.push_back(r.key);
  return keys;
}

Status resume_compat_status(const ResumeCompat& compat, const std::string& checkpoint) {
  if (compat.errors.empty()) return Status::ok();
  return Status::invalid_config("cannot resume from " + checkpoint + ": " +
                                join(compat.errors, "; "));
}

}  // namespace trident
