// llm.c GPT-2 checkpoints (model.init_from): read one into Trident's parameter names,
// take the architecture from it, and write one back.
//
// File layout (llm.c train_gpt2.c): int32 header[256] with
//   [0] magic 20240326, [1] version (3 = fp32, 5 = bf16), [2] maxT, [3] V, [4] L,
//   [5] NH, [6] C, [7] Vp;
// then the parameters, little-endian, in this order, each (out, in) like ours:
//   wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C), qkvb (L, 3C),
//   attprojw (L, C, C), attprojb (L, C), ln2w (L, C), ln2b (L, C), fcw (L, 4C, C),
//   fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C), lnfb (C).
// qkvw rows are q (first C rows), k, v; heads are contiguous HD-row blocks in each,
// which is Trident's [.., NH, HD] layout, so the split is a row slice.
//
// Errors: every failure to read a file is Status::invalid_input (exit code 2) whose
// message starts with the file path. Nothing here aborts on bad input.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "model/model_config.h"

namespace trident {

inline constexpr int kLlmcMagic = 20240326;
inline constexpr int kLlmcVersionF32 = 3;
inline constexpr int kLlmcVersionBF16 = 5;
inline constexpr int kLlmcHeaderInts = 256;

struct LlmcCheckpoint {
  std::string path;
  int version = 0;
  int max_seq_len = 0;   // maxT: rows of wpe
  int vocab_size = 0;    // V
  int padded_vocab = 0;  // Vp: rows of wte
  int n_layers = 0;      // L
  int n_heads = 0;       // NH
  int d_model = 0;       // C
  // Every tensor under Trident's name (model/transformer.h), fp32, row-major, in the
  // order of Trident's parameter table for a tied gpt2 model.
  std::vector<std::pair<std::string, std::vector<float>>> tensors;

  // nullptr when absent.
  const std::vector<float>* find(std::string_view name) const;
};

// Reads and validates the whole file (bf16 files are widened to fp32).
Result<LlmcCheckpoint> read_llmc_checkpoint(const std::string& path);

// Makes `config` describe the checkpoint's model: arch gpt2, vocab_size V, padded_vocab
// Vp, n_layers, n_heads, n_kv_heads = n_heads, d_model, d_ff = 4C, max_seq_len maxT,
// tied embeddings. Logs a warning for each configured value it overrides. seq_len is
// kept; seq_len > maxT is Status::invalid_config naming model.seq_len (config untouched).
// Call config->finalize() and validate() afterwards, as for any config.
Status apply_llmc_architecture(const LlmcCheckpoint& checkpoint, TransformerConfig* config);

// Returns the host data (numel floats, the global shape of model/transformer.h) of the
// named parameter, or nullptr if there is none.
using LlmcParamLookup = std::function<const float*(const std::string& name)>;

// Writes a version-3 (fp32) llm.c checkpoint of a finalized gpt2 `config` (tied,
// d_ff = 4C, n_kv_heads = n_heads; wpe has max_seq_len rows). Errors: invalid_config
// for a model llm.c cannot represent, invalid_input for a missing parameter, io_error
// when the file cannot be written; messages start with the path.
Status write_llmc_checkpoint(const std::string& path, const TransformerConfig& config,
                             const LlmcParamLookup& lookup);

}  // namespace trident
