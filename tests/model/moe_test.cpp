// The mixture-of-experts model's own properties (its numerics are checked against PyTorch
// in moe_reference_test.cpp): parameter names and shapes, results bitwise independent of
// the CPU thread count (the dispatch order is fixed), recomputation bitwise equal to none
// and recording each micro-batch once, and gradient accumulation over micro-batches.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/hf_export.h"
#include "model/model_description.h"
#include "model/transformer.h"
#include "tests/model/tiny_config.h"

namespace trident {
namespace {

TransformerConfig moe_model(Arch arch, int shared = 0) {
  TransformerConfig c = testing::tiny_model(arch, {.vocab_size = 64, .seq_len = 16, .d_model = 32,
                                                   .d_ff = 48});
  c.moe_experts = 5;
  c.moe_top_k = 2;
  c.moe_d_ff = 40;
  c.moe_shared_experts = shared;
  c.finalize();
  EXPECT_TRUE(c.validate().is_ok()) << c.validate().message();
  return c;
}

std::vector<int32_t> batch(int n, int vocab, unsigned seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = static_cast<int32_t>(gen() % static_cast<unsigned>(vocab));
  return v;
}

struct MoeRun {
  float loss = 0;
  std::vector<float> grads;
  Transformer::MoeStats stats;
};

MoeRun run(const TransformerConfig& c, Ops& ops, int B, Recompute recompute = Recompute::kNone,
        DType compute = DType::kF32) {
  ModelPartition whole;
  Transformer model(c, ops, whole, nullptr, nullptr, B, 1, compute, recompute);
  model.init_weights(3);
  model.set_moe_loss_coefs(0.05f, 0.01f);
  const auto tokens = batch(B * c.seq_len, c.vocab_size, 1);
  const auto targets = batch(B * c.seq_len, c.vocab_size, 2);
  MoeRun r;
  r.loss = model.forward(tokens.data(), targets.data(), B, c.seq_len);
  model.backward(1.0f);
  r.grads = model.grads_to_host();
  r.stats = model.take_moe_stats();
  return r;
}

TEST(Moe, ParametersAreTheRouterAndEveryExpertsMlp) {
  for (Arch arch : {Arch::kGpt2, Arch::kLlama}) {
    const TransformerConfig c = moe_model(arch);
    const ParamLayout layout = describe_params(c, ModelPartition{});
    std::set<std::string> names;
    for (const ParamInfo& p : layout.params) names.insert(p.name);
    EXPECT_EQ(names.count("layers.1.mlp.fc.weight") + names.count("layers.1.mlp.gate.weight"), 0u);
    const ParamInfo* router = layout.find("layers.1.moe.router.weight");
    ASSERT_NE(router, nullptr);
    EXPECT_EQ(router->shape, Shape({5, 32}));
    const bool gpt2 = arch == Arch::kGpt2;
    for (int e = 0; e < 5; ++e) {
      const std::string x = "layers.0.moe.experts." + std::to_string(e) + ".";
      const ParamInfo* in = layout.find(x + (gpt2 ? "fc.weight" : "gate.weight"));
      const ParamInfo* out = layout.find(x + (gpt2 ? "proj.weight" : "down.weight"));
      ASSERT_NE(in, nullptr) << x;
      ASSERT_NE(out, nullptr) << x;
      EXPECT_EQ(in->shape, Shape({40, 32}));
      EXPECT_EQ(out->shape, Shape({32, 40}));
      EXPECT_EQ(layout.find(x + "up.weight") != nullptr, !gpt2);
      EXPECT_EQ(layout.find(x + "fc.bias") != nullptr, gpt2);
      // Initialised like the dense MLP: the output projection residual-scaled.
      EXPECT_EQ(out->init, InitKind::kResidualNormal);
    }
    int64_t total = 0;
    for (const ParamInfo& p : layout.params) total += p.numel();
    EXPECT_EQ(total, c.num_parameters());
    // Shared experts: moe.shared_experts.{s}.*, the same MLP.
    const ParamLayout shared = describe_params(moe_model(arch, 2), ModelPartition{});
    const ParamInfo* s1 = shared.find(std::string("layers.1.moe.shared_experts.1.") +
                                      (gpt2 ? "fc.weight" : "gate.weight"));
    ASSERT_NE(s1, nullptr);
    EXPECT_EQ(s1->shape, Shape({40, 32}));
    EXPECT_EQ(shared.find("layers.1.moe.shared_experts.2.fc.weight"), nullptr);
  }
}

TEST(Moe, ResultsDoNotDependOnTheThreadCount) {
  for (Arch arch : {Arch::kGpt2, Arch::kLlama}) {
    const TransformerConfig c = moe_model(arch, 1);
    auto one = make_cpu_ops(1), two = make_cpu_ops(2);
    const MoeRun a = run(c, *one, 3), b = run(c, *two, 3);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grads, b.grads);
    EXPECT_EQ(a.stats.aux_loss, b.stats.aux_loss);
    EXPECT_EQ(a.stats.counts, b.stats.counts);
  }
}

TEST(Moe, RecomputationIsBitwiseAndRecordsOnce) {
  auto ops = make_cpu_ops(2);
  for (Arch arch : {Arch::kGpt2, Arch::kLlama}) {
    const TransformerConfig c = moe_model(arch, 2);
    const MoeRun none = run(c, *ops, 2);
    for (Recompute r : {Recompute::kSelective, Recompute::kFull}) {
      const MoeRun again = run(c, *ops, 2, r);
      EXPECT_EQ(again.loss, none.loss) << recompute_name(r);
      EXPECT_EQ(again.grads, none.grads) << recompute_name(r);
      EXPECT_EQ(again.stats.micro_batches, 1);
      EXPECT_EQ(again.stats.aux_loss, none.stats.aux_loss) << recompute_name(r);
      EXPECT_EQ(again.stats.counts, none.stats.counts) << recompute_name(r);
    }
    // Dropless: each layer's experts received exactly N * K assignments.
    for (const auto& layer : none.stats.counts) {
      int64_t sum = 0;
      for (int64_t n : layer) sum += n;
      EXPECT_EQ(sum, int64_t{2} * c.seq_len * c.moe_top_k);
    }
    // Balanced routing gives a load-balancing loss of 1 per layer; this one is near it.
    EXPECT_GT(none.stats.aux_loss, 0.9 * c.n_layers);
    EXPECT_LT(none.stats.aux_loss, 2.0 * c.n_layers);
  }
}

// The coefficients reach the gradient through the routers: every router's gradient
// changes with them, while what lies downstream of the last router (the last layer's
// experts, the final norm and the head) does not.
TEST(Moe, AuxiliaryLossesEnterThroughTheRouters) {
  auto ops = make_cpu_ops(2);
  const TransformerConfig c = moe_model(Arch::kLlama);
  Transformer model(c, *ops, 2);
  model.init_weights(3);
  const auto tokens = batch(2 * c.seq_len, c.vocab_size, 1);
  const auto targets = batch(2 * c.seq_len, c.vocab_size, 2);
  auto grads = [&](float aux, float z) {
    model.zero_grads();
    model.set_moe_loss_coefs(aux, z);
    model.forward(tokens.data(), targets.data(), 2, c.seq_len);
    model.backward(1.0f);
    return model.grads_to_host();
  };
  const std::vector<float> base = grads(0, 0), with_aux = grads(0.5f, 0), with_z = grads(0, 0.5f);
  const std::string last = "layers." + std::to_string(c.n_layers - 1) + ".moe.experts.";
  int routers = 0, downstream = 0;
  for (const ParamInfo& p : model.params()) {
    bool aux_differs = false, z_differs = false;
    for (size_t i = p.offset; i < p.offset + static_cast<size_t>(p.numel()); ++i) {
      aux_differs |= with_aux[i] != base[i];
      z_differs |= with_z[i] != base[i];
    }
    if (p.name.find("moe.router") != std::string::npos) {
      ++routers;
      EXPECT_TRUE(aux_differs && z_differs) << p.name;
    } else if (p.name.rfind(last, 0) == 0 || p.name.rfind("lnf", 0) == 0 ||
               p.name == "lm_head.weight") {
      ++downstream;
      EXPECT_FALSE(aux_differs || z_differs) << p.name;
    }
  }
  EXPECT_EQ(routers, c.n_layers);
  EXPECT_GT(downstream, 5);
}

// The Hugging Face export of a mixture of experts is Mixtral's layout: the router and
// each expert's w1 / w2 / w3 under block_sparse_moe, Trident's tensors unchanged; what
// Mixtral cannot hold (gpt2's GELU experts, shared experts, leading dense layers) is
// refused with exit 2 naming the key, before any tensor is read.
TEST(Moe, ExportsAsMixtralAndRefusesWhatMixtralCannotHold) {
  const TransformerConfig c = moe_model(Arch::kLlama);
  std::vector<std::string> looked_up;
  const auto lookup = [&](const std::string& name) -> Result<std::vector<float>> {
    looked_up.push_back(name);
    for (const ParamInfo& p : describe_params(c, ModelPartition{}).params) {
      if (p.name == name) return std::vector<float>(static_cast<size_t>(p.shape.numel()), 0.5f);
    }
    return Status::invalid_input("no " + name);
  };
  const auto r = to_hf_tensors(c, lookup);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const HfTensor& t : r.value()) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes.at("model.layers.1.block_sparse_moe.gate.weight"),
            (std::vector<int64_t>{5, 32}));
  EXPECT_EQ(shapes.at("model.layers.0.block_sparse_moe.experts.4.w1.weight"),
            (std::vector<int64_t>{40, 32}));
  EXPECT_EQ(shapes.at("model.layers.0.block_sparse_moe.experts.4.w2.weight"),
            (std::vector<int64_t>{32, 40}));
  EXPECT_EQ(shapes.at("model.layers.0.block_sparse_moe.experts.0.w3.weight"),
            (std::vector<int64_t>{40, 32}));
  for (const auto& [name, shape] : shapes) {
    EXPECT_EQ(name.find(".mlp."), std::string::npos) << name;  // no dense MLP in Mixtral
  }
  // Every Trident parameter is exported exactly once.
  EXPECT_EQ(looked_up.size(), describe_params(c, ModelPartition{}).params.size());
  const std::string json = hf_config_json(c);
  EXPECT_NE(json.find("\"MixtralForCausalLM\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"num_local_experts\": 5"), std::string::npos) << json;
  EXPECT_NE(json.find("\"num_experts_per_tok\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"intermediate_size\": 40"), std::string::npos) << json;

  struct Refused {
    TransformerConfig config;
    const char* key;
  };
  TransformerConfig dense_first = c;
  dense_first.moe_first_dense_layers = 1;  // a valid model that Mixtral cannot hold
  for (const Refused& bad : {Refused{moe_model(Arch::kGpt2), "gpt2 family"},
                             Refused{moe_model(Arch::kLlama, 1), "model.moe_shared_experts=1"},
                             Refused{dense_first, "model.moe_first_dense_layers=1"}}) {
    SCOPED_TRACE(bad.key);
    looked_up.clear();
    const auto refused = to_hf_tensors(bad.config, lookup);
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().exit_code(), 2);
    EXPECT_NE(refused.status().message().find(bad.key), std::string::npos)
        << refused.status().message();
    EXPECT_NE(refused.status().message().find("model.moe_experts"), std::string::npos);
    EXPECT_TRUE(looked_up.empty());
    EXPECT_FALSE(check_hf_exportable(bad.config).is_ok());
  }
}

}  // namespace
}  // namespace trident
