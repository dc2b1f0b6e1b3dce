// `trident generate --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T]
//                   [--top-k K] [--seed S] [--tokenizer SPEC [--tokenizer-pattern P]]
//                   [--vocab-dir DIR] [--print-ids]`
// Loads the parameters of a Trident checkpoint of any layout (the reader reshards every
// "param/<name>" to its global shape) into a KvCacheDecoder (model/kv_cache_decoder.h),
// with the architecture from the trainer state's "config" (the YAML the run trained
// with; padded_vocab and the gpt2 position rows come from the stored tensors' shapes, so
// a model started from an llm.c checkpoint loads too). DIR is a step directory or a
// checkpoint root (then `latest`, else the newest step_<N>).
//
// The tokenizer, first that applies:
//   --tokenizer SPEC  as `trident prepare` takes it (byte, gpt2, cl100k_base, o200k_base,
//                     llama3, a rank file with --tokenizer-pattern, a tokenizer.json);
//   the checkpoint's  the record of the training data's tokenizer that the trainer stores
//                     in the trainer state ("tokenizer", data/token_meta.h), loaded as
//                     prepare loaded it; a recorded file that is gone, or whose SHA-256 is
//                     not the recorded one, is exit 2 naming the file and both hashes
//                     (--tokenizer overrides);
//   model.vocab_size  for checkpoints without the record (trained on data without
//                     sidecars, or before the trainer stored it):
//     256            -> byte tokenizer (a token is one byte)
//     50257..50304   -> GPT-2 BPE (50257, or padded up to 50304 as nanoGPT does; only
//                       ids < 50257 are ever sampled)
//     anything else  -> exit 2 naming the tokenizers that exist.
// Vocabulary files of the names come from --vocab-dir, else $TRIDENT_GPT2_DIR (gpt2) or
// $TRIDENT_VOCAB_DIR (the others), else the source tree's .cache/gpt2 or .cache/vocab.
// Only ids below the tokenizer's size are sampled; a tokenizer larger than
// model.vocab_size is exit 2 naming both.
//
// Prints the prompt and its completion on stdout (the completion as it is produced),
// then a newline; a summary goes to stderr (with --print-ids, the prompt's ids and the
// new ones too). Exit 0 done, 2 bad usage or checkpoint
// (the message names the flag or the file), 1 unreadable checkpoint data.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/reader.h"
#include "cli/checkpoint_tokenizer.h"
#include "cli/commands.h"
#include "config/config.h"
#include "core/timer.h"
#include "data/bpe_vocabularies.h"
#include "data/gpt2_tokenizer.h"
#include "data/token_meta.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "model/generate.h"
#include "model/kv_cache_decoder.h"

namespace trident {

namespace {

constexpr int kGpt2MaxPaddedVocab = 50304;  // 50257 rounded up to a multiple of 128
constexpr const char* kOverrideRemedy = "--tokenizer SPEC overrides the checkpoint's tokenizer";

void print_generate_usage(std::FILE* to = stderr) {
  std::fprintf(to,
               "usage: trident generate --checkpoint DIR --prompt TEXT\n"
               "                        [--max-new-tokens N (default 64)]\n"
               "                        [--temperature T (default 1.0; 0 = greedy)]\n"
               "                        [--top-k K (default 0 = off)]\n"
               "                        [--seed S (default 0)]\n"
               "                        [--tokenizer SPEC (byte, gpt2, cl100k_base, o200k_base,\n"
               "                         llama3, a rank file PATH, PATH/tokenizer.json)]\n"
               "                        [--tokenizer-pattern gpt2|cl100k|o200k|llama3\n"
               "                         (a rank file PATH: its pre-tokenizer)]\n"
               "                        [--vocab-dir DIR (the named vocabularies' files; default\n"
               "                         $TRIDENT_GPT2_DIR or $TRIDENT_VOCAB_DIR, else\n"
               "                         %s or %s)]\n"
               "                        [--print-ids (the prompt's and the new token ids, on\n"
               "                         stderr)]\n"
               "  DIR: a step directory or a checkpoint root (its latest step).\n"
               "  The tokenizer: --tokenizer, else the one of the data the checkpoint trained on\n"
               "  (recorded by prepare, stored by train; its file must still have the recorded\n"
               "  SHA-256), else by model.vocab_size: 256 = bytes, 50257 (or padded up to\n"
               "  50304) = GPT-2 BPE.\n",
               TRIDENT_DEFAULT_GPT2_DIR, TRIDENT_DEFAULT_VOCAB_DIR);
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "trident generate: %s\n", message.c_str());
  print_generate_usage();
  return 2;
}

int fail(const Status& status) {
  std::fprintf(stderr, "trident generate: %s\n", status.message().c_str());
  return status.exit_code();
}

bool parse_int(const std::string& s, long lo, long hi, int* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = static_cast<int>(v);
  return true;
}

bool parse_u64(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  char* end = nullptr;
  errno = 0;
  *out = std::strtoull(s.c_str(), &end, 10);
  return errno == 0 && *end == '\0';
}

bool parse_temperature(const std::string& s, float* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v) || v < 0.0 || v > 100.0) return false;
  *out = static_cast<float>(v);
  return true;
}

// The model config stored with the checkpoint, sized by its tensors.
Result<TransformerConfig> checkpoint_model_config(const Checkpoint& ckpt) {
  const std::string where = ckpt.dir() + "/manifest.json";
  const nlohmann::json& state = ckpt.trainer_state();
  if (!state.is_object() || !state.contains("config") || !state.at("config").is_string()) {
    return Status::invalid_input(where + ": the trainer state has no \"config\" (the YAML the "
                                 "run trained with), so the architecture is unknown");
  }
  Result<Config> config =
      parse_config(state.at("config").get<std::string>(), {}, where + " trainer state config");
  if (!config.is_ok()) return config.status();
  TransformerConfig model = config.value().model;
  // Shapes the config alone does not fix: the padded vocabulary (and, for gpt2, the
  // position table) of a model initialised from an llm.c checkpoint.
  for (const char* name : {"param/wte", "param/wpe"}) {
    if (!ckpt.has_tensor(name)) continue;
    TRIDENT_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ckpt.shape(name));
    if (shape.size() != 2) continue;  // the parameter check below names it
    if (std::string(name) == "param/wte") model.padded_vocab = static_cast<int>(shape[0]);
    if (std::string(name) == "param/wpe" && model.family().learned_positions()) {
      model.max_seq_len = static_cast<int>(shape[0]);
    }
  }
  model.finalize();
  return model;
}

Status load_parameters(Checkpoint& ckpt, KvCacheDecoder& decoder) {
  std::vector<float> host;
  for (const ParamInfo& p : decoder.params()) {
    const std::string tensor = "param/" + p.name;
    if (!ckpt.has_tensor(tensor)) {
      return Status::invalid_input(ckpt.dir() + ": no tensor '" + tensor +
                                   "', which the stored model config needs");
    }
    TRIDENT_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ckpt.shape(tensor));
    if (shape != p.shape.dims()) {
      return Status::invalid_input(ckpt.dir() + ": tensor '" + tensor + "' has shape " +
                                   nlohmann::json(shape).dump() + ", the stored model config " +
                                   "needs " + nlohmann::json(p.shape.dims()).dump());
    }
    host.resize(static_cast<size_t>(p.shape.numel()));
    TRIDENT_RETURN_IF_ERROR(ckpt.read_tensor(tensor, host.data()));
    TRIDENT_RETURN_IF_ERROR(decoder.set_param(p.name, host.data(), host.size()));
  }
  return Status::ok();
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

}  // namespace

int cmd_generate(const std::vector<std::string>& args) {
  std::string checkpoint, vocab_dir, tokenizer_spec, tokenizer_pattern;
  bool print_ids = false;
  std::optional<std::string> prompt;
  int max_new_tokens = 64;
  SamplingOptions sampling;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    // Values may start with '-' (a prompt, a negative number to reject by name).
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    std::string v;
    if (flag == "--help" || flag == "-h") {
      print_generate_usage(stdout);
      return 0;
    } else if (flag == "--checkpoint") {
      if (!value(&checkpoint) || checkpoint.empty()) {
        return usage_error("--checkpoint needs a directory");
      }
    } else if (flag == "--prompt") {
      if (!value(&v)) return usage_error("--prompt needs a text");
      prompt = v;
    } else if (flag == "--max-new-tokens") {
      if (!value(&v) || !parse_int(v, 0, 1 << 20, &max_new_tokens)) {
        return usage_error("--max-new-tokens needs an integer in [0, 1048576], got '" + v + "'");
      }
    } else if (flag == "--temperature") {
      if (!value(&v) || !parse_temperature(v, &sampling.temperature)) {
        return usage_error("--temperature needs a number in [0, 100] (0 = greedy), got '" + v +
                           "'");
      }
    } else if (flag == "--top-k") {
      if (!value(&v) || !parse_int(v, 0, 1 << 30, &sampling.top_k)) {
        return usage_error("--top-k needs an integer >= 0 (0 = off), got '" + v + "'");
      }
    } else if (flag == "--seed") {
      if (!value(&v) || !parse_u64(v, &sampling.seed)) {
        return usage_error("--seed needs a non-negative integer, got '" + v + "'");
      }
    } else if (flag == "--tokenizer") {
      if (!value(&tokenizer_spec) || tokenizer_spec.empty()) {
        return usage_error("--tokenizer needs byte, gpt2, cl100k_base, o200k_base, llama3, a "
                           "rank file path or a tokenizer.json path");
      }
    } else if (flag == "--tokenizer-pattern") {
      if (!value(&tokenizer_pattern) || tokenizer_pattern.empty()) {
        return usage_error("--tokenizer-pattern needs gpt2, cl100k, o200k or llama3");
      }
    } else if (flag == "--print-ids") {
      print_ids = true;
    } else if (flag == "--vocab-dir") {
      if (!value(&vocab_dir) || vocab_dir.empty()) return usage_error("--vocab-dir needs a directory");
    } else {
      return usage_error("unknown option '" + flag + "'");
    }
  }
  if (checkpoint.empty()) return usage_error("missing --checkpoint DIR");
  if (!prompt) return usage_error("missing --prompt TEXT");
  if (!tokenizer_pattern.empty() && tokenizer_spec.empty()) {
    return usage_error("--tokenizer-pattern goes with --tokenizer PATH (a rank file)");
  }

  std::string note;
  Result<std::string> step_dir = resolve_step_dir(checkpoint, &note);
  if (!step_dir.is_ok()) return fail(step_dir.status());
  if (!note.empty()) std::fprintf(stderr, "trident generate: %s\n", note.c_str());
  Result<Checkpoint> ckpt = open_checkpoint(step_dir.value());
  if (!ckpt.is_ok()) return fail(ckpt.status());
  Result<TransformerConfig> model = checkpoint_model_config(ckpt.value());
  if (!model.is_ok()) return fail(model.status());
  const TransformerConfig& mc = model.value();

  // ---- the tokenizer: --tokenizer, the checkpoint's, else what the vocabulary size implies ----
  std::optional<CliTokenizer> chosen;
  if (!tokenizer_spec.empty()) {
    Result<CliTokenizer> t = load_tokenizer_spec(tokenizer_spec, vocab_dir, tokenizer_pattern);
    if (!t.is_ok()) return fail(t.status());
    chosen = std::move(t).value();
    chosen->name += " (--tokenizer)";
  } else {
    Result<std::optional<CliTokenizer>> t =
        checkpoint_tokenizer(ckpt.value(), vocab_dir, kOverrideRemedy);
    if (!t.is_ok()) return fail(t.status());
    chosen = std::move(t).value();
  }
  std::optional<Gpt2Tokenizer> gpt2;
  std::vector<int32_t> prompt_ids;
  if (chosen && chosen->bpe) {
    const LoadedTokenizer& tok = *chosen->bpe;
    if (tok.bpe.vocab_size() > mc.vocab_size) {
      return fail(Status::invalid_input(
          step_dir.value() + ": the tokenizer " + tok.spec + " has " +
          std::to_string(tok.bpe.vocab_size()) + " ids, more than the model's model.vocab_size " +
          std::to_string(mc.vocab_size)));
    }
    std::string text;
    sanitize_utf8(*prompt, &text);
    std::vector<uint32_t> ids;
    tok.bpe.encode(text, &ids);
    if (ids.empty()) ids.push_back(tok.document_token);  // how prepare starts a document
    prompt_ids.assign(ids.begin(), ids.end());
    sampling.vocab_limit = static_cast<int>(tok.bpe.vocab_size());
  } else if (chosen || mc.vocab_size == 256) {  // bytes, by name or by size
    for (unsigned char c : *prompt) {
      // A model of the bytes that occur (ASCII under 128) has no row for the others.
      if (c >= mc.vocab_size) {
        return usage_error("--prompt has byte " + std::to_string(c) + ", not below the model's "
                           "model.vocab_size " + std::to_string(mc.vocab_size));
      }
      prompt_ids.push_back(c);
    }
    if (prompt_ids.empty()) {
      return usage_error("--prompt is empty; the byte tokenizer has no start token to begin from");
    }
    sampling.vocab_limit = std::min(256, mc.vocab_size);
  } else if (mc.vocab_size >= kGpt2VocabSize && mc.vocab_size <= kGpt2MaxPaddedVocab) {
    if (vocab_dir.empty()) {
      const char* env = std::getenv("TRIDENT_GPT2_DIR");
      vocab_dir = env != nullptr && *env != '\0' ? env : TRIDENT_DEFAULT_GPT2_DIR;
    }
    Result<Gpt2Tokenizer> tok = Gpt2Tokenizer::load_dir(vocab_dir);
    if (!tok.is_ok()) {
      return fail(Status::invalid_input(
          tok.status().message() + " (the checkpoint's model.vocab_size=" +
          std::to_string(mc.vocab_size) + " means the GPT-2 tokenizer: run "
          "scripts/fetch_gpt2_vocab.sh, or pass --vocab-dir DIR or set TRIDENT_GPT2_DIR)"));
    }
    gpt2.emplace(std::move(tok).value());
    std::string text;
    sanitize_utf8(*prompt, &text);
    std::vector<uint32_t> ids;
    gpt2->encode(text, &ids);
    if (ids.empty()) ids.push_back(kGpt2EndOfText);  // GPT-2 starts a document this way
    prompt_ids.assign(ids.begin(), ids.end());
    sampling.vocab_limit = static_cast<int>(kGpt2VocabSize);
  } else {
    return fail(Status::invalid_input(
        step_dir.value() + ": model.vocab_size=" + std::to_string(mc.vocab_size) +
        " matches no tokenizer; the tokenizers are byte (vocab_size 256) and gpt2 (vocab_size "
        "50257, or padded up to 50304)"));
  }

  // The CPU backend, whatever runtime.device trained the checkpoint (the decoder runs on
  // any Ops; a CUDA generate is not wired up here).
  auto made = make_ops(DeviceKind::kCpu, /*threads=*/0, /*ranks_sharing_cores=*/1);
  if (!made.is_ok()) return fail(made.status());
  std::unique_ptr<Ops> ops = std::move(made).value();
  KvCacheDecoder decoder(mc, *ops);
  if (static_cast<int>(prompt_ids.size()) > decoder.max_positions()) {
    return usage_error("--prompt is " + std::to_string(prompt_ids.size()) +
                       " tokens; the model's context is " +
                       std::to_string(decoder.max_positions()) + " positions");
  }
  Status loaded = load_parameters(ckpt.value(), decoder);
  if (!loaded.is_ok()) return fail(loaded);

  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  std::fflush(stdout);
  auto print_token = [&](int32_t id) {
    std::string bytes;
    if (chosen && chosen->bpe) {
      bytes = chosen->bpe->bpe.decode({static_cast<uint32_t>(id)});
    } else if (gpt2) {
      bytes = gpt2->decode({static_cast<uint32_t>(id)});
    } else {
      bytes.push_back(static_cast<char>(id));
    }
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
  };
  const Timer timer;
  GenerateResult result = generate(decoder, prompt_ids, max_new_tokens, sampling,
                                   /*keep_logits=*/false, print_token);
  const double seconds = timer.elapsed_s();
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (result.context_full) {
    std::fprintf(stderr,
                 "trident generate: stopped after %zu of %d new tokens: the model's context is "
                 "%d positions\n",
                 result.tokens.size(), max_new_tokens, decoder.max_positions());
  }
  std::fprintf(stderr,
               "trident generate: %s (step %lld, %s), %zu prompt + %zu new tokens in %.2f s "
               "(%.1f tokens/s), tokenizer %s\n",
               step_dir.value().c_str(), static_cast<long long>(ckpt.value().step()),
               arch_name(mc.arch), prompt_ids.size(), result.tokens.size(), seconds,
               seconds > 0 ? static_cast<double>(prompt_ids.size() + result.tokens.size()) / seconds
                           : 0.0,
               chosen ? chosen->name.c_str() : gpt2 ? "gpt2 (by model.vocab_size)"
                                                    : "byte (by model.vocab_size)");
  if (print_ids) {
    std::fprintf(stderr, "trident generate: prompt ids %s\ntrident generate: new ids %s\n",
                 ids_text(prompt_ids).c_str(), ids_text(result.tokens).c_str());
  }
  return 0;
}

}  // namespace trident
