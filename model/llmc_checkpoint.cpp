#include "model/llmc_checkpoint.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unordered_map>

#include "core/log.h"
#include "core/tensor.h"
#include "model/finite_weights.h"

namespace trident {
namespace {

// One contiguous run of the file that is exactly one of our tensors. llm.c stacks each
// layer tensor over L, and qkvw[l] is q, k, v stacked by rows, so the whole payload is
// a flat sequence of such runs.
struct Piece {
  std::string name;
  int64_t numel;
};

std::vector<Piece> file_pieces(int64_t maxT, int64_t Vp, int64_t L, int64_t C) {
  std::vector<Piece> pieces;
  pieces.push_back({"wte", Vp * C});
  pieces.push_back({"wpe", maxT * C});
  auto per_layer = [&](std::initializer_list<std::pair<const char*, int64_t>> parts) {
    for (int64_t l = 0; l < L; ++l) {
      for (const auto& [suffix, numel] : parts) {
        pieces.push_back({"layers." + std::to_string(l) + "." + suffix, numel});
      }
    }
  };
  per_layer({{"ln1.weight", C}});
  per_layer({{"ln1.bias", C}});
  per_layer({{"attn.q.weight", C * C}, {"attn.k.weight", C * C}, {"attn.v.weight", C * C}});
  per_layer({{"attn.q.bias", C}, {"attn.k.bias", C}, {"attn.v.bias", C}});
  per_layer({{"attn.o.weight", C * C}});
  per_layer({{"attn.o.bias", C}});
  per_layer({{"ln2.weight", C}});
  per_layer({{"ln2.bias", C}});
  per_layer({{"mlp.fc.weight", 4 * C * C}});
  per_layer({{"mlp.fc.bias", 4 * C}});
  per_layer({{"mlp.proj.weight", C * 4 * C}});
  per_layer({{"mlp.proj.bias", C}});
  pieces.push_back({"lnf.weight", C});
  pieces.push_back({"lnf.bias", C});
  return pieces;
}

// Trident's parameter-table order (model/transformer.h) for a tied gpt2 model.
std::vector<std::string> table_order(int64_t L) {
  std::vector<std::string> names = {"wte", "wpe"};
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const char* s : {"ln1.weight", "ln1.bias", "attn.q.weight", "attn.q.bias",
                          "attn.k.weight", "attn.k.bias", "attn.v.weight", "attn.v.bias",
                          "attn.o.weight", "attn.o.bias", "ln2.weight", "ln2.bias",
                          "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"}) {
      names.push_back(p + s);
    }
  }
  names.push_back("lnf.weight");
  names.push_back("lnf.bias");
  return names;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Header sanity: every value positive, C divisible by NH, Vp >= V, and small enough
// that the size arithmetic cannot overflow. Returns "" when fine.
std::string header_problem(int maxT, int V, int L, int NH, int C, int Vp) {
  constexpr int kMaxDim = 1 << 24;
  constexpr int kMaxLayers = 1 << 12;
  constexpr int kMaxWidth = 1 << 18;
  auto range = [](const char* what, int v, int hi) -> std::string {
    if (v <= 0 || v > hi) {
      return std::string(what) + " " + std::to_string(v) + " is outside [1, " +
             std::to_string(hi) + "]";
    }
    return "";
  };
  for (std::string p : {range("max_seq_len", maxT, kMaxDim), range("vocab_size", V, kMaxDim),
                        range("n_layers", L, kMaxLayers), range("n_heads", NH, kMaxWidth),
                        range("d_model", C, kMaxWidth),
                        range("padded_vocab_size", Vp, kMaxDim)}) {
    if (!p.empty()) return p;
  }
  if (C % NH != 0) {
    return "d_model " + std::to_string(C) + " is not divisible by n_heads " + std::to_string(NH);
  }
  if (Vp < V) {
    return "padded_vocab_size " + std::to_string(Vp) + " is smaller than vocab_size " +
           std::to_string(V);
  }
  return "";
}

}  // namespace

const std::vector<float>* LlmcCheckpoint::find(std::string_view name) const {
  for (const auto& [n, data] : tensors) {
    if (n == name) return &data;
  }
  return nullptr;
}

Result<LlmcCheckpoint> read_llmc_checkpoint(const std::string& path) {
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(path, ec);
  if (ec) return Status::invalid_input(path + ": cannot read llm.c checkpoint: " + ec.message());
  File file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    return Status::invalid_input(path + ": cannot open llm.c checkpoint: " +
                                 std::strerror(errno));
  }
  constexpr size_t kHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
  if (file_size < kHeaderBytes) {
    return Status::invalid_input(path + ": " + std::to_string(file_size) +
                                 " bytes is shorter than the " + std::to_string(kHeaderBytes) +
                                 "-byte llm.c header");
  }
  int32_t header[kLlmcHeaderInts];
  if (std::fread(header, sizeof(int32_t), kLlmcHeaderInts, file.get()) != kLlmcHeaderInts) {
    return Status::invalid_input(path + ": cannot read the llm.c header");
  }
  if (header[0] != kLlmcMagic) {
    return Status::invalid_input(path + ": bad magic " + std::to_string(header[0]) +
                                 ", expected " + std::to_string(kLlmcMagic) +
                                 " (not an llm.c GPT-2 checkpoint)");
  }
  const int version = header[1];
  if (version != kLlmcVersionF32 && version != kLlmcVersionBF16) {
    return Status::invalid_input(path + ": unsupported llm.c checkpoint version " +
                                 std::to_string(version) + " (supported: 3 = fp32, 5 = bf16)");
  }
  LlmcCheckpoint ckpt;
  ckpt.path = path;
  ckpt.version = version;
  ckpt.max_seq_len = header[2];
  ckpt.vocab_size = header[3];
  ckpt.n_layers = header[4];
  ckpt.n_heads = header[5];
  ckpt.d_model = header[6];
  ckpt.padded_vocab = header[7];
  const std::string problem = header_problem(ckpt.max_seq_len, ckpt.vocab_size, ckpt.n_layers,
                                             ckpt.n_heads, ckpt.d_model, ckpt.padded_vocab);
  if (!problem.empty()) return Status::invalid_input(path + ": impossible header: " + problem);

  const std::vector<Piece> pieces =
      file_pieces(ckpt.max_seq_len, ckpt.padded_vocab, ckpt.n_layers, ckpt.d_model);
  int64_t total = 0;
  for (const Piece& p : pieces) total += p.numel;
  const size_t elem_bytes = version == kLlmcVersionF32 ? 4 : 2;
  const uint64_t expected = kHeaderBytes + static_cast<uint64_t>(total) * elem_bytes;
  if (file_size != expected) {
    return Status::invalid_input(
        path + ": size mismatch: the header (version " + std::to_string(version) +
        ", maxT " + std::to_string(ckpt.max_seq_len) + ", Vp " +
        std::to_string(ckpt.padded_vocab) + ", L " + std::to_string(ckpt.n_layers) + ", C " +
        std::to_string(ckpt.d_model) + ") implies " + std::to_string(expected) +
        " bytes, the file has " + std::to_string(file_size) + " bytes");
  }

  std::unordered_map<std::string, size_t> index;
  for (const std::string& name : table_order(ckpt.n_layers)) {
    index.emplace(name, ckpt.tensors.size());
    ckpt.tensors.emplace_back(name, std::vector<float>());
  }
  std::vector<bf16_t> staging;
  for (const Piece& p : pieces) {
    std::vector<float>& dst = ckpt.tensors[index.at(p.name)].second;
    const size_t n = static_cast<size_t>(p.numel);
    dst.resize(n);
    size_t got = 0;
    if (version == kLlmcVersionF32) {
      got = std::fread(dst.data(), sizeof(float), n, file.get());
    } else {
      staging.resize(n);
      got = std::fread(staging.data(), sizeof(bf16_t), n, file.get());
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(staging[i]);
    }
    if (got != n) {
      return Status::invalid_input(path + ": read failed in tensor " + p.name + ": " +
                                   std::strerror(errno));
    }
    const std::string bad = non_finite_problem(dst.data(), n);
    if (!bad.empty()) {
      return Status::invalid_input(path + ": tensor " + p.name + ": " + bad);
    }
  }
  return ckpt;
}

Status apply_llmc_architecture(const LlmcCheckpoint& ckpt, TransformerConfig* config) {
  if (config->seq_len > ckpt.max_seq_len) {
    return Status::invalid_config("model.seq_len: " + std::to_string(config->seq_len) +
                                  " exceeds the " + std::to_string(ckpt.max_seq_len) +
                                  " positions of model.init_from " + ckpt.path);
  }
  auto override_int = [&](const char* key, int* field, int value, bool configured) {
    if (configured && *field != value) {
      log::warn("model.init_from {}: overriding model.{}={} with {} from the checkpoint",
                ckpt.path, key, *field, value);
    }
    *field = value;
  };
  if (config->arch != Arch::kGpt2) {
    log::warn("model.init_from {}: overriding model.arch={} with gpt2 from the checkpoint",
              ckpt.path, arch_name(config->arch));
  }
  config->arch = Arch::kGpt2;
  override_int("vocab_size", &config->vocab_size, ckpt.vocab_size, true);
  override_int("n_layers", &config->n_layers, ckpt.n_layers, true);
  override_int("n_heads", &config->n_heads, ckpt.n_heads, true);
  // 0 and -1 mean "family default", which the checkpoint's values are.
  override_int("n_kv_heads", &config->n_kv_heads, ckpt.n_heads, config->n_kv_heads != 0);
  override_int("d_model", &config->d_model, ckpt.d_model, true);
  override_int("d_ff", &config->d_ff, 4 * ckpt.d_model, config->d_ff != 0);
  override_int("tie_embeddings", &config->tie_embeddings, 1, config->tie_embeddings != -1);
  config->padded_vocab = ckpt.padded_vocab;
  config->max_seq_len = ckpt.max_seq_len;
  config->head_dim = ckpt.d_model / ckpt.n_heads;
  return Status::ok();
}

Status write_llmc_checkpoint(const std::string& path, const TransformerConfig& config,
                             const LlmcParamLookup& lookup) {
  const int C = config.d_model;
  if (config.arch != Arch::kGpt2 || !config.tied() || config.d_ff != 4 * C ||
      (config.n_kv_heads != 0 && config.n_kv_heads != config.n_heads)) {
    return Status::invalid_config(path + ": llm.c checkpoints hold only tied gpt2 models with "
                                  "d_ff = 4 * d_model and n_kv_heads = n_heads");
  }
  const int maxT = config.max_seq_len > 0 ? config.max_seq_len : config.seq_len;
  const int Vp = config.padded_vocab;
  const std::string problem =
      header_problem(maxT, config.vocab_size, config.n_layers, config.n_heads, C, Vp);
  if (!problem.empty()) return Status::invalid_config(path + ": " + problem);
  const std::vector<Piece> pieces = file_pieces(maxT, Vp, config.n_layers, C);
  std::vector<const float*> data;
  for (const Piece& p : pieces) {
    const float* ptr = lookup(p.name);
    if (ptr == nullptr) return Status::invalid_input(path + ": no parameter " + p.name);
    data.push_back(ptr);
  }
  int32_t header[kLlmcHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersionF32;
  header[2] = maxT;
  header[3] = config.vocab_size;
  header[4] = config.n_layers;
  header[5] = config.n_heads;
  header[6] = C;
  header[7] = Vp;
  File file(std::fopen(path.c_str(), "wb"));
  if (!file) return Status::io_error(path + ": cannot create: " + std::strerror(errno));
  bool ok = std::fwrite(header, sizeof(int32_t), kLlmcHeaderInts, file.get()) == kLlmcHeaderInts;
  for (size_t i = 0; ok && i < pieces.size(); ++i) {
    const size_t n = static_cast<size_t>(pieces[i].numel);
    ok = std::fwrite(data[i], sizeof(float), n, file.get()) == n;
  }
  if (!ok || std::fflush(file.get()) != 0) {
    return Status::io_error(path + ": write failed: " + std::strerror(errno));
  }
  return Status::ok();
}

}  // namespace trident
