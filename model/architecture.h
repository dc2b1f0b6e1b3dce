// The architecture table: one row per model family (model.arch), naming the choices that
// distinguish the families (norm, activation, position encoding, biases, tied head,
// grouped-query attention) and the block builder that lists a layer's tensors and
// buffers from them (model/model_description.h). The model, its description, the
// config's defaults and validation and the HF exporter read these fields; only the table
// rows and the family-name lookup name a family.
//
// Rows: gpt2 and llama are built in; a test may register more (register_architecture),
// each with a new Arch value. The table is filled before any model is built and is
// not thread-safe to extend while models are described.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trident {

// A model family's id: its row in the architecture table. kGpt2 and kLlama are the
// built-in rows; registered ones take the following values.
enum class Arch : int { kGpt2 = 0, kLlama = 1 };

enum class NormKind { kLayerNorm, kRMSNorm };  // LayerNorm has a bias, RMSNorm none
enum class Activation { kGelu, kSwiGlu };      // GELU: fc, proj; SwiGLU: gate, up, down
enum class Position { kLearned, kRope };       // a learned table (wpe) or rotary

struct TransformerConfig;
struct BlockDescription;

// Appends a layer's parameter tensors and activation buffers to `block`. It may read the
// config's family and its moe_experts / moe_shared_experts only: describe_block caches
// the result by those (model/model_description.h).
using BlockBuilder = void (*)(const TransformerConfig& config, BlockDescription* block);

struct Architecture {
  const char* name = "";          // model.arch
  NormKind norm = NormKind::kLayerNorm;
  Activation activation = Activation::kGelu;
  Position position = Position::kLearned;
  float rope_scaling = 1.0f;      // RoPE position scaling (1: none; no row uses another)
  bool biases = true;             // the linears carry biases
  bool tied_head = true;          // model.tie_embeddings' default
  bool gqa = false;               // n_kv_heads may be smaller than n_heads
  bool qk_norm = false;           // norms on q and k (no row has them; validated false)
  BlockBuilder block = nullptr;   // null: the standard decoder block (standard_block)

  bool layer_norm() const { return norm == NormKind::kLayerNorm; }
  bool swiglu() const { return activation == Activation::kSwiGlu; }
  bool learned_positions() const { return position == Position::kLearned; }
  bool rope() const { return position == Position::kRope; }
};

// The row of `arch` (checked: a registered value).
const Architecture& architecture(Arch arch);
// The family named `name`, or nullopt.
std::optional<Arch> find_architecture(std::string_view name);
// Every row, in Arch order.
const std::vector<Architecture>& architectures();
// Adds a row (a test's family) and returns its Arch; its name must be new.
Arch register_architecture(const Architecture& row);

const char* arch_name(Arch arch);

}  // namespace trident
