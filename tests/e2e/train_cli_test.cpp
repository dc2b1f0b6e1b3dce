// End-to-end: `trident train` on a tiny model — the loss falls, two runs are bitwise
// identical, the metrics file has the fields of docs/ARCHITECTURE.md "Observability" — and
// bad input exits 2 naming
// the culprit (a directory as --config, an unusable checkpoint.dir found at start-up);
// every subcommand answers --help on stdout with exit 0.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/backend.h"
#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

using testing::run_command;
using testing::ScratchDir;

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(write_token_file(dir_.file("train.bin"), testing::english_bytes(40000), 1).is_ok());
    ASSERT_TRUE(write_token_file(dir_.file("val.bin"), testing::english_bytes(5000), 1).is_ok());
  }

  // A small gpt2 (or llama) config over the scratch data; `extra` is appended YAML.
  std::string write_config(const std::string& name, const std::string& arch,
                           const std::string& extra = "") {
    std::string yaml =
        "model: {arch: " + arch + ", vocab_size: 256, seq_len: 32, n_layers: 2, n_heads: 4,"
        " d_model: 64}\n"
        "parallel: {micro_batch_size: 4}\n"
        "data: {train: " + dir_.file("train.bin") + ", val: " + dir_.file("val.bin") + "}\n"
        "training: {global_batch_size: 8, max_steps: 30, lr: 0.003, warmup_steps: 5,"
        " eval_interval: 15, eval_batches: 2}\n"
        "logging: {metrics: " + dir_.file(name + ".jsonl") + ", log_interval: 10}\n" + extra;
    dir_.write(name + ".yaml", yaml);
    return dir_.file(name + ".yaml");
  }

  // Each config trains into its own checkpoint directory under the scratch dir (never the
  // default ./checkpoints, which --resume auto would continue across tests); a
  // checkpoint.dir in `flags` comes later and wins.
  testing::CommandResult train(const std::string& config, const std::string& flags = "") {
    const std::string ckpt = config + ".ckpt";
    return run_command(testing::trident_binary() + " train --config " + config +
                       " --set checkpoint.dir=" + ckpt + " " + flags);
  }

  std::vector<nlohmann::json> read_metrics(const std::string& name) {
    std::vector<nlohmann::json> records;
    std::ifstream in(dir_.file(name + ".jsonl"));
    std::string line;
    while (std::getline(in, line)) records.push_back(nlohmann::json::parse(line));
    return records;
  }

  ScratchDir dir_;
};

std::vector<std::string> step_losses(const std::vector<nlohmann::json>& records) {
  std::vector<std::string> out;
  for (const auto& r : records) {
    if (r.contains("loss")) out.push_back(r["loss"].dump());  // exact decimal round trip
  }
  return out;
}

TEST_F(TrainCli, LossFallsAndRunsAreBitwiseIdentical) {
  for (const char* arch : {"gpt2", "llama"}) {
    SCOPED_TRACE(arch);
    const std::string a = std::string(arch) + "_a", b = std::string(arch) + "_b";
    auto ra = train(write_config(a, arch));
    ASSERT_EQ(ra.exit_code, 0) << ra.output;
    auto rb = train(write_config(b, arch));
    ASSERT_EQ(rb.exit_code, 0) << rb.output;
    EXPECT_NE(ra.output.find("step 30/30 | loss"), std::string::npos) << ra.output;

    auto ma = read_metrics(a);
    auto la = step_losses(ma);
    ASSERT_EQ(la.size(), 30u);
    EXPECT_EQ(la, step_losses(read_metrics(b)));
    const double first = std::stod(la.front()), last = std::stod(la.back());
    EXPECT_NEAR(first, std::log(256.0), 0.3);  // starts near uniform over the bytes
    EXPECT_LT(last, 0.6 * first) << "loss did not fall: " << first << " -> " << last;

    // The metrics file: exactly the fields of docs/ARCHITECTURE.md "Observability", and
    // evaluations at 15 and 30.
    int evals = 0, summaries = 0, segments = 0;
    for (const auto& r : ma) {
      if (r.contains("segment")) {  // one header per launch (trainer/metrics.h)
        const auto& seg = r["segment"];
        EXPECT_EQ(seg["start_step"], 0);
        EXPECT_TRUE(seg["resumed_from"].is_null());
        EXPECT_EQ(seg["run_id"].get<std::string>().size(), 16u);
        EXPECT_EQ(seg["world_size"], 1);
        EXPECT_EQ(seg.size(), 5u) << r.dump();
        ++segments;
      } else if (r.contains("summary")) {
        ASSERT_EQ(r["summary"]["ranks"].size(), 1u);
        EXPECT_GT(r["summary"]["ranks"][0]["param_bytes"].get<double>(), 0);
        ++summaries;
      } else if (r.contains("val_loss")) {
        EXPECT_EQ(r.size(), 2u);
        EXPECT_TRUE(r["step"] == 15 || r["step"] == 30) << r.dump();
        EXPECT_LT(r["val_loss"].get<double>(), first);
        ++evals;
      } else {
        for (const char* key : {"step", "loss", "lr", "grad_norm", "step_ms", "tokens_per_s", "mfu",
                                "comm_exposed_ms", "comm_hidden_ms"}) {
          EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
        }
        EXPECT_EQ(r.size(), 9u) << r.dump();
        // One process: no group has another rank, so no communication time.
        for (const char* key : {"comm_exposed_ms", "comm_hidden_ms"}) {
          for (const char* group : {"tp", "dp", "pp", "embedding"}) {
            EXPECT_EQ(r[key][group], 0.0) << key << "." << group << " in " << r.dump();
          }
        }
      }
    }
    EXPECT_EQ(evals, 2);
    EXPECT_EQ(summaries, 1);
    EXPECT_EQ(segments, 1);
    EXPECT_TRUE(ma.back().contains("summary"));
  }
}

TEST_F(TrainCli, UnknownConfigKeyExits2NamingTheKey) {
  auto r = train(write_config("bad", "gpt2", "checkpoint: {intervall: 5}\n"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("checkpoint.intervall"), std::string::npos) << r.output;
}

TEST_F(TrainCli, UnknownSetOverrideExits2) {
  auto r = train(write_config("bad", "gpt2"), "--set training.lrr=0.1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("training.lrr"), std::string::npos) << r.output;
}

TEST_F(TrainCli, HeadsNotDividingWidthExits2) {
  auto r = train(write_config("bad", "gpt2"), "--set model.n_heads=5");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("model.n_heads"), std::string::npos) << r.output;
}

TEST_F(TrainCli, TruncatedTokenFileExits2NamingTheFile) {
  const std::string path = dir_.file("train.bin");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 3);
  auto r = train(write_config("bad", "gpt2"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(path), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
}

TEST_F(TrainCli, TokenIdBeyondVocabExits2) {
  auto tokens = testing::english_bytes(40000);
  tokens[123] = 300;  // >= vocab_size 256
  ASSERT_TRUE(write_token_file(dir_.file("train.bin"), tokens, 1).is_ok());
  auto r = train(write_config("bad", "gpt2", ""), "--set data.shuffle=false");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("300"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(dir_.file("train.bin")), std::string::npos) << r.output;
}

TEST_F(TrainCli, BadLlmcCheckpointExits2) {
  // Wrong magic.
  std::vector<int32_t> header(256, 0);
  header[0] = 12345;
  header[1] = 3;
  {
    std::ofstream out(dir_.file("bad_magic.ckpt"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
  }
  auto r = train(write_config("bad", "gpt2"), "--set model.init_from=" + dir_.file("bad_magic.ckpt"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("bad_magic.ckpt"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("magic"), std::string::npos) << r.output;

  // Right header, missing tensors.
  header = std::vector<int32_t>(256, 0);
  header[0] = 20240326;
  header[1] = 3;
  header[2] = 32;   // maxT
  header[3] = 256;  // V
  header[4] = 2;    // L
  header[5] = 4;    // NH
  header[6] = 64;   // C
  header[7] = 256;  // Vp
  {
    std::ofstream out(dir_.file("short.ckpt"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    std::vector<float> some(1000, 0.0f);
    out.write(reinterpret_cast<const char*>(some.data()), 4000);
  }
  r = train(write_config("bad", "gpt2"), "--set model.init_from=" + dir_.file("short.ckpt"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("short.ckpt"), std::string::npos) << r.output;
}

TEST_F(TrainCli, BadLayoutsExit2NamingTheKey) {
  // The world (one process here) must equal dp * tp * pp.
  auto r = train(write_config("bad", "gpt2"), "--set parallel.dp=2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("dp*tp*pp = 2 but the world size is 1"), std::string::npos) << r.output;
  // Heads must split over tp (4 heads, tp 3).
  r = train(write_config("bad", "gpt2"), "--set parallel.tp=3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.tp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.n_heads"), std::string::npos) << r.output;
  // No more pipeline stages than layers (2 layers, pp 3).
  r = train(write_config("bad", "gpt2"), "--set parallel.pp=3");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("parallel.pp"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.n_layers"), std::string::npos) << r.output;
}

// runtime.device=cuda without a usable CUDA backend is a config error naming the key and
// the reason, before any step runs; an unknown device lists the allowed ones.
TEST_F(TrainCli, UnavailableDeviceExits2NamingRuntimeDevice) {
  auto r = train(write_config("cuda", "gpt2"), "--set runtime.device=cuda");
  if (visible_cuda_devices() == 0) {  // on a GPU machine cuda is available: nothing to refuse
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("runtime.device: cuda: "), std::string::npos) << r.output;
    if (!build_has_cuda()) {  // no plugin beside trident (a build without nvcc)
      EXPECT_NE(r.output.find("the CUDA backend (libtrident_cuda.so) could not be loaded: "
                              "cannot load "),
                std::string::npos) << r.output;
    } else {  // the driver's reason follows, e.g. "CUDA driver version is insufficient ..."
      EXPECT_NE(r.output.find("no CUDA device is available (cudaGetDeviceCount: "),
                std::string::npos) << r.output;
    }
    EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
  }
  r = train(write_config("gpu", "gpt2"), "--set runtime.device=gpu");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("runtime.device: expected one of auto, cpu, cuda; got 'gpu'"),
            std::string::npos) << r.output;
  // cpu and auto both train.
  r = train(write_config("cpu", "gpt2"), "--set runtime.device=cpu --set runtime.threads=1 --set training.max_steps=2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // The banner names the backend (Ops::description) and where the MFU peak comes from.
  EXPECT_NE(r.output.find("backend: cpu"), std::string::npos) << r.output;
  r = train(write_config("peak", "gpt2"), "--set runtime.device=cpu --set runtime.threads=1 --set training.max_steps=1 --set runtime.peak_tflops=2.5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("MFU against 2500.0 GFLOP/s per rank (runtime.peak_tflops)"),
            std::string::npos) << r.output;
}

TEST_F(TrainCli, UsageErrorsExit2) {
  EXPECT_EQ(run_command(testing::trident_binary()).exit_code, 2);
  EXPECT_EQ(run_command(testing::trident_binary() + " frobnicate").exit_code, 2);
  auto r = run_command(testing::trident_binary() + " train");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--config"), std::string::npos) << r.output;
  r = train(write_config("ok", "gpt2"), "--bogus");
  EXPECT_EQ(r.exit_code, 2);
  r = run_command(testing::trident_binary() + " train --config " + dir_.file("missing.yaml"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("missing.yaml"), std::string::npos) << r.output;
}

TEST_F(TrainCli, DirectoryAsConfigExits2) {
  auto r = run_command(testing::trident_binary() + " train --config " + dir_.path());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(dir_.path() + ": is a directory"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "it trained:\n" << r.output;
}

// stdout only: usage is the answer to --help, not an error.
testing::CommandResult run_stdout_only(const std::string& args) {
  return run_command("(" + testing::trident_binary() + " " + args + " 2>/dev/null)");
}

TEST_F(TrainCli, EveryCommandAnswersHelpOnStdout) {
  auto top = run_stdout_only("--help");
  EXPECT_EQ(top.exit_code, 0) << top.output;
  for (const char* command : {"train", "prepare", "ckpt", "export", "generate"}) {
    SCOPED_TRACE(command);
    EXPECT_NE(top.output.find(std::string("  ") + command + " "), std::string::npos)
        << "trident --help does not list it:\n" << top.output;
    for (const char* flag : {"--help", "-h"}) {
      auto r = run_stdout_only(std::string(command) + " " + flag);
      EXPECT_EQ(r.exit_code, 0) << flag << "\n" << r.output;
      EXPECT_EQ(r.output.rfind(std::string("usage: trident ") + command, 0), 0u)
          << flag << "\n" << r.output;
    }
  }
  // --help wins over everything else on the train command line, even a bad config.
  auto r = run_stdout_only("train --config " + dir_.file("missing.yaml") + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--resume auto|none|DIR"), std::string::npos) << r.output;
  // No command at all is still a usage error.
  EXPECT_EQ(run_command(testing::trident_binary()).exit_code, 2);
}

TEST_F(TrainCli, UnusableCheckpointDirExits2AtStartUp) {
  dir_.write("plain", "x");
  struct Case {
    std::string dir, message;
  };
  std::vector<Case> cases = {
      {dir_.file("plain"), "checkpoint.dir " + dir_.file("plain") + ": not a directory"},
      {dir_.file("plain/ckpt"), "checkpoint.dir " + dir_.file("plain/ckpt") + ": cannot create: " +
                                    dir_.file("plain") + " is not a directory"},
  };
  if (::geteuid() != 0) {  // root writes into a mode 0555 directory anyway
    std::filesystem::create_directory(dir_.file("ro"));
    std::filesystem::permissions(dir_.file("ro"), std::filesystem::perms::owner_read |
                                                      std::filesystem::perms::owner_exec);
    cases.push_back({dir_.file("ro"), "checkpoint.dir " + dir_.file("ro") + ": not writable: "});
  }
  // interval 0: before the start-up check this surfaced only at a signal's save.
  for (const char* interval : {"0", "5"}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.dir + " interval " + interval);
      auto r = train(write_config("ck", "gpt2"), "--set checkpoint.dir=" + c.dir +
                                                     " --set checkpoint.interval=" + interval);
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_NE(r.output.find("error: " + c.message), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "it trained:\n" << r.output;
    }
  }
  if (::geteuid() != 0) {
    std::filesystem::permissions(dir_.file("ro"), std::filesystem::perms::owner_all);
  }
}

TEST_F(TrainCli, UnusableCheckpointDirExits2OnEveryRank) {
  if (std::system("command -v mpirun >/dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun not found";
  dir_.write("plain", "x");
  // Every rank checks and the ranks agree: both exit 2 together, each naming its reason.
  auto r = run_command("mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 2 " +
                       testing::trident_binary() + " train --config " +
                       write_config("ck2", "gpt2") + " --set parallel.dp=2 --set checkpoint.dir=" +
                       dir_.file("plain"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (int rank : {0, 1}) {
    EXPECT_NE(r.output.find("error: rank " + std::to_string(rank) + ": checkpoint.dir " +
                            dir_.file("plain") + ": not a directory"),
              std::string::npos)
        << r.output;
  }
}

}  // namespace
}  // namespace trident
