// `trident plan` against published, measured training runs (tests/plan/published_runs.json;
// docs/PERFORMANCE.md "trident plan vs published runs"): for every run, the plan of its
// published model, layout, batch and recompute on its GPUs, and the error of the
// predicted MFU against the published one, both in one FLOP convention (6N + 12·L·h·s per
// token, TransformerConfig::flops_per_token, over the hardware table's bf16 peak). A
// change of the time model that moves the predictions away from what these runs measured
// fails here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "plan/calibrate.h"
#include "plan/hardware.h"
#include "plan/plan.h"

namespace trident {
namespace {

// The bounds, on the relative error of the predicted MFU (predicted / published - 1).
// The target is ±15% on at least 90% of the rows; the model reaches it on 42 of
// the 46 (docs/PERFORMANCE.md gives every row and why the others are off: Llama 3's
// interleaved pipeline on uneven stages, which Trident cannot lay out, torchtitan's Llama 2
// 70B at local batch 1, and MPT-13B on 8 H100 at +15.6%). torchtitan's "selective op"
// rows are planned with its op-level policy (selective_reruns, plan/plan.h). Three rows
// are fits, not predictions: the a100 and h100 efficiencies of configs/hardware.yaml were
// fitted to one row each (LLM Foundry's MPT-7B on 8 GPUs), and the 12 rows of NVIDIA's
// NeMo 25.02 recipe are planned with the h100 entry calibrated from that stack's
// single-node run ("calibrated_from"; with the shipped h100 entry all 12 are 20-22% slow,
// one factor of 1.256 for the whole stack). Of the other 43, held out, 39 are within ±15%.
// The test holds what the model reaches, so that a change of the model cannot make the
// fit worse unnoticed:
constexpr double kNearBound = 0.15;         // "near": within ±15%
constexpr double kNearShareAtLeast = 0.91;  // share of the rows that are near (42/46 = 0.913)
constexpr double kHardCap = 0.50;           // no row further off (the worst is 0.474)
// The rows not marked "fitted" (the two MPT-7B and NeMo's 8-GPU row are): 39 of the 43.
constexpr double kHeldOutNearShareAtLeast = 0.90;  // 39/43 = 0.907

struct Row {
  std::string name, family;
  double published_mfu = 0, predicted_mfu = 0, error = 0;
  bool fsdp = false, fits = false, fit_exempt = false, fitted = false;
  double memory_gib = 0;
};

std::string source_dir() { return TRIDENT_SOURCE_DIR; }

nlohmann::json published_runs() {
  std::ifstream in(source_dir() + "/tests/plan/published_runs.json");
  EXPECT_TRUE(in.good()) << "tests/plan/published_runs.json";
  return nlohmann::json::parse(in);
}

// One run's published configuration, the options it is planned with, its GPU's bf16
// peak and its plan.
struct PlannedRun {
  Config config;
  PlanOptions options;
  double peak_flops = 0;
  PlanResult plan;
};

// The plan of a run's configuration on its GPUs, with `extra` --set overrides after the
// run's own (nullopt: the config did not load); `hardware`, when given, replaces the
// table's entry for its GPU (a calibrated one).
std::optional<PlannedRun> plan_run(const nlohmann::json& run, const HardwareTable& table,
                                   const std::vector<std::string>& extra = {},
                                   const Hardware* hardware = nullptr) {
  const std::string name = run["name"];
  std::vector<std::string> sets = run["set"].get<std::vector<std::string>>();
  sets.insert(sets.end(), extra.begin(), extra.end());
  auto loaded = load_config(source_dir() + "/" + run["config"].get<std::string>(), sets);
  EXPECT_TRUE(loaded.is_ok()) << name << ": " << loaded.status().message();
  if (!loaded.is_ok()) return std::nullopt;
  PlannedRun out;
  out.config = loaded.value();
  const int devices = run["devices"];
  EXPECT_EQ(out.config.parallel.world_size_wide(), devices) << name << ": the layout is for its GPUs";
  auto hw = find_gpu(table, run["gpu"]);
  EXPECT_TRUE(hw.is_ok()) << name;
  if (!hw.is_ok()) return std::nullopt;
  PlanOptions o;
  o.devices = devices;
  o.gpus_per_node = 8;
  o.hardware = hardware != nullptr ? *hardware : hw.value();
  o.attention_state_bytes = gpu_attention_state_bytes;
  // A run whose attention materialized the scores (pre-flash Megatron-LM): the plain
  // path, as `TRIDENT_ATTENTION=plain trident plan` plans it.
  if (run.value("attention", "") == "plain") {
    o.plain_attention = true;
    o.attention_state_bytes = gpu_plain_attention_state_bytes;
  }
  // A run whose selective recomputation is another trainer's policy, as its source
  // states it (torchtitan's op-level "selective op"): its time and its memory.
  if (run.contains("selective_reruns")) {
    EXPECT_TRUE(parse_selective_reruns(run["selective_reruns"], &o.selective_reruns)) << name;
    EXPECT_EQ(out.config.training.recompute, Recompute::kSelective) << name;
  }
  out.peak_flops = o.hardware.peak_flops;
  out.plan = evaluate_layout(out.config, o);
  out.options = o;
  return out;
}

// A software stack's own efficiencies ("calibrated_from"): the GPU's entry fitted, as
// `trident plan --calibrate` fits it, to the source run's published step alone (its tokens
// per step over the published throughput; no communication figures, so the links keep the
// table's figures), as bench/plan_vs_published.py's `calibrated` does.
Result<Hardware> calibrated_from(const nlohmann::json& source, const HardwareTable& table) {
  const std::string name = source["name"];
  const std::optional<PlannedRun> p = plan_run(source, table);
  if (!p) return Status::invalid_input(name + ": not planned");
  MeasuredRun run;
  run.path = "published run '" + name + "'";
  run.world_size = p->options.devices;
  run.steps = 2;
  run.steps_used = 1;
  const double tokens_per_step =
      static_cast<double>(p->config.training.global_batch_size) * p->config.model.seq_len;
  run.step_s = tokens_per_step / (source["published_tokens_per_s_per_gpu"].get<double>() *
                                  p->options.devices);
  auto c = calibrate(p->config, p->options, run);
  if (!c.is_ok()) return c.status();
  return c->hardware;
}

HardwareTable hardware_table() {
  Result<HardwareTable> table = load_hardware_table(source_dir() + "/configs/hardware.yaml");
  EXPECT_TRUE(table.is_ok()) << table.status().message();
  return table.is_ok() ? table.value() : HardwareTable{};
}

std::vector<Row> plan_published_runs() {
  const nlohmann::json doc = published_runs();
  const HardwareTable table = hardware_table();
  std::map<std::string, Hardware> stacks;  // calibrated_from: the source's name -> its fit
  std::vector<Row> rows;
  for (const nlohmann::json& run : doc["runs"]) {
    Row r;
    r.name = run["name"];
    r.family = run["family"];
    r.fsdp = run["fsdp"];
    r.fit_exempt = run.contains("fit_exempt");
    r.fitted = run.contains("fitted");
    const Hardware* hardware = nullptr;
    if (run.contains("calibrated_from")) {
      const std::string from = run["calibrated_from"];
      if (!stacks.count(from)) {
        const auto source = std::find_if(doc["runs"].begin(), doc["runs"].end(),
                                         [&](const nlohmann::json& x) { return x["name"] == from; });
        EXPECT_TRUE(source != doc["runs"].end()) << r.name << ": calibrated_from '" << from << "'";
        if (source == doc["runs"].end()) continue;
        EXPECT_EQ((*source)["gpu"], run["gpu"]) << r.name << ": calibrated from another GPU";
        Result<Hardware> fit = calibrated_from(*source, table);
        EXPECT_TRUE(fit.is_ok()) << r.name << ": " << fit.status().message();
        if (!fit.is_ok()) continue;
        stacks.emplace(from, fit.value());
      }
      hardware = &stacks.at(from);
    }
    const std::optional<PlannedRun> planned = plan_run(run, table, {}, hardware);
    if (!planned) continue;
    const PlanResult& p = planned->plan;
    // A throughput is converted with Trident's own FLOPs per token; an MFU is taken as
    // the source states it, already in (or converted to) the same convention.
    r.published_mfu = run.contains("published_tokens_per_s_per_gpu")
                          ? run["published_tokens_per_s_per_gpu"].get<double>() *
                                planned->config.model.flops_per_token() / planned->peak_flops
                          : run["published_mfu_pct"].get<double>() / 100;
    r.predicted_mfu = p.mfu;
    r.error = p.mfu / r.published_mfu - 1;
    r.fits = p.fits;
    r.memory_gib = p.memory.total / 1073741824.0;
    rows.push_back(r);
  }
  return rows;
}

TEST(PublishedRuns, PredictedMfuWithinTheStatedBounds) {
  const std::vector<Row> rows = plan_published_runs();
  ASSERT_GE(rows.size(), 20u) << "the issue asks for at least 20 published runs";
  int near = 0, held_out = 0, held_out_near = 0;
  std::vector<double> abs_errors;
  for (const Row& r : rows) {
    std::printf("%-52s published %5.1f%%  plan %5.1f%%  error %+6.1f%%  %s %.1f GiB%s\n", r.name.c_str(),
                100 * r.published_mfu, 100 * r.predicted_mfu, 100 * r.error,
                r.fits ? "fits" : "does not fit", r.memory_gib, r.fitted ? "  (fitted)" : "");
    near += std::abs(r.error) <= kNearBound;
    if (!r.fitted) {
      ++held_out;
      held_out_near += std::abs(r.error) <= kNearBound;
    }
    abs_errors.push_back(std::abs(r.error));
    EXPECT_LE(std::abs(r.error), kHardCap) << r.name << ": predicted MFU " << r.predicted_mfu
                                           << " vs published " << r.published_mfu;
  }
  std::sort(abs_errors.begin(), abs_errors.end());
  std::printf("%zu runs: %d within ±15%%, median |error| %.1f%%, max %.1f%%\n", rows.size(), near,
              100 * abs_errors[abs_errors.size() / 2], 100 * abs_errors.back());
  std::printf("%d held out (not fitted): %d within ±15%%\n", held_out, held_out_near);
  EXPECT_GE(near, kNearShareAtLeast * static_cast<double>(rows.size()));
  EXPECT_EQ(held_out, static_cast<int>(rows.size()) - 3)
      << "the fits: the two MPT-7B rows (configs/hardware.yaml) and NeMo's single-node row";
  EXPECT_GE(held_out_near, kHeldOutNearShareAtLeast * held_out);
}

// Every published FSDP run ran on its GPUs, so its configuration must be predicted to
// fit; a row is exempt only where Trident has no setting equal to the published one (the
// data file says why). torchtitan's "selective op" rows are planned with the memory of
// its op-level policy (selective_reruns), so they are not exempt.
TEST(PublishedRuns, EveryPublishedFsdpConfigurationFits) {
  int checked = 0;
  for (const Row& r : plan_published_runs()) {
    if (!r.fsdp || r.fit_exempt) continue;
    ++checked;
    EXPECT_TRUE(r.fits) << r.name << ": predicted " << r.memory_gib << " GiB per GPU";
  }
  EXPECT_GE(checked, 15);
}

// torchtitan's table (docs/performance.md at 0413364, footnote 1 of its Llama 2 rows):
// "the 70B training with local batch size 2 will cause an OOM error when selective
// activation checkpointing is used", so it published local batch 1. The plan of its op
// policy's memory must say the same of both: batch 1 fits the 80 GB A100, batch 2 does not.
TEST(PublishedRuns, TorchtitanLlama2_70bSelectiveOpFitsAtLocalBatch1AndNotAt2) {
  const std::string name = "torchtitan Llama 2 70B lbs1 AC selective op, 64 A100";
  const nlohmann::json doc = published_runs();
  const HardwareTable table = hardware_table();
  const auto run = std::find_if(doc["runs"].begin(), doc["runs"].end(),
                                [&](const nlohmann::json& r) { return r["name"] == name; });
  ASSERT_NE(run, doc["runs"].end()) << name;
  ASSERT_EQ(run->value("selective_reruns", ""), "torchtitan-op");
  const std::optional<PlannedRun> lbs1 = plan_run(*run, table);
  const std::optional<PlannedRun> lbs2 =
      plan_run(*run, table, {"parallel.micro_batch_size=2", "training.global_batch_size=128"});
  ASSERT_TRUE(lbs1 && lbs2);
  ASSERT_EQ(lbs2->config.grad_accum_steps(), 1);  // one micro-batch of 2 per GPU, as published
  std::printf("70B selective op: local batch 1 %.1f GiB, local batch 2 %.1f GiB (of %.1f)\n",
              lbs1->plan.memory.total / 1073741824.0, lbs2->plan.memory.total / 1073741824.0,
              find_gpu(table, "a100").value().memory_bytes / 1073741824.0);
  EXPECT_TRUE(lbs1->plan.fits) << lbs1->plan.memory.total / 1073741824.0 << " GiB";
  EXPECT_FALSE(lbs2->plan.fits) << lbs2->plan.memory.total / 1073741824.0 << " GiB";
}

}  // namespace
}  // namespace trident
