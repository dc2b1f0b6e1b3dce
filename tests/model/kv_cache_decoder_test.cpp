// KvCacheDecoder (model/kv_cache_decoder.h) against the training code path: decoding
// with the cache must give the same tokens, step for step, as recomputing
// Transformer::forward over the whole prefix each step (no cache), and logits within
// 1e-5 relative (max |a - b| / max |b|), for both families, dense and mixture of experts
// (the MoE block's router, experts and dispatch over the new tokens; llama's with a shared
// expert); and choose_token's rules.
// The cache mode itself (Transformer::forward_cached): a prompt prefilled in one call
// equals the same prompt fed token by token, and a prefill at position 0 is the training
// forward bit for bit (one layer code path, the CPU's two attention ops one kernel), with
// two sequences, in f32 and bf16; a full cache, pipeline stages and tensor parallelism are
// refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "model/generate.h"
#include "model/kv_cache_decoder.h"
#include "model/transformer.h"
#include "tests/model/tiny_config.h"

namespace trident {
namespace {

// A family, dense or mixture of experts.
struct Case {
  Arch arch;
  bool moe = false;
};

TransformerConfig tiny(Case k) {
  TransformerConfig c = testing::tiny_model(k.arch);
  // Larger than the training default, so the logits are far from uniform and greedy
  // choices are not decided by rounding.
  c.init_std = 0.2f;
  if (k.moe) {
    c.moe_experts = 4;
    c.moe_top_k = 2;
    c.moe_d_ff = 48;
    c.moe_shared_experts = k.arch == Arch::kLlama ? 1 : 0;
    c.finalize();
  }
  return c;
}

double relative_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / std::max(scale, 1e-30);
}

class KvCacheDecoderTest : public ::testing::TestWithParam<Case> {};

TEST_P(KvCacheDecoderTest, CachedDecodeEqualsFullRecompute) {
  const TransformerConfig c = tiny(GetParam());
  ASSERT_TRUE(c.validate().is_ok()) << c.validate().message();
  auto ops = make_cpu_ops(1);
  Transformer model(c, *ops, 1);
  model.init_weights(7);
  KvCacheDecoder decoder(c, *ops);
  ASSERT_EQ(decoder.max_positions(), c.seq_len);
  for (const ParamInfo& p : model.params()) {
    std::vector<float> host(static_cast<size_t>(p.numel()));
    model.get_param(p, host.data());
    ASSERT_TRUE(decoder.set_param(p.name, host.data(), host.size()).is_ok()) << p.name;
  }
  const std::vector<int32_t> prompt = {'T', 'h', 'e', ' ', 'c'};
  for (const float temperature : {0.0f, 0.9f}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    SamplingOptions sampling;
    sampling.temperature = temperature;
    sampling.top_k = temperature > 0 ? 40 : 0;
    sampling.seed = 3;
    // Runs to the end of the context: the last steps attend over all 32 positions.
    const GenerateResult cached = generate(decoder, prompt, 100, sampling, true);
    ASSERT_TRUE(cached.context_full);
    ASSERT_EQ(cached.tokens.size(), static_cast<size_t>(c.seq_len) - prompt.size() + 1);

    std::vector<int32_t> seq = prompt;
    double worst = 0.0;
    for (size_t i = 0; i < cached.tokens.size(); ++i) {
      const int T = static_cast<int>(seq.size());
      model.forward(seq.data(), nullptr, 1, T);
      const std::vector<float> all = model.logits_to_host();
      const std::vector<float> last(all.end() - c.padded_vocab, all.end());
      const double rel = relative_max_diff(cached.logits[i], last);
      worst = std::max(worst, rel);
      EXPECT_LE(rel, 1e-5) << "step " << i << " (position " << T - 1 << ")";
      const int32_t next = choose_token(last, sampling, i);
      ASSERT_EQ(cached.tokens[i], next) << "step " << i;
      seq.push_back(next);
    }
    std::printf("[%s%s T=%.1f] %zu tokens, worst logits rel diff %.2e\n", arch_name(c.arch),
                c.moe() ? " moe" : "", temperature, cached.tokens.size(), worst);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, KvCacheDecoderTest,
                         ::testing::Values(Case{Arch::kGpt2}, Case{Arch::kLlama},
                                           Case{Arch::kGpt2, true}, Case{Arch::kLlama, true}),
                         [](const auto& info) {
                           return std::string(arch_name(info.param.arch)) +
                                  (info.param.moe ? "_moe" : "");
                         });

// The decoder's logits after the prompt fed in one call and fed token by token: the same
// within float rounding (the matrix products of 1 and of 5 rows round differently).
TEST_P(KvCacheDecoderTest, PrefillEqualsTokenByToken) {
  const TransformerConfig c = tiny(GetParam());
  auto ops = make_cpu_ops(1);
  Transformer model(c, *ops, 1);
  model.init_weights(11);
  KvCacheDecoder decoder(c, *ops);
  for (const ParamInfo& p : model.params()) {
    std::vector<float> host(static_cast<size_t>(p.numel()));
    model.get_param(p, host.data());
    ASSERT_TRUE(decoder.set_param(p.name, host.data(), host.size()).is_ok()) << p.name;
  }
  const std::vector<int32_t> prompt = {'a', ' ', 'c', 'a', 't', ' ', 's', 'a', 't'};
  const std::vector<float> prefilled = decoder.feed(prompt);
  EXPECT_EQ(decoder.position(), static_cast<int>(prompt.size()));
  decoder.reset();
  std::vector<float> stepped;
  for (int32_t t : prompt) stepped = decoder.step(t);
  ASSERT_EQ(prefilled.size(), static_cast<size_t>(c.padded_vocab));
  EXPECT_LE(relative_max_diff(stepped, prefilled), 1e-5);
  // A prefill continuing a cache: 4 tokens, then the other 5 in one call.
  decoder.reset();
  decoder.feed(std::span(prompt).first(4));
  const std::vector<float> continued = decoder.feed(std::span(prompt).subspan(4));
  EXPECT_LE(relative_max_diff(continued, prefilled), 1e-5);
  // And every position's logits, through the model's own cache with all_logits.
  KvCache cache = model.make_kv_cache(1, c.max_seq_len, static_cast<int>(prompt.size()), true);
  model.forward_cached(prompt.data(), 1, static_cast<int>(prompt.size()), cache);
  const std::vector<float> all = model.cached_logits_to_host(cache);
  KvCache one = model.make_kv_cache(1, c.max_seq_len, 1);
  for (size_t t = 0; t < prompt.size(); ++t) {
    model.forward_cached(&prompt[t], 1, 1, one);
    const std::vector<float> row(all.begin() + t * c.padded_vocab,
                                 all.begin() + (t + 1) * c.padded_vocab);
    EXPECT_LE(relative_max_diff(model.cached_logits_to_host(one), row), 1e-5) << "position " << t;
  }
}

// forward_cached over a whole prompt at position 0 runs what forward runs, so its logits
// are forward's bit for bit; then one decode step per sequence equals the last row of
// forward over the longer sequences. Two sequences (the cache's [batch][capacity] rows),
// f32 and bf16 (the cache in the compute dtype).
TEST_P(KvCacheDecoderTest, CachedForwardIsTheTrainingForward) {
  const TransformerConfig c = tiny(GetParam());
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    auto ops = make_cpu_ops(2);
    Transformer model(c, *ops, 2, dtype);
    model.init_weights(5);
    const int B = 2, T = 6;
    std::vector<int32_t> tokens(static_cast<size_t>(B) * (T + 1));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 3) % 256);
    // [B][T] prompts and [B][1] next tokens, out of the [B][T + 1] sequences.
    std::vector<int32_t> prompts, next;
    for (int b = 0; b < B; ++b) {
      const auto seq = tokens.begin() + b * (T + 1);
      prompts.insert(prompts.end(), seq, seq + T);
      next.push_back(seq[T]);
    }
    model.forward(prompts.data(), nullptr, B, T);
    const std::vector<float> want = model.logits_to_host();
    KvCache cache = model.make_kv_cache(B, c.max_seq_len, T, /*all_logits=*/true);
    model.forward_cached(prompts.data(), B, T, cache);
    EXPECT_EQ(model.cached_logits_to_host(cache), want);

    model.forward(tokens.data(), nullptr, B, T + 1);
    const std::vector<float> longer = model.logits_to_host();
    model.forward_cached(next.data(), B, 1, cache);
    EXPECT_EQ(cache.position(), T + 1);
    const std::vector<float> got = model.cached_logits_to_host(cache);
    const size_t Vp = static_cast<size_t>(c.padded_vocab);
    ASSERT_EQ(got.size(), B * Vp);
    for (int b = 0; b < B; ++b) {
      const auto row = longer.begin() + ((b + 1) * (T + 1) - 1) * Vp;
      const std::vector<float> last(row, row + Vp);
      const std::vector<float> mine(got.begin() + b * Vp, got.begin() + (b + 1) * Vp);
      // bf16: the activations are rounded at other points of a 1-row and a 7-row product.
      EXPECT_LE(relative_max_diff(mine, last), dtype == DType::kF32 ? 1e-5 : 2e-2) << "b " << b;
    }
  }
}

TEST(KvCacheDecoder, RefusesAFullCacheAndWhatCacheModeCannotDo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const TransformerConfig c = tiny({Arch::kLlama});
  auto ops = make_cpu_ops(1);
  KvCacheDecoder decoder(c, *ops);
  const std::vector<int32_t> context(static_cast<size_t>(c.max_seq_len), 'x');
  decoder.feed(std::span(context).first(c.max_seq_len - 1));
  decoder.step('y');  // the last position
  EXPECT_EQ(decoder.position(), decoder.max_positions());
  EXPECT_DEATH(decoder.step('z'),
               "KV cache full: 32 positions filled \\+ 1 new tokens exceed its capacity of 32");
  decoder.reset();
  EXPECT_DEATH(decoder.feed(std::vector<int32_t>(33, 'x')), "forward_cached: B=1 T=33");

  ModelPartition stage;  // the first of two pipeline stages
  stage.pp_size = 2;
  stage.layer_end = 1;
  Transformer first(c, *ops, stage, nullptr, nullptr, 1, 0);
  KvCache cache = first.make_kv_cache(1, 8, 8);
  const int32_t token = 'a';
  EXPECT_DEATH(first.forward_cached(&token, 1, 1, cache), "pp > 1 is not supported");
  ModelPartition tp;  // planning-only tensor parallelism (no communicator)
  tp.tp_size = 2;
  Transformer sliced(c, *ops, tp, nullptr, nullptr, 1, 0);
  KvCache sliced_cache = sliced.make_kv_cache(1, 8, 8);
  EXPECT_DEATH(sliced.forward_cached(&token, 1, 1, sliced_cache),
               "cache mode does not support tensor \\(or sequence\\) parallelism, tp 2");
  Transformer model(c, *ops, 1);
  EXPECT_DEATH(model.make_kv_cache(1, c.max_seq_len + 1, 1), "is not in \\[1, 32\\]");
}

// What make_kv_cache allocates is what describe_kv_cache describes (to the arena's 64-byte
// alignment of each buffer), so a memory plan can count a cache from the description; and
// its buffers are the training forward's: LayerNorm's mean rows for gpt2, none for
// llama's RMSNorm; scratch only for a mixture of experts (its forward's three buffers).
TEST(KvCacheDecoder, CacheBytesAreTheDescriptions) {
  for (const Case k : {Case{Arch::kGpt2}, Case{Arch::kLlama}, Case{Arch::kGpt2, true},
                       Case{Arch::kLlama, true}}) {
    const Arch arch = k.arch;
    SCOPED_TRACE(std::string(arch_name(arch)) + (k.moe ? " moe" : ""));
    const TransformerConfig c = tiny(k);
    auto ops = make_cpu_ops(1);
    Transformer model(c, *ops, ModelPartition{}, nullptr, nullptr, 1, 0);
    const uint64_t before = ops->allocation_counts().live_bytes;
    KvCache cache = model.make_kv_cache(2, 20, 7);
    const uint64_t allocated = ops->allocation_counts().live_bytes - before;
    KvCacheShape shape;
    shape.batch = 2;
    shape.capacity = 20;
    shape.max_new = 7;
    const KvCacheDescription d = describe_kv_cache(c, shape);
    EXPECT_EQ(d.keys.elements, 2.0 * 20 * c.n_kv_heads * c.head_dim);
    const double described = d.bytes(c.n_layers);
    const size_t buffers =
        d.forward.globals.size() + 2 + d.forward.layer.size() + d.forward.scratch.size();
    int scratch_buffers = 0;
    for (const BufferDesc& b : d.forward.scratch) scratch_buffers += b.bytes > 0;
    // The MoE layer's three; llama's fused q/k/v rows.
    EXPECT_EQ(scratch_buffers, (k.moe ? 3 : 0) + (arch == Arch::kLlama ? 1 : 0));
    EXPECT_EQ(d.forward.scratch[buffers::kQkv].elements,
              arch == Arch::kLlama ? 2.0 * 7 * (c.n_heads + 2 * c.n_kv_heads) * c.head_dim : 0.0);
    EXPECT_EQ(allocated, cache.bytes());
    EXPECT_GE(static_cast<double>(allocated), described);
    EXPECT_LE(static_cast<double>(allocated), described + 64.0 * (buffers + 2));
    bool means = false;
    for (const BufferDesc& b : d.forward.layer) means |= b.name == "ln1_mean" || b.name == "ln2_mean";
    EXPECT_EQ(means, arch == Arch::kGpt2);
    EXPECT_EQ(d.forward.globals[buffers::kLnfMean].bytes > 0, arch == Arch::kGpt2);
  }
}

TEST(KvCacheDecoder, SetParamNamesTheParameter) {
  const TransformerConfig c = tiny({Arch::kGpt2});
  auto ops = make_cpu_ops(1);
  KvCacheDecoder decoder(c, *ops);
  std::vector<float> v(10);
  Status st = decoder.set_param("lm_head.weight", v.data(), v.size());  // tied: no head
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_NE(st.message().find("'lm_head.weight' is not in the model"), std::string::npos)
      << st.message();
  st = decoder.set_param("wpe", v.data(), v.size());
  EXPECT_NE(st.message().find("'wpe': 10 values for 2048 elements"), std::string::npos)
      << st.message();
}

TEST(ChooseToken, GreedyTopKAndSeeds) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 7.0f, 0.0f};
  SamplingOptions greedy;
  greedy.temperature = 0.0f;
  EXPECT_EQ(choose_token(logits, greedy, 0), 4);
  greedy.vocab_limit = 4;  // id 4 is outside the tokenizer: never chosen
  EXPECT_EQ(choose_token(logits, greedy, 0), 1);  // the lower of two equal maxima

  SamplingOptions topk;
  topk.temperature = 1.0f;
  topk.top_k = 2;
  topk.vocab_limit = 4;  // top 2 of ids 0..3 are ids 1 and 2
  for (uint64_t draw = 0; draw < 200; ++draw) {
    const int32_t t = choose_token(logits, topk, draw);
    EXPECT_TRUE(t == 1 || t == 2) << t;
  }
  // Deterministic for (seed, draw); another seed gives a different sequence.
  SamplingOptions a;
  a.temperature = 1.0f;
  a.seed = 11;
  SamplingOptions b = a;
  b.seed = 12;
  const std::vector<float> flat(64, 0.0f);
  std::vector<int32_t> sa, sa2, sb;
  for (uint64_t d = 0; d < 32; ++d) {
    sa.push_back(choose_token(flat, a, d));
    sa2.push_back(choose_token(flat, a, d));
    sb.push_back(choose_token(flat, b, d));
  }
  EXPECT_EQ(sa, sa2);
  EXPECT_NE(sa, sb);
}

}  // namespace
}  // namespace trident
