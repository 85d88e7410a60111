#include "durable/checkpoint_codec.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "durable/coding.h"

namespace meridian {
namespace durable {
namespace {

constexpr char kCheckpointMagic[8] = {'M', 'R', 'D', 'N', 'C', 'K', 'P', 'T'};

// Checkpoint: magic, version, total length, sequence, fingerprint length.
constexpr size_t kCheckpointFixedBytes = 32;
// The smallest checkpoint: one fingerprint byte, no meta, no array.
constexpr size_t kMinCheckpointBytes = kCheckpointFixedBytes + 1 + 8 + 4 + 4;

class VectorOutput final : public Output {
 public:
  explicit VectorOutput(std::vector<std::byte>* out) : out_(out) {}
  Status Write(std::span<const std::byte> bytes) override {
    AppendBytes(out_, bytes);
    return Status::Ok();
  }

 private:
  std::vector<std::byte>* out_;
};

}  // namespace

Result<uint64_t> CheckpointEncodedBytes(const Checkpoint& checkpoint) {
  MERIDIAN_RETURN_IF_ERROR(
      ValidateFingerprint(checkpoint.fingerprint)
          .WithContext("checkpoint " + std::to_string(checkpoint.sequence)));
  if (checkpoint.arrays.size() > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgumentError("too many arrays in a checkpoint");
  }
  uint64_t total = kCheckpointFixedBytes + checkpoint.fingerprint.size() + 8 +
                   checkpoint.meta.size() + 4;
  std::set<std::string_view> names;
  for (const NamedArray& array : checkpoint.arrays) {
    if (array.name.empty() || array.name.size() > kMaxArrayNameBytes) {
      return InvalidArgumentError(
          "checkpoint array name '" + Printable(array.name) + "' has " +
          std::to_string(array.name.size()) + " bytes, not 1.." +
          std::to_string(kMaxArrayNameBytes));
    }
    if (!names.insert(array.name).second) {
      return InvalidArgumentError("checkpoint array '" + Printable(array.name) +
                                  "' appears twice");
    }
    total += 4 + array.name.size() + 8 + 4 * uint64_t{array.values.size()};
  }
  return total + kChecksumBytes;
}

Status EmitCheckpoint(const Checkpoint& checkpoint, uint64_t total,
                      Output* out) {
  uint32_t crc = 0;
  auto put = [&](std::span<const std::byte> bytes) {
    crc = Crc32(crc, bytes);
    return out->Write(bytes);
  };
  std::vector<std::byte> head;
  AppendBytes(&head, std::as_bytes(std::span(kCheckpointMagic)));
  AppendBytes(&head, BytesOf(kCheckpointFormatVersion));
  AppendBytes(&head, BytesOf(total));
  AppendBytes(&head, BytesOf(checkpoint.sequence));
  AppendBytes(&head,
              BytesOf(static_cast<uint32_t>(checkpoint.fingerprint.size())));
  AppendBytes(&head, BytesOf(std::string_view(checkpoint.fingerprint)));
  AppendBytes(&head, BytesOf(uint64_t{checkpoint.meta.size()}));
  MERIDIAN_RETURN_IF_ERROR(put(head));
  MERIDIAN_RETURN_IF_ERROR(put(BytesOf(std::string_view(checkpoint.meta))));
  MERIDIAN_RETURN_IF_ERROR(
      put(BytesOf(static_cast<uint32_t>(checkpoint.arrays.size()))));
  for (const NamedArray& array : checkpoint.arrays) {
    head.clear();
    AppendBytes(&head, BytesOf(static_cast<uint32_t>(array.name.size())));
    AppendBytes(&head, BytesOf(std::string_view(array.name)));
    AppendBytes(&head, BytesOf(uint64_t{array.values.size()}));
    MERIDIAN_RETURN_IF_ERROR(put(head));
    MERIDIAN_RETURN_IF_ERROR(put(std::as_bytes(std::span(array.values))));
  }
  return out->Write(BytesOf(crc));
}

Status CheckCheckpointHead(std::span<const std::byte> head, uint64_t file_bytes,
                           const std::string& name) {
  auto refuse = [&](const std::string& why) {
    return DataLossError(name + ": " + why);
  };
  const std::span<const std::byte> magic =
      std::as_bytes(std::span(kCheckpointMagic));
  const size_t magic_seen = std::min(head.size(), magic.size());
  if (!std::equal(head.begin(), head.begin() + magic_seen, magic.begin())) {
    return refuse(
        "not a Meridian checkpoint (the file does not start with "
        "\"MRDNCKPT\")");
  }
  if (head.size() < kCheckpointHeadBytes) {
    return refuse("truncated: " + std::to_string(file_bytes) +
                  " bytes, shorter than the " +
                  std::to_string(kCheckpointHeadBytes) + "-byte header");
  }
  const uint32_t version = LoadLe<uint32_t>(head.data() + 8);
  if (version != kCheckpointFormatVersion) {
    return FailedPreconditionError(
        name + ": format version " + std::to_string(version) +
        ", this build reads version " +
        std::to_string(kCheckpointFormatVersion) +
        " (written by another Meridian version, or corrupt)");
  }
  const uint64_t total = LoadLe<uint64_t>(head.data() + 12);
  if (total != file_bytes) {
    return refuse((total > file_bytes ? "truncated: " : "wrong size: ") +
                  std::to_string(file_bytes) + " bytes, the header says " +
                  std::to_string(total));
  }
  return Status::Ok();
}

}  // namespace durable

using durable::BytesOf;
using durable::Crc32;
using durable::LoadLe;
using durable::Printable;

const NamedArray* Checkpoint::Find(std::string_view name) const {
  for (const NamedArray& array : arrays) {
    if (array.name == name) return &array;
  }
  return nullptr;
}

Result<std::vector<std::byte>> EncodeCheckpoint(const Checkpoint& checkpoint) {
  MERIDIAN_ASSIGN_OR_RETURN(const uint64_t total,
                            durable::CheckpointEncodedBytes(checkpoint));
  std::vector<std::byte> bytes;
  bytes.reserve(total);
  durable::VectorOutput out(&bytes);
  MERIDIAN_RETURN_IF_ERROR(durable::EmitCheckpoint(checkpoint, total, &out));
  return bytes;
}

Result<Checkpoint> DecodeCheckpoint(std::span<const std::byte> bytes,
                                    std::string_view source) {
  const std::string name = "checkpoint '" + std::string(source) + "'";
  auto refuse = [&](const std::string& why) {
    return DataLossError(name + ": " + why);
  };
  MERIDIAN_RETURN_IF_ERROR(durable::CheckCheckpointHead(
      bytes.first(std::min(bytes.size(), durable::kCheckpointHeadBytes)),
      bytes.size(), name));
  if (bytes.size() < durable::kMinCheckpointBytes) {
    return refuse("truncated: " + std::to_string(bytes.size()) +
                  " bytes, shorter than the smallest checkpoint (" +
                  std::to_string(durable::kMinCheckpointBytes) + ")");
  }
  const std::span<const std::byte> body =
      bytes.first(bytes.size() - durable::kChecksumBytes);
  const uint32_t stored = LoadLe<uint32_t>(body.data() + body.size());
  const uint32_t computed = Crc32(0, body);
  if (stored != computed) {
    return refuse("checksum mismatch (stored " + durable::Hex32(stored) +
                  ", computed " + durable::Hex32(computed) +
                  "): the file is corrupt");
  }

  // The checksum holds: what follows only fails on a file written wrong,
  // but is checked as carefully.
  durable::Reader in(body);
  in.Take(durable::kCheckpointHeadBytes);
  Checkpoint checkpoint;
  uint32_t fingerprint_bytes = 0;
  in.Read(&checkpoint.sequence);
  in.Read(&fingerprint_bytes);
  if (fingerprint_bytes == 0 || fingerprint_bytes > kMaxFingerprintBytes ||
      fingerprint_bytes > in.remaining()) {
    return refuse("fingerprint length " + std::to_string(fingerprint_bytes) +
                  " outside 1.." + std::to_string(kMaxFingerprintBytes) +
                  " or beyond the " + std::to_string(in.remaining()) +
                  " bytes left");
  }
  const auto text = [](std::span<const std::byte> b) {
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  checkpoint.fingerprint = text(in.Take(fingerprint_bytes));
  uint64_t meta_bytes = 0;
  if (!in.Read(&meta_bytes) || meta_bytes > in.remaining()) {
    return refuse("meta length " + std::to_string(meta_bytes) + " beyond the " +
                  std::to_string(in.remaining()) + " bytes left");
  }
  checkpoint.meta = text(in.Take(static_cast<size_t>(meta_bytes)));
  uint32_t array_count = 0;
  // Each array takes at least 12 bytes (name length and element count).
  if (!in.Read(&array_count) || array_count > in.remaining() / 12) {
    return refuse(std::to_string(array_count) + " arrays cannot fit in the " +
                  std::to_string(in.remaining()) + " bytes left");
  }
  checkpoint.arrays.resize(array_count);
  std::set<std::string_view> names;
  for (uint32_t i = 0; i < array_count; ++i) {
    NamedArray& array = checkpoint.arrays[i];
    const std::string which = "array " + std::to_string(i);
    uint32_t name_bytes = 0;
    if (!in.Read(&name_bytes) || name_bytes == 0 ||
        name_bytes > kMaxArrayNameBytes || name_bytes > in.remaining()) {
      return refuse(which + ": name length " + std::to_string(name_bytes) +
                    " outside 1.." + std::to_string(kMaxArrayNameBytes) +
                    " or beyond the " + std::to_string(in.remaining()) +
                    " bytes left");
    }
    array.name = text(in.Take(name_bytes));
    if (!names.insert(array.name).second) {
      return refuse(which + ": the name '" + Printable(array.name) +
                    "' appears twice");
    }
    uint64_t count = 0;
    if (!in.Read(&count) || count > in.remaining() / sizeof(float)) {
      return refuse(which + " ('" + Printable(array.name) + "'): " +
                    std::to_string(count) + " elements cannot fit in the " +
                    std::to_string(in.remaining()) + " bytes left");
    }
    array.values.resize(static_cast<size_t>(count));
    const std::span<const std::byte> values =
        in.Take(static_cast<size_t>(count) * sizeof(float));
    if (!values.empty()) {
      std::memcpy(array.values.data(), values.data(), values.size());
    }
  }
  if (in.remaining() != 0) {
    return refuse(std::to_string(in.remaining()) +
                  " unexpected bytes after the last array");
  }
  return checkpoint;
}

}  // namespace meridian
