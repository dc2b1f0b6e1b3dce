#include "checkpoint/train_state.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <random>
#include <set>

namespace trident {

using nlohmann::json;

namespace {

// The fields this version writes; anything else is `extra`.
const std::set<std::string>& known_fields() {
  static const std::set<std::string> kFields = {
      "version", "step",   "consumed_samples", "optimizer_steps", "layout", "seeds",
      "config",  "run_id", "checkpoint_uid",   "ancestors"};
  return kFields;
}

std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

class FieldReader {
 public:
  FieldReader(const json& object, std::string where) : object_(object), where_(std::move(where)) {}

  Status error(const std::string& field, const std::string& rule, const json* value) const {
    std::string m = where_ + ": trainer state: '" + field + "' " + rule;
    if (value) m += ", got " + shown(*value);
    return Status::corrupt(m);
  }

  Result<const json*> get(const std::string& field) const {
    const json* v = lookup(field);
    if (v == nullptr) return error(field, "is missing", nullptr);
    return v;
  }

  // An integer in [lo, hi].
  Result<int64_t> integer(const std::string& field, int64_t lo, int64_t hi) const {
    TRIDENT_ASSIGN_OR_RETURN(const json* v, get(field));
    const std::string rule = "must be an integer in [" + std::to_string(lo) + ", " +
                             std::to_string(hi) + "]";
    if (!v->is_number_integer()) return error(field, rule, v);
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(hi)) return error(field, rule, v);
      return static_cast<int64_t>(u);
    }
    const int64_t i = v->get<int64_t>();
    if (i < lo || i > hi) return error(field, rule, v);
    return i;
  }

  Result<uint64_t> unsigned_integer(const std::string& field) const {
    TRIDENT_ASSIGN_OR_RETURN(const json* v, get(field));
    if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0)) {
      return error(field, "must be a non-negative integer", v);
    }
    return v->get<uint64_t>();
  }

  Result<std::string> string(const std::string& field, bool allow_empty) const {
    TRIDENT_ASSIGN_OR_RETURN(const json* v, get(field));
    if (!v->is_string()) return error(field, "must be a string", v);
    std::string s = v->get<std::string>();
    if (s.empty() && !allow_empty) return error(field, "must not be empty", nullptr);
    return s;
  }

  // A lineage id: 1..64 characters of [0-9a-zA-Z_-].
  Result<std::string> id(const std::string& field) const {
    TRIDENT_ASSIGN_OR_RETURN(std::string s, string(field, false));
    const bool ok = s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
                    });
    if (!ok) {
      const json shown_value = s;
      return error(field, "must be an id of at most 64 letters, digits, '_' or '-'", &shown_value);
    }
    return s;
  }

 private:
  // "a.b" looks into nested objects.
  const json* lookup(const std::string& field) const {
    const json* cur = &object_;
    size_t start = 0;
    while (true) {
      const size_t dot = field.find('.', start);
      const std::string part = field.substr(start, dot == std::string::npos ? dot : dot - start);
      if (!cur->is_object()) return nullptr;
      auto it = cur->find(part);
      if (it == cur->end()) return nullptr;
      cur = &*it;
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  const json& object_;
  std::string where_;
};

}  // namespace

bool TrainState::descends_from(const std::string& uid) const {
  if (uid.empty()) return false;
  return checkpoint_uid == uid || std::find(ancestors.begin(), ancestors.end(), uid) != ancestors.end();
}

json train_state_to_json(const TrainState& s) {
  json j = s.extra.is_object() ? s.extra : json::object();
  j["version"] = s.version;
  j["step"] = s.step;
  j["consumed_samples"] = s.consumed_samples;
  j["optimizer_steps"] = s.optimizer_steps;
  j["layout"] = {{"dp", s.layout.dp}, {"tp", s.layout.tp}, {"pp", s.layout.pp},
                 {"zero_stage", s.layout.zero_stage}, {"world_size", s.layout.world_size}};
  // Context parallelism: written only when used, so a cp 1 state reads as before.
  if (s.layout.cp > 1) j["layout"]["cp"] = s.layout.cp;
  j["seeds"] = {{"init", s.init_seed}, {"data", s.data_seed}};
  j["config"] = s.config_yaml;
  j["run_id"] = s.run_id;
  j["checkpoint_uid"] = s.checkpoint_uid;
  j["ancestors"] = s.ancestors;
  return j;
}

Result<TrainState> parse_train_state(const json& j, int64_t manifest_step, int manifest_world_size,
                                     const std::string& where) {
  if (!j.is_object()) {
    return Status::corrupt(where + ": trainer state must be an object, got " + shown(j));
  }
  FieldReader r(j, where);
  TrainState s;
  if (j.contains("version")) {
    TRIDENT_ASSIGN_OR_RETURN(int64_t v, r.integer("version", 1, INT_MAX));
    if (v > kTrainStateVersion) {
      return Status::corrupt(where + ": trainer state version " + std::to_string(v) +
                             " was written by a newer Trident (this one reads versions 1 to " +
                             std::to_string(kTrainStateVersion) + ")");
    }
    s.version = static_cast<int>(v);
  } else {
    s.version = 1;
  }
  // The step is an int in the trainer (and names step_<N>): 0 .. INT_MAX, and it must be
  // the step the manifest (and the directory) says.
  TRIDENT_ASSIGN_OR_RETURN(s.step, r.integer("step", 0, INT_MAX));
  if (s.step != manifest_step) {
    return Status::corrupt(where + ": trainer state: 'step' is " + std::to_string(s.step) +
                           " but the manifest is for step " + std::to_string(manifest_step));
  }
  TRIDENT_ASSIGN_OR_RETURN(s.consumed_samples, r.unsigned_integer("consumed_samples"));
  // Every step consumes between 1 and INT_MAX (training.global_batch_size) samples,
  // whatever the batch size was in each segment of the run.
  const uint64_t max_samples = static_cast<uint64_t>(s.step) * static_cast<uint64_t>(INT_MAX);
  if (s.consumed_samples < static_cast<uint64_t>(s.step) || s.consumed_samples > max_samples) {
    return Status::corrupt(where + ": trainer state: 'consumed_samples' " +
                           std::to_string(s.consumed_samples) + " is impossible after " +
                           std::to_string(s.step) + " steps (each step consumes 1 to " +
                           std::to_string(INT_MAX) + " samples)");
  }
  TRIDENT_ASSIGN_OR_RETURN(s.optimizer_steps, r.integer("optimizer_steps", 0, s.step));
  TRIDENT_ASSIGN_OR_RETURN(int64_t dp, r.integer("layout.dp", 1, INT_MAX));
  TRIDENT_ASSIGN_OR_RETURN(int64_t tp, r.integer("layout.tp", 1, INT_MAX));
  TRIDENT_ASSIGN_OR_RETURN(int64_t pp, r.integer("layout.pp", 1, INT_MAX));
  TRIDENT_ASSIGN_OR_RETURN(int64_t zero, r.integer("layout.zero_stage", 0, 3));
  TRIDENT_ASSIGN_OR_RETURN(int64_t world, r.integer("layout.world_size", 1, INT_MAX));
  int64_t cp = 1;  // absent: written at cp 1 (or before context parallelism)
  if (j.contains("layout") && j.at("layout").is_object() && j.at("layout").contains("cp")) {
    TRIDENT_ASSIGN_OR_RETURN(cp, r.integer("layout.cp", 1, INT_MAX));
  }
  if (dp * cp * tp * pp != world || world != manifest_world_size) {
    return Status::corrupt(where + ": trainer state: layout dp=" + std::to_string(dp) +
                           (cp > 1 ? " cp=" + std::to_string(cp) : std::string()) + " tp=" +
                           std::to_string(tp) + " pp=" + std::to_string(pp) + " world_size=" +
                           std::to_string(world) + " does not match the manifest's " +
                           std::to_string(manifest_world_size) + " rank files");
  }
  s.layout = {static_cast<int>(dp), static_cast<int>(tp), static_cast<int>(pp),
              static_cast<int>(zero), static_cast<int>(world), static_cast<int>(cp)};
  TRIDENT_ASSIGN_OR_RETURN(s.init_seed, r.unsigned_integer("seeds.init"));
  TRIDENT_ASSIGN_OR_RETURN(s.data_seed, r.unsigned_integer("seeds.data"));
  TRIDENT_ASSIGN_OR_RETURN(s.config_yaml, r.string("config", false));
  if (s.version >= 2) {
    TRIDENT_ASSIGN_OR_RETURN(s.run_id, r.id("run_id"));
    TRIDENT_ASSIGN_OR_RETURN(s.checkpoint_uid, r.id("checkpoint_uid"));
    TRIDENT_ASSIGN_OR_RETURN(const json* ancestors, r.get("ancestors"));
    if (!ancestors->is_array() || ancestors->size() > kMaxAncestors) {
      return r.error("ancestors", "must be a list of at most " + std::to_string(kMaxAncestors) +
                                      " checkpoint ids", ancestors);
    }
    for (const json& a : *ancestors) {
      if (!a.is_string() || a.get<std::string>().empty()) {
        return r.error("ancestors", "must hold checkpoint ids (strings)", &a);
      }
      s.ancestors.push_back(a.get<std::string>());
    }
  }
  for (const auto& [key, value] : j.items()) {
    if (!known_fields().count(key)) s.extra[key] = value;
  }
  return s;
}

std::string new_lineage_id() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace trident
