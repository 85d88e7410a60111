// A checkpoint (everything a site needs to continue after a crash) and the
// bytes of its file: EncodeCheckpoint and DecodeCheckpoint. No I/O:
// checkpoint_dir.h writes and loads the files.
//
// Checkpoint file `ckpt-<16 lowercase hex digits of the sequence>`, format
// version 1 (F, M, L, E: the lengths declared just before):
//
//   offset   bytes  field
//   0        8      magic "MRDNCKPT" (4D 52 44 4E 43 4B 50 54)
//   8        4      u32 format version = 1
//   12       8      u64 total file length in bytes, this header and the
//                   trailing checksum included
//   20       8      u64 sequence (equals the one in the file name)
//   28       4      u32 fingerprint length F, 1..kMaxFingerprintBytes
//   32       F      fingerprint bytes
//   32+F     8      u64 meta length M
//   40+F     M      meta bytes (opaque: the caller's serialized message)
//   40+F+M   4      u32 array count N
//   then N arrays, each:
//            4      u32 name length L, 1..kMaxArrayNameBytes
//            L      name bytes (names are unique within a checkpoint)
//            8      u64 element count E
//            4*E    E floats
//   end-4    4      u32 CRC-32 of every byte before it
//
// (Integers, floats and the CRC: coding.h.)
#ifndef MERIDIAN_DURABLE_CHECKPOINT_CODEC_H_
#define MERIDIAN_DURABLE_CHECKPOINT_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "durable/fingerprint.h"
#include "meridian/core/status.h"

namespace meridian {

inline constexpr uint32_t kCheckpointFormatVersion = 1;
// Bound of an array's name (bytes). It keeps error messages, which quote
// names, readable.
inline constexpr size_t kMaxArrayNameBytes = 4096;

// One named array of floats (a tensor, an optimizer slot, an accumulator).
struct NamedArray {
  std::string name;
  std::vector<float> values;

  friend bool operator==(const NamedArray&, const NamedArray&) = default;
};

// Everything one checkpoint holds. The fields' meaning is the caller's;
// float values are stored bit for bit (NaN and infinities included).
struct Checkpoint {
  // Orders checkpoints: the newest is the highest. Numbered by the caller,
  // typically the resumed checkpoint's sequence + 1 (so that a new write
  // replaces a newer file that was refused on load).
  uint64_t sequence = 0;
  // Identifies the job and site the state belongs to (non-empty, at most
  // kMaxFingerprintBytes); loading with another fingerprint is refused.
  // Quoted in errors, so make it readable: see CheckpointFingerprint().
  std::string fingerprint;
  // Opaque bytes, e.g. a serialized Protobuf message the caller owns
  // (clocks, what was received from each peer, policy state).
  std::string meta;
  // Unique, non-empty names (at most kMaxArrayNameBytes each).
  std::vector<NamedArray> arrays;

  // The array called `name`, or null. Linear in the number of arrays.
  const NamedArray* Find(std::string_view name) const;

  // Field by field; floats compare as floats (a NaN differs from itself).
  friend bool operator==(const Checkpoint&, const Checkpoint&) = default;
};

// The file's bytes (see the format above). Fails (InvalidArgument) on an
// empty or too long fingerprint and on empty, too long or repeated array
// names: what is written can always be read back.
Result<std::vector<std::byte>> EncodeCheckpoint(const Checkpoint& checkpoint);

// Parses a checkpoint file's bytes; `source` names them in errors ("<file>
// ..."). Refuses (DataLoss; FailedPrecondition for another format version)
// wrong magic, other versions, truncated or extended files, checksum
// mismatches and malformed contents. Does not check the fingerprint.
// Every length is checked against the bytes left before anything is
// allocated: memory stays within a small multiple of bytes.size().
// Thread-safe.
Result<Checkpoint> DecodeCheckpoint(std::span<const std::byte> bytes,
                                    std::string_view source);

namespace durable {

// What CheckCheckpointHead reads: magic, version, total length.
inline constexpr size_t kCheckpointHeadBytes = 20;

// Checks what the decoder would refuse, and returns the file's size.
Result<uint64_t> CheckpointEncodedBytes(const Checkpoint& checkpoint);

// Checks the first bytes of a checkpoint file of `file_bytes` bytes: magic,
// version, total length. `head` holds min(file_bytes, 20) bytes; `name`
// ("checkpoint '<path>'") starts each error. Cheap: the file reader runs it
// before reading (and allocating for) the rest.
Status CheckCheckpointHead(std::span<const std::byte> head, uint64_t file_bytes,
                           const std::string& name);

// Where encoded bytes go: memory (EncodeCheckpoint) or a file
// (WriteCheckpoint streams it).
class Output {
 public:
  virtual ~Output() = default;
  virtual Status Write(std::span<const std::byte> bytes) = 0;
};

// Emits a checkpoint's bytes to `out`, checksumming as it goes; arrays are
// written straight from the checkpoint's memory. Precondition: `total` ==
// CheckpointEncodedBytes(checkpoint).
Status EmitCheckpoint(const Checkpoint& checkpoint, uint64_t total,
                      Output* out);

}  // namespace durable
}  // namespace meridian

#endif  // MERIDIAN_DURABLE_CHECKPOINT_CODEC_H_
