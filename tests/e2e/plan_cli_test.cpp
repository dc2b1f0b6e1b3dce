// `trident plan` end to end (cli/cmd_plan.cpp; docs/PLAN.md): the 70B config on 1024
// H100s in well under 5 s with a sensible table, --json with docs/PLAN.md's "JSON" object, --gpu
// cpu, and every bad input exiting 2 with a message naming the flag or key.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/e2e/cli_util.h"

namespace trident::testing {
namespace {

std::string plan_cmd(const std::string& args) { return trident_binary() + " plan " + args; }
std::string configs() { return std::string(TRIDENT_SOURCE_DIR) + "/configs/"; }

// A small llama config file (tp 1-2 valid; 2 layers).
std::string small_config(const ScratchDir& dir, const std::string& parallel = "{}") {
  dir.write("small.yaml",
            "model: {arch: llama, vocab_size: 256, seq_len: 32, n_layers: 2, n_heads: 4, "
            "n_kv_heads: 2, d_model: 64, d_ff: 128}\n"
            "parallel: " + parallel + "\n"
            "data: {train: unused.bin}\n"
            "training: {global_batch_size: 8}\n");
  return dir.file("small.yaml");
}

TEST(PlanCli, Llama70bOn1024H100sIsFastAndSensible) {
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r =
      run_command(plan_cmd("--config " + configs() + "llama-70b.yaml --devices 1024 --gpu h100"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("trident plan llama-70b, 1024 x h100: %.2f s\n", seconds);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(seconds, 5.0);
  EXPECT_NE(r.output.find("# rank  layout"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n  1     dp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n  conf  dp16 tp8 pp8 z1 sp none mbs1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on 1024 it is evaluated with dp=16"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("valid layouts on 1024 x h100 (8 per node)"), std::string::npos);
  EXPECT_NE(r.output.find("\nrecommended: dp"), std::string::npos) << r.output;
  // Sensible: 70B parameters need tensor parallelism on 80 GiB GPUs, and the predicted
  // MFU of the recommendation is between 20% and 70%.
  const size_t rec = r.output.find("\nrecommended: ");
  EXPECT_EQ(r.output.find("tp1 ", rec), std::string::npos) << r.output.substr(rec);
  const size_t mfu_at = r.output.find("MFU ", rec);
  ASSERT_NE(mfu_at, std::string::npos);
  const double mfu = std::stod(r.output.substr(mfu_at + 4));
  EXPECT_GT(mfu, 20.0);
  EXPECT_LT(mfu, 70.0);
}

TEST(PlanCli, JsonIsTheDesignObject) {
  ScratchDir dir;
  const CommandResult r = run_command(
      plan_cmd("--config " + small_config(dir, "{dp: 8, micro_batch_size: 1}") + " --devices 8 --gpu a100 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["devices"], 8);
  EXPECT_EQ(j["gpu"], "a100");
  EXPECT_EQ(j["gpus_per_node"], 8);
  EXPECT_EQ(j["layouts"].size(), 156u);  // tests/plan/plan_test.cpp counts them
  EXPECT_EQ(j["configured"]["dp"], 8);
  EXPECT_EQ(j["configured"]["virtual_stages"], 1);
  EXPECT_TRUE(j["recommended"]["fits"].get<bool>());
  EXPECT_EQ(j["recommended"], j["layouts"][0]);
  for (const char* key : {"params", "grads", "optimizer", "activations", "buffers", "total"}) {
    EXPECT_TRUE(j["recommended"]["memory_bytes"].contains(key)) << key;
  }
}

// configs/mixtral-8x7b.yaml: the parameters counted from the published shape by hand
// here (Mixtral 8x7B: 46.7B in all, 12.9B active), MFU of the active FLOPs, and no
// tensor parallelism (MoE refuses tp > 1).
// parallel.dp: auto on --devices N: dp = N / (tp * pp). scripts/slurm/train.sbatch decides
// whether a job continues on fewer nodes from these "# configured:" lines and the exit
// code (docs/SLURM.md "Lost nodes without a spare"), so their wording is pinned here.
TEST(PlanCli, DataParallelAutoFollowsTheDevices) {
  ScratchDir dir;
  const std::string config = small_config(dir, "{dp: auto, tp: 2, micro_batch_size: 1}");
  CommandResult r = run_command(plan_cmd("--config " + config + " --devices 8 --gpu a100 --configured-only --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["dp_auto"], true);
  EXPECT_EQ(j["configured"]["dp"], 4);
  r = run_command(plan_cmd("--config " + config + " --devices 4 --gpu a100 --configured-only"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\n# configured: parallel.dp: auto is dp 2 on 4 devices\n"), std::string::npos)
      << r.output;
  // 6 devices: dp 3 does not divide the global batch of 8; 5: not a multiple of tp.
  r = run_command(plan_cmd("--config " + config + " --devices 6 --gpu a100 --configured-only"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("# configured: parallel.dp: auto = world size 6 / tp*pp 2 = 3: "
                          "training.global_batch_size: 8 is not divisible by"),
            std::string::npos) << r.output;
  r = run_command(plan_cmd("--config " + config + " --devices 5 --gpu a100 --configured-only"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.dp: auto: the world size 5 is not a multiple of tp*pp = 2*1 = 2"),
            std::string::npos) << r.output;
  // A fixed dp is rescaled for the plan only, and says so (the script then requeues).
  r = run_command(plan_cmd("--config " + small_config(dir, "{dp: 4, tp: 2, micro_batch_size: 1}") +
                           " --devices 4 --gpu a100 --configured-only --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["dp_auto"], false);
  r = run_command(plan_cmd("--config " + dir.file("small.yaml") + " --devices 4 --gpu a100 --configured-only"));
  EXPECT_NE(r.output.find("\n# configured: the config's layout is for 8 devices (parallel.dp=4); on 4 it "
                          "is evaluated with dp=2\n"), std::string::npos) << r.output;
}

TEST(PlanCli, Mixtral8x7bCountsTotalAndActiveParameters) {
  const CommandResult r = run_command(
      plan_cmd("--config " + configs() + "mixtral-8x7b.yaml --devices 64 --gpu h100 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  const int64_t C = 4096, KV = 1024, F = 14336, V = 32000, L = 32, E = 8, K = 2, T = 4096;
  const int64_t attention = 2 * C * C + 2 * C * KV, norms = 2 * C, router = E * C;
  const int64_t expert = 3 * C * F, outside = 2 * V * C + C;  // embedding, head, final norm
  const int64_t total = L * (attention + norms + router + E * expert) + outside;
  const int64_t active = L * (attention + norms + router + K * expert) + outside;
  EXPECT_EQ(total, 46702792704);
  EXPECT_EQ(j["model"]["parameters"].get<int64_t>(), total);
  EXPECT_EQ(j["model"]["active_parameters"].get<int64_t>(), active);
  const double flops = 6.0 * active + 12.0 * L * C * T;
  EXPECT_DOUBLE_EQ(j["model"]["flops_per_token"].get<double>(), flops);
  const nlohmann::json& rec = j["recommended"];
  ASSERT_TRUE(rec.is_object()) << r.output.substr(0, 2000);
  EXPECT_EQ(rec["tp"], 1);
  EXPECT_NEAR(rec["mfu"].get<double>(), flops * rec["tokens_per_s_per_gpu"].get<double>() / 989e12,
              1e-12);
  const CommandResult table = run_command(
      plan_cmd("--config " + configs() + "mixtral-8x7b.yaml --devices 64 --gpu h100"));
  EXPECT_NE(table.output.find("# model: 46.70B parameters, 12.88B active per token"),
            std::string::npos)
      << table.output;
}

// TRIDENT_RING_OVERLAP, read as the trainer reads it (parallel/context_parallel.h): =0
// the cp ring is blocking and its exposed time is its whole transfer time, more than
// the overlapped ring's (unset or 1); any other value exits 2 naming the variable.
TEST(PlanCli, RingOverlapEnvironmentAsTheTrainerReadsIt) {
  const std::string cmd = plan_cmd(
      "--config " + configs() + "llama-8b.yaml --devices 8 --gpu h100 --configured-only --json"
      " --set model.seq_len=32768 --set parallel.dp=1 --set parallel.tp=4 --set parallel.cp=2"
      " --set parallel.sequence_parallel=true --set training.global_batch_size=8"
      " --set training.recompute=full");
  auto configured = [&](const char* value) {
    if (value != nullptr) setenv("TRIDENT_RING_OVERLAP", value, 1);
    const CommandResult r = run_command(cmd);
    unsetenv("TRIDENT_RING_OVERLAP");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output)["configured"];
  };
  const nlohmann::json unset = configured(nullptr), on = configured("1"), off = configured("0");
  EXPECT_EQ(unset, on);
  EXPECT_EQ(on["cp_ring_overlapped"], true);
  EXPECT_EQ(off["cp_ring_overlapped"], false);
  const double exposed = off["time_s"]["cp"].get<double>();
  EXPECT_GT(exposed, 0);
  // (That it is the whole ring, cp_comm_s, tests/plan/plan_cp_test.cpp checks.)
  EXPECT_GT(exposed, on["time_s"]["cp"].get<double>());
  EXPECT_NEAR(off["step_time_s"].get<double>() - on["step_time_s"].get<double>(),
              exposed - on["time_s"]["cp"].get<double>(), 1e-9 * exposed);

  setenv("TRIDENT_RING_OVERLAP", "yes", 1);
  const CommandResult bad = run_command(cmd);
  unsetenv("TRIDENT_RING_OVERLAP");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("trident plan: TRIDENT_RING_OVERLAP='yes': must be 1 (overlap, the "
                            "default) or 0"),
            std::string::npos)
      << bad.output;
}

TEST(PlanCli, GpuCpuPlansForThisMachine) {
  ScratchDir dir;
  const CommandResult r = run_command(
      plan_cmd("--config " + small_config(dir) + " --devices 2 --gpu cpu --set runtime.peak_tflops=0.1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("valid layouts on 2 x cpu (2 per node)"), std::string::npos) << r.output;
}

// --cores fixes the machine's share: with it and runtime.peak_tflops a cpu plan is the
// same on any machine (the host memory aside, which the capacity column shows).
TEST(PlanCli, GpuCpuWithCoresGivenDoesNotReadTheMachinesCores) {
  ScratchDir dir;
  const std::string args = "--config " + small_config(dir) +
                           " --devices 2 --gpu cpu --json --set runtime.peak_tflops=0.1 --cores ";
  const CommandResult two = run_command(plan_cmd(args + "2")), many = run_command(plan_cmd(args + "512"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  ASSERT_EQ(many.exit_code, 0) << many.output;
  const nlohmann::json a = nlohmann::json::parse(two.output), b = nlohmann::json::parse(many.output);
  // 2 ranks of 1 thread each on 2 cores share them with their communication threads; on 512
  // they do not, so the dp collectives of a dp 2 layout cost more on 2: waits plus the
  // compute they slow (time_s.dp + dp_slowdown).
  double dp_two = 0, dp_many = 0;
  for (size_t i = 0; i < a["layouts"].size(); ++i) {
    for (const char* part : {"dp", "dp_slowdown"}) {
      dp_two += a["layouts"][i]["time_s"][part].get<double>();
      dp_many += b["layouts"][i]["time_s"][part].get<double>();
    }
  }
  EXPECT_GT(dp_two, dp_many);
}

TEST(PlanCli, UnknownGpuNamesTheFlagAndTheKnownOnes) {
  ScratchDir dir;
  const CommandResult r =
      run_command(plan_cmd("--config " + small_config(dir) + " --devices 8 --gpu v100"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("trident plan: --gpu: unknown GPU 'v100'; known: h100, h200, a100, b200, cpu"),
            std::string::npos)
      << r.output;
}

TEST(PlanCli, BadDevicesAndMissingFlagsExit2) {
  ScratchDir dir;
  const std::string config = small_config(dir);
  struct Case {
    std::string args, message;
  };
  const Case cases[] = {
      {"--config " + config, "trident plan: --devices is required"},
      {"--config " + config + " --devices 0", "trident plan: --devices: expected a number >= 1, got '0'"},
      {"--config " + config + " --devices -4", "trident plan: --devices: expected a number >= 1, got '-4'"},
      {"--config " + config + " --devices many", "trident plan: --devices: expected a number >= 1, got 'many'"},
      {"--devices 8", "trident plan: --config is required"},
      {"--config " + config + " --devices 8 --gpus-per-node 0",
       "trident plan: --gpus-per-node: expected a number >= 1, got '0'"},
      {"--config " + config + " --devices 8 --frobnicate", "trident plan: unknown option '--frobnicate'"},
      {"--config " + dir.file("missing.yaml") + " --devices 8", "missing.yaml: cannot open config file"},
      {"--config " + config + " --devices 8 --set parallel.tp=3",
       "parallel.tp: 3 does not divide model.n_heads=4"},
      {"--config " + config + " --devices 6 --set parallel.tp=2 --set parallel.pp=2",
       "trident plan: parallel.tp * parallel.pp = 2 * 2 does not divide --devices 6"},
      {"--config " + config + " --devices 8 --hardware " + dir.file("none.yaml"),
       "none.yaml: cannot open hardware file"},
      {"--config " + config + " --devices 2 --gpu cpu --cores 0",
       "trident plan: --cores: expected a number >= 1, got '0'"},
      {"--config " + config + " --devices 8 --cores 4",
       "trident plan: --cores goes with --gpu cpu"},
      {"--config " + config + " --devices 8 --selective-reruns op",
       "trident plan: --selective-reruns: expected attention-core or torchtitan-op, got 'op'"},
  };
  for (const Case& c : cases) {
    const CommandResult r = run_command(plan_cmd(c.args));
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(PlanCli, AConfiguredLayoutThatDoesNotFitPrintsTheTableThenNamesTheKeys) {
  ScratchDir dir;
  // Llama-3-70B's shape on 8 H100s, tp 8: ~17.6 GiB of bf16 weights per rank and 8 GiB of
  // fp32 masters, gradients 35 GiB and moments 70 GiB: far over 80 GiB, nothing fits.
  dir.write("big.yaml",
            "model: {arch: llama, vocab_size: 128256, seq_len: 8192, n_layers: 80, n_heads: 64,"
            " n_kv_heads: 8, d_model: 8192, d_ff: 28672}\n"
            "parallel: {tp: 8, micro_batch_size: 1}\n"
            "data: {train: unused.bin}\n"
            "training: {global_batch_size: 8, precision: bf16}\n");
  const CommandResult r = run_command(plan_cmd("--config " + dir.file("big.yaml") + " --devices 8"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  const size_t table = r.output.find("# rank  layout");
  const size_t message = r.output.find("trident plan: the configured layout (parallel.dp=1, parallel.tp=8, "
                                       "parallel.pp=1, parallel.zero_stage=0, parallel.micro_batch_size=1");
  ASSERT_NE(table, std::string::npos) << r.output;
  ASSERT_NE(message, std::string::npos) << r.output;
  EXPECT_LT(table, message);
  EXPECT_NE(r.output.find("does not fit on h100: pipeline stage 0 needs", message), std::string::npos);
  EXPECT_NE(r.output.find("but a rank has 80.0 GiB; biggest: optimizer state", message), std::string::npos)
      << r.output.substr(message);
  EXPECT_NE(r.output.find("recommended: none (no layout fits)"), std::string::npos);
}

}  // namespace
}  // namespace trident::testing
