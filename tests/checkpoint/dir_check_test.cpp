// check_checkpoint_dir_writable (checkpoint/dir_check.h): creates missing directories,
// leaves no probe file behind, and names the path and the reason when the checkpoint
// root is a file, lies under a file, or is not writable.
#include "checkpoint/dir_check.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/checkpoint/ckpt_test_util.h"

namespace trident {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

TEST(CheckpointDirCheck, CreatesMissingParentsAndLeavesNoProbe) {
  test::TempDir tmp;
  const std::string dir = tmp.path() + "/a/b/ckpt";
  Status st = check_checkpoint_dir_writable(dir);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_TRUE(entries(dir).empty());
  // An existing directory, with a trailing slash, and relative spellings are fine too.
  st = check_checkpoint_dir_writable(dir + "/");
  EXPECT_TRUE(st.is_ok()) << st.message();
  st = check_checkpoint_dir_writable(tmp.path() + "//a//b/ckpt2");
  EXPECT_TRUE(st.is_ok()) << st.message();
  EXPECT_TRUE(fs::is_directory(tmp.path() + "/a/b/ckpt2"));
  EXPECT_TRUE(entries(dir).empty());
}

TEST(CheckpointDirCheck, ExistingFileIsNotADirectory) {
  test::TempDir tmp;
  const std::string file = tmp.path() + "/ckpt";
  std::ofstream(file) << "x";
  Status st = check_checkpoint_dir_writable(file);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_EQ(st.message(), "checkpoint.dir " + file + ": not a directory");
}

TEST(CheckpointDirCheck, PathUnderAFileCannotBeCreated) {
  test::TempDir tmp;
  const std::string file = tmp.path() + "/plain";
  std::ofstream(file) << "x";
  const std::string dir = file + "/sub/ckpt";
  Status st = check_checkpoint_dir_writable(dir);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.exit_code(), 2);
  EXPECT_EQ(st.message(), "checkpoint.dir " + dir + ": cannot create: " + file +
                              " is not a directory");
}

// The check's message as an unprivileged user: as root (which writes into a mode 0555
// directory anyway) the check runs in a child that drops to uid/gid 65534 ("nobody");
// "" = ok. Sets *dropped when that was possible.
std::string check_unprivileged(const std::string& dir, bool* dropped) {
  *dropped = true;
  if (::geteuid() != 0) {
    Status st = check_checkpoint_dir_writable(dir);
    return st.is_ok() ? "" : st.message();
  }
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    Status st = check_checkpoint_dir_writable(dir);
    const std::string m = st.is_ok() ? "" : st.message();
    ssize_t ignored = ::write(fds[1], m.data(), m.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  *dropped = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return out;
}

TEST(CheckpointDirCheck, ReadOnlyDirectoryIsNotWritable) {
  test::TempDir tmp;
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0755), 0);  // "nobody" may look inside
  const std::string ro = tmp.path() + "/ro";
  ASSERT_EQ(::mkdir(ro.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);  // whatever the umask
  bool dropped = false;
  std::string message = check_unprivileged(ro, &dropped);
  if (!dropped) GTEST_SKIP() << "running as root and cannot switch to uid 65534 to test it";
  EXPECT_EQ(message.rfind("checkpoint.dir " + ro + ": not writable: cannot create " + ro +
                              "/.trident-probe-",
                          0),
            0u)
      << message;
  EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
  // A missing directory under it cannot be created.
  message = check_unprivileged(ro + "/sub", &dropped);
  EXPECT_EQ(message, "checkpoint.dir " + ro + "/sub: cannot create " + ro +
                         "/sub: Permission denied");
  ::chmod(ro.c_str(), 0755);
}

}  // namespace
}  // namespace trident
