// Tests of the background checkpoint writer
// (src/durable/checkpoint_writer.h).

#include "durable/checkpoint_writer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "durable/checkpoint_dir.h"
#include "testing/status_matchers.h"
#include "tests/durable/durable_test_util.h"

namespace meridian::durable_test {
namespace {

// A write function that records what it writes and can be held.
class FakeDisk {
 public:
  Status Write(const std::string&, const Checkpoint& c) {
    std::unique_lock<std::mutex> lock(mu_);
    started_.push_back(c.sequence);
    cv_.notify_all();
    cv_.wait(lock, [&] { return !hold_; });
    if (fail_.count(c.sequence) > 0) {
      return UnavailableError("disk says no to " + std::to_string(c.sequence));
    }
    written_.push_back(c.sequence);
    return Status::Ok();
  }
  void Hold(bool hold) {
    std::lock_guard<std::mutex> lock(mu_);
    hold_ = hold;
    cv_.notify_all();
  }
  void Fail(uint64_t sequence) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_.insert(sequence);
  }
  void WaitStarted(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return started_.size() >= n; });
  }
  std::vector<uint64_t> written() {
    std::lock_guard<std::mutex> lock(mu_);
    return written_;
  }
  std::vector<uint64_t> started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
  std::set<uint64_t> fail_;
  std::vector<uint64_t> started_;
  std::vector<uint64_t> written_;
};

CheckpointWriterOptions FakeOptions(FakeDisk* disk, uint64_t durable = 0) {
  CheckpointWriterOptions options;
  options.dir = "unused";
  options.durable_sequence = durable;
  options.write = [disk](const std::string& dir, const Checkpoint& c) {
    return disk->Write(dir, c);
  };
  return options;
}

TEST(CheckpointWriterTest, WritesToDiskAndReportsDurableSequence) {
  const std::string dir = Dir("writer");
  CheckpointWriter writer({.dir = dir, .durable_sequence = 4});
  EXPECT_EQ(writer.durable_sequence(), 4u);
  EXPECT_FALSE(writer.Submit(MakeCheckpoint(5, 1000)));
  EXPECT_OK(writer.Flush());
  EXPECT_EQ(writer.durable_sequence(), 5u);
  EXPECT_EQ(writer.stats().written, 1u);
  EXPECT_EQ(LoadLatest(dir, Fp())->checkpoint->sequence, 5u);
  EXPECT_OK(writer.Flush());  // nothing submitted since: returns
}

TEST(CheckpointWriterTest, ANewerSubmissionReplacesAPendingOne) {
  FakeDisk disk;
  disk.Hold(true);
  CheckpointWriter writer(FakeOptions(&disk));
  EXPECT_FALSE(writer.Submit(MakeCheckpoint(1)));
  disk.WaitStarted(1);                             // 1 is being written, held
  EXPECT_FALSE(writer.Submit(MakeCheckpoint(2)));  // pending
  EXPECT_TRUE(writer.Submit(MakeCheckpoint(3)));   // replaces 2
  EXPECT_TRUE(writer.Submit(MakeCheckpoint(4)));   // replaces 3
  EXPECT_EQ(writer.durable_sequence(), 0u);
  disk.Hold(false);
  EXPECT_OK(writer.Flush());
  EXPECT_EQ(disk.written(), (std::vector<uint64_t>{1, 4}));
  EXPECT_EQ(writer.durable_sequence(), 4u);
  const CheckpointWriter::Stats stats = writer.stats();
  EXPECT_EQ(stats.written, 2u);
  EXPECT_EQ(stats.replaced, 2u);
  EXPECT_EQ(stats.failed, 0u);
}

TEST(CheckpointWriterTest, FailuresAreReportedAndDoNotAdvance) {
  FakeDisk disk;
  disk.Fail(2);
  CheckpointWriter writer(FakeOptions(&disk, 1));
  writer.Submit(MakeCheckpoint(2));
  const Status status = writer.Flush();
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_CONTAINS(status.message(), "disk says no to 2");
  EXPECT_EQ(writer.last_error(), status);
  EXPECT_EQ(writer.durable_sequence(), 1u);
  EXPECT_EQ(writer.stats().failed, 1u);
  writer.Submit(MakeCheckpoint(3));
  EXPECT_OK(writer.Flush());
  EXPECT_OK(writer.last_error());
  EXPECT_EQ(writer.durable_sequence(), 3u);
}

TEST(CheckpointWriterTest, RealWriteErrorsNameThePath) {
  const std::string dir = Dir("writer-error");
  WriteBytes(dir + "/file", Bytes("x"));
  CheckpointWriter writer({.dir = dir + "/file/sub"});
  writer.Submit(MakeCheckpoint(1));
  const Status status = writer.Flush();
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), dir + "/file/sub");
  EXPECT_EQ(writer.durable_sequence(), 0u);
}

TEST(CheckpointWriterTest, DestructorFinishesTheWriteInProgress) {
  FakeDisk disk;
  disk.Hold(true);
  auto writer = std::make_unique<CheckpointWriter>(FakeOptions(&disk));
  writer->Submit(MakeCheckpoint(1));
  disk.WaitStarted(1);
  writer->Submit(MakeCheckpoint(2));  // pending: dropped by the destructor
  std::thread destroy([&] { writer.reset(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(disk.written().empty());  // still held: the destructor waits
  disk.Hold(false);
  destroy.join();
  EXPECT_EQ(disk.written(), std::vector<uint64_t>{1});
  EXPECT_EQ(disk.started(), std::vector<uint64_t>{1});
}

TEST(CheckpointWriterTest, ManyThreadsSubmitting) {
  const std::string dir = Dir("writer-threads");
  CheckpointWriter writer({.dir = dir});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&writer, t] {
      for (uint64_t i = 1; i <= 20; ++i) {
        writer.Submit(MakeCheckpoint(t * 100 + i, 50));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_OK(writer.Flush());
  const CheckpointWriter::Stats stats = writer.stats();
  EXPECT_EQ(stats.written + stats.replaced, 80u);
  Result<LoadedCheckpoint> loaded = LoadLatest(dir, Fp());
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->checkpoint->sequence, writer.durable_sequence());
}

TEST(CheckpointWriterTest, ReportsHowLongTheLastWriteTook) {
  FakeDisk disk;
  disk.Hold(true);
  CheckpointWriter writer(FakeOptions(&disk));
  EXPECT_EQ(writer.stats().last_write_s, 0.0);
  writer.Submit(MakeCheckpoint(1));
  disk.WaitStarted(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  disk.Hold(false);
  ASSERT_OK(writer.Flush());
  EXPECT_GE(writer.stats().last_write_s, 0.05);
}

}  // namespace
}  // namespace meridian::durable_test
