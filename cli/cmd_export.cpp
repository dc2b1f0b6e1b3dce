// `trident export --checkpoint DIR --format safetensors --out DIR [--no-tokenizer]
//                 [--vocab-dir DIR]`: a Trident checkpoint (a step directory or a checkpoint
// root, whose `latest` step is taken; any layout, the reader reshards) as a Hugging Face
// model directory, model.safetensors + config.json (model/hf_export.h), loadable by
// transformers' from_pretrained and by model.init_from. The architecture comes from the
// config stored in the checkpoint's trainer state, the padded vocabulary and position
// table sizes from the tensors themselves.
//
// With the tokenizer the checkpoint records (cli/checkpoint_tokenizer.h: the training
// data's, a BPE vocabulary) it also writes tokenizer.json and tokenizer_config.json
// (data/bpe_hf_export.h), so that AutoTokenizer.from_pretrained(DIR) gives the ids the
// model trained on. A checkpoint that records none, or the byte tokenizer, gets no
// tokenizer files (one line on stderr says so); --no-tokenizer skips them. A recorded
// tokenizer that cannot be loaded as recorded (file gone or changed) is exit 2 before
// anything is written.
//
// Every file's content is made before the first write; then all are written as
// PATH.tmp and fsync'ed, and only then renamed into place (and the directory fsync'ed):
// a failed write removes the temporary files and leaves the directory as it was. Exit 0
// done, 2 bad usage, an unreadable checkpoint or its tokenizer, 1 a corrupt checkpoint
// or a write failure (the message names the file).
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/durable_io.h"
#include "checkpoint/reader.h"
#include "cli/checkpoint_tokenizer.h"
#include "cli/commands.h"
#include "config/config.h"
#include "data/bpe_hf_export.h"
#include "model/hf_export.h"
#include "model/safetensors.h"

namespace trident {

namespace {

void print_export_usage(std::FILE* to = stderr) {
  std::fprintf(to,
               "usage: trident export --checkpoint DIR --format safetensors --out DIR\n"
               "                      [--no-tokenizer] [--vocab-dir DIR]\n"
               "  writes DIR/model.safetensors and DIR/config.json (Hugging Face\n"
               "  GPT2LMHeadModel or LlamaForCausalLM, fp32) from a checkpoint step\n"
               "  directory or root (its latest step), and DIR/tokenizer.json +\n"
               "  DIR/tokenizer_config.json when the checkpoint records a BPE tokenizer\n"
               "  (--no-tokenizer: not). --vocab-dir: the named vocabularies' files (default\n"
               "  $TRIDENT_GPT2_DIR or $TRIDENT_VOCAB_DIR, else %s or %s)\n",
               TRIDENT_DEFAULT_GPT2_DIR, TRIDENT_DEFAULT_VOCAB_DIR);
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

struct ExportFile {
  std::string path;
  std::string bytes;
};

// Writes the files as described in the file comment: all of them as PATH.tmp (fsync'ed),
// then the renames; a directory in the way of one is found before anything is written.
Status write_export_files(const std::vector<ExportFile>& files) {
  for (const ExportFile& f : files) {
    std::error_code ec;
    if (std::filesystem::is_directory(f.path, ec)) {
      return Status::io_error(f.path + ": is a directory, so the export cannot write this file; "
                              "nothing was written");
    }
  }
  auto remove_temporaries = [&](size_t n) {
    for (size_t i = 0; i < n; ++i) {
      std::error_code ec;
      std::filesystem::remove(files[i].path + ".tmp", ec);
    }
  };
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string tmp = files[i].path + ".tmp";
    FileHandle f;
    Status st = FileHandle::open_write(tmp, &f);
    // Only the temporary files this export created are removed (not, say, a directory in
    // the way of one).
    const size_t created = st.is_ok() ? i + 1 : i;
    if (st.is_ok()) st = f.write_all(files[i].bytes.data(), files[i].bytes.size(), tmp);
    if (st.is_ok()) st = f.sync(tmp);
    if (!st.is_ok()) {
      remove_temporaries(created);
      return Status(st.code(), st.message() + " (the temporary files were removed; no file was "
                                              "replaced)");
    }
  }
  for (size_t i = 0; i < files.size(); ++i) {
    Status st = rename_durable(files[i].path + ".tmp", files[i].path);
    if (!st.is_ok()) {
      remove_temporaries(files.size());
      std::string done;
      for (size_t k = 0; k < i; ++k) done += " " + files[k].path;
      return Status(st.code(), st.message() + (i == 0 ? std::string(" (no file was replaced)")
                                                      : " (already replaced:" + done + ")"));
    }
  }
  return Status::ok();
}

// The tokenizer files of the checkpoint (see the file comment), and in *ids the special
// tokens config.json records; none, with *note saying why, when it records no BPE
// tokenizer.
Result<std::vector<ExportFile>> tokenizer_files(const Checkpoint& ckpt,
                                                const TransformerConfig& model,
                                                const std::string& vocab_dir,
                                                const std::string& out, std::string* note,
                                                HfTokenIds* ids) {
  TRIDENT_ASSIGN_OR_RETURN(
      std::optional<CliTokenizer> tok,
      checkpoint_tokenizer(ckpt, vocab_dir, "--no-tokenizer exports the model without it"));
  if (!tok) {
    *note = "no tokenizer.json written: the checkpoint records no tokenizer (its data had no "
            "prepare sidecars, or it was trained before the trainer stored the record)";
    return std::vector<ExportFile>{};
  }
  if (!tok->bpe) {
    *note = "no tokenizer.json written: the checkpoint's tokenizer is byte (one id per byte), "
            "which is no BPE vocabulary";
    return std::vector<ExportFile>{};
  }
  const LoadedTokenizer& bpe = *tok->bpe;
  // train refuses such data at start-up (the sidecars' vocab_size); this guards a
  // checkpoint whose trainer state was written some other way.
  if (bpe.bpe.vocab_size() > model.vocab_size) {
    return Status::invalid_input(
        ckpt.dir() + ": the checkpoint's tokenizer " + bpe.spec + " has " +
        std::to_string(bpe.bpe.vocab_size()) + " ids, more than the model's model.vocab_size " +
        std::to_string(model.vocab_size) + "; --no-tokenizer exports the model without it");
  }
  TRIDENT_ASSIGN_OR_RETURN(HfTokenizerFiles files, hf_tokenizer_files(bpe, model.seq_len));
  *ids = {files.bos_token_id, files.eos_token_id};
  *note = std::string("tokenizer ") + tok->name +
          (files.source_copied ? ": tokenizer.json copied from it" : ": tokenizer.json written");
  const std::filesystem::path dir(out);
  return std::vector<ExportFile>{
      {(dir / kHfTokenizerFile).string(), std::move(files.tokenizer_json)},
      {(dir / kHfTokenizerConfigFile).string(), std::move(files.tokenizer_config_json)}};
}

}  // namespace

int cmd_export(const std::vector<std::string>& args) {
  std::string checkpoint, format, out, vocab_dir;
  bool with_tokenizer = true;
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
    } else if (flag == "--no-tokenizer") {
      with_tokenizer = false;
    } else if (flag == "--vocab-dir") {
      if (!value(&vocab_dir) || vocab_dir.empty()) return usage_error("--vocab-dir needs a directory");
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
  // Before anything is written: a mixture-of-experts model exports only as Mixtral.
  if (Status exportable = check_hf_exportable(model.value()); !exportable.is_ok()) {
    return fail(Status(exportable.code(), ckpt.dir() + ": " + exportable.message()));
  }

  std::vector<ExportFile> files;
  std::string tokenizer_note = "no tokenizer.json written (--no-tokenizer)";
  HfTokenIds token_ids;
  if (with_tokenizer) {
    auto tok = tokenizer_files(ckpt, model.value(), vocab_dir, out, &tokenizer_note, &token_ids);
    if (!tok.is_ok()) return fail(tok.status());
    files = std::move(tok).value();
  }

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
  const std::filesystem::path dir(out);
  files.push_back({(dir / kHfWeightsFile).string(), encode_safetensors(entries)});
  files.push_back({(dir / kHfConfigFile).string(), hf_config_json(model.value(), token_ids)});
  Status st = make_dirs(out);
  if (st.is_ok()) st = write_export_files(files);
  if (!st.is_ok()) return fail(st);
  std::fprintf(stderr, "trident export: %s\n", tokenizer_note.c_str());
  std::printf("exported step %lld of %s (%s, %lld parameters, %zu tensors) to %s\n",
              static_cast<long long>(ckpt.step()), ckpt.dir().c_str(),
              hf_class_name(model.value()),
              static_cast<long long>(num_params), entries.size(), out.c_str());
  return 0;
}

}  // namespace trident
