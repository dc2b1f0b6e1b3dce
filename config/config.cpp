// Strict YAML config parsing. One table (kSections) lists every key with its kind and
// where it lives in Config; parsing, `--set` overrides and config_to_yaml all walk the
// same table, so a key cannot be parseable but missing from the printed config.
#include "config/config.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <thread>

#include "comm/topology.h"
#include "config/dp_auto.h"

namespace trident {
namespace {

// kDataSpec: data.train, a string or a list of {path, weight}; its ref is the DataConfig.
enum class Kind {
  kInt, kUint64, kFloat, kBool, kString, kIntList, kArch, kPipeline, kLrSchedule, kDevice, kPrecision, kRecompute, kTie,
  kDegreeOrAuto,  // parallel.dp: an int >= 1, or auto (kDpAuto until resolve_auto_dp)
  kDataSpec
};

struct Field {
  const char* name;
  Kind kind;
  void* (*ref)(Config&);  // where the value lives
};

struct Section {
  const char* name;
  std::vector<Field> fields;
};

#define TRIDENT_FIELD(section, key, kind) \
  Field { #key, Kind::kind, [](Config& c) -> void* { return &c.section.key; } }
#define TRIDENT_DATA_SPEC_FIELD(key) \
  Field { #key, Kind::kDataSpec, [](Config& c) -> void* { return &c.data; } }

const std::vector<Section>& sections() {
  static const std::vector<Section> kSections = {
      {"model",
       {TRIDENT_FIELD(model, arch, kArch), TRIDENT_FIELD(model, vocab_size, kInt),
        TRIDENT_FIELD(model, seq_len, kInt), TRIDENT_FIELD(model, n_layers, kInt),
        TRIDENT_FIELD(model, n_heads, kInt), TRIDENT_FIELD(model, n_kv_heads, kInt),
        TRIDENT_FIELD(model, d_model, kInt), TRIDENT_FIELD(model, d_ff, kInt),
        TRIDENT_FIELD(model, tie_embeddings, kTie), TRIDENT_FIELD(model, norm_eps, kFloat),
        TRIDENT_FIELD(model, rope_theta, kFloat), TRIDENT_FIELD(model, init_std, kFloat),
        TRIDENT_FIELD(model, init_from, kString), TRIDENT_FIELD(model, moe_experts, kInt),
        TRIDENT_FIELD(model, moe_top_k, kInt), TRIDENT_FIELD(model, moe_d_ff, kInt),
        TRIDENT_FIELD(model, moe_first_dense_layers, kInt),
        TRIDENT_FIELD(model, moe_shared_experts, kInt)}},
      {"parallel",
       {TRIDENT_FIELD(parallel, dp, kDegreeOrAuto), TRIDENT_FIELD(parallel, tp, kInt),
        TRIDENT_FIELD(parallel, pp, kInt), TRIDENT_FIELD(parallel, cp, kInt),
        TRIDENT_FIELD(parallel, ep, kInt), TRIDENT_FIELD(parallel, zero_stage, kInt),
        TRIDENT_FIELD(parallel, micro_batch_size, kInt),
        TRIDENT_FIELD(parallel, pipeline_schedule, kPipeline),
        TRIDENT_FIELD(parallel, stage_layers, kIntList),
        TRIDENT_FIELD(parallel, virtual_stages, kInt),
        TRIDENT_FIELD(parallel, sequence_parallel, kBool), TRIDENT_FIELD(parallel, bucket_mb, kInt),
        TRIDENT_FIELD(parallel, overlap_grad_reduce, kBool),
        TRIDENT_FIELD(parallel, overlap_param_gather, kBool),
        TRIDENT_FIELD(parallel, comm_timeout_s, kInt)}},
      {"runtime",
       {TRIDENT_FIELD(runtime, device, kDevice), TRIDENT_FIELD(runtime, threads, kInt),
        TRIDENT_FIELD(runtime, peak_tflops, kFloat)}},
      {"data",
       {TRIDENT_DATA_SPEC_FIELD(train), TRIDENT_FIELD(data, val, kString),
        TRIDENT_FIELD(data, shuffle, kBool), TRIDENT_FIELD(data, seed, kUint64)}},
      {"training",
       {TRIDENT_FIELD(training, global_batch_size, kInt), TRIDENT_FIELD(training, max_steps, kInt),
        TRIDENT_FIELD(training, lr, kFloat), TRIDENT_FIELD(training, min_lr, kFloat),
        TRIDENT_FIELD(training, warmup_steps, kInt),
        TRIDENT_FIELD(training, lr_schedule, kLrSchedule),
        TRIDENT_FIELD(training, precision, kPrecision),
        TRIDENT_FIELD(training, recompute, kRecompute),
        TRIDENT_FIELD(training, weight_decay, kFloat), TRIDENT_FIELD(training, beta1, kFloat),
        TRIDENT_FIELD(training, beta2, kFloat), TRIDENT_FIELD(training, eps, kFloat),
        TRIDENT_FIELD(training, grad_clip, kFloat), TRIDENT_FIELD(training, seed, kUint64),
        TRIDENT_FIELD(training, eval_interval, kInt), TRIDENT_FIELD(training, eval_batches, kInt),
        TRIDENT_FIELD(training, loss_spike_factor, kFloat),
        TRIDENT_FIELD(training, loss_spike_window, kInt),
        TRIDENT_FIELD(training, moe_aux_loss_coef, kFloat),
        TRIDENT_FIELD(training, moe_z_loss_coef, kFloat)}},
      {"checkpoint",
       {TRIDENT_FIELD(checkpoint, dir, kString), TRIDENT_FIELD(checkpoint, interval, kInt),
        TRIDENT_FIELD(checkpoint, keep_last, kInt), TRIDENT_FIELD(checkpoint, async, kBool),
        TRIDENT_FIELD(checkpoint, save_final, kBool)}},
      {"logging",
       {TRIDENT_FIELD(logging, metrics, kString), TRIDENT_FIELD(logging, log_interval, kInt),
        TRIDENT_FIELD(logging, straggler_factor, kFloat),
        TRIDENT_FIELD(logging, straggler_window, kInt)}},
  };
  return kSections;
}

#undef TRIDENT_FIELD
#undef TRIDENT_DATA_SPEC_FIELD

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string allowed_sections() {
  std::vector<std::string> names;
  for (const auto& s : sections()) names.push_back(s.name);
  return join_names(names);
}

std::string allowed_keys(const Section& section) {
  std::vector<std::string> names;
  for (const auto& f : section.fields) names.push_back(f.name);
  return join_names(names);
}

const Section* find_section(const std::string& name) {
  for (const auto& s : sections()) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

const Field* find_field(const Section& section, const std::string& name) {
  for (const auto& f : section.fields) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

// What the user wrote, for "expected X, got Y" messages.
std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      return (node.Tag() == "!" ? "the string '" : "'") + node.Scalar() + "'";
    default:
      return "an undefined value";
  }
}

// A plain (unquoted) scalar: quoted "4" is a string, not a number or a bool.
bool is_plain_scalar(const YAML::Node& node) {
  return node.IsScalar() && node.Tag() != "!";
}

Status type_error(const std::string& key, const char* expected, const YAML::Node& node) {
  return Status::invalid_config(key + ": expected " + expected + ", got " + describe(node));
}

template <typename T>
bool parse_number(std::string text, T* out) {
  if (!text.empty() && text[0] == '+') {
    text.erase(0, 1);
    if (!text.empty() && (text[0] == '+' || text[0] == '-')) return false;
  }
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

Status parse_int(const std::string& key, const YAML::Node& node, int* out) {
  int64_t v = 0;
  if (!is_plain_scalar(node) || !parse_number(node.Scalar(), &v)) {
    return type_error(key, "an integer", node);
  }
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    return type_error(key, "an integer that fits in 32 bits", node);
  }
  *out = static_cast<int>(v);
  return Status::ok();
}

Status parse_value(const std::string& key, Kind kind, const YAML::Node& node, void* dst);
Status at_least(const std::string& key, int64_t value, int64_t min);

// One spec, or a list of {path, weight} mappings (a blend).
Status parse_data_spec(const std::string& key, const YAML::Node& node, DataConfig* data) {
  if (node.IsNull() || node.IsScalar()) {
    data->train_blend.clear();
    return parse_value(key, Kind::kString, node, &data->train);
  }
  if (!node.IsSequence()) {
    return type_error(key, "a path (file, glob, directory or Megatron prefix) or a list of "
                      "{path, weight}", node);
  }
  if (node.size() == 0) return Status::invalid_config(key + ": an empty blend; list at least one {path, weight}");
  std::vector<BlendSource> blend;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string entry = key + "[" + std::to_string(i) + "]";
    const YAML::Node& item = node[i];
    if (!item.IsMap()) return type_error(entry, "a mapping {path, weight}", item);
    BlendSource source;
    bool has_path = false, has_weight = false;
    for (auto kv = item.begin(); kv != item.end(); ++kv) {
      const std::string name = kv->first.Scalar();
      if (name == "path" && !has_path) {
        has_path = true;
        if (!kv->second.IsScalar() || kv->second.Scalar().empty()) {
          return type_error(entry + ".path", "a non-empty path", kv->second);
        }
        source.path = kv->second.Scalar();
      } else if (name == "weight" && !has_weight) {
        has_weight = true;
        if (!is_plain_scalar(kv->second) || !parse_number(kv->second.Scalar(), &source.weight)) {
          return type_error(entry + ".weight", "a number", kv->second);
        }
        if (!(source.weight > 0) || !std::isfinite(source.weight)) {
          return type_error(entry + ".weight", "a positive finite number", kv->second);
        }
      } else if (name == "path" || name == "weight") {
        return Status::invalid_config("duplicate key " + entry + "." + name);
      } else {
        return Status::invalid_config("unknown key " + entry + "." + name +
                                      "; allowed keys in a blend entry: path, weight");
      }
    }
    if (!has_path) return Status::invalid_config(entry + ": missing path");
    if (!has_weight) return Status::invalid_config(entry + ": missing weight");
    blend.push_back(std::move(source));
  }
  data->train.clear();
  data->train_blend = std::move(blend);
  return Status::ok();
}

Status parse_value(const std::string& key, Kind kind, const YAML::Node& node, void* dst) {
  switch (kind) {
    case Kind::kDataSpec:
      return parse_data_spec(key, node, static_cast<DataConfig*>(dst));
    case Kind::kInt:
      return parse_int(key, node, static_cast<int*>(dst));
    case Kind::kDegreeOrAuto:
      if (is_plain_scalar(node) && node.Scalar() == "auto") {
        *static_cast<int*>(dst) = kDpAuto;
        return Status::ok();
      }
      if (!parse_int(key, node, static_cast<int*>(dst)).is_ok()) {
        return type_error(key, "an integer >= 1, or auto (the world size / (cp * tp * pp))", node);
      }
      // kDpAuto (0) only from "auto": a written 0 is an error.
      return at_least(key, *static_cast<int*>(dst), 1);
    case Kind::kUint64: {
      uint64_t v = 0;
      if (!is_plain_scalar(node) || !parse_number(node.Scalar(), &v)) {
        return type_error(key, "a non-negative integer", node);
      }
      *static_cast<uint64_t*>(dst) = v;
      return Status::ok();
    }
    case Kind::kFloat: {
      float v = 0;
      if (!is_plain_scalar(node) || !parse_number(node.Scalar(), &v)) {
        return type_error(key, "a number", node);
      }
      if (!std::isfinite(v)) return type_error(key, "a finite number", node);
      *static_cast<float*>(dst) = v;
      return Status::ok();
    }
    case Kind::kBool: {
      // YAML 1.2 core schema only: yes/no/on/off/1/0 are too easy to get wrong.
      static const std::set<std::string> kTrue = {"true", "True", "TRUE"};
      static const std::set<std::string> kFalse = {"false", "False", "FALSE"};
      if (is_plain_scalar(node) && kTrue.count(node.Scalar())) {
        *static_cast<bool*>(dst) = true;
      } else if (is_plain_scalar(node) && kFalse.count(node.Scalar())) {
        *static_cast<bool*>(dst) = false;
      } else {
        return type_error(key, "a boolean (true or false)", node);
      }
      return Status::ok();
    }
    case Kind::kString:
      if (node.IsNull()) {
        static_cast<std::string*>(dst)->clear();
      } else if (node.IsScalar()) {
        *static_cast<std::string*>(dst) = node.Scalar();
      } else {
        return type_error(key, "a string", node);
      }
      return Status::ok();
    case Kind::kIntList: {
      auto* list = static_cast<std::vector<int>*>(dst);
      if (node.IsNull()) {
        list->clear();
        return Status::ok();
      }
      if (!node.IsSequence()) return type_error(key, "a list of integers, e.g. [2, 2]", node);
      std::vector<int> values(node.size());
      for (size_t i = 0; i < node.size(); ++i) {
        TRIDENT_RETURN_IF_ERROR(
            parse_int(key + "[" + std::to_string(i) + "]", node[i], &values[i]));
      }
      *list = std::move(values);
      return Status::ok();
    }
    case Kind::kTie: {
      bool b = false;
      if (is_plain_scalar(node) && node.Scalar() == "auto") {
        *static_cast<int*>(dst) = -1;
      } else if (parse_value(key, Kind::kBool, node, &b).is_ok()) {
        *static_cast<int*>(dst) = b ? 1 : 0;
      } else {
        int v = 0;
        if (!parse_int(key, node, &v).is_ok() || v < -1 || v > 1) {
          return type_error(key, "true, false or auto (the family default)", node);
        }
        *static_cast<int*>(dst) = v;
      }
      return Status::ok();
    }
    case Kind::kArch:
    case Kind::kPipeline:
    case Kind::kLrSchedule:
    case Kind::kDevice:
    case Kind::kPrecision:
    case Kind::kRecompute: {
      struct Choice {
        const char* name;
        int value;
      };
      std::vector<Choice> choices;
      if (kind == Kind::kArch) {
        for (size_t i = 0; i < architectures().size(); ++i) {
          choices.push_back({architectures()[i].name, static_cast<int>(i)});
        }
      } else if (kind == Kind::kPipeline) {
        choices = {{"gpipe", int(PipeSchedule::kGPipe)}, {"1f1b", int(PipeSchedule::kOneFOneB)}};
      } else if (kind == Kind::kDevice) {
        choices = {{"auto", int(DeviceKind::kAuto)},
                   {"cpu", int(DeviceKind::kCpu)},
                   {"cuda", int(DeviceKind::kCuda)}};
      } else if (kind == Kind::kPrecision) {
        choices = {{"fp32", int(Precision::kFp32)}, {"bf16", int(Precision::kBf16)}};
      } else if (kind == Kind::kRecompute) {
        choices = {{"none", int(Recompute::kNone)},
                   {"selective", int(Recompute::kSelective)},
                   {"full", int(Recompute::kFull)}};
      } else {
        choices = {{"constant", int(LrSchedule::kConstant)},
                   {"cosine", int(LrSchedule::kCosine)},
                   {"linear", int(LrSchedule::kLinear)}};
      }
      std::vector<std::string> names;
      for (const auto& c : choices) {
        names.push_back(c.name);
        if (node.IsScalar() && node.Scalar() == c.name) {
          // All six enums are int-sized scoped enums.
          static_assert(sizeof(Arch) == sizeof(int) && sizeof(LrSchedule) == sizeof(int) &&
                        sizeof(PipeSchedule) == sizeof(int) && sizeof(DeviceKind) == sizeof(int) &&
                        sizeof(Precision) == sizeof(int) && sizeof(Recompute) == sizeof(int));
          std::memcpy(dst, &c.value, sizeof(int));
          return Status::ok();
        }
      }
      return Status::invalid_config(key + ": expected one of " + join_names(names) + "; got " +
                                    describe(node));
    }
  }
  return Status::internal(key + ": unhandled kind");
}

Status unknown_key(const std::string& section, const std::string& key) {
  const Section* s = find_section(section);
  if (s == nullptr) {
    return Status::invalid_config("unknown section '" + section +
                                  "'; allowed sections: " + allowed_sections());
  }
  return Status::invalid_config("unknown key " + section + "." + key + "; allowed keys in " +
                                section + ": " + allowed_keys(*s));
}

// "path:LINE: message", the line of `node` (1-based).
Status at(const std::string& source, const YAML::Node& node, const Status& status) {
  return status.with_context(source + ":" + std::to_string(node.Mark().line + 1));
}

Status apply_document(const YAML::Node& root, const std::string& source, Config* config) {
  if (root.IsNull()) return Status::ok();
  if (!root.IsMap()) {
    return at(source, root, Status::invalid_config("expected a mapping of sections (" +
                                                   allowed_sections() + "), got " + describe(root)));
  }
  std::set<std::string> seen_sections;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string section_name = it->first.Scalar();
    const Section* section = find_section(section_name);
    if (section == nullptr) return at(source, it->first, unknown_key(section_name, ""));
    if (!seen_sections.insert(section_name).second) {
      return at(source, it->first, Status::invalid_config("duplicate section '" + section_name + "'"));
    }
    const YAML::Node& body = it->second;
    if (body.IsNull()) continue;
    if (!body.IsMap()) {
      return at(source, it->first,
                type_error(section_name, "a mapping of keys", body));
    }
    std::set<std::string> seen_keys;
    for (auto kv = body.begin(); kv != body.end(); ++kv) {
      const std::string key = kv->first.Scalar();
      const std::string full = section_name + "." + key;
      const Field* field = find_field(*section, key);
      if (field == nullptr) return at(source, kv->first, unknown_key(section_name, key));
      if (!seen_keys.insert(key).second) {
        return at(source, kv->first, Status::invalid_config("duplicate key " + full));
      }
      Status st = parse_value(full, field->kind, kv->second, field->ref(*config));
      if (!st.is_ok()) return at(source, kv->first, st);
    }
  }
  return Status::ok();
}

// "section.key=value" with value in YAML syntax (a scalar or a flow list).
Status apply_override(const std::string& text, Config* config) {
  const std::string context = "--set " + text;
  const size_t eq = text.find('=');
  if (eq == std::string::npos) {
    return Status::invalid_config(context + ": no equals sign; expected section.key=value");
  }
  const std::string path = text.substr(0, eq);
  const size_t dot = path.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == path.size() ||
      path.find('.', dot + 1) != std::string::npos) {
    return Status::invalid_config(context + ": '" + path + "' is not of the form section.key");
  }
  const std::string section_name = path.substr(0, dot);
  const std::string key = path.substr(dot + 1);
  const Section* section = find_section(section_name);
  const Field* field = section ? find_field(*section, key) : nullptr;
  if (field == nullptr) return unknown_key(section_name, key).with_context(context);
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return Status::invalid_config(context + ": cannot parse the value as YAML: " + e.msg);
  }
  return parse_value(path, field->kind, value, field->ref(*config)).with_context(context);
}

// Shortest text that parses back to the same float: plain decimals in the usual range
// (500000, 0.0003), else scientific with a dot in the mantissa ("1.0e-08") so that YAML
// 1.1 readers such as PyYAML also see a number.
std::string float_text(float v) {
  char buf[96];
  const float a = std::fabs(v);
  const bool fixed = a == 0.0f || (a >= 1e-6f && a < 1e9f);
  auto [ptr, ec] = fixed ? std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed)
                         : std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string text(buf, ec == std::errc() ? ptr : buf);
  const size_t e = text.find('e');
  if (e != std::string::npos && text.find('.') == std::string::npos) text.insert(e, ".0");
  return text;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

// Shortest text that parses back to the same double, with a dot or an exponent with a
// dot in the mantissa (see float_text).
std::string double_text(double v) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  std::string text(buf, ec == std::errc() ? ptr : buf);
  const size_t e = text.find('e');
  if (e != std::string::npos && text.find('.') == std::string::npos) text.insert(e, ".0");
  return text;
}

std::string data_spec_text(const DataConfig& data) {
  if (data.train_blend.empty()) return quoted(data.train);
  std::string out = "[";
  for (const BlendSource& s : data.train_blend) {
    out += (out.size() > 1 ? ", " : "") + std::string("{path: ") + quoted(s.path) +
           ", weight: " + double_text(s.weight) + "}";
  }
  return out + "]";
}

std::string value_text(Kind kind, void* p) {
  switch (kind) {
    case Kind::kDataSpec:
      return data_spec_text(*static_cast<DataConfig*>(p));
    case Kind::kInt:
      return std::to_string(*static_cast<int*>(p));
    case Kind::kDegreeOrAuto: {
      const int v = *static_cast<int*>(p);
      return v == kDpAuto ? "auto" : std::to_string(v);
    }
    case Kind::kUint64:
      return std::to_string(*static_cast<uint64_t*>(p));
    case Kind::kFloat:
      return float_text(*static_cast<float*>(p));
    case Kind::kBool:
      return *static_cast<bool*>(p) ? "true" : "false";
    case Kind::kString:
      return quoted(*static_cast<std::string*>(p));
    case Kind::kIntList: {
      std::string out = "[";
      for (int v : *static_cast<std::vector<int>*>(p)) {
        out += (out.size() > 1 ? ", " : "") + std::to_string(v);
      }
      return out + "]";
    }
    case Kind::kTie: {
      const int v = *static_cast<int*>(p);
      return v < 0 ? "auto" : (v ? "true" : "false");
    }
    case Kind::kArch:
      return arch_name(*static_cast<Arch*>(p));
    case Kind::kPipeline:
      return pipe_schedule_name(*static_cast<PipeSchedule*>(p));
    case Kind::kDevice:
      return device_kind_name(*static_cast<DeviceKind*>(p));
    case Kind::kLrSchedule:
      return lr_schedule_name(*static_cast<LrSchedule*>(p));
    case Kind::kPrecision:
      return precision_name(*static_cast<Precision*>(p));
    case Kind::kRecompute:
      return recompute_name(*static_cast<Recompute*>(p));
  }
  return "";
}

Status at_least(const std::string& key, int64_t value, int64_t min) {
  if (value >= min) return Status::ok();
  return Status::invalid_config(key + ": must be >= " + std::to_string(min) + ", got " +
                                std::to_string(value));
}

Status float_check(const std::string& key, float value, bool ok, const std::string& rule) {
  if (ok && std::isfinite(value)) return Status::ok();
  return Status::invalid_config(key + ": must be " + rule + ", got " + float_text(value));
}

Status tp_divides(int tp, const std::string& what, int value) {
  if (value % tp == 0) return Status::ok();
  return Status::invalid_config("parallel.tp: " + std::to_string(tp) + " does not divide " + what +
                                "=" + std::to_string(value));
}

// World sizes and ranks are ints (MPI's); the product of the degrees must be one (ep
// folds into dp and is no factor of the world).
Status validate_layout_sizes(const ParallelConfig& p) {
  if (p.world_size_wide() <= std::numeric_limits<int>::max()) return Status::ok();
  const bool cp = p.cp > 1;  // named only when used, as in validate_layout
  return Status::invalid_config(std::string("parallel: dp * ") + (cp ? "cp * " : "") +
                                "tp * pp = " + std::to_string(p.dp) + " * " +
                                (cp ? std::to_string(p.cp) + " * " : std::string()) +
                                std::to_string(p.tp) + " * " + std::to_string(p.pp) +
                                " is more than " +
                                std::to_string(std::numeric_limits<int>::max()) +
                                " ranks (parallel.dp=" + std::to_string(p.dp) +
                                (cp ? ", parallel.cp=" + std::to_string(p.cp) : std::string()) +
                                ", parallel.tp=" + std::to_string(p.tp) +
                                ", parallel.pp=" + std::to_string(p.pp) + ")");
}

// The model indexes one micro-batch's tokens with an int (N = B * T), and sizes its
// activations in 64 bits: the CPU backend's attention state, the probabilities
// (B, NH/tp, T, T), is the biggest.
// Values past these limits would wrap, not fail, so they are refused here; whether the
// activations fit in memory is plan/memory_plan.h's business.
Status validate_micro_batch_sizes(const ParallelConfig& p, const TransformerConfig& m) {
  const int64_t tokens = int64_t{p.micro_batch_size} * m.seq_len;
  if (tokens > std::numeric_limits<int>::max()) {
    return Status::invalid_config(
        "parallel.micro_batch_size: " + std::to_string(p.micro_batch_size) +
        " sequences of model.seq_len=" + std::to_string(m.seq_len) + " tokens are " +
        std::to_string(tokens) + " tokens per micro-batch; at most " +
        std::to_string(std::numeric_limits<int>::max()) +
        " are supported (reduce parallel.micro_batch_size or model.seq_len)");
  }
  int64_t att = 0;
  if (__builtin_mul_overflow(tokens, int64_t{m.n_heads / p.tp} * m.seq_len, &att)) {
    return Status::invalid_config(
        "model.seq_len: " + std::to_string(m.seq_len) + " with parallel.micro_batch_size=" +
        std::to_string(p.micro_batch_size) + " and model.n_heads=" + std::to_string(m.n_heads) +
        " needs micro_batch_size * n_heads / tp * seq_len^2 attention probabilities per "
        "layer, more than 2^63");
  }
  return Status::ok();
}

// Context parallelism (parallel/context_parallel.h): each sequence is cut into 2 * cp
// equal chunks. A mixture-of-experts layer's load-balancing loss is a product of two
// means over the micro-batch's tokens (E * sum_e f_e * P_e), which a cp rank, holding
// 1/cp of them, cannot form: the objective differs from cp 1's, so it is refused.
// (Measured with the refusal lifted, configs/tiny_moe.yaml for 5 steps: at
// moe_aux_loss_coef 0.01 the cp 2 losses leave cp 1's from step 2 on, 1e-5 relative by
// step 5; at 0 they agree to every printed digit.)
Status validate_context_parallel(const ParallelConfig& p, const TransformerConfig& m) {
  if (p.cp == 1) return Status::ok();
  if (m.seq_len % (2 * p.cp) != 0) {
    return Status::invalid_config(
        "parallel.cp: " + std::to_string(p.cp) + " needs model.seq_len divisible by 2 * cp = " +
        std::to_string(2 * p.cp) + " (each sequence is cut into 2 * cp equal chunks for the "
        "causal load balance), got model.seq_len=" + std::to_string(m.seq_len));
  }
  if (m.moe()) {
    return Status::invalid_config(
        "parallel.cp: " + std::to_string(p.cp) + " with model.moe_experts=" +
        std::to_string(m.moe_experts) + ": context parallelism of mixture-of-experts models is "
        "not supported (the load-balancing loss needs every token of the micro-batch; use "
        "parallel.cp 1)");
  }
  return Status::ok();
}

// Expert parallelism (parallel.ep; validate_degrees checks that it divides dp): each ep
// rank holds moe_experts / ep of every layer's routed experts.
Status validate_expert_parallel(const ParallelConfig& p, const TransformerConfig& m) {
  if (p.ep == 1) return Status::ok();
  if (!m.moe()) {
    return Status::invalid_config("parallel.ep: " + std::to_string(p.ep) +
                                  " needs a mixture-of-experts model (model.moe_experts > 0); "
                                  "this model is dense");
  }
  if (m.moe_experts % p.ep != 0) {
    return Status::invalid_config("parallel.ep: " + std::to_string(p.ep) +
                                  " does not divide model.moe_experts=" +
                                  std::to_string(m.moe_experts) +
                                  " (each ep rank holds moe_experts / ep experts)");
  }
  return Status::ok();
}

Status validate_parallel(const Config& config, const TransformerConfig& m) {
  // dp: auto is resolved at launch (resolve_auto_dp); until then every check that does
  // not need dp runs with dp 1.
  ParallelConfig p = config.parallel;
  if (p.dp == kDpAuto) p.dp = 1;
  TRIDENT_RETURN_IF_ERROR(validate_degrees(p));
  if (p.zero_stage < 0 || p.zero_stage > 3) {
    return Status::invalid_config("parallel.zero_stage: must be 0, 1, 2 or 3, got " +
                                  std::to_string(p.zero_stage));
  }
  TRIDENT_RETURN_IF_ERROR(at_least("parallel.micro_batch_size", p.micro_batch_size, 1));
  TRIDENT_RETURN_IF_ERROR(at_least("parallel.bucket_mb", p.bucket_mb, 1));
  TRIDENT_RETURN_IF_ERROR(at_least("parallel.comm_timeout_s", p.comm_timeout_s, 1));
  TRIDENT_RETURN_IF_ERROR(validate_layout_sizes(p));
  // Megatron-style TP splits heads, kv heads, FFN columns and vocabulary rows evenly.
  TRIDENT_RETURN_IF_ERROR(validate_expert_parallel(p, m));
  TRIDENT_RETURN_IF_ERROR(tp_divides(p.tp, "model.n_heads", m.n_heads));
  TRIDENT_RETURN_IF_ERROR(tp_divides(p.tp, "model.n_kv_heads", m.n_kv_heads));
  TRIDENT_RETURN_IF_ERROR(tp_divides(p.tp, "model.d_ff", m.d_ff));
  TRIDENT_RETURN_IF_ERROR(tp_divides(
      p.tp, "the padded vocabulary (model.vocab_size=" + std::to_string(m.vocab_size) + " padded)",
      m.padded_vocab));
  TRIDENT_RETURN_IF_ERROR(validate_micro_batch_sizes(p, m));
  if (p.sequence_parallel && p.tp == 1) {
    return Status::invalid_config(
        "parallel.sequence_parallel: needs parallel.tp > 1 (it splits the sequence over the "
        "tensor-parallel ranks), got tp=1");
  }
  TRIDENT_RETURN_IF_ERROR(validate_context_parallel(p, m));
  // A cp rank's micro-batch has seq_len / cp positions per sequence.
  if (p.sequence_parallel && (m.seq_len / p.cp) % p.tp != 0) {
    return Status::invalid_config(
        "parallel.sequence_parallel: model.seq_len=" + std::to_string(m.seq_len) +
        (p.cp > 1 ? " / parallel.cp=" + std::to_string(p.cp) : std::string()) +
        " does not split over parallel.tp=" + std::to_string(p.tp));
  }
  if (p.pp > m.n_layers) {
    return Status::invalid_config("parallel.pp: " + std::to_string(p.pp) +
                                  " pipeline stages but model.n_layers=" +
                                  std::to_string(m.n_layers) + ": more stages than layers");
  }
  if (!p.stage_layers.empty()) {
    if (static_cast<int>(p.stage_layers.size()) != p.pp) {
      return Status::invalid_config("parallel.stage_layers: has " +
                                    std::to_string(p.stage_layers.size()) +
                                    " entries but parallel.pp=" + std::to_string(p.pp));
    }
    int64_t sum = 0;
    for (size_t i = 0; i < p.stage_layers.size(); ++i) {
      TRIDENT_RETURN_IF_ERROR(at_least("parallel.stage_layers[" + std::to_string(i) + "]",
                                       p.stage_layers[i], 1));
      sum += p.stage_layers[i];
    }
    if (sum != m.n_layers) {
      return Status::invalid_config("parallel.stage_layers: sums to " + std::to_string(sum) +
                                    " but model.n_layers=" + std::to_string(m.n_layers));
    }
  }
  return Status::ok();
}

Status validate_training(const Config& config) {
  const TrainingConfig& t = config.training;
  const ParallelConfig& p = config.parallel;
  TRIDENT_RETURN_IF_ERROR(at_least("training.global_batch_size", t.global_batch_size, 1));
  const int64_t per_step = int64_t{p.micro_batch_size} * p.dp;
  // dp: auto: checked when the world size resolves it (resolve_auto_dp).
  if (p.dp != kDpAuto && t.global_batch_size % per_step != 0) {
    return Status::invalid_config(
        "training.global_batch_size: " + std::to_string(t.global_batch_size) +
        " is not divisible by parallel.micro_batch_size * parallel.dp = " +
        std::to_string(p.micro_batch_size) + " * " + std::to_string(p.dp) + " = " +
        std::to_string(per_step));
  }
  TRIDENT_RETURN_IF_ERROR(at_least("training.max_steps", t.max_steps, 1));
  TRIDENT_RETURN_IF_ERROR(float_check("training.lr", t.lr, t.lr > 0, "> 0"));
  TRIDENT_RETURN_IF_ERROR(float_check("training.min_lr", t.min_lr, t.min_lr >= 0 && t.min_lr <= t.lr,
                                      "in [0, training.lr=" + float_text(t.lr) + "]"));
  TRIDENT_RETURN_IF_ERROR(at_least("training.warmup_steps", t.warmup_steps, 0));
  TRIDENT_RETURN_IF_ERROR(float_check("training.weight_decay", t.weight_decay, t.weight_decay >= 0, ">= 0"));
  TRIDENT_RETURN_IF_ERROR(float_check("training.beta1", t.beta1, t.beta1 >= 0 && t.beta1 < 1, "in [0, 1)"));
  TRIDENT_RETURN_IF_ERROR(float_check("training.beta2", t.beta2, t.beta2 >= 0 && t.beta2 < 1, "in [0, 1)"));
  TRIDENT_RETURN_IF_ERROR(float_check("training.eps", t.eps, t.eps > 0, "> 0"));
  TRIDENT_RETURN_IF_ERROR(float_check("training.grad_clip", t.grad_clip, t.grad_clip >= 0, ">= 0 (0 = off)"));
  TRIDENT_RETURN_IF_ERROR(float_check("training.moe_aux_loss_coef", t.moe_aux_loss_coef,
                                      t.moe_aux_loss_coef >= 0, ">= 0"));
  TRIDENT_RETURN_IF_ERROR(float_check("training.moe_z_loss_coef", t.moe_z_loss_coef,
                                      t.moe_z_loss_coef >= 0, ">= 0"));
  TRIDENT_RETURN_IF_ERROR(at_least("training.eval_interval", t.eval_interval, 0));
  if (t.eval_interval > 0 && !config.data.val.empty()) {
    TRIDENT_RETURN_IF_ERROR(at_least("training.eval_batches", t.eval_batches, 1));
  }
  // A factor <= 1 would stop any run whose loss ever rises above its median.
  TRIDENT_RETURN_IF_ERROR(float_check("training.loss_spike_factor", t.loss_spike_factor,
                                      t.loss_spike_factor == 0 || t.loss_spike_factor > 1,
                                      "0 (off) or > 1"));
  TRIDENT_RETURN_IF_ERROR(at_least("training.loss_spike_window", t.loss_spike_window, 1));
  return Status::ok();
}

// Interleaved 1F1B (parallel/pipeline.h): the schedule, the micro-batch count and the
// layer split must allow v model chunks per pipeline rank.
Status validate_virtual_stages(const Config& config, const TransformerConfig& m) {
  const ParallelConfig& p = config.parallel;
  TRIDENT_RETURN_IF_ERROR(at_least("parallel.virtual_stages", p.virtual_stages, 1));
  // dp: auto: the micro-batch count is known once the world size resolves dp.
  if (p.virtual_stages == 1 || p.dp == kDpAuto) return Status::ok();
  if (!p.stage_layers.empty()) {
    return Status::invalid_config(
        "parallel.stage_layers: cannot be set with parallel.virtual_stages=" +
        std::to_string(p.virtual_stages) + " (the model chunks are equal)");
  }
  std::string problem =
      interleave_problem(p.pipeline_schedule, p.pp, p.virtual_stages, config.grad_accum_steps());
  if (problem.empty()) problem = layer_split_problem(m.n_layers, p.pp, p.virtual_stages);
  if (!problem.empty()) return Status::invalid_config(problem);
  const int chunks = p.pp * p.virtual_stages;
  if (m.n_layers % chunks != 0) {
    return Status::invalid_config(
        "parallel.virtual_stages: model.n_layers=" + std::to_string(m.n_layers) +
        " does not divide into parallel.pp * parallel.virtual_stages = " +
        std::to_string(p.pp) + " * " + std::to_string(p.virtual_stages) + " = " +
        std::to_string(chunks) + " equal model chunks");
  }
  return Status::ok();
}

}  // namespace

const char* precision_name(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

const char* lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::kConstant:
      return "constant";
    case LrSchedule::kCosine:
      return "cosine";
    case LrSchedule::kLinear:
      return "linear";
  }
  return "?";
}

namespace {

// runtime.threads: 0 (automatic) up to kMaxThreadsPerCore per core of this machine, and
// at least kMinThreadsLimit (a config written for a larger machine still loads); far
// more threads than cores only slows a step, and tens of thousands crash the OpenMP
// runtime.
Status validate_threads(int threads) {
  TRIDENT_RETURN_IF_ERROR(at_least("runtime.threads", threads, 0));
  static const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int most = std::max(kMinThreadsLimit, kMaxThreadsPerCore * cores);
  if (threads <= most) return Status::ok();
  return Status::invalid_config("runtime.threads: " + std::to_string(threads) + " is more than " +
                                std::to_string(most) + " (" + std::to_string(kMaxThreadsPerCore) +
                                " per core of this machine's " + std::to_string(cores) +
                                ", at least " + std::to_string(kMinThreadsLimit) +
                                "); 0 picks the cores divided by the ranks");
}

}  // namespace

Status validate_config(const Config& config) {
  TRIDENT_RETURN_IF_ERROR(config.model.validate());
  TransformerConfig model = config.model;  // effective sizes, whether finalized or not
  model.finalize();
  TRIDENT_RETURN_IF_ERROR(validate_parallel(config, model));
  TRIDENT_RETURN_IF_ERROR(validate_training(config));
  TRIDENT_RETURN_IF_ERROR(validate_virtual_stages(config, model));
  TRIDENT_RETURN_IF_ERROR(validate_threads(config.runtime.threads));
  TRIDENT_RETURN_IF_ERROR(float_check("runtime.peak_tflops", config.runtime.peak_tflops,
                                      config.runtime.peak_tflops >= 0, ">= 0 (0 = the backend's)"));
  if (config.data.train.empty() && config.data.train_blend.empty()) {
    return Status::invalid_config(
        "data.train: required: a token file, glob, directory, Megatron prefix or blend");
  }
  if (!config.data.train.empty() && !config.data.train_blend.empty()) {
    return Status::invalid_config("data.train: both a path and a blend are set");
  }
  for (size_t i = 0; i < config.data.train_blend.size(); ++i) {
    const BlendSource& s = config.data.train_blend[i];
    const std::string entry = "data.train[" + std::to_string(i) + "]";
    if (s.path.empty()) return Status::invalid_config(entry + ".path: must not be empty");
    if (!(s.weight > 0) || !std::isfinite(s.weight)) {
      return Status::invalid_config(entry + ".weight: must be a positive finite number, got " +
                                    double_text(s.weight));
    }
  }
  if (!config.data.train_blend.empty()) {
    std::vector<double> weights;
    for (const BlendSource& s : config.data.train_blend) weights.push_back(s.weight);
    TRIDENT_RETURN_IF_ERROR(blend_quotas(weights).status());
  }
  const CheckpointConfig& ck = config.checkpoint;
  TRIDENT_RETURN_IF_ERROR(at_least("checkpoint.interval", ck.interval, 0));
  TRIDENT_RETURN_IF_ERROR(at_least("checkpoint.keep_last", ck.keep_last, 1));
  if (ck.dir.empty()) {
    // Also needed with interval 0 and save_final false: a SIGTERM/SIGINT/SIGHUP/SIGUSR1 stop
    // saves a checkpoint.
    return Status::invalid_config("checkpoint.dir: must not be empty");
  }
  const LoggingConfig& lg = config.logging;
  TRIDENT_RETURN_IF_ERROR(at_least("logging.log_interval", lg.log_interval, 1));
  // A factor <= 1 would call every rank above the median a straggler.
  TRIDENT_RETURN_IF_ERROR(float_check("logging.straggler_factor", lg.straggler_factor,
                                      lg.straggler_factor == 0 || lg.straggler_factor > 1,
                                      "0 (off) or > 1"));
  TRIDENT_RETURN_IF_ERROR(at_least("logging.straggler_window", lg.straggler_window, 1));
  return Status::ok();
}

Status resolve_auto_dp(Config* config, int world_size) {
  ParallelConfig& p = config->parallel;
  if (p.dp != kDpAuto) return Status::ok();
  const int64_t others = int64_t{p.cp} * p.tp * p.pp * p.ep;
  const bool cp = p.cp > 1;
  const std::string product_name = cp ? "cp*tp*pp" : "tp*pp";
  const std::string product_text = cp ? std::to_string(p.cp) + "*" + std::to_string(p.tp) + "*" +
                                            std::to_string(p.pp)
                                      : std::to_string(p.tp) + "*" + std::to_string(p.pp);
  if (world_size < 1 || others < 1 || world_size % others != 0) {
    return Status::invalid_config(
        "parallel.dp: auto: the world size " + std::to_string(world_size) +
        " is not a multiple of " + product_name + " = " + product_text + " = " +
        std::to_string(others) + "; launch a multiple of " + std::to_string(others) +
        " processes");
  }
  p.dp = static_cast<int>(world_size / others);
  return validate_config(*config).with_context(
      "parallel.dp: auto = world size " + std::to_string(world_size) + " / " + product_name +
      " " + std::to_string(others) + " = " + std::to_string(p.dp));
}

Result<Config> parse_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                            const std::string& source_name) {
  Config config;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return Status::invalid_config(source_name + ":" + std::to_string(e.mark.line + 1) +
                                  ": YAML syntax error: " + e.msg);
  }
  TRIDENT_RETURN_IF_ERROR(apply_document(root, source_name, &config));
  for (const auto& o : overrides) TRIDENT_RETURN_IF_ERROR(apply_override(o, &config));
  config.model.finalize();
  TRIDENT_RETURN_IF_ERROR(validate_config(config).with_context(source_name));
  return config;
}

Result<Config> load_config(const std::string& path, const std::vector<std::string>& overrides) {
  // An ifstream opens a directory and reads it as empty: the defaults would train.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::invalid_input(path + ": is a directory (--config needs a YAML file)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::invalid_input(path + ": cannot open config file: " + std::strerror(errno));
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::invalid_input(path + ": cannot read config file");
  return parse_config(text.str(), overrides, path);
}

std::string config_to_yaml(const Config& config) {
  Config copy = config;  // the field table hands out mutable pointers
  std::string out;
  for (const auto& section : sections()) {
    out += std::string(section.name) + ":\n";
    for (const auto& field : section.fields) {
      out += std::string("  ") + field.name + ": " + value_text(field.kind, field.ref(copy)) + "\n";
    }
  }
  return out;
}

std::string data_train_text(const DataConfig& data) {
  return data.train_blend.empty() ? data.train : data_spec_text(data);
}

std::vector<std::pair<std::string, std::string>> config_values(const Config& config) {
  Config copy = config;  // the field table hands out mutable pointers
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& section : sections()) {
    for (const auto& field : section.fields) {
      out.emplace_back(std::string(section.name) + "." + field.name,
                       value_text(field.kind, field.ref(copy)));
    }
  }
  return out;
}

}  // namespace trident
