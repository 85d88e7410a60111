#include "durable/log_reader.h"

#include <algorithm>
#include <utility>

#include "durable/coding.h"
#include "durable/file_util.h"
#include "durable/fingerprint.h"

namespace meridian {

using durable::kChecksumBytes;
using durable::LoadLe;
using durable::Quoted;

Result<DecodedLogSegment> DecodeLogSegment(std::span<const std::byte> bytes,
                                           std::string_view source,
                                           bool tolerate_torn_tail) {
  const std::string name = "log segment " + Quoted(source);
  auto refuse = [&](const std::string& why) {
    return DataLossError(name + ": " + why);
  };
  MERIDIAN_RETURN_IF_ERROR(durable::CheckLogHead(
      bytes.first(std::min(bytes.size(), durable::kLogHeadBytes)), name));
  if (bytes.size() < durable::kLogFixedBytes) {
    return refuse("truncated header: " + std::to_string(bytes.size()) +
                  " bytes");
  }
  const uint32_t fingerprint_bytes = LoadLe<uint32_t>(bytes.data() + 28);
  if (fingerprint_bytes == 0 || fingerprint_bytes > kMaxFingerprintBytes) {
    return refuse("corrupt header: fingerprint length " +
                  std::to_string(fingerprint_bytes) + " outside 1.." +
                  std::to_string(kMaxFingerprintBytes));
  }
  const size_t header_bytes = durable::kLogFixedBytes + fingerprint_bytes;
  if (bytes.size() < header_bytes + kChecksumBytes) {
    return refuse("truncated header: " + std::to_string(bytes.size()) +
                  " bytes, the header needs " +
                  std::to_string(header_bytes + kChecksumBytes));
  }
  const uint32_t stored = LoadLe<uint32_t>(bytes.data() + header_bytes);
  const uint32_t computed = durable::Crc32(0, bytes.first(header_bytes));
  if (stored != computed) {
    return refuse("header checksum mismatch (stored " + durable::Hex32(stored) +
                  ", computed " + durable::Hex32(computed) + "): corrupt");
  }
  DecodedLogSegment segment;
  segment.segment = LoadLe<uint64_t>(bytes.data() + 12);
  segment.previous = LoadLe<uint64_t>(bytes.data() + 20);
  segment.fingerprint.assign(
      reinterpret_cast<const char*>(bytes.data() + durable::kLogFixedBytes),
      fingerprint_bytes);

  durable::Reader in(bytes);
  in.Take(header_bytes + kChecksumBytes);
  while (in.remaining() > 0) {
    const size_t offset = in.offset();
    std::string problem;
    uint32_t length = 0;
    uint32_t crc = 0;
    if (in.remaining() < durable::kRecordHeaderBytes) {
      problem = "only " + std::to_string(in.remaining()) +
                " bytes of its 8-byte header";
    } else {
      in.Read(&length);
      in.Read(&crc);
      if (length > in.remaining()) {
        problem = "declares " + std::to_string(length) + " bytes, " +
                  std::to_string(in.remaining()) + " left";
      } else {
        const std::span<const std::byte> payload = in.Take(length);
        const uint32_t actual = durable::RecordChecksum(length, payload);
        if (actual == crc) {
          segment.records.push_back(payload);
          continue;
        }
        problem = "checksum mismatch (stored " + durable::Hex32(crc) +
                  ", computed " + durable::Hex32(actual) + ")";
      }
    }
    const std::string why =
        "record at offset " + std::to_string(offset) + ": " + problem;
    if (!tolerate_torn_tail) return refuse(why + ": corrupt");
    segment.valid_bytes = offset;
    segment.ignored_bytes = bytes.size() - offset;
    segment.ignored_note = std::string(source) + ": " + why;
    return segment;
  }
  segment.valid_bytes = bytes.size();
  return segment;
}

namespace durable {

Result<DecodedLogSegment> ReadLogSegmentFile(const std::string& path,
                                             uint64_t segment,
                                             std::string_view fingerprint,
                                             bool tolerate_torn_tail,
                                             std::vector<std::byte>* bytes) {
  const std::string name = "log segment " + Quoted(path);
  MERIDIAN_ASSIGN_OR_RETURN(
      *bytes, ReadWholeFile(path, kLogHeadBytes,
                            [&](std::span<const std::byte> head, uint64_t) {
                              return CheckLogHead(head, name);
                            }));
  MERIDIAN_ASSIGN_OR_RETURN(DecodedLogSegment decoded,
                            DecodeLogSegment(*bytes, path, tolerate_torn_tail));
  if (decoded.segment != segment) {
    return DataLossError("log segment " + Quoted(path) + ": its header says " +
                         "segment " + std::to_string(decoded.segment) +
                         ", its name " + std::to_string(segment));
  }
  if (decoded.fingerprint != fingerprint) {
    return FailedPreconditionError(
        "log segment " + Quoted(path) + " belongs to " +
        Printable(decoded.fingerprint) + ", not to " + Printable(fingerprint));
  }
  return decoded;
}

}  // namespace durable

Result<std::vector<uint64_t>> ListLogSegments(const std::string& dir) {
  MERIDIAN_ASSIGN_OR_RETURN(durable::DirEntries entries,
                            durable::ListNumbered(dir, durable::kLogPrefix));
  return std::move(entries.numbers);
}

Result<LogContents> ReadLog(const std::string& dir,
                            std::string_view fingerprint,
                            uint64_t from_segment) {
  MERIDIAN_RETURN_IF_ERROR(
      durable::ValidateFingerprint(fingerprint).WithContext("ReadLog"));
  MERIDIAN_ASSIGN_OR_RETURN(const std::vector<uint64_t> segments,
                            ListLogSegments(dir));
  LogContents contents;
  if (segments.empty()) return contents;
  contents.last_segment = segments.back();
  uint64_t before = kNoSegment;  // the segment read before this one
  std::vector<std::byte> bytes;
  for (uint64_t number : segments) {
    if (number < from_segment) continue;
    const std::string path = durable::JoinPath(dir, LogSegmentFileName(number));
    const bool last = number == segments.back();
    MERIDIAN_ASSIGN_OR_RETURN(
        DecodedLogSegment segment,
        durable::ReadLogSegmentFile(path, number, fingerprint, last, &bytes));
    // The chain: every segment names the one written before it.
    if (before == kNoSegment) {
      if (segment.previous != kNoSegment && segment.previous >= from_segment) {
        return DataLossError(
            "log segment " + Quoted(path) + " follows segment " +
            std::to_string(segment.previous) + ", which is missing");
      }
    } else if (segment.previous != before) {
      return DataLossError("log segment " + Quoted(path) + " follows segment " +
                           durable::SegmentText(segment.previous) +
                           ", but the segment before it is " +
                           std::to_string(before) +
                           ": segments are missing or misplaced");
    }
    before = number;
    for (std::span<const std::byte> record : segment.records) {
      contents.records.push_back(LogRecord{
          number, std::vector<std::byte>(record.begin(), record.end())});
    }
    if (last) {
      contents.ignored_bytes = segment.ignored_bytes;
      contents.ignored_note = std::move(segment.ignored_note);
    }
  }
  return contents;
}

}  // namespace meridian
