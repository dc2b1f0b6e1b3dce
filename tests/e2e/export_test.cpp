// End-to-end: `trident export --format safetensors` and model.init_from of the result.
//
// Logits: tiny gpt2 and llama models trained a few steps (one process, and tp=2 under
// mpirun for the resharding read) are exported; tests/reference/hf_reference.py, GPT-2
// and Llama written out in Hugging Face's architecture and names in PyTorch (no code
// shared with Trident), computes the logits of a batch from model.safetensors +
// config.json, and they must match Trident's own forward on the checkpoint's weights to
// 1e-5 (max |difference| / max |logit|). The script needs /usr/bin/python3 with torch
// (scripts/setup.sh installs python3-torch); without them these tests FAIL.
//
// Round trip: the llm.c GPT-2 fixture trained 5 steps, exported, and loaded back through
// model.init_from gives the bitwise same next-step loss as resuming the checkpoint.
//
// Mixtral: a llama mixture-of-experts model exports as MixtralForCausalLM; the reference's
// float64 Mixtral (the sparse MoE block from the published description) gives the same
// logits, and on a periodic stream the loss of the step after the checkpoint that the
// resumed run logs; model.init_from of the export continues bitwise like the checkpoint.
// MoE models Mixtral cannot hold (gpt2's experts, shared experts) exit 2 naming the key.
//
// Bad directories (missing config.json, unknown model_type, a missing tensor, a wrong
// shape, a truncated file, a header that is not JSON) exit 2 naming the file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <tuple>
#include <nlohmann/json.hpp>

#include "checkpoint/reader.h"
#include "config/config.h"
#include "kernels/ops.h"
#include "model/safetensors.h"
#include "model/transformer.h"
#include "tests/e2e/cli_util.h"
#include "tests/e2e/fault_util.h"

namespace trident {
namespace {

using testing::run_command;
using testing::ScratchDir;

constexpr int kBatch = 2;
constexpr int kSeq = 32;

std::string reference_script() {
  return std::string(TRIDENT_SOURCE_DIR) + "/tests/reference/hf_reference.py";
}

std::vector<int32_t> test_tokens(int n, int vocab) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  uint64_t x = 12345;
  for (int32_t& t : tokens) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return tokens;
}

class Export : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), testing::english_bytes(40000), 1).is_ok());
  }

  // A tiny model trained 5 steps with a checkpoint at step 5 under ckpt_<name>.
  std::string write_config(const std::string& name, const std::string& model_yaml,
                           const std::string& extra = "", int max_steps = 5,
                           const std::string& data = "") {
    std::string yaml =
        "model: {" + model_yaml + "}\n"
        "parallel: {micro_batch_size: 4}\n"
        "data: {train: " + (data.empty() ? dir_.file("train.bin") : data) + "}\n"
        "training: {global_batch_size: 8, max_steps: " + std::to_string(max_steps) +
        ", lr: 0.003, warmup_steps: 2}\n"
        "checkpoint: {dir: " + dir_.file("ckpt_" + name) + ", interval: 5}\n"
        "logging: {metrics: " + dir_.file(name + ".jsonl") + ", log_interval: 1}\n" + extra;
    dir_.write(name + ".yaml", yaml);
    return dir_.file(name + ".yaml");
  }

  testing::CommandResult train(const std::string& config, const std::string& flags = "",
                               const std::string& launcher = "") {
    return run_command(launcher + testing::trident_binary() + " train --config " + config + " " +
                       flags);
  }

  testing::CommandResult export_hf(const std::string& checkpoint, const std::string& out) {
    return run_command(testing::trident_binary() + " export --checkpoint " + checkpoint +
                       " --format safetensors --out " + out);
  }

  // The reference logits [B, T, V] of the Hugging Face directory; fails the test when
  // the script (or python3 / torch) is missing or fails.
  std::vector<float> hf_logits(const std::string& model_dir, const std::vector<int32_t>& tokens,
                               int B) {
    const std::string tok = dir_.file("tokens.i32"), out = dir_.file("logits.f32");
    {
      std::ofstream f(tok, std::ios::binary);
      f.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * 4));
    }
    std::filesystem::remove(out);
    auto r = run_command("/usr/bin/python3 " + reference_script() + " --model " + model_dir +
                         " --tokens " + tok + " --batch " + std::to_string(B) + " --out " + out);
    EXPECT_EQ(r.exit_code, 0) << "the PyTorch reference failed (needs /usr/bin/python3 with "
                                 "torch: apt-get install python3-torch):\n" << r.output;
    std::ifstream f(out, std::ios::binary);
    std::vector<float> logits;
    float v;
    while (f.read(reinterpret_cast<char*>(&v), 4)) logits.push_back(v);
    return logits;
  }

  // Trident's logits [B, T, V] (padded columns dropped): the model of the stored config
  // run forward on the checkpoint's weights, whatever layout wrote them.
  std::vector<float> trident_logits(const std::string& ckpt_root,
                                    const std::vector<int32_t>& tokens, int B, int T) {
    std::string note;
    auto step_dir = resolve_step_dir(ckpt_root, &note);
    EXPECT_TRUE(step_dir.is_ok()) << step_dir.status().message();
    if (!step_dir.is_ok()) return {};
    auto ckpt = open_checkpoint(step_dir.value());
    EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().message();
    if (!ckpt.is_ok()) return {};
    auto config = parse_config(ckpt.value().trainer_state().at("config").get<std::string>(), {});
    EXPECT_TRUE(config.is_ok()) << config.status().message();
    if (!config.is_ok()) return {};
    TransformerConfig mc = config.value().model;
    mc.padded_vocab = static_cast<int>(ckpt.value().shape("param/wte").value()[0]);
    if (mc.family().learned_positions()) mc.max_seq_len = static_cast<int>(ckpt.value().shape("param/wpe").value()[0]);
    auto ops = make_cpu_ops(1);
    Transformer model(mc, *ops, B);
    for (const ParamInfo& p : model.params()) {
      std::vector<float> values(static_cast<size_t>(p.shape.numel()));
      Status st = ckpt.value().read_tensor("param/" + p.name, values.data());
      EXPECT_TRUE(st.is_ok()) << st.message();
      model.set_param(p, values.data());
    }
    model.forward(tokens.data(), nullptr, B, T);
    const std::vector<float> padded = model.logits_to_host();
    std::vector<float> logits;
    for (int row = 0; row < B * T; ++row) {
      const float* r = padded.data() + static_cast<size_t>(row) * mc.padded_vocab;
      logits.insert(logits.end(), r, r + mc.vocab_size);
    }
    return logits;
  }

  // max |a - b| / max |b|.
  static double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::abs(static_cast<double>(b[i])));
    }
    return scale > 0 ? diff / scale : INFINITY;
  }

  void expect_logits_match(const std::string& ckpt_root, const std::string& export_dir, int V) {
    const std::vector<int32_t> tokens = test_tokens(kBatch * kSeq, V);
    const std::vector<float> ours = trident_logits(ckpt_root, tokens, kBatch, kSeq);
    const std::vector<float> ref = hf_logits(export_dir, tokens, kBatch);
    ASSERT_EQ(ours.size(), static_cast<size_t>(kBatch) * kSeq * V);
    ASSERT_EQ(ref.size(), ours.size());
    const double err = relative_error(ours, ref);
    std::printf("[ measured ] %s: max|trident - hf| / max|hf| = %.3g\n", export_dir.c_str(), err);
    EXPECT_LT(err, 1e-5);
  }

  nlohmann::json read_json(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f, nullptr, false);
  }

  // The reference's mean cross-entropy (float64) of the directory's model on tokens
  // [B, T] against targets [B, T].
  double hf_loss(const std::string& model_dir, const std::vector<int32_t>& tokens,
                 const std::vector<int32_t>& targets, int B) {
    const std::string tok = dir_.file("loss_tokens.i32"), tgt = dir_.file("loss_targets.i32");
    const std::string logits = dir_.file("loss_logits.f32"), out = dir_.file("loss.f64");
    for (const auto& [path, ids] : {std::pair{tok, &tokens}, std::pair{tgt, &targets}}) {
      std::ofstream f(path, std::ios::binary);
      f.write(reinterpret_cast<const char*>(ids->data()),
              static_cast<std::streamsize>(ids->size() * 4));
    }
    std::filesystem::remove(out);
    auto r = run_command("/usr/bin/python3 " + reference_script() + " --model " + model_dir +
                         " --tokens " + tok + " --batch " + std::to_string(B) + " --out " +
                         logits + " --targets " + tgt + " --loss-out " + out);
    EXPECT_EQ(r.exit_code, 0) << "the PyTorch reference failed (needs /usr/bin/python3 with "
                                 "torch: apt-get install python3-torch):\n" << r.output;
    double loss = NAN;
    std::ifstream(out, std::ios::binary).read(reinterpret_cast<char*>(&loss), sizeof(loss));
    return loss;
  }

  std::vector<std::string> losses(const std::string& name) {
    std::vector<std::string> out;
    std::ifstream in(dir_.file(name + ".jsonl"));
    std::string line;
    while (std::getline(in, line)) {
      auto r = nlohmann::json::parse(line);
      if (r.contains("loss")) out.push_back(r["loss"].dump());
    }
    return out;
  }

  void check_export(const std::string& name, const std::string& model_yaml, int V, bool tied);

  ScratchDir dir_;
};

const char* kGpt2 = "arch: gpt2, vocab_size: 256, seq_len: 32, n_layers: 2, n_heads: 4, d_model: 64";
const char* kLlama =
    "arch: llama, vocab_size: 200, seq_len: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2,"
    " d_model: 64";

// Trains the model `model_yaml` (vocabulary V, head tied or not) 5 steps, exports it
// and checks config.json, the stored tensors and the logits.
void Export::check_export(const std::string& name, const std::string& model_yaml, int V,
                          bool tied) {
  auto r = train(write_config(name, model_yaml));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string out = dir_.file("hf_" + name);
  r = export_hf(dir_.file("ckpt_" + name), out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exported step 5"), std::string::npos) << r.output;

  const nlohmann::json cfg = read_json(out + "/config.json");
  const bool gpt2 = model_yaml.find("arch: gpt2") != std::string::npos;
  EXPECT_EQ(cfg["model_type"], gpt2 ? "gpt2" : "llama");
  EXPECT_EQ(cfg["architectures"][0], gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM");
  EXPECT_EQ(cfg["vocab_size"], V);
  EXPECT_EQ(cfg["tie_word_embeddings"], tied);
  if (!gpt2) {
    EXPECT_EQ(cfg["num_key_value_heads"], 2);
    EXPECT_EQ(cfg["rms_norm_eps"].get<double>(), 1e-5);  // the configured value, not 9.99e-6
  }
  auto file = read_safetensors(out + "/model.safetensors");
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  EXPECT_EQ(file.value().find("lm_head.weight") != nullptr, !tied);  // a tied head is the embedding
  const char* emb = gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  ASSERT_NE(file.value().find(emb), nullptr);
  EXPECT_EQ(file.value().find(emb)->shape, (std::vector<int64_t>{V, 64}));  // padding dropped
  if (gpt2) {
    const auto* qkv = file.value().find("transformer.h.0.attn.c_attn.weight");
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->shape, (std::vector<int64_t>{64, 192}));  // Conv1D [in, out]
  }
  expect_logits_match(dir_.file("ckpt_" + name), out, V);
}

TEST_F(Export, Gpt2LogitsMatchTheHuggingFaceReference) { check_export("gpt2", kGpt2, 256, true); }

TEST_F(Export, UntiedGpt2LogitsMatchTheHuggingFaceReference) {
  check_export("gpt2_untied", std::string(kGpt2) + ", tie_embeddings: 0", 256, false);
}

TEST_F(Export, LlamaLogitsMatchTheHuggingFaceReference) {
  check_export("llama", kLlama, 200, false);  // padded vocab 256, GQA, own head
}

TEST_F(Export, TiedLlamaLogitsMatchTheHuggingFaceReference) {
  check_export("llama_tied", std::string(kLlama) + ", tie_embeddings: 1", 200, true);
}

TEST_F(Export, TensorParallelCheckpointExportsTheSameModel) {
  // tp=2 splits the heads, kv heads, FFN and vocabulary rows over two files; the reader
  // reshards, so the export is the whole model.
  auto r = train(write_config("tp", kLlama), "--set parallel.tp=2", testing::mpirun_prefix(2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = export_hf(dir_.file("ckpt_tp"), dir_.file("hf_tp"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_logits_match(dir_.file("ckpt_tp"), dir_.file("hf_tp"), 200);
}

TEST_F(Export, InitFromTheExportContinuesLikeTheCheckpoint) {
  // Every sample of a stream with period T is the same window, so step 6 of the resumed
  // run and step 1 of the run started from the export see the same batch: their losses
  // are computed from the same weights by the same code, so they are bitwise equal.
  std::vector<uint32_t> periodic;
  for (int i = 0; i < 4000; ++i) periodic.push_back(static_cast<uint32_t>((i * 7 + 3) % 16 * 4));
  ASSERT_TRUE(write_token_file(dir_.file("periodic.bin"), periodic, 1).is_ok());
  const std::string fixture =
      std::string(TRIDENT_SOURCE_DIR) + "/tests/reference/fixtures/gpt2_llmc.bin";
  const std::string model = "arch: gpt2, seq_len: 16, init_from: " + fixture;
  auto r = train(write_config("llmc", model, "", 5, dir_.file("periodic.bin")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = export_hf(dir_.file("ckpt_llmc"), dir_.file("hf_llmc"));
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // A: resume the checkpoint for one more step.
  r = train(write_config("llmc", model, "", 6, dir_.file("periodic.bin")), "--resume auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto resumed = losses("llmc");
  ASSERT_EQ(resumed.size(), 6u);
  // B: a fresh run from the exported directory.
  const std::string from_hf = "arch: gpt2, seq_len: 16, init_from: " + dir_.file("hf_llmc");
  r = train(write_config("from_hf", from_hf, "", 1, dir_.file("periodic.bin")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto fresh = losses("from_hf");
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0], resumed[5]);

  // HF's own gpt2 upload names tensors without "transformer." and may carry the
  // attention-mask buffers: the same model.
  auto file = read_safetensors(dir_.file("hf_llmc/model.safetensors"));
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  std::vector<SafetensorsEntry> entries;
  for (const auto& t : file.value().tensors) {
    entries.push_back({t.name.substr(std::string("transformer.").size()), t.shape, t.data.data()});
  }
  const std::vector<float> mask(16 * 16, 1.0f);
  entries.push_back({"h.0.attn.bias", {1, 1, 16, 16}, mask.data()});
  std::filesystem::create_directory(dir_.file("hf_hub_style"));
  std::filesystem::copy(dir_.file("hf_llmc/config.json"), dir_.file("hf_hub_style/config.json"));
  std::ofstream(dir_.file("hf_hub_style/model.safetensors"), std::ios::binary)
      << encode_safetensors(entries);
  const std::string from_hub = "arch: gpt2, seq_len: 16, init_from: " + dir_.file("hf_hub_style");
  r = train(write_config("from_hub", from_hub, "", 1, dir_.file("periodic.bin")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("ignoring tensor"), std::string::npos) << r.output;
  ASSERT_EQ(losses("from_hub").size(), 1u);
  EXPECT_EQ(losses("from_hub")[0], resumed[5]);
  // The batch really is the same at every step: step 1's loss differs (other weights).
  EXPECT_NE(resumed[0], resumed[5]);
}

const char* kMixtral =
    "arch: llama, vocab_size: 200, seq_len: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2,"
    " d_model: 64, moe_experts: 4, moe_top_k: 2, moe_d_ff: 48";

TEST_F(Export, MixtralLogitsMatchTheHuggingFaceReference) {
  auto r = train(write_config("mixtral", kMixtral));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string out = dir_.file("hf_mixtral");
  r = export_hf(dir_.file("ckpt_mixtral"), out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("MixtralForCausalLM"), std::string::npos) << r.output;
  const nlohmann::json cfg = read_json(out + "/config.json");
  EXPECT_EQ(cfg["model_type"], "mixtral");
  EXPECT_EQ(cfg["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(cfg["num_local_experts"], 4);
  EXPECT_EQ(cfg["num_experts_per_tok"], 2);
  EXPECT_EQ(cfg["intermediate_size"], 48);  // the experts' width
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  auto file = read_safetensors(out + "/model.safetensors");
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  for (const auto& t : file.value().tensors) {
    EXPECT_EQ(t.name.find(".mlp."), std::string::npos) << t.name;
    EXPECT_EQ(t.name.find("shared"), std::string::npos) << t.name;
  }
  const auto* gate = file.value().find("model.layers.1.block_sparse_moe.gate.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->shape, (std::vector<int64_t>{4, 64}));
  const auto* w2 = file.value().find("model.layers.0.block_sparse_moe.experts.3.w2.weight");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->shape, (std::vector<int64_t>{64, 48}));
  // Per layer: norms 2, attention 4, router 1, experts 4 x 3; plus embedding, norm, head.
  EXPECT_EQ(file.value().tensors.size(), 2u * (2 + 4 + 1 + 4 * 3) + 3);
  expect_logits_match(dir_.file("ckpt_mixtral"), out, 200);
}

TEST_F(Export, MixtralExportReproducesTheNextStepsLossAndInitFromContinues) {
  // A stream of period T, so every sample is the same window (see the dense round trip
  // below): the step after the checkpoint logs the loss of the checkpoint's weights on
  // it, which the reference computes from the export alone.
  std::vector<uint32_t> periodic;
  for (int i = 0; i < 4000; ++i) periodic.push_back(static_cast<uint32_t>((i * 7 + 3) % 16 * 4));
  ASSERT_TRUE(write_token_file(dir_.file("periodic.bin"), periodic, 1).is_ok());
  const std::string model =
      "arch: llama, vocab_size: 64, seq_len: 16, n_layers: 2, n_heads: 4, n_kv_heads: 2,"
      " d_model: 64, moe_experts: 4, moe_top_k: 2, moe_d_ff: 48";
  auto r = train(write_config("moe", model, "", 5, dir_.file("periodic.bin")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string hf = dir_.file("hf_moe");
  r = export_hf(dir_.file("ckpt_moe"), hf);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = train(write_config("moe", model, "", 6, dir_.file("periodic.bin")), "--resume auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto resumed = losses("moe");
  ASSERT_EQ(resumed.size(), 6u);

  std::vector<int32_t> tokens, targets;
  for (int t = 0; t < 16; ++t) {
    tokens.push_back(static_cast<int32_t>(periodic[static_cast<size_t>(t)]));
    targets.push_back(static_cast<int32_t>(periodic[static_cast<size_t>(t) + 1]));
  }
  const double ref = hf_loss(hf, tokens, targets, 1);
  const double logged = std::stod(resumed[5]);
  std::printf("[ measured ] step 6 loss: logged %s, float64 Mixtral on the export %.9g "
              "(rel diff %.2g)\n", resumed[5].c_str(), ref, std::abs(logged - ref) / ref);
  EXPECT_LT(std::abs(logged - ref), 1e-5 * ref);
  EXPECT_NE(resumed[0], resumed[5]);  // other weights, another loss: the check can fail

  // model.init_from of the export: the architecture (experts included) from config.json;
  // step 1 sees the same window with the same weights.
  const std::string from_hf = "arch: llama, seq_len: 16, init_from: " + hf;
  r = train(write_config("moe_from_hf", from_hf, "", 1, dir_.file("periodic.bin")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("ignoring tensor"), std::string::npos) << r.output;
  const auto fresh = losses("moe_from_hf");
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0], resumed[5]);
}

TEST_F(Export, MixtureOfExpertsWithoutAMixtralFormExits2) {
  const std::string base = "vocab_size: 256, seq_len: 32, n_layers: 2, n_heads: 4, d_model: 64,"
                           " moe_experts: 4, moe_top_k: 2";
  for (const auto& [name, model, key] :
       {std::tuple<std::string, std::string, std::string>{"gpt2_moe", "arch: gpt2, " + base,
                                                          "gpt2 family"},
        {"shared_moe", "arch: llama, n_kv_heads: 2, moe_shared_experts: 1, " + base,
         "model.moe_shared_experts=1"}}) {
    SCOPED_TRACE(name);
    auto r = train(write_config(name, model));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string out = dir_.file("hf_" + name);
    r = export_hf(dir_.file("ckpt_" + name), out);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(key), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("Mixtral"), std::string::npos) << r.output;
    EXPECT_FALSE(std::filesystem::exists(out));  // refused before anything is written
  }
}

TEST_F(Export, BadDirectoriesExit2NamingTheFile) {
  auto r = train(write_config("good", kGpt2));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string good = dir_.file("hf_good");
  r = export_hf(dir_.file("ckpt_good"), good);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto original = read_safetensors(good + "/model.safetensors");
  ASSERT_TRUE(original.is_ok()) << original.status().message();

  // A copy of the good export with `edit` applied; then init_from must exit 2 naming
  // `culprit` (a file of the copy) and saying `what`.
  int n = 0;
  auto expect_refused = [&](const std::function<void(const std::string&)>& edit,
                            const std::string& culprit, const std::string& what) {
    const std::string bad = dir_.file("bad_" + std::to_string(++n));
    std::filesystem::copy(good, bad);
    edit(bad);
    auto res = train(write_config("bad", kGpt2, "", 1),
                     "--set model.init_from=" + bad + " --set checkpoint.interval=0");
    EXPECT_EQ(res.exit_code, 2) << what << ": " << res.output;
    EXPECT_NE(res.output.find(bad + "/" + culprit), std::string::npos) << what << ": " << res.output;
    EXPECT_NE(res.output.find(what), std::string::npos) << res.output;
  };
  auto rewrite = [&](const std::string& dir, const std::vector<SafetensorsTensor>& tensors) {
    std::vector<SafetensorsEntry> entries;
    for (const auto& t : tensors) entries.push_back({t.name, t.shape, t.data.data()});
    std::ofstream(dir + "/model.safetensors", std::ios::binary) << encode_safetensors(entries);
  };
  expect_refused([](const std::string& d) { std::filesystem::remove(d + "/config.json"); },
                 "config.json", "cannot open");
  expect_refused([](const std::string& d) {
    std::ofstream(d + "/config.json") << R"({"model_type": "bert", "vocab_size": 256})";
  }, "config.json", "unknown model_type \"bert\"");
  expect_refused([](const std::string& d) {
    std::ofstream(d + "/config.json") << "{not json";
  }, "config.json", "not a JSON object");
  expect_refused([&](const std::string& d) {
    auto tensors = original.value().tensors;
    tensors.erase(std::remove_if(tensors.begin(), tensors.end(), [](const auto& t) {
      return t.name == "transformer.h.1.mlp.c_fc.bias";
    }), tensors.end());
    rewrite(d, tensors);
  }, "model.safetensors", "missing tensor transformer.h.1.mlp.c_fc.bias");
  expect_refused([&](const std::string& d) {
    auto tensors = original.value().tensors;
    for (auto& t : tensors) {
      if (t.name == "transformer.h.0.attn.c_proj.weight") t.shape = {32, 128};
    }
    rewrite(d, tensors);
  }, "model.safetensors", "tensor transformer.h.0.attn.c_proj.weight has shape [32, 128]");
  expect_refused([](const std::string& d) {
    const std::string f = d + "/model.safetensors";
    std::filesystem::resize_file(f, std::filesystem::file_size(f) - 100);
  }, "model.safetensors", "truncated");
  expect_refused([](const std::string& d) {
    std::fstream f(d + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("#garbage", 8);
  }, "model.safetensors", "header is not a JSON object");
  expect_refused([](const std::string& d) {
    auto cfg = nlohmann::json::parse(std::ifstream(d + "/config.json"));
    cfg["activation_function"] = "relu";
    std::ofstream(d + "/config.json") << cfg.dump();
  }, "config.json", "'activation_function' is \"relu\"");
  // A NaN weight is refused when read (not blamed on the learning rate at step 1).
  expect_refused([&](const std::string& d) {
    auto tensors = original.value().tensors;
    for (auto& t : tensors) {
      if (t.name == "transformer.h.1.mlp.c_fc.bias") t.data[3] = std::nanf("");
    }
    rewrite(d, tensors);
  }, "model.safetensors", "tensor 'transformer.h.1.mlp.c_fc.bias': element 3 of 256 is NaN");
}

// An llm.c checkpoint with a +Inf weight: `trident train` exits 2 naming the file and the
// tensor before any step.
TEST_F(Export, NonFiniteLlmcInitFromExits2NamingTheTensor) {
  std::ifstream in(std::string(TRIDENT_SOURCE_DIR) + "/tests/reference/fixtures/gpt2_llmc.bin",
                   std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 121344u);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(bytes.data() + 1024 + 4 * (128 * 32 + 5), &inf, 4);  // wpe[5], after wte (Vp x C)
  const std::string bad = dir_.file("inf_llmc.bin");
  std::ofstream(bad, std::ios::binary) << bytes;
  std::vector<uint32_t> tokens;  // within the checkpoint's 64-token vocabulary
  for (int i = 0; i < 4000; ++i) tokens.push_back(static_cast<uint32_t>(i % 64));
  ASSERT_TRUE(write_token_file(dir_.file("small_vocab.bin"), tokens, 1).is_ok());
  auto r = train(write_config("inf", "arch: gpt2, seq_len: 16, init_from: " + bad, "", 1,
                              dir_.file("small_vocab.bin")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(bad + ": tensor wpe: element 5 of 512 is +Inf"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
}

TEST_F(Export, BadUsageExits2) {
  auto r = run_command(testing::trident_binary() + " export --checkpoint " +
                       dir_.file("nowhere") + " --format safetensors --out " + dir_.file("o"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir_.file("nowhere")), std::string::npos) << r.output;
  r = run_command(testing::trident_binary() + " export --checkpoint x --format onnx --out y");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown format 'onnx'"), std::string::npos) << r.output;
  r = run_command(testing::trident_binary() + " export --checkpoint x --format safetensors");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--out is required"), std::string::npos) << r.output;
  for (const char* flag : {"--help", "-h"}) {  // on stdout, exit 0
    r = run_command("(" + testing::trident_binary() + " export " + flag + " 2>/dev/null)");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.rfind("usage: trident export", 0), 0u) << r.output;
  }
  r = run_command("(" + testing::trident_binary() + " --help 2>/dev/null)");
  EXPECT_NE(r.output.find("  export "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace trident
