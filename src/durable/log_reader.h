// Reading the outgoing-update log back (format: log_format.h): after a
// crash, every complete record of a log directory, in append order.
#ifndef MERIDIAN_DURABLE_LOG_READER_H_
#define MERIDIAN_DURABLE_LOG_READER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "durable/log_format.h"
#include "meridian/core/status.h"

namespace meridian {

// One record read back, with the segment it was in.
struct LogRecord {
  uint64_t segment = 0;
  std::vector<std::byte> payload;
};

struct LogContents {
  std::vector<LogRecord> records;  // in append order
  // The newest segment found (kNoSegment when none): a new writer opens
  // above it.
  uint64_t last_segment = kNoSegment;
  // Bytes at the end of the newest segment that hold no complete record (a
  // crash mid-append), and why, e.g. "<path>: record at offset 120:
  // declares 4000 bytes, 31 left". 0 and empty when none.
  uint64_t ignored_bytes = 0;
  std::string ignored_note;
};

// Every complete record of the segments numbered >= `from_segment` in
// `dir`, in order. The newest segment may end with a torn or corrupt
// record: reading stops there and reports the bytes it ignored. Anything
// wrong anywhere else is an error naming the file and offset: a corrupt
// or foreign header, a corrupt record in an older segment, a segment
// missing from the chain (each segment names its predecessor). Missing
// directory or no segment: OK, empty. Peak memory: the records plus one
// segment's bytes.
Result<LogContents> ReadLog(const std::string& dir,
                            std::string_view fingerprint,
                            uint64_t from_segment);

// Segment numbers of the log segment files in `dir`, ascending (names
// only). Missing directory: empty.
Result<std::vector<uint64_t>> ListLogSegments(const std::string& dir);

// One log segment file's bytes, parsed. Exposed for the fuzz target and
// tests; ReadLog is the API.
struct DecodedLogSegment {
  uint64_t segment = 0;
  uint64_t previous = kNoSegment;
  std::string fingerprint;
  // Views into the decoded bytes: valid while they are.
  std::vector<std::span<const std::byte>> records;
  uint64_t valid_bytes = 0;    // header + complete records
  uint64_t ignored_bytes = 0;  // the torn tail, when tolerated
  std::string ignored_note;
};

// Parses a segment's bytes; `source` names them in errors. With
// `tolerate_torn_tail` (the newest segment) parsing stops at the first
// incomplete or corrupt record and reports the rest as ignored; without it
// such a record is an error (DataLoss). A bad header is always an error.
// Does not check the fingerprint or the segment number. Thread-safe.
Result<DecodedLogSegment> DecodeLogSegment(std::span<const std::byte> bytes,
                                           std::string_view source,
                                           bool tolerate_torn_tail);

namespace durable {

// Reads segment `segment` from `path` into `*bytes` (which the result's
// records view) and decodes it, checking its header against the file name
// and `fingerprint`. A file that is not a log segment of this format
// version is refused from its first bytes, before its size is allocated.
Result<DecodedLogSegment> ReadLogSegmentFile(const std::string& path,
                                             uint64_t segment,
                                             std::string_view fingerprint,
                                             bool tolerate_torn_tail,
                                             std::vector<std::byte>* bytes);

}  // namespace durable
}  // namespace meridian

#endif  // MERIDIAN_DURABLE_LOG_READER_H_
