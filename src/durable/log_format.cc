#include "durable/log_format.h"

#include <algorithm>

#include "durable/coding.h"
#include "durable/file_util.h"

namespace meridian {

std::string LogSegmentFileName(uint64_t segment) {
  return durable::NumberedFileName(durable::kLogPrefix, segment);
}

namespace durable {
namespace {

constexpr char kLogMagic[8] = {'M', 'R', 'D', 'N', 'U', 'L', 'O', 'G'};

}  // namespace

Status CheckLogHead(std::span<const std::byte> head, const std::string& name) {
  const std::span<const std::byte> magic = std::as_bytes(std::span(kLogMagic));
  const size_t magic_seen = std::min(head.size(), magic.size());
  if (!std::equal(head.begin(), head.begin() + magic_seen, magic.begin())) {
    return DataLossError(name +
                         ": not a Meridian log segment (the file does not "
                         "start with \"MRDNULOG\")");
  }
  if (head.size() < kLogHeadBytes) return Status::Ok();
  const uint32_t version = LoadLe<uint32_t>(head.data() + 8);
  if (version != kLogFormatVersion) {
    return FailedPreconditionError(
        name + ": format version " + std::to_string(version) +
        ", this build reads version " + std::to_string(kLogFormatVersion) +
        " (written by another Meridian version, or corrupt)");
  }
  return Status::Ok();
}

std::vector<std::byte> EncodeLogHeader(uint64_t segment, uint64_t previous,
                                       std::string_view fingerprint) {
  std::vector<std::byte> header;
  AppendBytes(&header, std::as_bytes(std::span(kLogMagic)));
  AppendBytes(&header, BytesOf(kLogFormatVersion));
  AppendBytes(&header, BytesOf(segment));
  AppendBytes(&header, BytesOf(previous));
  AppendBytes(&header, BytesOf(static_cast<uint32_t>(fingerprint.size())));
  AppendBytes(&header, BytesOf(fingerprint));
  AppendBytes(&header, BytesOf(Crc32(0, header)));
  return header;
}

uint32_t RecordChecksum(uint32_t length, std::span<const std::byte> payload) {
  return Crc32(Crc32(0, BytesOf(length)), payload);
}

std::string SegmentText(uint64_t segment) {
  return segment == kNoSegment ? std::string("none") : std::to_string(segment);
}

}  // namespace durable
}  // namespace meridian
