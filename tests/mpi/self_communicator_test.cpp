// SelfCommunicator (single process, no launcher) and launcher detection. No MPI traffic:
// every rank runs these alone.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "mpi_test_util.h"

namespace trident::test {
namespace {

TEST(SelfCommunicator, CollectivesAreIdentities) {
  SelfCommunicator self;
  EXPECT_EQ(self.rank(), 0);
  EXPECT_EQ(self.size(), 1);
  EXPECT_EQ(self.name(), "world");
  EXPECT_STREQ(self.backend(), "self");

  std::vector<float> f = {1.5f, -2.0f, 3.25f};
  self.all_reduce(CommBuf::host(std::span(f)), ReduceOp::kSum);
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  std::vector<std::int64_t> k = {5, -7};
  self.all_reduce(CommBuf::host(std::span<std::int64_t>(k)), ReduceOp::kMax);
  EXPECT_EQ(k, (std::vector<std::int64_t>{5, -7}));

  std::vector<float> out(3, 0.0f);
  self.reduce_scatter(CommBuf::host(std::span(f)), CommBuf::host(std::span(out)));
  EXPECT_EQ(out, f);
  std::vector<float> gathered(3, 0.0f);
  self.all_gather(CommBuf::host(std::span(f)), CommBuf::host(std::span(gathered)));
  EXPECT_EQ(gathered, f);

  std::vector<std::byte> bytes = {std::byte{1}, std::byte{2}};
  self.broadcast(CommBuf::host(std::span(bytes)), 0);
  EXPECT_EQ(bytes[1], std::byte{2});
  self.barrier();

  // Counted like any backend: the payload, even with nobody to send it to.
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kAllReduce), 3 * 4 + 2 * 8);
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kReduceScatter), 12);
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kAllGather), 12);
  EXPECT_EQ(self.traffic().bytes_of(CollectiveKind::kBroadcast), 2);
}

TEST(SelfCommunicator, SplitAndProcessGroups) {
  SelfCommunicator self;
  self.set_default_timeout(std::chrono::milliseconds(1234));
  auto child = self.split(3, 0, "tp");
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->name(), "tp");
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->default_timeout().count(), 1234);
  EXPECT_EQ(self.split(kNoGroup, 0, "none"), nullptr);

  auto groups = make_process_groups(self, Layout{1, 1, 1}, /*tied_embeddings=*/true);
  ASSERT_TRUE(groups.is_ok()) << groups.status().message();
  EXPECT_EQ(groups->tp->size(), 1);
  EXPECT_EQ(groups->dp->name(), "dp");
  EXPECT_EQ(groups->pp->name(), "pp");
  EXPECT_EQ(groups->embedding, nullptr);  // pp == 1: no embedding group
  // The world carries host values; the groups, device memory.
  EXPECT_EQ(groups->world->space(), MemSpace::kHost);
  EXPECT_EQ(groups->dp->space(), MemSpace::kDevice);
  EXPECT_EQ(groups->tp->space(), MemSpace::kDevice);
  EXPECT_EQ(groups->pp->space(), MemSpace::kDevice);

  auto mismatch = make_process_groups(self, Layout{2, 1, 1}, false);
  ASSERT_FALSE(mismatch.is_ok());
  EXPECT_EQ(mismatch.status().exit_code(), 2);
  EXPECT_EQ(mismatch.status().message().rfind("parallel: dp*tp*pp = 2 but the world size is 1", 0),
            0u)
      << mismatch.status().message();
}

std::map<std::string, std::string>* g_fake_env = nullptr;
const char* fake_env(const char* key) {
  auto it = g_fake_env->find(key);
  return it == g_fake_env->end() ? nullptr : it->second.c_str();
}

TEST(DetectLauncher, FromEnvironment) {
  std::map<std::string, std::string> env;
  g_fake_env = &env;
  EXPECT_EQ(detect_launcher(fake_env), "");
  env = {{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}};
  EXPECT_EQ(detect_launcher(fake_env), "");  // a 1-task step needs no MPI
  env = {{"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "5"}};
  EXPECT_EQ(detect_launcher(fake_env), "");  // an sbatch script itself, not a step
  env = {{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}};
  EXPECT_EQ(detect_launcher(fake_env), "SLURM_STEP_ID");
  env = {{"PMIX_RANK", "3"}};
  EXPECT_EQ(detect_launcher(fake_env), "PMIX_RANK");
  env = {{"PMI_RANK", "3"}};
  EXPECT_EQ(detect_launcher(fake_env), "PMI_RANK");
  env = {{"OMPI_COMM_WORLD_SIZE", "2"}, {"PMIX_RANK", "1"}};
  EXPECT_EQ(detect_launcher(fake_env), "OMPI_COMM_WORLD_SIZE");
  g_fake_env = nullptr;
  // This binary runs under mpirun.
  EXPECT_FALSE(detect_launcher().empty());
}

}  // namespace
}  // namespace trident::test
