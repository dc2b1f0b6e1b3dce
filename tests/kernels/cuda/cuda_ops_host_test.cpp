// Host-side tests of the CUDA Ops: everything that runs without a device — the launch
// arithmetic of every kernel shape on odd sizes, device selection from the launcher's
// environment, the peak table, the attention choice, and make_ops(cuda) failing cleanly
// with exit 2 on a machine without a GPU.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/peak_table.h"

namespace trident::cuda {
namespace {

// A launch covers n items when every item has a thread (grid-stride loops make up for a
// capped grid: threads * per_thread >= n).
uint64_t threads_of(const Launch& l) { return static_cast<uint64_t>(l.grid_x) * l.block; }

TEST(CudaLaunch, ElementwiseCoversOddSizesAndSkipsZero) {
  EXPECT_TRUE(elementwise_launch(0).empty());
  EXPECT_EQ(elements_per_thread(0), 0u);
  for (uint64_t n : {1ull, 7ull, 255ull, 256ull, 257ull, 1000003ull, 16777216ull, 16777217ull}) {
    const Launch l = elementwise_launch(n);
    EXPECT_EQ(l.block, kBlock);
    EXPECT_EQ(l.grid_y, 1u);
    EXPECT_GE(threads_of(l), std::min<uint64_t>(n, kMaxElementwiseBlocks * kBlock)) << n;
    EXPECT_LT(threads_of(l), n + kBlock) << n << ": at most one partial block";
    EXPECT_GE(threads_of(l) * elements_per_thread(n), n) << n;
    EXPECT_LT(threads_of(l) * (elements_per_thread(n) - 1), n) << n << ": no idle pass";
  }
  EXPECT_EQ(elementwise_launch(257).grid_x, 2u);
  EXPECT_EQ(elements_per_thread(257), 1u);
}

TEST(CudaLaunch, ElementwiseGridIsCappedForHugeSizes) {
  const uint64_t n = 10'000'000'019ull;  // above 2^32: size_t indexing in the kernels
  const Launch l = elementwise_launch(n);
  EXPECT_EQ(l.grid_x, kMaxElementwiseBlocks);
  EXPECT_LE(l.grid_x, kMaxGridX);
  EXPECT_EQ(elements_per_thread(n), ceil_div(n, kMaxElementwiseBlocks * kBlock));
  EXPECT_GE(threads_of(l) * elements_per_thread(n), n);
}

TEST(CudaLaunch, WarpPerRowCoversEveryRow) {
  EXPECT_TRUE(warp_per_row_launch(0).empty());
  EXPECT_EQ(kWarpsPerBlock * kWarp, kBlock);
  for (uint64_t rows : {1ull, 7ull, 8ull, 9ull, 4097ull}) {
    const Launch l = warp_per_row_launch(rows);
    EXPECT_EQ(l.grid_x, ceil_div(rows, kWarpsPerBlock)) << rows;
    EXPECT_GE(static_cast<uint64_t>(l.grid_x) * kWarpsPerBlock, rows);
  }
  // Beyond the cap the kernels' row-stride loop covers the rest.
  EXPECT_EQ(warp_per_row_launch(kMaxRowBlocks * kWarpsPerBlock * 3 + 1).grid_x, kMaxRowBlocks);
}

TEST(CudaLaunch, BlockPerRowAndColumns) {
  EXPECT_TRUE(block_per_row_launch(0).empty());
  EXPECT_EQ(block_per_row_launch(13).grid_x, 13u);
  EXPECT_EQ(block_per_row_launch(kMaxRowBlocks + 5).grid_x, kMaxRowBlocks);

  EXPECT_TRUE(column_launch(0).empty());
  EXPECT_TRUE(column_launch(13, 0).empty());
  EXPECT_EQ(column_launch(13).grid_x, 1u);
  EXPECT_EQ(column_launch(256).grid_x, 1u);
  EXPECT_EQ(column_launch(257).grid_x, 2u);
  EXPECT_EQ(column_launch(50257, 7).grid_y, 7u);
  // A y dimension beyond CUDA's 65535 is capped; the wpe kernel loops t += gridDim.y.
  EXPECT_EQ(column_launch(768, 131072).grid_y, kMaxGridY);
}

TEST(CudaLaunch, ColumnReductionsChunkTheRows) {
  EXPECT_EQ(column_chunks(0), 0u);
  EXPECT_EQ(column_chunks(1), 1u);
  EXPECT_EQ(column_chunks(kColumnRowChunk), 1u);  // one partial: the CPU's order exactly
  EXPECT_EQ(column_chunks(kColumnRowChunk + 1), 2u);
  EXPECT_EQ(column_chunks(16384), 512u);  // GPT-2: B 16 x T 1024 rows
  EXPECT_TRUE(column_chunk_launch(768, 0).empty());
  EXPECT_TRUE(column_chunk_launch(0, 100).empty());
  const Launch l = column_chunk_launch(768, 16384);
  EXPECT_EQ(l.grid_x, 3u);
  EXPECT_EQ(l.grid_y, 512u);
  const Launch odd = column_chunk_launch(13, 7);
  EXPECT_EQ(odd.grid_x, 1u);
  EXPECT_EQ(odd.grid_y, 1u);
  // Beyond 65535 chunks (2M rows) the y grid is capped; the kernels loop over chunks.
  EXPECT_EQ(column_chunk_launch(64, kColumnRowChunk * 70000).grid_y, kMaxGridY);
}

TEST(CudaLaunch, EmbeddingBackwardSplitsTheVocabulary) {
  EXPECT_TRUE(embedding_backward_launch(64, 0).empty());  // a rank with no vocabulary rows
  EXPECT_TRUE(embedding_backward_launch(0, 100).empty());
  EXPECT_EQ(embedding_backward_launch(13, 5).grid_y, 5u);
  EXPECT_EQ(embedding_backward_launch(13, 5).grid_x, 1u);
  EXPECT_EQ(embedding_backward_launch(768, 50257).grid_y, kEmbeddingSplits);
  EXPECT_EQ(embedding_backward_launch(768, 50257).grid_x, 3u);
}

TEST(CudaLaunch, SumOfSquaresPartialsDependOnlyOnN) {
  EXPECT_EQ(sum_squares_partials(0), 0u);
  EXPECT_EQ(sum_squares_partials(1), 1u);
  EXPECT_EQ(sum_squares_partials(kSumChunk), 1u);
  EXPECT_EQ(sum_squares_partials(kSumChunk + 1), 2u);
  EXPECT_EQ(sum_squares_partials(124'439'808), 7596u);  // GPT-2 124M's parameters
}

TEST(CudaLaunch, GemmLayoutRuleSendsOddShapesToTheSimpleKernel) {
  // The linear layers of GPT-2 124M: N = 8192 rows, C = 768, 4C = 3072, V padded 50304.
  EXPECT_TRUE(gemm_layout_ok(false, true, 8192, 3072, 768, {0, 256, 1024}));       // forward
  EXPECT_TRUE(gemm_layout_ok(false, false, 8192, 768, 3072, {0, 256, 1024}));      // dinp
  EXPECT_TRUE(gemm_layout_ok(true, false, 50304, 768, 8192, {0, 256, 1024, 512}));  // dweight
  EXPECT_TRUE(gemm_layout_ok(false, true, 8192, 768, 768, {0, 0, 0, 0}));  // null bias: address 0
  // The op table's odd shapes: N7_IC13_OC5.
  EXPECT_FALSE(gemm_layout_ok(false, true, 7, 5, 13, {0, 256, 1024}));
  EXPECT_FALSE(gemm_layout_ok(false, true, 7, 8, 13, {0, 256, 1024}));   // A's rows of 13
  EXPECT_FALSE(gemm_layout_ok(true, false, 13, 8, 7, {0, 256, 1024}));   // A^T stored [7, 13]
  EXPECT_TRUE(gemm_layout_ok(true, false, 16, 8, 7, {0, 256, 1024}));    // K = 7 is free
  EXPECT_FALSE(gemm_layout_ok(false, true, 16, 16, 16, {0, 8, 1024}));   // a pointer off by 8
}

void expect_gemm_shape(const GemmDesc& d, int M, int N, int K, bool trans_a, bool trans_b,
                       bool accumulate) {
  EXPECT_EQ(d.M, M);
  EXPECT_EQ(d.N, N);
  EXPECT_EQ(d.K, K);
  EXPECT_EQ(d.trans_a, trans_a);
  EXPECT_EQ(d.trans_b, trans_b);
  EXPECT_EQ(d.accumulate, accumulate);
}

TEST(CudaLinearGemm, ShapesOfTheThreeGemms) {
  expect_gemm_shape(linear_gemm_desc(LinearGemm::kForward, 7, 13, 5), 7, 5, 13, false, true,
                    false);
  expect_gemm_shape(linear_gemm_desc(LinearGemm::kDinp, 7, 13, 5), 7, 13, 5, false, false, true);
  // The first writer's input gradient (GradWrite::kSet): the same GEMM with beta = 0.
  expect_gemm_shape(linear_gemm_desc(LinearGemm::kDinpSet, 7, 13, 5), 7, 13, 5, false, false,
                    false);
  expect_gemm_shape(linear_gemm_desc(LinearGemm::kDweight, 7, 13, 5), 5, 13, 7, true, false, true);
}

// Every linear GEMM of the tiny test model and of GPT-2 124M, in the dtypes CudaOps gives
// them, is accepted by cuBLASLt's descriptors (GemmEngine::describe, no device needed).
TEST(CudaLinearGemm, TinyAnd124MShapesDescribe) {
  struct Linear {
    int N, IC, OC;
    bool bias;
  };
  // (rows N = B*T; per layer qkv, attention projection, MLP up and down; the LM head.)
  const Linear shapes[] = {{64, 64, 192, true},     {64, 64, 64, true},     {64, 64, 256, true},
                           {64, 256, 64, true},     {64, 64, 256, false},   {8192, 768, 2304, true},
                           {8192, 768, 768, true},  {8192, 768, 3072, true}, {8192, 3072, 768, true},
                           {8192, 768, 50304, false}};
  for (const Linear& l : shapes) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      GemmDesc f = linear_gemm_desc(LinearGemm::kForward, l.N, l.IC, l.OC);
      f.ab_dtype = f.d_dtype = dt;
      f.bias = l.bias;
      GemmDesc di = linear_gemm_desc(LinearGemm::kDinp, l.N, l.IC, l.OC);
      di.ab_dtype = di.d_dtype = dt;
      GemmDesc ds = linear_gemm_desc(LinearGemm::kDinpSet, l.N, l.IC, l.OC);
      ds.ab_dtype = ds.d_dtype = dt;
      GemmDesc dw = linear_gemm_desc(LinearGemm::kDweight, l.N, l.IC, l.OC);
      dw.ab_dtype = dt;
      dw.d_dtype = DType::kF32;  // parameter gradients are f32
      for (const GemmDesc& d : {f, di, ds, dw}) {
        EXPECT_TRUE(gemm_layout_ok(d.trans_a, d.trans_b, d.M, d.N, d.K, {0}));
        const Status s = GemmEngine::describe(d);
        EXPECT_TRUE(s.is_ok()) << d.str() << ": " << s.message();
      }
    }
  }
}

std::function<const char*(const char*)> env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(CudaDevice, LocalRankFromTheLauncherEnvironment) {
  auto r = local_rank_from_env(env({}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, -1);
  r = local_rank_from_env(env({{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, 3);
  r = local_rank_from_env(env({{"SLURM_LOCALID", "5"}}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, 5);
  r = local_rank_from_env(env({{"MPI_LOCALRANKID", "2"}}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, 2);
  r = local_rank_from_env(env({{"LOCAL_RANK", "0"}}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, 0);
  // Open MPI first, then Slurm (srun under mpirun sets both).
  r = local_rank_from_env(env({{"LOCAL_RANK", "9"}, {"SLURM_LOCALID", "1"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "7"}}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, 7);
  r = local_rank_from_env(env({{"LOCAL_RANK", "9"}, {"SLURM_LOCALID", "1"}}));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, 1);
}

TEST(CudaDevice, MalformedLocalRankNamesTheVariable) {
  for (const char* bad : {"", "x", "1x", "-1", " 2", "99999999999"}) {
    auto r = local_rank_from_env(env({{"SLURM_LOCALID", bad}}));
    ASSERT_FALSE(r.is_ok()) << "'" << bad << "'";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidConfig);
    EXPECT_NE(r.status().message().find("SLURM_LOCALID"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << r.status().message();
  }
}

TEST(CudaDevice, DeviceIsLocalRankModuloTheDevices) {
  EXPECT_EQ(device_for_local_rank(-1, 8), 0);
  EXPECT_EQ(device_for_local_rank(0, 8), 0);
  EXPECT_EQ(device_for_local_rank(7, 8), 7);
  EXPECT_EQ(device_for_local_rank(9, 8), 1);
  EXPECT_EQ(device_for_local_rank(3, 1), 0);
}

TEST(CudaPeakTable, KnownGpusByName) {
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H100 SXM5 80GB"), 989e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H200"), 989e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H100 NVL"), 835e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H200 NVL"), 835e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA A100 80GB PCIe"), 312e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA L40S"), 362e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA GeForce RTX 4090"), 165e12);
  EXPECT_EQ(peak_bf16_flops_for("NVIDIA GeForce GTX 1080"), 0.0);
  EXPECT_EQ(peak_bf16_flops_for(""), 0.0);
}

TEST(CudaAttentionChoice, FromTheEnvironment) {
  auto c = attention_choice_from_env(nullptr);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(*c, AttentionChoice::kAuto);  // cuDNN for bf16 shapes it plans, else plain
  c = attention_choice_from_env("");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(*c, AttentionChoice::kAuto);
  c = attention_choice_from_env("plain");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(*c, AttentionChoice::kPlain);
  c = attention_choice_from_env("cudnn");
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(*c, AttentionChoice::kCudnn);
  c = attention_choice_from_env("flash");
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidConfig);
  EXPECT_NE(c.status().message().find("TRIDENT_ATTENTION: expected plain or cudnn, got 'flash'"),
            std::string::npos)
      << c.status().message();
}

// bf16 tries cuDNN unless plain is forced; f32 never does (cuDNN's flash attention is
// bf16 only), even when cudnn is forced.
TEST(CudaAttentionChoice, Bf16TriesCudnnByDefault) {
  EXPECT_TRUE(attention_tries_cudnn(AttentionChoice::kAuto, DType::kBF16));
  EXPECT_TRUE(attention_tries_cudnn(AttentionChoice::kCudnn, DType::kBF16));
  EXPECT_FALSE(attention_tries_cudnn(AttentionChoice::kPlain, DType::kBF16));
  EXPECT_FALSE(attention_tries_cudnn(AttentionChoice::kAuto, DType::kF32));
  EXPECT_FALSE(attention_tries_cudnn(AttentionChoice::kCudnn, DType::kF32));
  EXPECT_STREQ(attention_choice_name(AttentionChoice::kAuto), "auto");
}

// The state reserves what the chosen path keeps, after the 64-byte tag: cuDNN the row
// statistics (no T x T matrix), plain the probabilities in the io dtype (bf16: 2 bytes
// each, rows padded to 8), a recomputing plain fallback nothing.
TEST(CudaAttentionState, ReservesOnlyWhatThePathKeeps) {
  const AttentionShape gpt2{16, 1024, 12, 12, 64, DType::kBF16};  // GPT-2 124M, B16 T1024
  EXPECT_EQ(attention_state_total_bytes(AttentionStatePath::kCudnn, gpt2),
            64u + size_t{16} * 12 * 1024 * sizeof(float));
  EXPECT_EQ(attention_state_total_bytes(AttentionStatePath::kPlain, gpt2),
            64u + size_t{16} * 12 * 1024 * 1024 * 2);
  EXPECT_EQ(attention_state_total_bytes(AttentionStatePath::kPlainRecompute, gpt2), 64u);
  const AttentionShape odd{2, 7, 4, 2, 16, DType::kF32};  // rows padded to ld = 8
  EXPECT_EQ(attention_state_total_bytes(AttentionStatePath::kPlain, odd),
            64u + size_t{2} * 4 * 7 * 8 * sizeof(float));
  AttentionShape bf16 = odd;
  bf16.dtype = DType::kBF16;
  EXPECT_EQ(attention_state_total_bytes(AttentionStatePath::kPlain, bf16),
            64u + size_t{2} * 4 * 7 * 8 * 2);
  const AttentionShape huge{1 << 30, 1 << 30, 1 << 30, 1, 64, DType::kBF16};
  EXPECT_EQ(attention_state_total_bytes(AttentionStatePath::kPlain, huge), SIZE_MAX);
  EXPECT_EQ(attention_state_total_bytes(AttentionStatePath::kCudnn, huge), SIZE_MAX);
  // A shape that falls back without having been asked for runs in a buffer sized for a
  // larger cuDNN shape: recomputing fits in every such buffer, keeping P would not.
  const AttentionShape shorter{16, 1000, 12, 12, 64, DType::kBF16};
  EXPECT_LE(attention_state_total_bytes(AttentionStatePath::kPlainRecompute, shorter),
            attention_state_total_bytes(AttentionStatePath::kCudnn, gpt2));
  EXPECT_GT(attention_state_total_bytes(AttentionStatePath::kPlain, shorter),
            attention_state_total_bytes(AttentionStatePath::kCudnn, gpt2));
  EXPECT_NE(attention_state_tag(AttentionStatePath::kCudnn),
            attention_state_tag(AttentionStatePath::kPlain));
  EXPECT_NE(attention_state_tag(AttentionStatePath::kPlain),
            attention_state_tag(AttentionStatePath::kPlainRecompute));
}

// The one line a shape that falls back from cuDNN logs: the shape, cuDNN's reason, that
// plain runs it, and whether cudnn was forced.
TEST(CudaAttentionChoice, FallbackLineNamesTheShapeAndTheReason) {
  const AttentionShape t1{1, 1, 12, 12, 64, DType::kBF16};
  const Status why = cudnn_runtime_support(t1, 91900);
  ASSERT_FALSE(why.is_ok());
  const std::string line = attention_fallback_message(AttentionChoice::kAuto, t1, why);
  EXPECT_NE(line.find("B=1 T=1 NH=12 NKV=12 HD=64"), std::string::npos) << line;
  EXPECT_NE(line.find("T=1 is not supported"), std::string::npos) << line;
  EXPECT_NE(line.find("the plain path runs this shape"), std::string::npos) << line;
  EXPECT_EQ(line.find("TRIDENT_ATTENTION"), std::string::npos) << line;
  const std::string forced = attention_fallback_message(AttentionChoice::kCudnn, t1, why);
  EXPECT_NE(forced.find("TRIDENT_ATTENTION=cudnn, but cuDNN cannot serve"), std::string::npos)
      << forced;
}

// The per-shape choice with a fake cuDNN that serves T >= 128 only: bf16 takes cuDNN where
// it plans; a shape it rejects runs plain (keeping P when asked for, recomputing when first
// seen at a call) with one line; a decision is kept, so backward follows forward even if
// cuDNN would now answer otherwise; f32 and forced plain never ask cuDNN.
TEST(CudaAttentionPlanner, ChoosesPerShapeAndKeepsTheChoice) {
  int asked_cudnn = 0;
  bool serve_all = false;
  const AttentionPlanner::PrepareCudnn fake = [&](const AttentionShape& s) {
    ++asked_cudnn;
    return serve_all || s.T >= 128 ? Status::ok() : Status::invalid_config("T too short");
  };
  const AttentionShape train{8, 1024, 12, 12, 64, DType::kBF16};
  const AttentionShape decode{1, 1, 12, 12, 64, DType::kBF16};
  const AttentionShape last{8, 100, 12, 12, 64, DType::kBF16};
  for (AttentionChoice choice : {AttentionChoice::kAuto, AttentionChoice::kCudnn}) {
    AttentionPlanner planner(choice);
    asked_cudnn = 0;
    serve_all = false;
    EXPECT_EQ(planner.decide(train, true, fake), AttentionStatePath::kCudnn);
    EXPECT_EQ(planner.decide(decode, true, fake), AttentionStatePath::kPlain);
    EXPECT_EQ(planner.decide(last, false, fake), AttentionStatePath::kPlainRecompute);
    EXPECT_EQ(planner.fallbacks(), 2u);
    EXPECT_EQ(asked_cudnn, 3);
    // Kept: the same answers without asking again (one line per shape), even though the
    // fake would serve every shape now.
    serve_all = true;
    for (bool asked : {true, false}) {
      EXPECT_EQ(planner.decide(train, asked, fake), AttentionStatePath::kCudnn);
      EXPECT_EQ(planner.decide(decode, asked, fake), AttentionStatePath::kPlain);
      EXPECT_EQ(planner.decide(last, asked, fake), AttentionStatePath::kPlainRecompute);
    }
    EXPECT_EQ(asked_cudnn, 3);
    EXPECT_EQ(planner.fallbacks(), 2u);
    // Another dtype is another shape: f32 runs plain without asking cuDNN.
    AttentionShape f32 = train;
    f32.dtype = DType::kF32;
    EXPECT_EQ(planner.decide(f32, true, fake), AttentionStatePath::kPlain);
    EXPECT_EQ(planner.decide(f32, false, fake), AttentionStatePath::kPlain);
    EXPECT_EQ(asked_cudnn, 3);
  }
  AttentionPlanner plain(AttentionChoice::kPlain);
  asked_cudnn = 0;
  EXPECT_EQ(plain.decide(train, true, fake), AttentionStatePath::kPlain);
  EXPECT_EQ(plain.decide(last, false, fake), AttentionStatePath::kPlain);
  EXPECT_EQ(asked_cudnn, 0);
  EXPECT_EQ(plain.fallbacks(), 0u);
}

// The runtime cuDNN's rules, version by version (cudnn-frontend's for these graphs): T = 1
// is refused whatever the version (and says so first), T % 128 != 0 below 9.16, anything
// below 9.10.2.
TEST(CudnnRuntimeSupport, RulesByVersion) {
  const AttentionShape t1{2, 1, 4, 2, 64, DType::kBF16};
  for (size_t version : {90100u, 91500u, 91900u}) {
    const Status s = cudnn_runtime_support(t1, version);
    ASSERT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("T=1 is not supported"), std::string::npos) << s.message();
  }
  const AttentionShape t7{2, 7, 4, 2, 64, DType::kBF16}, t128{2, 128, 4, 2, 64, DType::kBF16};
  const Status old = cudnn_runtime_support(t7, 91501);
  ASSERT_FALSE(old.is_ok());
  EXPECT_NE(old.message().find("before 9.16 needs T to be a multiple of 128 (T=7)"),
            std::string::npos)
      << old.message();
  EXPECT_NE(old.message().find("cuDNN 9.15.1"), std::string::npos) << old.message();
  EXPECT_TRUE(cudnn_runtime_support(t128, 91501).is_ok());
  EXPECT_TRUE(cudnn_runtime_support(t7, 91600).is_ok());
  EXPECT_FALSE(cudnn_runtime_support(t128, 91001).is_ok());
}

// On this machine (no GPU): runtime.device=cuda is a config error (exit 2) that says no
// device is available and why; auto falls back to the CPU.
TEST(CudaBackend, WithoutADeviceCudaIsAConfigErrorAndAutoIsCpu) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is visible: the no-device path";
  auto ops = make_ops(DeviceKind::kCuda, 1, 1);
  ASSERT_FALSE(ops.is_ok());
  EXPECT_EQ(ops.status().code(), StatusCode::kInvalidConfig);
  EXPECT_EQ(ops.status().exit_code(), 2);
  EXPECT_NE(ops.status().message().find(
                "runtime.device: cuda: no CUDA device is available (cudaGetDeviceCount: "),
            std::string::npos)
      << ops.status().message();
  auto count = cuda_device_count_or_error();
  ASSERT_FALSE(count.is_ok());
  EXPECT_NE(ops.status().message().find(count.status().message()), std::string::npos);

  auto autos = make_ops(DeviceKind::kAuto, 1, 1);
  ASSERT_TRUE(autos.is_ok()) << autos.status().message();
  EXPECT_STREQ((*autos)->name(), "cpu");
  // The CPU backend's line: its name, then the BLAS kernels and threads it runs.
  EXPECT_EQ((*autos)->description().rfind("cpu (OpenBLAS ", 0), 0u) << (*autos)->description();
  EXPECT_NE((*autos)->description().find(" kernels, 1 thread)"), std::string::npos)
      << (*autos)->description();
}

}  // namespace
}  // namespace trident::cuda
