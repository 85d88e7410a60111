// Tests of directories of checkpoint files (src/durable/checkpoint_dir.h):
// atomic writes, retention, loading with fallback, refusals, I/O errors.

#include "durable/checkpoint_dir.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "durable/log_reader.h"
#include "testing/status_matchers.h"
#include "tests/durable/durable_test_util.h"

namespace meridian::durable_test {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointDirTest, WriteThenLoadLatest) {
  const std::string dir = Dir("write") + "/sub/ckpt";  // created
  const Checkpoint c = MakeCheckpoint(12, 1000);
  ASSERT_OK(WriteCheckpoint(dir, c));
  EXPECT_EQ(Names(dir), std::vector<std::string>{"ckpt-000000000000000c"});
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  ASSERT_TRUE(loaded->checkpoint.has_value());
  ExpectSameCheckpoint(c, *loaded->checkpoint);
  EXPECT_EQ(loaded->path, dir + "/ckpt-000000000000000c");
  EXPECT_TRUE(loaded->refused.empty());
  // The file is exactly the encoding.
  EXPECT_EQ(ReadBytes(loaded->path), Encode(c));
}

TEST(CheckpointDirTest, MissingOrEmptyDirectoryIsNoCheckpoint) {
  const std::string dir = Dir("empty");
  for (const std::string& d : {dir + "/missing", dir}) {
    Result<LoadedCheckpoint> loaded = LoadLatest(d, Fp());
    ASSERT_OK(loaded);
    EXPECT_FALSE(loaded->checkpoint.has_value());
    EXPECT_TRUE(loaded->refused.empty());
  }
  // Temporary files and unrelated names do not count.
  WriteBytes(dir + "/ckpt-0000000000000001.tmp", Bytes("half"));
  WriteBytes(dir + "/ckpt-1", Bytes("not ours"));
  WriteBytes(dir + "/notes.txt", Bytes("hello"));
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_FALSE(loaded->checkpoint.has_value());
  // A path that is a file is an error, not "no checkpoint".
  EXPECT_FALSE(LoadLatest(dir + "/notes.txt", Fp()).ok());
}

TEST(CheckpointDirTest, KeepsTheNewestTwo) {
  const std::string dir = Dir("keep");
  for (uint64_t s = 1; s <= 5; ++s) {
    ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(s)));
  }
  EXPECT_EQ(*ListCheckpoints(dir), (std::vector<uint64_t>{4, 5}));
  // A lower sequence (a caller that resumed from an older checkpoint)
  // becomes the latest: newer files would otherwise shadow it.
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(3)));
  EXPECT_EQ(*ListCheckpoints(dir), (std::vector<uint64_t>{3}));
  EXPECT_EQ(LoadLatest(dir, Fp())->checkpoint->sequence, 3u);
  // Rewriting the same sequence replaces it.
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(4)));
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(4, 3)));
  EXPECT_EQ(*ListCheckpoints(dir), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(LoadLatest(dir, Fp())->checkpoint->arrays[0].values.size(), 3u);
}

TEST(CheckpointDirTest, FallsBackToTheOlderWhenTheNewestIsCorrupt) {
  const std::string dir = Dir("fallback");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(7)));
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(8)));
  const std::string newest = dir + "/ckpt-0000000000000008";
  std::vector<std::byte> bytes = ReadBytes(newest);
  bytes[bytes.size() / 2] ^= std::byte{0x10};
  WriteBytes(newest, bytes);
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, 7u);
  ASSERT_EQ(loaded->refused.size(), 1u);
  EXPECT_CONTAINS(loaded->refused[0], newest);
  EXPECT_CONTAINS(loaded->refused[0], "checksum mismatch");
  // Truncated (e.g. by a file system after a crash): the same.
  const std::vector<std::byte> older =
      ReadBytes(dir + "/ckpt-0000000000000007");
  WriteBytes(newest, std::span(older).first(100));
  loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, 7u);
  EXPECT_CONTAINS(loaded->refused[0], "truncated");
  // The caller continues at 8, replacing the refused file.
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(8)));
  loaded = LoadLatest(dir, Fp());
  EXPECT_EQ(loaded->checkpoint->sequence, 8u);
  EXPECT_TRUE(loaded->refused.empty());
}

TEST(CheckpointDirTest, AFileUnderTheWrongNameIsRefused) {
  const std::string dir = Dir("misnamed");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(1)));
  fs::copy_file(dir + "/ckpt-0000000000000001", dir + "/ckpt-0000000000000009");
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, 1u);
  ASSERT_EQ(loaded->refused.size(), 1u);
  EXPECT_CONTAINS(loaded->refused[0], "holds sequence 1, its name says 9");
}

TEST(CheckpointDirTest, OnlyCorruptCheckpointsIsAnError) {
  const std::string dir = Dir("corrupt");
  WriteBytes(dir + "/ckpt-0000000000000002", Bytes("garbage"));
  WriteBytes(dir + "/ckpt-0000000000000001", {});
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss);
  EXPECT_CONTAINS(loaded.status().message(), "no usable checkpoint");
  EXPECT_CONTAINS(loaded.status().message(), dir + "/ckpt-0000000000000002");
  EXPECT_CONTAINS(loaded.status().message(), dir + "/ckpt-0000000000000001");
}

TEST(CheckpointDirTest, ForeignCheckpointsAreRefusedNamingBothJobs) {
  const std::string dir = Dir("foreign");
  const std::string other = CheckpointFingerprint("cifar", "eu", 7, "3f2a9c");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(12, 10, other)));
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(
      loaded.status().message(),
      "checkpoint '" + dir +
          "/ckpt-000000000000000c' belongs to job 'cifar' site 'eu' "
          "seed 7 layout 3f2a9c, not to job 'mnist' site 'us' seed 7 "
          "layout 3f2a9c");
  Result<Checkpoint> read =
      ReadCheckpointFile(dir + "/ckpt-000000000000000c", Fp());
  EXPECT_EQ(read.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_OK(ReadCheckpointFile(dir + "/ckpt-000000000000000c", other));
}

TEST(CheckpointDirTest, AHugeForeignFileIsRefusedWithoutReadingIt) {
  // 64 GiB of sparse zeros: refused from its first bytes; allocating its
  // size would fail or kill the process.
  const std::string dir = Dir("huge");
  const std::string path = dir + "/ckpt-0000000000000001";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, off_t{64} << 30), 0);
  ::close(fd);
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_FALSE(loaded.ok());
  EXPECT_CONTAINS(loaded.status().message(), "not a Meridian checkpoint");
  // The same for a log segment.
  const std::string segment = dir + "/log-0000000000000001";
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  ASSERT_EQ(::rename(path.c_str(), segment.c_str()), 0);
  ASSERT_EQ(::truncate(segment.c_str(), off_t{64} << 30), 0);
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(),
                  "not a Meridian log segment");
}

TEST(CheckpointDirTest, AStaleTemporaryFileIsIgnoredThenCleaned) {
  const std::string dir = Dir("stale");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(2)));
  // A crash mid-write of checkpoint 3 left half a file.
  const std::vector<std::byte> half = Encode(MakeCheckpoint(3, 100));
  WriteBytes(dir + "/ckpt-0000000000000003.tmp",
             std::span(half).first(half.size() / 2));
  WriteBytes(dir + "/ckpt-0000000000000009.tmp", Bytes("older crash"));
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, 2u);
  EXPECT_TRUE(loaded->refused.empty());
  EXPECT_EQ(Names(dir).size(), 3u);  // loading deletes nothing
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(3)));
  EXPECT_EQ(Names(dir), (std::vector<std::string>{"ckpt-0000000000000002",
                                                  "ckpt-0000000000000003"}));
  // PruneCheckpoints cleans them too.
  WriteBytes(dir + "/ckpt-0000000000000004.tmp", Bytes("x"));
  ASSERT_OK(PruneCheckpoints(dir, 3));
  EXPECT_EQ(Names(dir), std::vector<std::string>{"ckpt-0000000000000003"});
  EXPECT_OK(PruneCheckpoints(dir + "/missing", 3));
}

TEST(CheckpointDirTest, WriteErrorsNameThePathAndLeaveTheOldState) {
  const std::string dir = Dir("errors");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(1)));

  // The directory cannot be created: its parent is a file.
  WriteBytes(dir + "/file", Bytes("x"));
  Status status = WriteCheckpoint(dir + "/file/sub", MakeCheckpoint(2));
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "'" + dir + "/file/sub'");

  // The final name is taken by a directory: the rename fails.
  fs::create_directories(dir + "/ckpt-0000000000000002/x");
  status = WriteCheckpoint(dir, MakeCheckpoint(2));
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "cannot rename '" + dir +
                                        "/ckpt-0000000000000002.tmp' to '" +
                                        dir + "/ckpt-0000000000000002'");
  fs::remove_all(dir + "/ckpt-0000000000000002");

  // The disk is "full" mid-write (file size limit: EFBIG).
  {
    FileSizeLimit limit(16 * 1024);
    status = WriteCheckpoint(dir, MakeCheckpoint(3, 100000));
  }
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(),
                  "cannot write '" + dir + "/ckpt-0000000000000003.tmp'");
  EXPECT_CONTAINS(status.message(), "File too large");
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);

  // Nothing of the failed writes is left; the old checkpoint loads.
  EXPECT_EQ(Names(dir),
            (std::vector<std::string>{"ckpt-0000000000000001", "file"}));
  EXPECT_EQ(LoadLatest(dir, Fp())->checkpoint->sequence, 1u);
}

// Runs `body` where file permissions apply: in this process, or, when it
// runs as root (whose CAP_DAC_OVERRIDE ignores them), in a child process
// that became `nobody`. Returns what `body` returned, or "SKIP: why".
std::string RunUnprivileged(const std::function<std::string()>& body) {
  if (::geteuid() != 0) return body();
  int fds[2];
  if (::pipe(fds) != 0) return "SKIP: pipe failed";
  const pid_t pid = ::fork();
  if (pid < 0) return "SKIP: fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 ||
        ::setuid(65534) != 0) {
      out = "SKIP: cannot become nobody";
    } else {
      out = body();
    }
    const ssize_t n = ::write(fds[1], out.data(), out.size());
    ::_exit(n == static_cast<ssize_t>(out.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buffer, sizeof(buffer))) > 0) {
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return "child failed: " + out;
  }
  return out;
}

TEST(CheckpointDirTest, AnUnwritableDirectoryIsAnError) {
  const std::string dir = Dir("readonly");
  ASSERT_OK(WriteCheckpoint(dir, MakeCheckpoint(1)));
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  const std::string written = RunUnprivileged(
      [&] { return WriteCheckpoint(dir, MakeCheckpoint(2)).ToString(); });
  if (written.starts_with("SKIP: ")) GTEST_SKIP() << written;
  EXPECT_EQ(written, "FAILED_PRECONDITION: cannot create '" + dir +
                         "/ckpt-0000000000000002.tmp': Permission denied");
  // A directory that cannot be listed is an error, not "no checkpoint".
  ASSERT_EQ(::chmod(dir.c_str(), 0300), 0);
  const std::string loaded = RunUnprivileged(
      [&] { return LoadLatest(dir, Fp()).status().ToString(); });
  EXPECT_EQ(loaded, "FAILED_PRECONDITION: cannot list directory '" + dir +
                        "': Permission denied");
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(*ListCheckpoints(dir), std::vector<uint64_t>{1});
}

}  // namespace
}  // namespace meridian::durable_test
