// Tests of the resume compatibility checks (trainer/resume_compat.h): every class of key
// (refuse / warn / grouped warn / ignore), the exact messages, the data fingerprint
// (content hash of the first and last MiB plus the size; sizes; spec), and tolerant
// reading of old or partial fingerprints and of stored configs that do not parse.
#include "trainer/resume_compat.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/token_file.h"
#include "tests/common/scratch_dir.h"

namespace trident {
namespace {

const std::string kBase =
    "model: {arch: gpt2, vocab_size: 256, seq_len: 16, n_layers: 2, n_heads: 4, d_model: 32}\n"
    "parallel: {micro_batch_size: 1}\n"
    "data: {train: /data/train.bin}\n"
    "training: {global_batch_size: 8, lr: 0.003, max_steps: 20, lr_schedule: constant}\n";
const std::string kLlama =
    "model: {arch: llama, vocab_size: 256, seq_len: 16, n_layers: 2, n_heads: 4, d_model: 32}\n"
    "parallel: {micro_batch_size: 1}\n"
    "data: {train: /data/train.bin}\n";
constexpr int64_t kStep = 10;

Config config(const std::vector<std::string>& overrides, const std::string& yaml = kBase) {
  Result<Config> r = parse_config(yaml, overrides, "test.yaml");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : Config{};
}

// The checkpoint trained with `yaml`; this run adds `now_overrides`. Data: what the
// configs say (no files).
ResumeCompat compare(const std::vector<std::string>& now_overrides,
                     const std::string& yaml = kBase) {
  const Config saved = config({}, yaml), now = config(now_overrides, yaml);
  return compare_for_resume(saved, now, kStep, std::nullopt, fingerprint_from_config(now.data));
}

std::string all(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(ResumeCompat, IdenticalConfigsSayNothing) {
  const ResumeCompat c = compare({});
  EXPECT_TRUE(c.errors.empty()) << all(c.errors);
  EXPECT_TRUE(c.warnings.empty()) << all(c.warnings);
  EXPECT_TRUE(c.notes.empty()) << all(c.notes);
}

TEST(ResumeCompat, EveryConfigKeyHasARule) {
  const std::vector<std::string> rules = resume_compat_rule_keys();
  const std::set<std::string> known(rules.begin(), rules.end());
  for (const auto& [key, value] : config_values(Config{})) {
    EXPECT_TRUE(known.count(key)) << key << " has no line in trainer/resume_compat.cpp's table";
  }
}

// ---- refuse ------------------------------------------------------------------------

struct Refusal {
  std::vector<std::string> overrides;
  std::string yaml;
  std::string message;  // the expected error, up to the explanation
};

TEST(ResumeCompat, ArchitectureChangesAreRefusedNamingKeyAndBothValues) {
  const std::string kWhy =
      " (a different model; start a new checkpoint.dir, or use model.init_from to start from "
      "its weights)";
  const std::vector<Refusal> cases = {
      {{"model.arch=llama"},
       kBase,
       "model.arch: the checkpoint was trained with gpt2, the config says llama"},
      {{"model.vocab_size=200"},
       kBase,
       "model.vocab_size: the checkpoint was trained with 256, the config says 200"},
      {{"model.n_layers=3"},
       kBase,
       "model.n_layers: the checkpoint was trained with 2, the config says 3"},
      {{"model.n_heads=8"},
       kBase,
       "model.n_heads: the checkpoint was trained with 4, the config says 8"},
      {{"model.n_kv_heads=2"},
       kLlama,
       "model.n_kv_heads: the checkpoint was trained with 4, the config says 2"},
      {{"model.d_model=64"},
       kBase,
       "model.d_model: the checkpoint was trained with 32, the config says 64"},
      {{"model.d_ff=64"},
       kBase,
       "model.d_ff: the checkpoint was trained with 128, the config says 64"},
      {{"model.tie_embeddings=true"},
       kLlama,
       "model.tie_embeddings: the checkpoint was trained with false, the config says true"},
  };
  for (const Refusal& r : cases) {
    const ResumeCompat c = compare(r.overrides, r.yaml);
    EXPECT_TRUE(contains(all(c.errors), r.message + kWhy + "\n")) << r.overrides[0] << ":\n"
                                                                  << all(c.errors);
    const Status st = resume_compat_status(c, "/ck/step_10");
    EXPECT_EQ(st.code(), StatusCode::kInvalidConfig) << r.overrides[0];
    EXPECT_EQ(st.exit_code(), 2);
    EXPECT_TRUE(contains(st.message(), "cannot resume from /ck/step_10: " + r.message))
        << st.message();
  }
}

TEST(ResumeCompat, EffectiveValuesAreCompared) {
  // d_ff 0 means 4 * d_model for gpt2: writing the default out is no change.
  EXPECT_TRUE(compare({"model.d_ff=128"}).errors.empty());
  EXPECT_TRUE(compare({"model.n_kv_heads=4"}).errors.empty());
  EXPECT_TRUE(compare({"model.tie_embeddings=true"}).errors.empty());
  // n_heads also moves the effective n_kv_heads (0 = n_heads): both are named.
  const ResumeCompat c = compare({"model.n_heads=8"});
  ASSERT_EQ(c.errors.size(), 2u) << all(c.errors);
  EXPECT_TRUE(contains(c.errors[1],
                       "model.n_kv_heads: the checkpoint was trained with 4, the config says 8"));
}

TEST(ResumeCompat, AllErrorsAreJoinedIntoOneStatus) {
  const ResumeCompat c = compare({"model.vocab_size=200", "model.n_layers=3"});
  const Status st = resume_compat_status(c, "DIR");
  EXPECT_TRUE(contains(st.message(), "model.vocab_size: the checkpoint was trained with 256"));
  EXPECT_TRUE(contains(st.message(), "; model.n_layers: the checkpoint was trained with 2"));
  EXPECT_TRUE(resume_compat_status(compare({"training.lr=0.001"}), "DIR").is_ok());
}

// ---- warn --------------------------------------------------------------------------

struct Warning {
  std::string override_text;
  std::vector<std::string> needles;  // all in one warning
};

void expect_one_warning(const Warning& w, const std::string& yaml = kBase) {
  const ResumeCompat c = compare({w.override_text}, yaml);
  EXPECT_TRUE(c.errors.empty()) << w.override_text << ": " << all(c.errors);
  ASSERT_EQ(c.warnings.size(), 1u) << w.override_text << ":\n" << all(c.warnings);
  for (const auto& needle : w.needles) {
    EXPECT_TRUE(contains(c.warnings[0], needle))
        << w.override_text << ": " << c.warnings[0] << "\nmissing: " << needle;
  }
}

TEST(ResumeCompat, ModelKeysThatMayChangeWarnWithTheirConsequence) {
  expect_one_warning({"model.seq_len=32",
                      {"model.seq_len: the checkpoint was trained with 16, the config says 32",
                       "samples are now 32+1 tokens", "gpt2's position table (wpe)",
                       "fails to load on wpe's shape"}});
  expect_one_warning(
      {"model.norm_eps=0.000001",
       {"model.norm_eps: the checkpoint was trained with 0.00001, the config says 0.000001",
        "from step 11 on"}});
  expect_one_warning(
      {"model.rope_theta=500000",
       {"model.rope_theta: the checkpoint was trained with 10000, the config says 500000",
        "context extension"}},
      kLlama);
  expect_one_warning({"model.init_std=0.01",
                      {"model.init_std: the checkpoint was trained with 0.02, the config says 0.01",
                       "no effect after resume"}});
  expect_one_warning({"model.init_from=gpt2_124M.bin",
                      {"model.init_from: the checkpoint was trained with \"\", the config says "
                       "\"gpt2_124M.bin\"",
                       "no effect after resume"}});
  expect_one_warning({"training.seed=7",
                      {"training.seed: the checkpoint was trained with 42, the config says 7",
                       "no effect after resume"}});
}

TEST(ResumeCompat, TrainingKeysWarnWithTheirConsequence) {
  expect_one_warning(
      {"training.global_batch_size=16",
       {"training.global_batch_size: the checkpoint was trained with 8, the config says 16",
        "consumed samples carry over", "each step now takes 16 sequences"}});
  for (const char* key : {"training.weight_decay=0.2", "training.beta1=0.8", "training.beta2=0.99",
                          "training.eps=0.000001"}) {
    const std::string k(key);
    expect_one_warning({k,
                        {k.substr(0, k.find('=')) + ": the checkpoint was trained with",
                         "AdamW moments carry over", "from step 11 on use the new value"}});
  }
  expect_one_warning({"training.grad_clip=0.5",
                      {"training.grad_clip: the checkpoint was trained with 1, the config says 0.5",
                       "clipped to the new value from step 11"}});
}

TEST(ResumeCompat, LrScheduleChangesAreOneWarningWithTheNewCurve) {
  expect_one_warning({"training.lr=0.001",
                      {"training.lr: the checkpoint was trained with 0.003, the config says 0.001",
                       "the LR schedule is a function of training.max_steps",
                       "from step 10 the curve follows the new one",
                       "(the LR of step 11: 0.003 before, 0.001 now)"}});
  expect_one_warning(
      {"training.max_steps=40",
       {"training.max_steps: the checkpoint was trained with 20, the config says 40"}});
  const ResumeCompat c =
      compare({"training.lr=0.001", "training.lr_schedule=cosine", "training.warmup_steps=2"});
  ASSERT_EQ(c.warnings.size(), 1u) << all(c.warnings);
  EXPECT_TRUE(contains(c.warnings[0],
                       "training.lr, training.warmup_steps, training.lr_schedule: the checkpoint "
                       "was trained with lr=0.003 warmup_steps=0 lr_schedule=constant, the config "
                       "says lr=0.001 warmup_steps=2 lr_schedule=cosine"))
      << c.warnings[0];
}

TEST(ResumeCompat, LayoutChangesAreOneResharding) {
  expect_one_warning({"parallel.dp=2",
                      {"parallel.dp: resharded from dp=1 tp=1 pp=1 to dp=2 tp=1 pp=1; results "
                       "equal within fp32 rounding"}});
  const ResumeCompat c =
      compare({"parallel.tp=2", "parallel.pp=2", "parallel.zero_stage=3",
               "parallel.pipeline_schedule=gpipe", "parallel.stage_layers=[1, 1]"});
  ASSERT_EQ(c.warnings.size(), 1u) << all(c.warnings);
  EXPECT_TRUE(contains(c.warnings[0],
                       "parallel.tp, parallel.pp, parallel.zero_stage, parallel.pipeline_schedule, "
                       "parallel.stage_layers: resharded from dp=1 tp=1 pp=1 zero_stage=0 "
                       "pipeline_schedule=1f1b stage_layers=[] to dp=1 tp=2 pp=2 zero_stage=3 "
                       "pipeline_schedule=gpipe stage_layers=[1, 1]"))
      << c.warnings[0];
  expect_one_warning(
      {"parallel.micro_batch_size=2", {"micro_batch_size=1 to dp=1 tp=1 pp=1 micro_batch_size=2"}});
}

TEST(ResumeCompat, KeysWithoutEffectAreOneNote) {
  const ResumeCompat c =
      compare({"checkpoint.dir=/elsewhere", "checkpoint.interval=5", "checkpoint.keep_last=1",
               "checkpoint.async=false", "logging.metrics=m.jsonl", "logging.log_interval=7",
               "training.eval_interval=3", "training.eval_batches=2", "data.val=/data/val.bin",
               "parallel.bucket_mb=5", "parallel.comm_timeout_s=60"});
  EXPECT_TRUE(c.errors.empty()) << all(c.errors);
  EXPECT_TRUE(c.warnings.empty()) << all(c.warnings);
  ASSERT_EQ(c.notes.size(), 1u) << all(c.notes);
  EXPECT_TRUE(contains(c.notes[0], "changed without effect on training: parallel.bucket_mb"))
      << c.notes[0];
  EXPECT_TRUE(contains(c.notes[0], "checkpoint.interval 0 -> 5"));
  EXPECT_TRUE(contains(c.notes[0], "parallel.bucket_mb 25 -> 5"));
}

// ---- data keys from the configs ------------------------------------------------------

TEST(ResumeCompat, DataSeedAndShuffleChangeTheSampleOrder) {
  expect_one_warning({"data.seed=7",
                      {"data.seed: the checkpoint was trained with 1234, the config says 7",
                       "the global sample order changes, so the samples after the resume point "
                       "(step 10) are not the ones the old order would have given",
                       "some samples may repeat and some may be skipped"}});
  expect_one_warning({"data.shuffle=false",
                      {"data.shuffle: the checkpoint was trained with true, the config says false",
                       "the global sample order changes"}});
  expect_one_warning(
      {"data.train=/data/other.bin",
       {"data.train: the checkpoint was trained with \"/data/train.bin\", the config "
        "says \"/data/other.bin\"",
        "a different dataset: the samples from step 11 on come from the new one"}});
  // Without shuffling the seed orders nothing.
  const Config saved = config({"data.shuffle=false"}),
               now = config({"data.shuffle=false", "data.seed=7"});
  const ResumeCompat c =
      compare_for_resume(saved, now, kStep, std::nullopt, fingerprint_from_config(now.data));
  EXPECT_TRUE(c.warnings.empty()) << all(c.warnings);
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_TRUE(contains(c.notes[0], "data.seed 1234 -> 7 (no effect: data.shuffle is off)"));
}

// ---- the fingerprint ---------------------------------------------------------------

// Two llm.c shards: a.bin of 1.5 M uint16 tokens (3 MiB: a first MiB, a middle and a last
// MiB) and b.bin of 1000 tokens.
class Fingerprint : public ::testing::Test {
 protected:
  void SetUp() override {
    write("a.bin", 1500000, 0);
    write("b.bin", 1000, 7);
  }
  void write(const std::string& name, size_t n, uint32_t salt) {
    std::vector<uint32_t> tokens(n);
    for (size_t i = 0; i < n; ++i) tokens[i] = static_cast<uint32_t>((i * 31 + salt) % 50000);
    ASSERT_TRUE(write_token_file(dir_.file(name), tokens, 1).is_ok());
  }
  // Flips one byte of `name` at `offset` (in place: the size stays).
  void flip(const std::string& name, uint64_t offset) {
    std::fstream f(dir_.file(name), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(offset));
    f.put(static_cast<char>(c ^ 0x01));
  }
  DataFingerprint fingerprint(const std::string& spec) {
    DataConfig data;
    data.train = spec;
    auto ds = TokenDataset::open(spec, 65536);
    EXPECT_TRUE(ds.is_ok()) << ds.status().message();
    if (!ds.is_ok()) return {};
    auto fp = fingerprint_dataset(ds.value(), data);
    EXPECT_TRUE(fp.is_ok()) << fp.status().message();
    return fp.is_ok() ? fp.value() : DataFingerprint{};
  }
  // Warnings when a checkpoint trained on `was` resumes on `now` (same config otherwise).
  std::vector<std::string> warnings(const DataFingerprint& was, const DataFingerprint& now) {
    Config saved = config({"data.train=" + was.spec}), current = config({"data.train=" + now.spec});
    const ResumeCompat c = compare_for_resume(saved, current, kStep, was, now);
    EXPECT_TRUE(c.errors.empty()) << all(c.errors);
    return c.warnings;
  }
  std::string dir() const { return dir_.path(); }

  testing::ScratchDir dir_;
};

TEST_F(Fingerprint, RecordsFilesSizesTokensAndSettings) {
  const DataFingerprint fp = fingerprint(dir());
  EXPECT_EQ(fp.spec, dir());
  ASSERT_TRUE(fp.files.has_value());
  ASSERT_EQ(fp.files->size(), 2u);
  EXPECT_EQ((*fp.files)[0].path, dir() + "/a.bin");
  EXPECT_EQ((*fp.files)[0].bytes, std::optional<uint64_t>(1024 + 2 * 1500000));
  EXPECT_EQ((*fp.files)[0].tokens, std::optional<uint64_t>(1500000));
  EXPECT_EQ((*fp.files)[1].bytes, std::optional<uint64_t>(1024 + 2 * 1000));
  EXPECT_EQ((*fp.files)[1].content_hash.size(), 16u);
  EXPECT_NE((*fp.files)[0].content_hash, (*fp.files)[1].content_hash);
  EXPECT_EQ(fp.total_tokens, std::optional<uint64_t>(1501000));
  EXPECT_EQ(fp.seed, std::optional<uint64_t>(1234));
  EXPECT_EQ(fp.shuffle, std::optional<bool>(true));
  EXPECT_TRUE(warnings(fp, fingerprint(dir())).empty());
}

TEST_F(Fingerprint, OneByteInTheFirstOrLastMiBChangesTheHash) {
  const DataFingerprint before = fingerprint(dir());
  flip("a.bin", 1024 + 1000);
  const DataFingerprint after = fingerprint(dir());
  EXPECT_NE((*before.files)[0].content_hash, (*after.files)[0].content_hash);
  EXPECT_EQ((*before.files)[1].content_hash, (*after.files)[1].content_hash);
  const std::vector<std::string> w = warnings(before, after);
  ASSERT_EQ(w.size(), 1u) << all(w);
  EXPECT_TRUE(
      contains(w[0], "data file " + dir() + "/a.bin changed since the checkpoint (content hash " +
                         (*before.files)[0].content_hash + " -> " + (*after.files)[0].content_hash +
                         "): the samples read from it differ from the old run's"))
      << w[0];

  flip("a.bin", 1024 + 2 * 1500000 - 1);  // the last byte
  EXPECT_NE((*fingerprint(dir()).files)[0].content_hash, (*after.files)[0].content_hash);
}

TEST_F(Fingerprint, AChangeInTheMiddleOfALargeFileIsNotSeen) {
  // The documented limit of a cheap fingerprint: bytes 1 MiB .. size - 1 MiB are not read.
  const DataFingerprint before = fingerprint(dir());
  flip("a.bin", 1500000);
  EXPECT_EQ((*before.files)[0].content_hash, (*fingerprint(dir()).files)[0].content_hash);
}

TEST_F(Fingerprint, SizeChangesAreNamed) {
  const DataFingerprint before = fingerprint(dir());
  write("b.bin", 1200, 7);
  const DataFingerprint after = fingerprint(dir());
  const std::string w = all(warnings(before, after));
  EXPECT_TRUE(contains(w, "data file " + dir() +
                              "/b.bin changed since the checkpoint (size 3024 -> "
                              "3424 bytes, tokens 1000 -> 1200, content hash "))
      << w;
  EXPECT_TRUE(contains(w,
                       "data: the checkpoint's dataset held 1501000 tokens, the config's holds "
                       "1501200: the number of samples per epoch changes"))
      << w;
}

TEST_F(Fingerprint, SpecChanges) {
  const DataFingerprint whole = fingerprint(dir());
  // The same files named another way: the order is unchanged.
  const std::vector<std::string> same = warnings(whole, fingerprint(dir() + "/*.bin"));
  ASSERT_EQ(same.size(), 1u) << all(same);
  EXPECT_TRUE(contains(same[0], "data.train: the checkpoint was trained with \"" + dir() +
                                    "\", the config says \"" + dir() +
                                    "/*.bin\": the files have "
                                    "the same sizes, token counts and content hashes, so the "
                                    "sample order is unchanged"))
      << same[0];
  // One of the files only: a different dataset, fewer files, fewer tokens.
  const std::string w = all(warnings(whole, fingerprint(dir() + "/b.bin")));
  EXPECT_TRUE(contains(w, "\", the config says \"" + dir() + "/b.bin\": a different dataset")) << w;
  EXPECT_TRUE(contains(w,
                       "data.train: the checkpoint was trained on 2 files, the config reads 1; "
                       "removed: " +
                           dir() + "/a.bin"))
      << w;
  EXPECT_TRUE(contains(w, "held 1501000 tokens, the config's holds 1000")) << w;
}

TEST_F(Fingerprint, JsonRoundTrip) {
  const DataFingerprint fp = fingerprint(dir());
  const nlohmann::json j = fp;
  const DataFingerprint back = nlohmann::json::parse(j.dump()).get<DataFingerprint>();
  EXPECT_EQ(nlohmann::json(back), j);
  EXPECT_EQ(back.spec, fp.spec);
  ASSERT_TRUE(back.files.has_value());
  EXPECT_EQ((*back.files)[0].content_hash, (*fp.files)[0].content_hash);
  EXPECT_EQ(back.total_tokens, fp.total_tokens);
  EXPECT_TRUE(warnings(back, fp).empty());
}

TEST(FingerprintJson, MissingOrMistypedFieldsAreUnknownAndNotCompared) {
  const DataFingerprint empty = nlohmann::json::object().get<DataFingerprint>();
  EXPECT_EQ(empty.spec, kUnknown);
  EXPECT_FALSE(empty.files.has_value());
  EXPECT_FALSE(empty.total_tokens.has_value());
  EXPECT_FALSE(empty.seed.has_value());
  EXPECT_FALSE(empty.shuffle.has_value());

  const auto partial = nlohmann::json::parse(
                           R"({"spec": "/data/train.bin", "seed": "abc", "shuffle": 1,
          "files": [{"path": "/data/train.bin", "bytes": -3}, "junk"]})")
                           .get<DataFingerprint>();
  EXPECT_EQ(partial.spec, "/data/train.bin");
  EXPECT_FALSE(partial.seed.has_value());
  EXPECT_FALSE(partial.shuffle.has_value());
  ASSERT_TRUE(partial.files.has_value());
  ASSERT_EQ(partial.files->size(), 2u);
  EXPECT_FALSE((*partial.files)[0].bytes.has_value());
  EXPECT_EQ((*partial.files)[0].content_hash, kUnknown);
  EXPECT_EQ((*partial.files)[1].path, kUnknown);

  // Compared with a full fingerprint, the unknown fields say nothing; the stored config
  // still supplies data.seed.
  DataFingerprint now = fingerprint_from_config(config({}).data);
  now.files = std::vector<DataFileFingerprint>{{"/data/train.bin", 5000, 1988, "0123456789abcdef"}};
  now.total_tokens = 1988;
  const auto old =
      nlohmann::json::parse(R"({"files": [{"path": "/data/train.bin"}]})").get<DataFingerprint>();
  ResumeCompat c = compare_for_resume(config({}), config({}), kStep, old, now);
  EXPECT_TRUE(c.warnings.empty()) << all(c.warnings);
  c = compare_for_resume(config({"data.seed=5"}), config({}), kStep, old, now);
  ASSERT_EQ(c.warnings.size(), 1u) << all(c.warnings);
  EXPECT_TRUE(contains(c.warnings[0],
                       "data.seed: the checkpoint was trained with 5, the config says 1234"));
}

// ---- from a trainer state ------------------------------------------------------------

TEST(ResumeCompatState, ComparesTheStoredConfigText) {
  const Config saved = config({});
  const Config now = config({"model.n_heads=8"});
  const nlohmann::json state = {{"step", 10}, {"config", config_to_yaml(saved)}};
  const ResumeCompat c = check_resume_compat(state, now, kStep, fingerprint_from_config(now.data));
  EXPECT_TRUE(contains(all(c.errors),
                       "model.n_heads: the checkpoint was trained with 4, the config says 8"))
      << all(c.errors);
  EXPECT_TRUE(c.warnings.empty()) << all(c.warnings);
}

TEST(ResumeCompatState, AStoredConfigThatDoesNotParseIsAWarning) {
  const Config now = config({});
  DataFingerprint saved_data = fingerprint_from_config(now.data);
  saved_data.seed = 99;
  const nlohmann::json state = {{"config", "model: {future_key: 1}\n"},
                                {"data", nlohmann::json(saved_data)}};
  const ResumeCompat c = check_resume_compat(state, now, kStep, fingerprint_from_config(now.data));
  EXPECT_TRUE(c.errors.empty()) << all(c.errors);
  ASSERT_EQ(c.warnings.size(), 2u) << all(c.warnings);
  EXPECT_TRUE(contains(c.warnings[0],
                       "cannot compare the stored config: the stored config:1: "
                       "unknown key model.future_key"))
      << c.warnings[0];
  // The data are still compared.
  EXPECT_TRUE(contains(c.warnings[1],
                       "data.seed: the checkpoint was trained with 99, the config says 1234"))
      << c.warnings[1];

  const ResumeCompat none =
      check_resume_compat(nlohmann::json{{"step", 3}}, now, 3, fingerprint_from_config(now.data));
  ASSERT_EQ(none.warnings.size(), 1u);
  EXPECT_EQ(none.warnings[0],
            "cannot compare the stored config: the checkpoint's trainer state has no \"config\"");
  EXPECT_TRUE(none.errors.empty());
}

}  // namespace
}  // namespace trident
