// The format of the outgoing-update log: a directory of segment files
// (log_writer.h appends, log_reader.h reads back). A record is either read
// back whole or not at all.
//
// Log segment file `log-<16 lowercase hex digits of the segment number>`,
// format version 1. A segment appears under its name only complete with
// its header (written as a temporary file, then linked):
//
//   offset   bytes  field
//   0        8      magic "MRDNULOG" (4D 52 44 4E 55 4C 4F 47)
//   8        4      u32 format version = 1
//   12       8      u64 segment number (equals the one in the file name)
//   20       8      u64 number of the segment written before this one, or
//                   2^64-1 (kNoSegment) for the first segment of a log
//   28       4      u32 fingerprint length F, 1..kMaxFingerprintBytes
//   32       F      fingerprint bytes
//   32+F     4      u32 CRC-32 of bytes [0, 32+F)
//   then records up to the end of the file, each:
//   0        4      u32 payload length P
//   4        4      u32 CRC-32 of the 4 length bytes followed by the payload
//   8        P      payload bytes
//
// Temporary files (`log-<hex>.tmp`) are left only by a crash while a
// segment is created (they never hold a record); readers ignore them and
// the next writer deletes them. (Integers and the CRC: coding.h.)
#ifndef MERIDIAN_DURABLE_LOG_FORMAT_H_
#define MERIDIAN_DURABLE_LOG_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/core/status.h"

namespace meridian {

inline constexpr uint32_t kLogFormatVersion = 1;
// "No segment": the previous segment of a log's first segment.
inline constexpr uint64_t kNoSegment = ~uint64_t{0};

// "log-000000000000000c" for 12.
std::string LogSegmentFileName(uint64_t segment);

namespace durable {

inline constexpr std::string_view kLogPrefix = "log-";
// Segment header: magic, version, segment, previous, fingerprint length.
inline constexpr size_t kLogFixedBytes = 32;
// What CheckLogHead reads: magic, version.
inline constexpr size_t kLogHeadBytes = 12;
// Record header: payload length, checksum.
inline constexpr size_t kRecordHeaderBytes = 8;

// What a log segment's first 12 bytes say: magic and version (`head` may
// be shorter: the rest is checked later). `name` ("log segment '<path>'")
// starts each error.
Status CheckLogHead(std::span<const std::byte> head, const std::string& name);

// A segment's header, checksum included.
std::vector<std::byte> EncodeLogHeader(uint64_t segment, uint64_t previous,
                                       std::string_view fingerprint);

// The checksum of a record: CRC-32 of its 4 length bytes, then its payload.
uint32_t RecordChecksum(uint32_t length, std::span<const std::byte> payload);

// A segment number in an error: "none" for kNoSegment.
std::string SegmentText(uint64_t segment);

}  // namespace durable
}  // namespace meridian

#endif  // MERIDIAN_DURABLE_LOG_FORMAT_H_
