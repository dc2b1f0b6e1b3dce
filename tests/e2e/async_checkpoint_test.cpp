// Asynchronous checkpoints, in process (one rank, the trainer's own SelfCommunicator):
// after save_checkpoint(true) the trainer keeps taking optimizer steps while the
// writer thread is still writing (held back by the chunk hook); wait() then commits a
// checkpoint that verifies and holds the parameters of the step at which save was
// called, not those of the steps taken while it was written.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "checkpoint/reader.h"
#include "config/config.h"
#include "tests/common/trainer_fixture.h"
#include "tests/e2e/cli_util.h"
#include "tests/e2e/fault_util.h"
#include "trainer/trainer.h"

namespace trident {
namespace {

TEST(AsyncCheckpoint, TrainingContinuesWhileTheWriterWritesAndTheSnapshotIsKept) {
  testing::ScratchDir dir;
  ASSERT_TRUE(write_token_file(dir.file("train.bin"), testing::english_bytes(20000), 1).is_ok());
  // ~0.85M parameters: params + two AdamW moments are ~10 MB, more than one 8 MiB chunk.
  auto config = parse_config(
      testing::tiny_model_yaml(Arch::kGpt2, {.n_layers = 4, .d_model = 128}) +
      "parallel: {micro_batch_size: 2}\n"
      "data: {train: " + dir.file("train.bin") + "}\n"
      "training: {global_batch_size: 2, max_steps: 20, lr: 0.003, warmup_steps: 1}\n"
      "checkpoint: {dir: " + dir.file("ckpt") + ", interval: 0}\n"
      "logging: {metrics: ''}\n",
      {});
  ASSERT_TRUE(config.is_ok()) << config.status().message();

  // The writer thread reports each chunk; on the last one it is held until the trainer
  // has completed 3 more steps (or 20 s pass: then train_step must have been waiting for
  // the writer, and the assertions below fail).
  std::atomic<int> chunks{0}, steps_after_save{0};
  std::atomic<int64_t> total_bytes{0};
  std::atomic<bool> hook_returned{false};
  TrainerOptions options = testing::test_trainer_options();
  options.peak_flops = 1e12;
  options.checkpoint_chunk_hook = [&](int64_t written, int64_t total) -> Status {
    ++chunks;
    total_bytes = total;
    if (written < total) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return Status::ok();
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (steps_after_save.load() < 3 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    hook_returned = true;
    return Status::ok();
  };
  const auto created = testing::make_test_trainer(std::move(config).value(), options);
  ASSERT_NE(created, nullptr);
  Trainer& trainer = *created;

  for (int i = 0; i < 3; ++i) ASSERT_TRUE(trainer.train_step().is_ok());
  const int save_step = trainer.step();
  ASSERT_EQ(save_step, 3);
  const auto at_save = trainer.gather_parameters();
  ASSERT_FALSE(at_save.empty());

  ASSERT_TRUE(trainer.save_checkpoint(/*async=*/true).is_ok());
  EXPECT_TRUE(trainer.checkpoint_writer().in_flight());
  int steps_while_writing = 0;
  for (int i = 0; i < 4; ++i) {
    auto m = trainer.train_step();
    ASSERT_TRUE(m.is_ok()) << m.status().message();
    // Completed while the writer thread had not finished its file.
    if (trainer.checkpoint_writer().in_flight() && !hook_returned.load()) ++steps_while_writing;
    ++steps_after_save;
    // Polling at a step boundary never blocks on the writer, and commits only once the
    // file is written.
    bool committed = false;
    ASSERT_TRUE(trainer.checkpoint_writer().poll(&committed).is_ok());
    if (committed) {
      EXPECT_TRUE(hook_returned.load());
    }
  }
  EXPECT_GE(steps_while_writing, 2);
  EXPECT_EQ(trainer.step(), save_step + 4);

  ASSERT_TRUE(trainer.checkpoint_writer().wait().is_ok());
  EXPECT_FALSE(trainer.checkpoint_writer().in_flight());
  ASSERT_TRUE(trainer.checkpoint_writer().last_committed_step().has_value());
  EXPECT_EQ(*trainer.checkpoint_writer().last_committed_step(), save_step);
  const int64_t chunk = trainer.checkpoint_writer().options().chunk_bytes;
  const int64_t payload = total_bytes.load() - kRankFileHeaderBytes;
  EXPECT_GT(payload, chunk) << "the model should span several chunks";
  EXPECT_EQ(chunks.load(), (payload + chunk - 1) / chunk);

  const std::string step_dir = dir.file("ckpt/step_3");
  Status st = verify_checkpoint(step_dir);
  ASSERT_TRUE(st.is_ok()) << st.message();
  auto ckpt = open_checkpoint(step_dir);
  ASSERT_TRUE(ckpt.is_ok());
  // `latest` names the step, its run and the checkpoint itself (checkpoint/lineage.h).
  EXPECT_EQ(testing::read_text(dir.file("ckpt/latest")),
            "step_3\nrun " + ckpt->trainer_state().at("run_id").get<std::string>() + "\nuid " +
                ckpt->trainer_state().at("checkpoint_uid").get<std::string>() + "\n");
  EXPECT_EQ(ckpt->trainer_state().at("step").get<int>(), save_step);

  // The checkpoint holds the parameters of step 3, bitwise; the live ones have moved on.
  std::string err;
  const auto saved = testing::read_params(step_dir, &err);
  ASSERT_EQ(saved.size(), at_save.size()) << err;
  const auto now = trainer.gather_parameters();
  int moved = 0;
  for (const auto& [name, values] : at_save) {
    ASSERT_TRUE(saved.count(name)) << name;
    EXPECT_TRUE(testing::bitwise_equal(saved.at(name), values)) << name;
    moved += !testing::bitwise_equal(now.at(name), values);
  }
  EXPECT_GT(moved, 0) << "training after the save changed no parameter";
}

}  // namespace
}  // namespace trident
