#include "model/architecture.h"

#include "core/check.h"

namespace trident {
namespace {

std::vector<Architecture>& table() {
  static std::vector<Architecture> rows = [] {
    std::vector<Architecture> r(2);
    // gpt2: GPT-2's exact math.
    r[0].name = "gpt2";
    r[0].norm = NormKind::kLayerNorm;
    r[0].activation = Activation::kGelu;
    r[0].position = Position::kLearned;
    r[0].biases = true;
    r[0].tied_head = true;
    r[0].gqa = false;
    // llama: RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases, untied head.
    r[1].name = "llama";
    r[1].norm = NormKind::kRMSNorm;
    r[1].activation = Activation::kSwiGlu;
    r[1].position = Position::kRope;
    r[1].biases = false;
    r[1].tied_head = false;
    r[1].gqa = true;
    return r;
  }();
  return rows;
}

}  // namespace

const std::vector<Architecture>& architectures() { return table(); }

const Architecture& architecture(Arch arch) {
  const auto i = static_cast<size_t>(arch);
  TRIDENT_CHECK_MSG(i < table().size(), "unknown model family " + std::to_string(int(arch)));
  return table()[i];
}

std::optional<Arch> find_architecture(std::string_view name) {
  for (size_t i = 0; i < table().size(); ++i) {
    if (name == table()[i].name) return static_cast<Arch>(i);
  }
  return std::nullopt;
}

Arch register_architecture(const Architecture& row) {
  TRIDENT_CHECK_MSG(!find_architecture(row.name), std::string("model family ") + row.name +
                                                     " is already registered");
  table().push_back(row);
  return static_cast<Arch>(table().size() - 1);
}

const char* arch_name(Arch arch) {
  const auto i = static_cast<size_t>(arch);
  return i < table().size() ? table()[i].name : "?";
}

}  // namespace trident
