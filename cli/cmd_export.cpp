// `trident export --checkpoint DIR --format safetensors --out DIR`: a Trident checkpoint
// (a step directory or a checkpoint root, whose `latest` step is taken; any layout, the
// reader reshards) as a Hugging Face model directory, model.safetensors + config.json
// (model/hf_export.h), loadable by transformers' from_pretrained and by model.init_from.
// The architecture comes from the config stored in the checkpoint's trainer state, the
// padded vocabulary and position table sizes from the tensors themselves. Both files
// are written durably (temp file, fsync, rename). Exit 0 done, 2 bad usage or an
// unreadable checkpoint, 1 a corrupt checkpoint or a write failure.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/durable_io.h"
#include "checkpoint/reader.h"
#include "cli/commands.h"
#include "config/config.h"
#include "model/hf_export.h"
#include "model/safetensors.h"

namespace trident {

namespace {

void print_export_usage(std::FILE* to = stderr) {
  std::fprintf(to,
               "usage: trident export --checkpoint DIR --format safetensors --out DIR\n"
               "  writes DIR/model.safetensors and DIR/config.json (Hugging Face\n"
               "  GPT2LMHeadModel or LlamaForCausalLM, fp32) from a checkpoint step\n"
               "  directory or root (its latest step)\n");
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "trident export: %s\n", message.c_str());
  print_export_usage();
  return 2;
}

int fail(const Status& st) {
  std::fprintf(stderr, "trident export: %s\n", st.message().c_str());
  return st.exit_code();
}

// The model config of the run that wrote the checkpoint, with the vocabulary padding and
// (gpt2) position rows as its tensors have them (model.init_from can size both).
Result<TransformerConfig> checkpoint_model_config(const Checkpoint& ckpt) {
  const std::string where = ckpt.dir() + "/manifest.json";
  const nlohmann::json& state = ckpt.trainer_state();
  if (!state.is_object() || !state.contains("config") || !state.at("config").is_string()) {
    return Status::invalid_input(where + ": the trainer state has no stored config");
  }
  TRIDENT_ASSIGN_OR_RETURN(Config config, parse_config(state.at("config").get<std::string>(), {},
                                                       where + " (stored config)"));
  TransformerConfig model = config.model;
  TRIDENT_ASSIGN_OR_RETURN(std::vector<int64_t> wte, ckpt.shape("param/wte"));
  model.padded_vocab = static_cast<int>(wte.at(0));
  if (model.family().learned_positions()) {
    TRIDENT_ASSIGN_OR_RETURN(std::vector<int64_t> wpe, ckpt.shape("param/wpe"));
    model.max_seq_len = static_cast<int>(wpe.at(0));
  }
  return model;
}

}  // namespace

int cmd_export(const std::vector<std::string>& args) {
  std::string checkpoint, format, out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    auto value = [&](std::string* dst) {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) return false;
      *dst = args[++i];
      return true;
    };
    if (flag == "--help" || flag == "-h") {
      print_export_usage(stdout);
      return 0;
    } else if (flag == "--checkpoint") {
      if (!value(&checkpoint)) return usage_error("--checkpoint needs a directory");
    } else if (flag == "--format") {
      if (!value(&format)) return usage_error("--format needs a value");
    } else if (flag == "--out") {
      if (!value(&out)) return usage_error("--out needs a directory");
    } else {
      return usage_error("unknown option '" + flag + "'");
    }
  }
  if (checkpoint.empty()) return usage_error("--checkpoint is required");
  if (out.empty()) return usage_error("--out is required");
  if (format.empty()) return usage_error("--format is required (safetensors)");
  if (format != "safetensors") {
    return usage_error("--format: unknown format '" + format + "' (supported: safetensors)");
  }

  std::string note;
  auto step_dir = resolve_step_dir(checkpoint, &note);
  if (!step_dir.is_ok()) return fail(step_dir.status());
  if (!note.empty()) std::fprintf(stderr, "trident export: %s\n", note.c_str());
  auto opened = open_checkpoint(step_dir.value());
  if (!opened.is_ok()) return fail(opened.status());
  Checkpoint& ckpt = opened.value();
  auto model = checkpoint_model_config(ckpt);
  if (!model.is_ok()) return fail(model.status());

  auto lookup = [&](const std::string& name) -> Result<std::vector<float>> {
    const std::string tensor = "param/" + name;
    TRIDENT_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ckpt.shape(tensor));
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> data(static_cast<size_t>(n));
    TRIDENT_RETURN_IF_ERROR(ckpt.read_tensor(tensor, data.data()));
    return data;
  };
  auto tensors = to_hf_tensors(model.value(), lookup);
  if (!tensors.is_ok()) {
    return fail(Status(tensors.status().code(), ckpt.dir() + ": " + tensors.status().message()));
  }
  std::vector<SafetensorsEntry> entries;
  int64_t num_params = 0;
  for (const HfTensor& t : tensors.value()) {
    entries.push_back({t.name, t.shape, t.data.data()});
    num_params += static_cast<int64_t>(t.data.size());
  }
  const std::string weights = (std::filesystem::path(out) / kHfWeightsFile).string();
  const std::string config_json = (std::filesystem::path(out) / kHfConfigFile).string();
  Status st = make_dirs(out);
  if (st.is_ok()) {
    const std::string bytes = encode_safetensors(entries);
    st = write_file_atomic(weights, std::span<const char>(bytes.data(), bytes.size()));
  }
  if (st.is_ok()) st = write_file_atomic(config_json, hf_config_json(model.value()));
  if (!st.is_ok()) return fail(st);
  std::printf("exported step %lld of %s (%s, %lld parameters, %zu tensors) to %s\n",
              static_cast<long long>(ckpt.step()), ckpt.dir().c_str(),
              hf_class_name(model.value()),
              static_cast<long long>(num_params), entries.size(), out.c_str());
  return 0;
}

}  // namespace trident
