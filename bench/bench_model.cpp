// Training-step throughput of the CPU backend on fixed model presets: tokens/s, model
// GFLOP/s and the share of the measured sgemm peak, with a correctness column (the
// loss of the first step must be ~ln(V) and finite). Prints a '#' header and a
// fixed-width table; bench/model_bench.sh runs it next to PyTorch eager.
// Every step is timed on its own: ms/step (and tokens/s, GFLOP/s, %peak from it) is the
// median step, which a step slowed by another process on a shared machine does not
// move; mean_ms is the mean. bench/torch_model.py reports PyTorch the same way.
// The sgemm peak (column `peak`) is measured after every timed step, outside its time,
// and is the median of those: the rate under the same machine load as the steps (one
// measurement before the table swung between 103 and 145 GFLOP/s on a shared machine).
//
//   build/bench/bench_model [--preset small|medium|all|moe] [--steps N] [--threads N]
//                           [--precision fp32|bf16] [--arch gpt2|llama] [--profile]
//
// --arch llama: the presets' shapes as the llama family (RMSNorm, SwiGLU at the same d_ff,
// RoPE, no biases, an untied head) with half as many kv heads as query heads (GQA); q, k
// and v then run as one GEMM unless TRIDENT_FUSED_QKV=0 (bytes and time before / after).
//
// --preset moe: each mixture-of-experts preset (bench/presets.h) beside its dense preset of
// the same active FLOPs per token, and the ratio of their step times; with --profile, the
// router's share of the MoE step.
//
// --profile: then, per preset, `steps` more steps on a new model whose Ops time every
// call (bench/profiling_ops.h), and a table of each op's share of the step, its time per
// step and its GFLOP/s (GEMM-shaped ops) or GB/s (the rest), forward and backward.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/presets.h"
#include "bench/profiling_ops.h"
#include "comm/communicator.h"
#include "core/rng.h"
#include "core/timer.h"
#include "kernels/cpu/sgemm_peak.h"
#include "model/transformer.h"
#include "parallel/data_parallel.h"

namespace trident {
namespace {

using bench::ProfilingOps;

double sum_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using bench::kMoePresets;
using bench::kPresets;
using bench::MoePreset;
using bench::Preset;

int run(int argc, char** argv) {
  std::string preset = "all";
  int steps = 10, threads = 0;
  std::string precision = "fp32";
  std::string arch = "gpt2";
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--profile")) {
      profile = true;
      continue;
    }
    if (i + 1 == argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", argv[0], argv[i]);
      return 2;
    }
    if (!std::strcmp(argv[i], "--preset")) preset = argv[i + 1];
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--precision")) precision = argv[i + 1];
    else if (!std::strcmp(argv[i], "--arch")) arch = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: %s [--preset small|medium|all|moe] [--steps N] [--threads N] "
                   "[--precision fp32|bf16] [--arch gpt2|llama] [--profile]\n",
                   argv[0]);
      return 2;
    }
    ++i;
  }
  if (precision != "fp32" && precision != "bf16") {
    std::fprintf(stderr, "--precision: expected fp32 or bf16, got '%s'\n", precision.c_str());
    return 2;
  }
  if (arch != "gpt2" && arch != "llama") {
    std::fprintf(stderr, "--arch: expected gpt2 or llama, got '%s'\n", arch.c_str());
    return 2;
  }
  const DType compute = precision == "bf16" ? DType::kBF16 : DType::kF32;
  auto ops = make_cpu_ops(threads);
  std::printf("# trident CPU training step (fwd + bwd + AdamW), %s, %s%s, %d threads; peak: "
              "sgemm 1024^3 GFLOP/s, the median of one measurement after each timed step\n",
              precision.c_str(), arch.c_str(),
              arch != "llama"                        ? ""
              : Transformer::fused_qkv_from_env() ? " (one q/k/v GEMM)"
                                                    : " (three q/k/v GEMMs)",
              omp_get_max_threads());
  std::printf("# %-8s %10s %8s %10s %10s %12s %10s %8s %8s %10s %6s\n", "preset", "params",
              "tokens", "ms/step", "mean_ms", "tokens/s", "GFLOP/s", "peak", "%peak", "loss0", "ok");
  // One preset's row (and profile); returns its median ms per step.
  auto bench_preset = [&](const Preset& p, const MoePreset* moe) {
    TransformerConfig c;
    c.arch = arch == "llama" ? Arch::kLlama : Arch::kGpt2;
    c.vocab_size = p.vocab;
    c.seq_len = p.seq_len;
    c.n_layers = p.n_layers;
    c.n_heads = p.n_heads;
    c.d_model = p.d_model;
    if (c.arch == Arch::kLlama) {
      c.n_kv_heads = p.n_heads / 2;
      c.d_ff = 4 * p.d_model;
    }
    if (moe) {
      c.moe_experts = moe->experts;
      c.moe_top_k = moe->top_k;
      c.moe_d_ff = moe->expert_d_ff;
    }
    c.finalize();
    // The training step of `trident train` in one process: ZeRO stage 0 over a
    // single-rank data-parallel group (no communication), on `step_ops`; returns the
    // first step's loss and the seconds of each of `steps` steps after two warm-up steps;
    // with `peaks`, an sgemm peak measurement after each timed step goes there.
    const int N = p.micro_batch * p.seq_len;
    auto measure = [&](Ops& step_ops, ProfilingOps* profiler, float* loss0,
                       std::vector<double>* peaks) {
      SelfCommunicator self("dp", MemSpace::kDevice);  // the dp group carries device buffers
      const ModelPartition whole;
      const ParamLayout layout = describe_params(c, whole);
      AdamWParams adamw;
      adamw.weight_decay = 0.1f;
      DataParallel dp(layout, step_ops, self, /*zero_stage=*/0, size_t{25} << 20, adamw, compute);
      Transformer model(c, step_ops, whole, nullptr, &dp.store(), p.micro_batch, 1, compute);
      for (size_t i = 0; i < layout.params.size(); ++i) {
        dp.load_param(static_cast<int>(i), Transformer::initial_value(c, layout.params[i], 1));
      }
      std::vector<int32_t> tokens(N), targets(N);
      const uint64_t key = rng_key(7, 7);
      for (int i = 0; i < N; ++i) {
        tokens[i] = static_cast<int32_t>(uniform_int_at(key, i, p.vocab));
        targets[i] = static_cast<int32_t>(uniform_int_at(key, i + N, p.vocab));
      }
      auto step = [&]() {
        dp.zero_grad();
        float loss = model.forward(tokens.data(), targets.data(), p.micro_batch, p.seq_len);
        model.backward(1.0f);
        dp.reduce_gradients();
        const double norm = std::sqrt(dp.owned_grad_square_sum(true));
        if (norm > 1.0) dp.scale_gradients(static_cast<float>(1.0 / norm));
        dp.step(1e-4f);
        return loss;
      };
      *loss0 = step();  // warm-up, and the correctness check
      step();
      if (profiler) profiler->reset();
      std::vector<double> seconds;
      for (int s = 0; s < steps; ++s) {
        Timer timer;
        step();
        seconds.push_back(timer.elapsed_s());
        if (peaks) peaks->push_back(measure_sgemm_peak_gflops());
      }
      return seconds;
    };
    float loss0 = 0;
    std::vector<double> peaks;
    std::vector<double> seconds = measure(*ops, nullptr, &loss0, &peaks);
    const double peak = median_of(peaks);
    const double mean_ms = 1e3 * sum_of(seconds) / steps;
    const double ms = 1e3 * median_of(seconds);
    const double tok_s = N / (ms / 1000.0);
    const double gflops = c.flops_per_token() * tok_s / 1e9;
    const bool ok = std::isfinite(loss0) && std::fabs(loss0 - std::log(p.vocab)) < 0.5;
    std::printf("  %-8s %10lld %8d %10.2f %10.2f %12.0f %10.1f %8.1f %7.1f%% %10.4f %6s\n",
                p.name, static_cast<long long>(c.num_parameters()), N, ms, mean_ms, tok_s, gflops,
                peak, 100.0 * gflops / peak, loss0, ok ? "yes" : "NO");
    if (profile) {
      ProfilingOps profiler(*ops);
      if (moe) profiler.name_gemms(moe->experts, "router_matmul");
      float profiled_loss0 = 0;
      const double profiled = sum_of(measure(profiler, &profiler, &profiled_loss0, nullptr));
      std::printf("# profile: %s, %d steps of %.2f ms (%.2f ms unprofiled), %s\n", p.name, steps,
                  1e3 * profiled / steps, mean_ms, precision.c_str());
      profiler.print(profiled, steps);
      if (moe) {
        // The router: its GEMM (forward and backward) and the softmax / top-k / statistics
        // op, against the profiled step.
        double router = 0;
        for (const auto& [name, e] : profiler.entries()) {
          if (name.rfind("router_matmul", 0) == 0 || name.rfind("moe_route", 0) == 0) {
            router += e.seconds;
          }
        }
        std::printf("# router share of %s: %.2f ms of %.2f ms per step (%.1f%%): "
                    "router_matmul_* + moe_route_*\n",
                    p.name, 1e3 * router / steps, 1e3 * profiled / steps,
                    100.0 * router / profiled);
      }
    }
    return ms;
  };
  if (preset == "moe") {
    for (const MoePreset& m : kMoePresets) {
      const Preset* dense = nullptr;
      for (const Preset& p : kPresets) {
        if (!std::strcmp(p.name, m.dense)) dense = &p;
      }
      const double dense_ms = bench_preset(*dense, nullptr);
      const double moe_ms = bench_preset(m.shape, &m);
      std::printf("# %s (%d experts of width %d, top %d) against %s (the same active FLOPs per "
                  "token but the router's): %.2fx its step time\n",
                  m.shape.name, m.experts, m.expert_d_ff, m.top_k, dense->name, moe_ms / dense_ms);
    }
    return 0;
  }
  for (const Preset& p : kPresets) {
    if (preset == "all" || preset == p.name) bench_preset(p, nullptr);
  }
  return 0;
}

}  // namespace
}  // namespace trident

int main(int argc, char** argv) { return trident::run(argc, argv); }
