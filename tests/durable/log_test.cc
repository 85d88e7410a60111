// Tests of the outgoing-update log: appending (src/durable/log_writer.h),
// reading back after a crash (log_reader.h), torn tails, corruption,
// missing and foreign segments, pruning, I/O errors.

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "durable/log_reader.h"
#include "durable/log_writer.h"
#include "testing/status_matchers.h"
#include "tests/durable/durable_test_util.h"

namespace meridian::durable_test {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<LogWriter> OpenLog(const std::string& dir, uint64_t segment,
                                   LogWriterOptions options = {}) {
  Result<std::unique_ptr<LogWriter>> writer =
      LogWriter::Open(dir, Fp(), segment, options);
  EXPECT_OK(writer);
  return writer.ok() ? std::move(writer).value() : nullptr;
}

// Writes segments 1, 2, 3 with `per_segment` records each; returns them.
std::vector<std::vector<std::byte>> WriteThreeSegments(const std::string& dir,
                                                       int per_segment = 3) {
  std::vector<std::vector<std::byte>> records;
  std::unique_ptr<LogWriter> log = OpenLog(dir, 1);
  for (uint64_t s = 1; s <= 3; ++s) {
    if (s > 1) {
      EXPECT_OK(log->Rotate(s));
    }
    for (int i = 0; i < per_segment; ++i) {
      records.push_back(
          Record(static_cast<int>(records.size()), static_cast<size_t>(i * 7)));
      EXPECT_OK(log->Append(records.back()));
    }
  }
  return records;
}

std::string SegmentPath(const std::string& dir, uint64_t segment) {
  return dir + "/" + LogSegmentFileName(segment);
}

TEST(LogTest, RoundTrip) {
  for (bool sync : {false, true}) {
    const std::string dir = Dir("log");
    std::unique_ptr<LogWriter> log =
        OpenLog(dir, 5, {.fsync_each_append = sync});
    ASSERT_NE(log, nullptr);
    std::vector<std::vector<std::byte>> records = {
        Record(0, 0), Record(1, 1), Record(2, 100000), Record(3, 17)};
    ASSERT_OK(log->Append(records[0]));
    ASSERT_OK(log->Append(records[1]));
    ASSERT_OK(log->Rotate(9));
    EXPECT_EQ(log->segment(), 9u);
    ASSERT_OK(log->Append(records[2]));
    ASSERT_OK(log->Append(records[3]));
    EXPECT_FALSE(log->Rotate(9).ok());  // must move forward
    EXPECT_TRUE(log->repair_note().empty());
    EXPECT_EQ(*ListLogSegments(dir), (std::vector<uint64_t>{5, 9}));

    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_OK(read);
    ASSERT_EQ(read->records.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(read->records[i].payload, records[i]) << i;
      EXPECT_EQ(read->records[i].segment, i < 2 ? 5u : 9u) << i;
    }
    EXPECT_EQ(read->last_segment, 9u);
    EXPECT_EQ(read->ignored_bytes, 0u);
    EXPECT_TRUE(read->ignored_note.empty());

    read = ReadLog(dir, Fp(), 6);
    ASSERT_OK(read);
    ASSERT_EQ(read->records.size(), 2u);
    EXPECT_EQ(read->records[0].payload, records[2]);
    // The file is the documented format, byte for byte.
    EXPECT_EQ(ReadBytes(SegmentPath(dir, 9)),
              HandMadeSegment(9, 5, Fp(), {records[2], records[3]}));
  }
}

TEST(LogTest, MissingOrEmptyLogIsEmpty) {
  const std::string dir = Dir("nolog");
  for (const std::string& d : {dir, dir + "/missing"}) {
    Result<LogContents> read = ReadLog(d, Fp(), 0);
    ASSERT_OK(read);
    EXPECT_TRUE(read->records.empty());
    EXPECT_EQ(read->last_segment, kNoSegment);
  }
}

TEST(LogTest, ATornLastRecordIsIgnoredAtEveryCut) {
  const std::string dir = Dir("torn");
  const std::vector<std::vector<std::byte>> records = WriteThreeSegments(dir);
  const std::string last = SegmentPath(dir, 3);
  const std::vector<std::byte> full = ReadBytes(last);
  const size_t header = 32 + Fp().size() + 4;
  // Record boundaries of segment 3 (records 6, 7, 8 of 0, 7, 14 bytes).
  const std::vector<size_t> ends = {header, header + 8, header + 8 + 15,
                                    header + 8 + 15 + 22};
  ASSERT_EQ(ends.back(), full.size());
  for (size_t cut = header; cut < full.size(); ++cut) {
    WriteBytes(last, std::span(full).first(cut));
    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_OK(read) << cut << ": " << read.status();
    size_t complete = 0;
    while (complete + 1 < ends.size() && ends[complete + 1] <= cut) {
      ++complete;
    }
    EXPECT_EQ(read->records.size(), 6 + complete) << cut;
    EXPECT_EQ(read->ignored_bytes, cut - ends[complete]) << cut;
    EXPECT_EQ(read->ignored_note.empty(), cut == ends[complete]) << cut;
    for (size_t i = 0; i < read->records.size(); ++i) {
      ASSERT_EQ(read->records[i].payload, records[i]) << cut;
    }
  }
}

TEST(LogTest, ATornTailIsReportedThenCutByTheNextWriter) {
  const std::string dir = Dir("repair");
  const std::vector<std::vector<std::byte>> records = WriteThreeSegments(dir);
  const std::string last = SegmentPath(dir, 3);
  std::vector<std::byte> bytes = ReadBytes(last);
  const size_t size = bytes.size();
  // A crash mid-append: a record header that promises more than is there.
  Append<uint32_t>(&bytes, 1000);
  Append<uint32_t>(&bytes, 0x12345678);
  AppendText(&bytes, "partial");
  WriteBytes(last, bytes);
  Result<LogContents> read = ReadLog(dir, Fp(), 0);
  ASSERT_OK(read);
  EXPECT_EQ(read->records.size(), records.size());
  EXPECT_EQ(read->ignored_bytes, 15u);
  EXPECT_CONTAINS(read->ignored_note, last + ": record at offset " +
                                          std::to_string(size) +
                                          ": declares 1000 bytes, 7 left");
  // A restarted writer continues above the last segment and cuts the torn
  // tail first: segment 3 is no longer the newest.
  EXPECT_EQ(LogWriter::Open(dir, Fp(), 3).status().code(),
            StatusCode::kFailedPrecondition);
  std::unique_ptr<LogWriter> log = OpenLog(dir, read->last_segment + 1);
  ASSERT_NE(log, nullptr);
  EXPECT_CONTAINS(log->repair_note(), "cut 15 torn bytes off " + last);
  EXPECT_EQ(ReadBytes(last).size(), size);
  ASSERT_OK(log->Append(Record(99, 5)));
  read = ReadLog(dir, Fp(), 0);
  ASSERT_OK(read);
  EXPECT_EQ(read->records.size(), records.size() + 1);
  EXPECT_EQ(read->records.back().segment, 4u);
  EXPECT_EQ(read->ignored_bytes, 0u);
}

TEST(LogTest, CorruptionInTheLastSegmentStopsReading) {
  const std::string dir = Dir("lastcorrupt");
  const std::vector<std::vector<std::byte>> records = WriteThreeSegments(dir);
  const std::string last = SegmentPath(dir, 3);
  const std::vector<std::byte> full = ReadBytes(last);
  const size_t header = 32 + Fp().size() + 4;
  // Any byte of a record: reading stops before it, never returns it.
  for (size_t i = header; i < full.size(); ++i) {
    std::vector<std::byte> bad = full;
    bad[i] ^= std::byte{0x40};
    WriteBytes(last, bad);
    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_OK(read) << i << ": " << read.status();
    ASSERT_LT(read->records.size(), records.size()) << i;
    EXPECT_GT(read->ignored_bytes, 0u) << i;
    for (size_t r = 0; r < read->records.size(); ++r) {
      ASSERT_EQ(read->records[r].payload, records[r]) << i;
    }
  }
  // Any byte of its header: an error (the header is written atomically).
  for (size_t i = 0; i < header; ++i) {
    std::vector<std::byte> bad = full;
    bad[i] ^= std::byte{0x40};
    WriteBytes(last, bad);
    EXPECT_FALSE(ReadLog(dir, Fp(), 0).ok()) << i;
  }
}

TEST(LogTest, AnyCorruptionOfAnOlderSegmentIsAnError) {
  const std::string dir = Dir("midcorrupt");
  WriteThreeSegments(dir);
  const std::string middle = SegmentPath(dir, 2);
  const std::vector<std::byte> full = ReadBytes(middle);
  for (size_t i = 0; i < full.size(); ++i) {
    std::vector<std::byte> bad = full;
    bad[i] ^= std::byte{0x01};
    WriteBytes(middle, bad);
    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_FALSE(read.ok()) << i;
    EXPECT_CONTAINS(read.status().message(), middle) << i;
  }
  // Truncated: a torn tail in an older segment is an error too.
  const size_t header = 32 + Fp().size() + 4;
  for (size_t cut = 0; cut < full.size(); ++cut) {
    if (cut == header || cut == header + 8 || cut == header + 8 + 15) {
      continue;  // a record boundary: a shorter but well-formed segment
    }
    WriteBytes(middle, std::span(full).first(cut));
    Result<LogContents> read = ReadLog(dir, Fp(), 0);
    ASSERT_FALSE(read.ok()) << cut;
    EXPECT_EQ(read.status().code(), StatusCode::kDataLoss) << cut;
  }
  WriteBytes(middle, std::span(full).first(full.size() - 3));
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(),
                  "log segment '" + middle + "': record at offset " +
                      std::to_string(header + 8 + 15) +
                      ": declares 14 bytes, 11 left: corrupt");
  // Reading from the segment after it does not look at it.
  EXPECT_OK(ReadLog(dir, Fp(), 3));
}

TEST(LogTest, AMissingSegmentIsAnError) {
  const std::string dir = Dir("gap");
  WriteThreeSegments(dir);
  ASSERT_TRUE(fs::remove(SegmentPath(dir, 2)));
  Result<LogContents> read = ReadLog(dir, Fp(), 0);
  ASSERT_FALSE(read.ok());
  EXPECT_CONTAINS(read.status().message(),
                  "follows segment 2, but the segment before it is 1");
  read = ReadLog(dir, Fp(), 2);
  ASSERT_FALSE(read.ok());
  EXPECT_CONTAINS(read.status().message(),
                  "follows segment 2, which is missing");
  EXPECT_OK(ReadLog(dir, Fp(), 3));
}

TEST(LogTest, ForeignAndMisnamedSegmentsAreRefused) {
  const std::string dir = Dir("logforeign");
  const std::string other = CheckpointFingerprint("cifar", "us", 7, "3f2a9c");
  WriteBytes(SegmentPath(dir, 1), HandMadeSegment(1, kNoSegment, other, {}));
  Result<LogContents> read = ReadLog(dir, Fp(), 0);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(read.status().message(),
                  "belongs to job 'cifar' site 'us' seed 7 layout "
                  "3f2a9c, not to job 'mnist'");
  // A writer refuses to continue another job's log.
  EXPECT_EQ(LogWriter::Open(dir, Fp(), 2).status().code(),
            StatusCode::kFailedPrecondition);
  WriteBytes(SegmentPath(dir, 1), HandMadeSegment(4, kNoSegment, Fp(), {}));
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(),
                  "its header says segment 4, its name 1");
  WriteBytes(SegmentPath(dir, 1),
             Bytes(std::string_view("MRDNULOG\x02\0\0\0 and more", 21)));
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(), "format version 2");
  WriteBytes(SegmentPath(dir, 1), Bytes("hello"));
  EXPECT_CONTAINS(ReadLog(dir, Fp(), 0).status().message(),
                  "not a Meridian log segment");
}

TEST(LogTest, PruneDeletesOlderSegments) {
  const std::string dir = Dir("prune");
  const std::vector<std::vector<std::byte>> records = WriteThreeSegments(dir);
  ASSERT_OK(PruneLog(dir, 3));
  EXPECT_EQ(*ListLogSegments(dir), std::vector<uint64_t>{3});
  Result<LogContents> read = ReadLog(dir, Fp(), 3);
  ASSERT_OK(read);
  ASSERT_EQ(read->records.size(), 3u);
  EXPECT_EQ(read->records[0].payload, records[6]);
  EXPECT_OK(PruneLog(dir + "/missing", 3));
}

TEST(LogTest, OpenCleansStaleTemporaryFiles) {
  const std::string dir = Dir("logtmp");
  WriteThreeSegments(dir);
  WriteBytes(dir + "/log-0000000000000004.tmp", Bytes("MRDN"));
  std::unique_ptr<LogWriter> log = OpenLog(dir, 4);
  ASSERT_NE(log, nullptr);
  EXPECT_FALSE(fs::exists(dir + "/log-0000000000000004.tmp"));
  EXPECT_OK(ReadLog(dir, Fp(), 0));
}

TEST(LogTest, AFailedAppendLeavesNoTornRecord) {
  const std::string dir = Dir("logfull");
  std::unique_ptr<LogWriter> log = OpenLog(dir, 1);
  ASSERT_NE(log, nullptr);
  ASSERT_OK(log->Append(Record(0, 10)));
  {
    // Room for part of the next record only.
    FileSizeLimit limit(log->segment_bytes() + 100);
    const Status status = log->Append(Record(1, 1000));
    ASSERT_FALSE(status.ok());
    EXPECT_CONTAINS(status.message(),
                    "cannot write '" + SegmentPath(dir, 1) + "'");
  }
  ASSERT_OK(log->Append(Record(2, 10)));
  Result<LogContents> read = ReadLog(dir, Fp(), 0);
  ASSERT_OK(read);
  ASSERT_EQ(read->records.size(), 2u);
  EXPECT_EQ(read->records[1].payload, Record(2, 10));
  EXPECT_EQ(read->ignored_bytes, 0u);
}

}  // namespace
}  // namespace meridian::durable_test
