// Tests of the strict YAML config (config/config.h) and of the model config's derived
// sizes, validation, parameter count and FLOPs (model/model_config.h).
#include "config/config.h"
#include "config/dp_auto.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

const std::string kMinimal = "data:\n  train: data/train_*.bin\n";

// Parses `yaml` and expects a config error (exit code 2) whose message holds every
// string of `needles`.
void expect_error(const std::string& yaml, const std::vector<std::string>& overrides,
                  std::initializer_list<std::string> needles) {
  Result<Config> r = parse_config(yaml, overrides, "cfg.yaml");
  ASSERT_FALSE(r.is_ok()) << "parsed although it should not have:\n" << yaml;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
  EXPECT_EQ(r.status().exit_code(), 2);
  for (const auto& needle : needles) {
    EXPECT_NE(r.status().message().find(needle), std::string::npos)
        << "message: " << r.status().message() << "\nmissing: " << needle;
  }
}

Config parse_ok(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  Result<Config> r = parse_config(yaml, overrides, "cfg.yaml");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : Config{};
}

// Every key of the field table (config_values), so a key added to the table is compared
// without being listed here, plus the derived sizes, which are not keys.
void expect_config_eq(const Config& a, const Config& b) {
  const auto av = config_values(a), bv = config_values(b);
  ASSERT_EQ(av.size(), bv.size());
  for (size_t i = 0; i < av.size(); ++i) {
    ASSERT_EQ(av[i].first, bv[i].first);
    EXPECT_EQ(av[i].second, bv[i].second) << "key " << av[i].first;
  }
  EXPECT_TRUE(a.data.train_blend == b.data.train_blend);
  EXPECT_EQ(a.model.padded_vocab, b.model.padded_vocab);
  EXPECT_EQ(a.model.max_seq_len, b.model.max_seq_len);
  EXPECT_EQ(a.model.head_dim, b.model.head_dim);
}

TEST(Config, DefaultsAreTheStructsAndDerivedSizesAreFilled) {
  Config parsed = parse_ok(kMinimal);
  Config expected;
  expected.data.train = "data/train_*.bin";
  // Family defaults of a gpt2 with C=128, NH=4, V=256, T=64.
  expected.model.n_kv_heads = 4;
  expected.model.d_ff = 512;
  expected.model.tie_embeddings = 1;
  expected.model.padded_vocab = 256;
  expected.model.max_seq_len = 64;
  expected.model.head_dim = 32;
  expect_config_eq(parsed, expected);
  EXPECT_EQ(parsed.grad_accum_steps(), 2);  // 8 / (4 * 1)
  EXPECT_EQ(parsed.runtime.device, DeviceKind::kAuto);
  EXPECT_EQ(parsed.runtime.threads, 0);

  // An empty section is allowed and changes nothing.
  expect_config_eq(parse_ok(kMinimal + "logging:\n"), expected);
}

TEST(Config, LlamaFamilyDefaults) {
  Config c = parse_ok(kMinimal + "model: {arch: llama, vocab_size: 300}\n");
  EXPECT_EQ(c.model.n_kv_heads, 4);
  EXPECT_EQ(c.model.d_ff, 384);  // 8*128/3 = 341.3 rounded up to a multiple of 64
  EXPECT_EQ(c.model.tie_embeddings, 0);
  EXPECT_EQ(c.model.padded_vocab, 384);
  TransformerConfig m;
  m.arch = Arch::kLlama;
  m.d_model = 4096;
  m.n_heads = 32;
  m.finalize();
  EXPECT_EQ(m.d_ff, 10944);  // 10922.7 -> 171 * 64
  // finalize keeps a larger padded vocabulary / position table from a checkpoint.
  TransformerConfig g;
  g.vocab_size = 50257;
  g.padded_vocab = 50432;
  g.max_seq_len = 1024;
  g.finalize();
  EXPECT_EQ(g.padded_vocab, 50432);
  EXPECT_EQ(g.max_seq_len, 1024);
}

const char* kFull = R"(# every key, none at its default
model:
  arch: llama
  vocab_size: 1000
  seq_len: 96
  n_layers: 6
  n_heads: 8
  n_kv_heads: 2
  d_model: 256
  d_ff: 704
  tie_embeddings: true
  norm_eps: 1.0e-6
  rope_theta: 500000
  init_std: 0.01
  init_from: "weights/gpt2 #1: 'x'.bin"
parallel:
  dp: 2
  tp: 2
  pp: 3
  zero_stage: 2
  micro_batch_size: 3
  pipeline_schedule: gpipe
  stage_layers: [1, 2, 3]
  sequence_parallel: true
  virtual_stages: 1  # the default: more chunks need 1f1b and equal chunks
  bucket_mb: 50
  comm_timeout_s: 45
runtime:
  device: cpu
  threads: 3
  peak_tflops: 989.5
data:
  train: "a/train_*.bin"
  val: b/val.bin
  shuffle: false
  seed: 18446744073709551615
training:
  global_batch_size: 24
  max_steps: 7
  lr: 2.5e-4
  min_lr: 1e-5
  warmup_steps: 3
  lr_schedule: linear
  weight_decay: 0.05
  beta1: 0.8
  beta2: 0.99
  eps: 1e-7
  grad_clip: 0
  seed: 7
  eval_interval: 5
  eval_batches: 2
  moe_aux_loss_coef: 0.02
  moe_z_loss_coef: 0.001
checkpoint:
  dir: /tmp/ck
  interval: 4
  keep_last: 1
  async: false
logging:
  metrics: ""
  log_interval: 3
)";

TEST(Config, EveryKeyParsesAndRoundTrips) {
  Config c = parse_ok(kFull);
  EXPECT_EQ(c.model.arch, Arch::kLlama);
  EXPECT_EQ(c.model.padded_vocab, 1024);
  EXPECT_EQ(c.model.head_dim, 32);
  EXPECT_EQ(c.model.norm_eps, 1.0e-6f);
  EXPECT_EQ(c.model.init_from, "weights/gpt2 #1: 'x'.bin");
  EXPECT_EQ(c.parallel.pipeline_schedule, PipeSchedule::kGPipe);
  EXPECT_EQ(c.parallel.stage_layers, (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.runtime.device, DeviceKind::kCpu);
  EXPECT_EQ(c.runtime.threads, 3);
  EXPECT_EQ(c.runtime.peak_tflops, 989.5f);
  EXPECT_EQ(c.data.seed, 18446744073709551615ull);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.training.lr, 2.5e-4f);
  EXPECT_EQ(c.training.lr_schedule, LrSchedule::kLinear);
  EXPECT_EQ(c.training.grad_clip, 0.0f);
  EXPECT_EQ(c.logging.metrics, "");
  EXPECT_EQ(c.grad_accum_steps(), 4);  // 24 / (3 * 2)

  const std::string yaml = config_to_yaml(c);
  Config back = parse_ok(yaml);
  expect_config_eq(back, c);
  EXPECT_EQ(config_to_yaml(back), yaml);
}

// The mixture-of-experts keys of a dense kFull cannot all leave their defaults: a
// model of experts round-trips here, and each refusal names its key.
TEST(Config, MixtureOfExpertsKeysParseRoundTripAndRefuse) {
  const std::string moe = kMinimal +
                          "model: {arch: llama, moe_experts: 8, moe_top_k: 3, moe_d_ff: 96}\n";
  Config c = parse_ok(moe, {"model.moe_shared_experts=1"});
  EXPECT_EQ(c.model.moe_shared_experts, 1);
  EXPECT_EQ(c.model.moe_experts, 8);
  EXPECT_EQ(c.model.moe_top_k, 3);
  EXPECT_EQ(c.model.moe_d_ff, 96);
  Config back = parse_ok(config_to_yaml(c));
  expect_config_eq(back, c);
  // moe_d_ff defaults to d_ff.
  EXPECT_EQ(parse_ok(kMinimal + "model: {moe_experts: 4}\n").model.moe_d_ff, 512);

  // Tensor parallelism (with sequence parallelism too) replicates the experts over tp.
  EXPECT_EQ(parse_ok(moe, {"parallel.tp=2", "parallel.dp=1"}).parallel.tp, 2);
  EXPECT_TRUE(
      parse_ok(moe, {"parallel.tp=2", "parallel.dp=1", "parallel.sequence_parallel=true"})
          .parallel.sequence_parallel);
  expect_error(moe, {"model.moe_top_k=9"}, {"model.moe_top_k", "[1, model.moe_experts=8]"});
  expect_error(moe, {"model.moe_top_k=0"}, {"model.moe_top_k"});
  expect_error(moe, {"model.moe_experts=-1"}, {"model.moe_experts", ">= 0"});
  EXPECT_EQ(parse_ok(moe, {"model.moe_first_dense_layers=1"}).model.moe_first_dense_layers, 1);
  expect_error(moe, {"model.moe_first_dense_layers=4"},
               {"model.moe_first_dense_layers", "[0, model.n_layers=4)"});
  EXPECT_EQ(parse_ok(moe, {"model.moe_shared_experts=2"}).model.moe_shared_experts, 2);
  expect_error(moe, {"model.moe_shared_experts=-1"}, {"model.moe_shared_experts", ">= 0"});
  expect_error(moe, {"model.init_from=gpt2_124M.bin"}, {"model.init_from", "not supported yet"});
  expect_error(kMinimal, {"model.moe_d_ff=64"}, {"model.moe_d_ff", "dense model"});
  expect_error(kMinimal, {"model.moe_shared_experts=2"}, {"model.moe_shared_experts"});
  expect_error(moe, {"training.moe_aux_loss_coef=-1"}, {"training.moe_aux_loss_coef", ">= 0"});
  expect_error(moe, {"training.moe_z_loss_coef=-0.5"}, {"training.moe_z_loss_coef", ">= 0"});
}

// Active FLOPs: a token runs through top_k of the experts.
TEST(ModelConfig, MixtureOfExpertsCountsEveryParameterAndActiveFlops) {
  TransformerConfig dense;
  dense.arch = Arch::kLlama;
  dense.d_model = 64;
  dense.d_ff = 128;
  dense.finalize();
  TransformerConfig moe = dense;
  moe.moe_experts = 4;
  moe.moe_top_k = 2;
  moe.finalize();
  ASSERT_TRUE(moe.validate().is_ok()) << moe.validate().message();
  const int64_t L = dense.n_layers, C = 64, F = 128, E = 4;
  // Each layer: the dense MLP (3 F C) becomes E experts of 3 F C and an E x C router.
  EXPECT_EQ(moe.num_parameters() - dense.num_parameters(), L * ((E - 1) * 3 * F * C + E * C));
  // Active: K = 2 experts and the router.
  EXPECT_DOUBLE_EQ(moe.flops_per_token() - dense.flops_per_token(),
                   6.0 * L * (1 * 3 * F * C + E * C));
  // A shared expert is active for every token.
  TransformerConfig shared = moe;
  shared.moe_shared_experts = 1;
  EXPECT_EQ(shared.num_parameters() - moe.num_parameters(), L * 3 * F * C);
  EXPECT_DOUBLE_EQ(shared.flops_per_token() - moe.flops_per_token(), 6.0 * L * 3 * F * C);
}

TEST(Config, RoundTripKeepsFloatsAndOddStringsExactly) {
  Config c = parse_ok(kMinimal);
  c.training.lr = 0.1f;
  c.training.min_lr = 1.17549435e-38f;  // smallest normal float
  c.training.eps = 3.0e-8f;
  c.model.init_std = 0.0123456789f;
  c.data.train = "tab\there \"q\" back\\slash: # x";
  c.data.val = "null";  // a string that YAML would read as null unless quoted
  c.checkpoint.dir = "true";
  Config back = parse_ok(config_to_yaml(c));
  expect_config_eq(back, c);
}

TEST(Config, RoundTripOfRandomFloatsIsBitExact) {
  // Floats of every magnitude (positive finite bit patterns) survive the YAML text.
  Config c = parse_ok(kMinimal);
  uint32_t state = 12345;
  for (int i = 0; i < 2000; ++i) {
    state = state * 1664525u + 1013904223u;
    uint32_t bits = state & 0x7fffffffu;
    if ((bits >> 23) == 0xff) bits &= 0x7f7fffffu;  // no inf / nan
    float v;
    std::memcpy(&v, &bits, sizeof(v));
    c.training.weight_decay = v;
    Result<Config> back = parse_config(config_to_yaml(c), {});
    ASSERT_TRUE(back.is_ok()) << back.status().message();
    ASSERT_EQ(back->training.weight_decay, v) << config_to_yaml(c);
  }
}

TEST(Config, UnknownKeyNamesTheKeyAndTheAllowedOnes) {
  expect_error(kMinimal + "training:\n  lrr: 1\n",
               {}, {"cfg.yaml:4: ", "unknown key training.lrr", "allowed keys", "lr_schedule"});
  expect_error(kMinimal + "parallel: {dp: 1, sp: 2}\n", {}, {"parallel.sp"});
}

TEST(Config, UnknownSection) {
  expect_error(kMinimal + "optimizer:\n  lr: 1\n", {},
               {"cfg.yaml:3: ", "unknown section 'optimizer'", "model, parallel, runtime, data"});
  expect_error("- 1\n- 2\n", {}, {"expected a mapping of sections"});
  expect_error(kMinimal + "model: 3\n", {}, {"model: expected a mapping of keys, got '3'"});
}

TEST(Config, DuplicateKeysAreErrors) {
  expect_error(kMinimal + "training:\n  lr: 1\n  lr: 2\n", {}, {"duplicate key training.lr"});
}

TEST(Config, WrongTypesNameKeyExpectedAndFound) {
  struct Case {
    std::string yaml;
    std::string key;
    std::string expected;
    std::string found;
  };
  const std::vector<Case> cases = {
      {"training: {lr: abc}", "training.lr", "expected a number", "'abc'"},
      {"training: {max_steps: 1.5}", "training.max_steps", "expected an integer", "'1.5'"},
      {"training: {max_steps: \"10\"}", "training.max_steps", "expected an integer",
       "the string '10'"},
      {"training: {max_steps: }", "training.max_steps", "expected an integer", "null"},
      {"training: {max_steps: 99999999999}", "training.max_steps",
       "expected an integer that fits in 32 bits", "'99999999999'"},
      {"training: {lr: .nan}", "training.lr", "expected a number", "'.nan'"},
      {"training: {lr: inf}", "training.lr", "expected a finite number", "'inf'"},
      {"data: {train: x, shuffle: 1}", "data.shuffle", "expected a boolean", "'1'"},
      {"data: {train: x, shuffle: yes}", "data.shuffle", "expected a boolean", "'yes'"},
      // A list is a blend (data/blend.h): its entries are mappings.
      {"data: {train: [a, b]}", "data.train[0]", "expected a mapping {path, weight}", "'a'"},
      {"data: {train: x, val: [a, b]}", "data.val", "expected a string", "a list"},
      {"data: {train: x, seed: -1}", "data.seed", "expected a non-negative integer", "'-1'"},
      {"model: {d_model: {a: 1}}", "model.d_model", "expected an integer", "a mapping"},
      {"model: {tie_embeddings: 2}", "model.tie_embeddings", "expected true, false or auto", "'2'"},
      {"parallel: {stage_layers: 4}", "parallel.stage_layers", "expected a list of integers", "'4'"},
      {"parallel: {stage_layers: [2, x]}", "parallel.stage_layers[1]", "expected an integer",
       "'x'"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.yaml);
    const bool has_data = c.yaml.find("data:") != std::string::npos;  // no duplicate section
    expect_error((has_data ? "" : kMinimal) + c.yaml + "\n", {}, {c.key + ": " + c.expected, c.found});
  }
}

TEST(Config, BadEnumsListTheAllowedValues) {
  expect_error(kMinimal + "model: {arch: gpt3}\n", {},
               {"model.arch: expected one of gpt2, llama; got 'gpt3'"});
  expect_error(kMinimal + "parallel: {pipeline_schedule: zb}\n", {},
               {"parallel.pipeline_schedule", "gpipe, 1f1b", "'zb'"});
  expect_error(kMinimal + "training: {lr_schedule: step}\n", {},
               {"training.lr_schedule", "constant, cosine, linear", "'step'"});
  expect_error(kMinimal + "runtime: {device: gpu}\n", {},
               {"runtime.device: expected one of auto, cpu, cuda; got 'gpu'"});
  expect_error(kMinimal + "training: {precision: fp16}\n", {},
               {"training.precision: expected one of fp32, bf16; got 'fp16'"});
}

TEST(Config, YamlSyntaxErrorNamesTheFileAndLine) {
  expect_error(kMinimal + "training: {lr: [1\n", {}, {"cfg.yaml:", "YAML syntax error"});
}

TEST(Config, ModelShapeErrorsNameTheKeys) {
  expect_error(kMinimal + "model: {n_heads: 5}\n", {},
               {"cfg.yaml: model.n_heads: 5 does not divide model.d_model=128"});
  expect_error(kMinimal + "model: {arch: llama, n_kv_heads: 3}\n", {},
               {"model.n_kv_heads: 3 does not divide model.n_heads=4"});
  expect_error(kMinimal + "model: {n_kv_heads: 2}\n", {}, {"model.n_kv_heads", "gpt2"});
  expect_error(kMinimal + "model: {arch: llama, d_model: 12, n_heads: 4}\n", {},
               {"model.n_heads", "even head_dim"});
  expect_error(kMinimal + "model: {vocab_size: 1}\n", {}, {"model.vocab_size: must be >= 2"});
  expect_error(kMinimal + "model: {n_layers: 0}\n", {}, {"model.n_layers: must be >= 1"});
  expect_error(kMinimal + "model: {d_ff: -4}\n", {}, {"model.d_ff"});
  expect_error(kMinimal + "model: {norm_eps: 0}\n", {}, {"model.norm_eps: must be > 0"});
  expect_error(kMinimal + "model: {init_std: -1}\n", {}, {"model.init_std"});
  expect_error(kMinimal + "model: {rope_theta: 0}\n", {}, {"model.rope_theta"});
}

TEST(Config, BatchAndLayoutErrorsNameTheKeysAndNumbers) {
  expect_error(kMinimal + "training: {global_batch_size: 10}\n", {},
               {"training.global_batch_size: 10", "parallel.micro_batch_size * parallel.dp",
                "4 * 1 = 4"});
  expect_error(kMinimal + "parallel: {dp: 3, micro_batch_size: 2}\ntraining: {global_batch_size: 8}\n",
               {}, {"training.global_batch_size: 8", "2 * 3 = 6"});
  expect_error(kMinimal + "parallel: {tp: 3}\n", {},
               {"parallel.tp: 3 does not divide model.n_heads=4"});
  expect_error(kMinimal + "model: {arch: llama, n_kv_heads: 2}\nparallel: {tp: 4}\n", {},
               {"parallel.tp: 4 does not divide model.n_kv_heads=2"});
  expect_error(kMinimal + "model: {d_ff: 130}\nparallel: {tp: 4}\n", {},
               {"parallel.tp: 4 does not divide model.d_ff=130"});
  expect_error(kMinimal + "parallel: {pp: 5}\n", {},
               {"parallel.pp: 5", "model.n_layers=4", "more stages than layers"});
  expect_error(kMinimal + "parallel: {pp: 2, stage_layers: [2, 3]}\n", {},
               {"parallel.stage_layers: sums to 5 but model.n_layers=4"});
  expect_error(kMinimal + "parallel: {pp: 2, stage_layers: [4]}\n", {},
               {"parallel.stage_layers: has 1 entries but parallel.pp=2"});
  expect_error(kMinimal + "parallel: {pp: 2, stage_layers: [4, 0]}\n", {},
               {"parallel.stage_layers[1]: must be >= 1"});
  expect_error(kMinimal + "parallel: {sequence_parallel: true}\n", {},
               {"parallel.sequence_parallel: needs parallel.tp > 1", "tp=1"});
  expect_error(kMinimal + "model: {seq_len: 18}\nparallel: {tp: 4, sequence_parallel: true}\n", {},
               {"parallel.sequence_parallel: model.seq_len=18 does not split over parallel.tp=4"});
  // Interleaved 1F1B (kMinimal: 4 layers, global batch 8, micro-batch 4: 2 micro-batches).
  expect_error(kMinimal + "parallel: {pp: 2, virtual_stages: 0}\n", {},
               {"parallel.virtual_stages: must be >= 1"});
  expect_error(kMinimal + "parallel: {virtual_stages: 2}\n", {},
               {"parallel.virtual_stages 2", "needs parallel.pp > 1"});
  expect_error(kMinimal + "parallel: {pp: 2, virtual_stages: 2, pipeline_schedule: gpipe}\n", {},
               {"parallel.virtual_stages 2", "pipeline_schedule 1f1b, got gpipe"});
  expect_error(kMinimal + "parallel: {pp: 2, virtual_stages: 2, micro_batch_size: 8}\n", {},
               {"parallel.virtual_stages 2", "micro-batches per step (1", "multiple of parallel.pp (2)"});
  expect_error(kMinimal + "parallel: {pp: 2, virtual_stages: 3, micro_batch_size: 2}\n", {},
               {"parallel.virtual_stages 3", "6 chunks", "model.n_layers is 4"});
  expect_error(kMinimal + "model: {n_layers: 6}\nparallel: {pp: 2, virtual_stages: 2}\n", {},
               {"parallel.virtual_stages: model.n_layers=6 does not divide into parallel.pp * "
                "parallel.virtual_stages = 2 * 2 = 4 equal model chunks"});
  expect_error(kMinimal + "parallel: {pp: 2, virtual_stages: 2, stage_layers: [2, 2]}\n", {},
               {"parallel.stage_layers: cannot be set with parallel.virtual_stages=2"});
  expect_error(kMinimal + "parallel: {zero_stage: 4}\n", {}, {"parallel.zero_stage"});
  expect_error(kMinimal + "parallel: {dp: 0}\n", {}, {"parallel.dp: must be >= 1"});
  expect_error(kMinimal + "parallel: {micro_batch_size: 0}\n", {}, {"parallel.micro_batch_size"});
  // Accepted layouts.
  parse_ok(kMinimal + "parallel: {pp: 2, stage_layers: [1, 3], tp: 4, dp: 2, micro_batch_size: 1}\n");
  parse_ok(kMinimal + "model: {arch: llama, n_kv_heads: 2}\nparallel: {tp: 2}\n");
}

// parallel.dp: auto (a run continued on fewer nodes): world size / (cp * tp * pp), resolved
// at launch; the batch is checked against the resolved dp, and a world that is not a
// multiple of the other degrees is refused naming them.
TEST(Config, DataParallelAutoResolvesFromTheWorldSize) {
  const std::string yaml = kMinimal +
      "parallel: {dp: auto, tp: 2, micro_batch_size: 2}\ntraining: {global_batch_size: 12}\n";
  Config c = parse_ok(yaml);
  EXPECT_EQ(c.parallel.dp, kDpAuto);
  EXPECT_NE(config_to_yaml(c).find("  dp: auto\n"), std::string::npos);
  expect_config_eq(parse_ok(config_to_yaml(c)), c);  // round trip
  for (int world : {2, 4, 6, 12}) {  // dp 1, 2, 3, 6: 6, 3, 2, 1 micro-batches
    Config r = c;
    ASSERT_TRUE(resolve_auto_dp(&r, world).is_ok()) << world;
    EXPECT_EQ(r.parallel.dp, world / 2);
    EXPECT_EQ(r.grad_accum_steps(), 12 / (2 * (world / 2)));
    EXPECT_NE(config_to_yaml(r).find("  dp: " + std::to_string(world / 2) + "\n"), std::string::npos);
  }
  Config r = c;
  Status st = resolve_auto_dp(&r, 5);
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_NE(st.message().find("parallel.dp: auto: the world size 5 is not a multiple of tp*pp = 2*1 = 2"),
            std::string::npos) << st.message();
  r = c;
  st = resolve_auto_dp(&r, 8);  // dp 4: 12 is not divisible by 2 * 4
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_NE(st.message().find("parallel.dp: auto = world size 8 / tp*pp 2 = 4"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("training.global_batch_size: 12 is not divisible by "
                              "parallel.micro_batch_size * parallel.dp = 2 * 4 = 8"),
            std::string::npos) << st.message();
  // A fixed dp is left alone (the world size check is the trainer's).
  Config fixed = parse_ok(kMinimal + "parallel: {dp: 2, micro_batch_size: 2}\n");
  ASSERT_TRUE(resolve_auto_dp(&fixed, 7).is_ok());
  EXPECT_EQ(fixed.parallel.dp, 2);
  expect_error(kMinimal + "parallel: {dp: automatic}\n", {}, {"parallel.dp: expected an integer >= 1, or auto"});
  expect_error(kMinimal, {"parallel.dp=-1"}, {"parallel.dp: must be >= 1, got -1"});
  parse_ok(kMinimal, {"parallel.dp=auto"});
}

// Context parallelism (parallel.cp): the world is dp * cp * tp * pp; refused with exit 2
// naming the key when a sequence does not cut into 2 * cp equal chunks, and for a
// mixture-of-experts model; its combinations with the other dimensions parse.
TEST(Config, ContextParallelKeyAndItsRefusals) {
  Config c = parse_ok(kMinimal + "model: {seq_len: 64}\nparallel: {cp: 4, dp: 2, tp: 2}\n");
  EXPECT_EQ(c.parallel.cp, 4);
  EXPECT_EQ(c.parallel.world_size(), 16);
  EXPECT_EQ(c.grad_accum_steps(), 1);  // 8 / (4 * 2): cp does not split the batch
  expect_config_eq(parse_ok(config_to_yaml(c)), c);
  EXPECT_EQ(parse_ok(kMinimal).parallel.cp, 1);
  expect_error(kMinimal + "model: {seq_len: 20}\nparallel: {cp: 4}\n", {},
               {"parallel.cp: 4 needs model.seq_len divisible by 2 * cp = 8",
                "got model.seq_len=20"});
  expect_error(kMinimal + "model: {seq_len: 18}\n", {"parallel.cp=2"},
               {"parallel.cp: 2", "divisible by 2 * cp = 4"});
  expect_error(kMinimal + "parallel: {cp: 0}\n", {}, {"parallel.cp: must be >= 1, got 0"});
  expect_error(kMinimal + "model: {arch: llama, moe_experts: 4}\nparallel: {cp: 2}\n", {},
               {"parallel.cp: 2 with model.moe_experts=4", "not supported"});
  // Sequence parallelism splits a cp rank's seq_len / cp rows over tp.
  // (24 rows split over tp 4, but a cp 4 rank's 6 do not.)
  expect_error(kMinimal +
                   "model: {seq_len: 24}\nparallel: {cp: 4, tp: 4, sequence_parallel: true}\n",
               {}, {"parallel.sequence_parallel: model.seq_len=24 / parallel.cp=4 does not split "
                    "over parallel.tp=4"});
  parse_ok(kMinimal + "model: {seq_len: 32}\nparallel: {cp: 2, tp: 2, sequence_parallel: true}\n");
  parse_ok(kMinimal + "model: {seq_len: 32}\nparallel: {cp: 2, pp: 2, virtual_stages: 2, "
                      "micro_batch_size: 2}\n");
}

// Expert parallelism (parallel.ep) folds into dp: the world stays dp * cp * tp * pp; ep
// must divide dp and model.moe_experts, and a dense model refuses it, each with exit 2
// naming the key.
TEST(Config, ExpertParallelKeyAndItsRefusals) {
  const std::string moe = kMinimal +
                          "model: {arch: llama, moe_experts: 8}\n"
                          "parallel: {micro_batch_size: 1}\ntraining: {global_batch_size: 12}\n";
  Config c = parse_ok(moe, {"parallel.dp=4", "parallel.ep=2", "training.global_batch_size=8"});
  EXPECT_EQ(c.parallel.ep, 2);
  EXPECT_EQ(c.parallel.world_size(), 4);
  EXPECT_EQ(c.grad_accum_steps(), 2);  // 8 / (1 * 4): ep does not split the batch further
  expect_config_eq(parse_ok(config_to_yaml(c)), c);
  EXPECT_EQ(parse_ok(kMinimal).parallel.ep, 1);
  expect_error(moe, {"parallel.dp=2", "parallel.ep=4"},
               {"parallel.ep: 4 must divide parallel.dp=2"});
  expect_error(moe, {"parallel.dp=6", "parallel.ep=3"},
               {"parallel.ep: 3 does not divide model.moe_experts=8"});
  expect_error(kMinimal, {"parallel.dp=2", "parallel.ep=2", "parallel.micro_batch_size=1"},
               {"parallel.ep: 2 needs a mixture-of-experts model", "dense"});
  expect_error(moe, {"parallel.ep=0"}, {"parallel.ep: must be >= 1, got 0"});
  parse_ok(moe, {"parallel.dp=2", "parallel.ep=2", "parallel.pp=2", "parallel.zero_stage=3"});
}

// A "factor and window" pair of keys (the loss-spike guard, the straggler warning): the
// defaults, 0 = off, a --set override, and the errors naming the key.
void expect_factor_and_window_keys(const std::string& section, const std::string& factor,
                                   const std::string& window, float (*get_factor)(const Config&),
                                   int (*get_window)(const Config&), float default_factor,
                                   int default_window) {
  SCOPED_TRACE(section + "." + factor);
  const std::string f = section + "." + factor, w = section + "." + window;
  Config c = parse_ok(kMinimal);
  EXPECT_EQ(get_factor(c), default_factor);  // docs/CONFIG.md
  EXPECT_EQ(get_window(c), default_window);
  c = parse_ok(kMinimal + section + ": {" + factor + ": 0, " + window + ": 1}\n");
  EXPECT_EQ(get_factor(c), 0.0f);
  EXPECT_EQ(get_window(c), 1);
  EXPECT_EQ(get_factor(parse_ok(kMinimal, {f + "=2.5"})), 2.5f);
  EXPECT_EQ(get_factor(parse_ok(kMinimal, {f + "=1.25"})), 1.25f);
  expect_error(kMinimal + section + ": {" + factor + ": 1}\n", {},
               {f + ": must be 0 (off) or > 1, got 1"});
  expect_error(kMinimal + section + ": {" + factor + ": -3}\n", {}, {f});
  expect_error(kMinimal, {f + "=.nan"}, {f});
  expect_error(kMinimal + section + ": {" + window + ": 0}\n", {}, {w + ": must be >= 1, got 0"});
  expect_error(kMinimal + section + ": {" + window + ": many}\n", {}, {w});
}

TEST(Config, LossSpikeGuardKeys) {
  // On by default.
  expect_factor_and_window_keys(
      "training", "loss_spike_factor", "loss_spike_window",
      [](const Config& c) { return c.training.loss_spike_factor; },
      [](const Config& c) { return c.training.loss_spike_window; }, 10.0f, 50);
}

TEST(Config, StragglerKeys) {
  expect_factor_and_window_keys(
      "logging", "straggler_factor", "straggler_window",
      [](const Config& c) { return c.logging.straggler_factor; },
      [](const Config& c) { return c.logging.straggler_window; }, 2.0f, 20);
}

TEST(Config, TrainingAndOtherSectionErrors) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"training: {max_steps: 0}", "training.max_steps"},
      {"training: {lr: 0}", "training.lr: must be > 0"},
      {"training: {lr: 1e-3, min_lr: 2e-3}", "training.min_lr"},
      {"training: {min_lr: -1e-5}", "training.min_lr"},
      {"training: {warmup_steps: -1}", "training.warmup_steps"},
      {"training: {beta1: 1.0}", "training.beta1: must be in [0, 1)"},
      {"training: {beta2: -0.1}", "training.beta2"},
      {"training: {eps: 0}", "training.eps"},
      {"training: {weight_decay: -0.1}", "training.weight_decay"},
      {"training: {grad_clip: -1}", "training.grad_clip"},
      {"training: {eval_interval: -1}", "training.eval_interval"},
      {"training: {eval_interval: 5, eval_batches: 0}\ndata: {train: x, val: y}",
       "training.eval_batches"},
      {"checkpoint: {interval: -1}", "checkpoint.interval"},
      {"checkpoint: {keep_last: 0}", "checkpoint.keep_last"},
      {"checkpoint: {dir: \"\"}", "checkpoint.dir"},
      {"logging: {log_interval: 0}", "logging.log_interval"},
      {"parallel: {bucket_mb: 0}", "parallel.bucket_mb"},
      {"parallel: {comm_timeout_s: 0}", "parallel.comm_timeout_s"},
      {"runtime: {threads: -1}", "runtime.threads"},
      {"runtime: {peak_tflops: -1}", "runtime.peak_tflops: must be >= 0"},
  };
  for (const auto& [yaml, needle] : cases) {
    SCOPED_TRACE(yaml);
    // The later `data:` in one case would be a duplicate section after kMinimal.
    const bool has_data = yaml.find("data:") != std::string::npos;
    expect_error((has_data ? "" : kMinimal) + yaml + "\n", {}, {needle});
  }
  expect_error("training: {lr: 1e-3}\n", {}, {"data.train: required"});
  // eval_batches only matters when evaluation is on and there is a val set.
  parse_ok(kMinimal + "training: {eval_interval: 5, eval_batches: 0}\n");
}

TEST(Config, SetOverridesApplyInOrderAfterTheFile) {
  Config c = parse_ok(kMinimal + "training: {lr: 1e-2, max_steps: 3}\n",
                      {"training.lr=0.001", "training.max_steps=5", "training.max_steps=7",
                       "model.arch=llama", "parallel.pp=2", "parallel.stage_layers=[1, 3]",
                       "data.val=", "data.train=runs/x/train_*.bin", "data.shuffle=false",
                       "model.tie_embeddings=true"});
  EXPECT_EQ(c.training.lr, 0.001f);
  EXPECT_EQ(c.training.max_steps, 7);
  EXPECT_EQ(c.model.arch, Arch::kLlama);
  EXPECT_EQ(c.model.d_ff, 384);  // llama default after the override
  EXPECT_EQ(c.model.tie_embeddings, 1);
  EXPECT_EQ(c.parallel.stage_layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(c.data.val, "");
  EXPECT_EQ(c.data.train, "runs/x/train_*.bin");
  EXPECT_FALSE(c.data.shuffle);
}

TEST(Config, SetOverridesAreJustAsStrict) {
  expect_error(kMinimal, {"training.lrr=1"},
               {"--set training.lrr=1: unknown key training.lrr", "allowed keys"});
  expect_error(kMinimal, {"optim.lr=1"}, {"--set optim.lr=1: unknown section 'optim'"});
  expect_error(kMinimal, {"training.lr"}, {"--set training.lr: no equals sign"});
  expect_error(kMinimal, {"lr=1"}, {"--set lr=1", "section.key"});
  expect_error(kMinimal, {"training.max_steps=abc"},
               {"--set training.max_steps=abc: training.max_steps: expected an integer, got 'abc'"});
  expect_error(kMinimal, {"parallel.stage_layers=[1,"}, {"--set parallel.stage_layers=[1,",
                                                          "cannot parse"});
  expect_error(kMinimal, {"model.arch=bert"}, {"model.arch: expected one of gpt2, llama"});
  // Validation runs after the overrides.
  expect_error(kMinimal, {"model.n_heads=5"}, {"model.n_heads: 5 does not divide"});
}

TEST(Config, LoadConfigFromFile) {
  const testing::ScratchDir dir;
  const std::string path = dir.file("trident.yaml");
  {
    std::ofstream out(path);
    out << kMinimal << "training:\n  lr: fast\n";
  }
  Result<Config> r = load_config(path, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_EQ(r.status().message().rfind(path + ":4: training.lr: expected a number", 0), 0u)
      << r.status().message();
  {
    std::ofstream out(path);
    out << kMinimal;
  }
  r = load_config(path, {"training.max_steps=9"});
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->training.max_steps, 9);

  r = load_config("/nonexistent/trident.yaml", {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().exit_code(), 2);
  EXPECT_NE(r.status().message().find("/nonexistent/trident.yaml"), std::string::npos);
}

// GPT-2 124M as in llm.c: V=50257 padded to 50304, maxT=1024, L=12, NH=12, C=768.
TransformerConfig gpt2_124m() {
  TransformerConfig m;
  m.vocab_size = 50257;
  m.seq_len = 1024;
  m.n_layers = 12;
  m.n_heads = 12;
  m.d_model = 768;
  m.finalize();
  return m;
}

int64_t numel(std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

TEST(ModelConfig, Gpt2NumParametersMatchTheTensorTable) {
  const TransformerConfig m = gpt2_124m();
  ASSERT_EQ(m.padded_vocab, 50304);
  // The tensors of model/transformer.h, one by one.
  const int64_t Vp = 50304, T = 1024, C = 768, F = 4 * 768, L = 12;
  int64_t sum = numel({Vp, C}) + numel({T, C});  // wte (tied head), wpe
  for (int l = 0; l < L; ++l) {
    sum += numel({C}) + numel({C});          // ln1 weight, bias
    sum += 3 * (numel({C, C}) + numel({C}));  // q, k, v weight + bias (NH*HD = NKV*HD = C)
    sum += numel({C, C}) + numel({C});        // o
    sum += numel({C}) + numel({C});          // ln2
    sum += numel({F, C}) + numel({F});        // mlp.fc
    sum += numel({C, F}) + numel({C});        // mlp.proj
  }
  sum += numel({C}) + numel({C});  // lnf
  EXPECT_EQ(sum, 124475904);       // llm.c's count with the padded vocabulary
  EXPECT_EQ(m.num_parameters(), sum);

  // Untying adds exactly one (Vp, C) head.
  TransformerConfig untied = m;
  untied.tie_embeddings = 0;
  EXPECT_EQ(untied.num_parameters(), sum + Vp * C);
}

TEST(ModelConfig, LlamaNumParametersMatchPublishedCounts) {
  // Llama 3 8B: 8,030,261,248 parameters (untied, GQA 32/8, F=14336, V=128256).
  TransformerConfig m;
  m.arch = Arch::kLlama;
  m.vocab_size = 128256;
  m.seq_len = 8192;
  m.n_layers = 32;
  m.n_heads = 32;
  m.n_kv_heads = 8;
  m.d_model = 4096;
  m.d_ff = 14336;
  m.finalize();
  EXPECT_EQ(m.padded_vocab, 128256);
  EXPECT_EQ(m.num_parameters(), 8030261248);
  // Llama 3.2 1B: 1,235,814,400 (tied, 16 layers, C=2048, GQA 32/8, F=8192).
  TransformerConfig s = m;
  s.n_layers = 16;
  s.d_model = 2048;
  s.d_ff = 8192;
  s.tie_embeddings = 1;
  s.finalize();
  EXPECT_EQ(s.num_parameters(), 1235814400);
}

TEST(ModelConfig, FlopsPerTokenIs6NPlusAttention) {
  const TransformerConfig m = gpt2_124m();
  // N excludes the (1024, 768) position table.
  const double n = 124475904.0 - 1024.0 * 768.0;
  EXPECT_DOUBLE_EQ(m.flops_per_token(), 6.0 * n + 12.0 * 12 * 768 * 1024);
  EXPECT_DOUBLE_EQ(m.flops_per_token(), 855383040.0);

  TransformerConfig l;  // llama has no position table: N is all parameters
  l.arch = Arch::kLlama;
  l.finalize();
  EXPECT_DOUBLE_EQ(l.flops_per_token(),
                   6.0 * static_cast<double>(l.num_parameters()) + 12.0 * 4 * 128 * 64);
}

TEST(Configs, EveryExampleConfigParses) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(TRIDENT_SOURCE_DIR) / "configs";
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    // trident plan's GPU table, not a run config (tests/plan/plan_test.cpp reads it).
    if (entry.path().filename() == "hardware.yaml") continue;
    SCOPED_TRACE(entry.path().string());
    Result<Config> r = load_config(entry.path().string(), {});
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    ++count;
  }
  EXPECT_GE(count, 8);
}

TEST(Configs, ExampleConfigsHaveTheDocumentedModels) {
  const std::string dir = std::string(TRIDENT_SOURCE_DIR) + "/configs/";
  Result<Config> tiny = load_config(dir + "tiny.yaml", {});
  ASSERT_TRUE(tiny.is_ok()) << tiny.status().message();
  EXPECT_EQ(tiny->model.vocab_size, 256);
  EXPECT_EQ(tiny->model.seq_len, 128);
  EXPECT_EQ(tiny->grad_accum_steps(), 2);
  EXPECT_EQ(tiny->data.train, "runs/demo/data/train_*.bin");
  EXPECT_EQ(tiny->training.lr_schedule, LrSchedule::kCosine);

  Result<Config> g = load_config(dir + "gpt2-124m.yaml", {});
  ASSERT_TRUE(g.is_ok()) << g.status().message();
  EXPECT_EQ(g->model.num_parameters(), 124475904);

  Result<Config> l = load_config(dir + "llama-8b.yaml", {});
  ASSERT_TRUE(l.is_ok()) << l.status().message();
  EXPECT_EQ(l->model.num_parameters(), 8030261248);
  EXPECT_EQ(l->parallel.tp, 8);
}

}  // namespace
}  // namespace trident
