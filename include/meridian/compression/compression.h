// Compression of model updates for the WAN: a dense tensor slice, or a
// sparse set of (index, value) entries of one, becomes a self-describing
// byte buffer and back.
//
// An update passes the stages of a pb::CompressionConfig in this order:
//
//   selection    SELECT_ALL: every entry (a dense slice: every non-zero
//                element; a sparse set: every given entry); TOP_K: the k
//                largest |value| exactly, k = ceil(top_k_fraction * size);
//                TOP_K_SAMPLED: a threshold estimated from a sample, at most
//                k and about k entries, faster on large inputs.
//   index coding which entries are sent: INDEX_DELTA_VARINT (gaps between
//                sorted indices as LEB128 varints), INDEX_BITMAP (one bit
//                per element of the slice), INDEX_DENSE (no indices: every
//                element of the slice, unselected ones as 0), or INDEX_AUTO
//                (the smallest of the three for this message, before zstd).
//   value coding VALUE_FP32 (exact), VALUE_FP16, VALUE_BF16, VALUE_INT8,
//                VALUE_INT4 and VALUE_INT2 with one fp32 scale per block
//                of `block_size` sent values; rounding to nearest or
//                seeded stochastic.
//   zstd         when zstd_level != 0 (negative levels are zstd's fast
//                modes); dropped for a message it would not shrink.
//
// Error feedback: whatever a message does not carry — unselected entries,
// and the quantisation error of the sent ones — is returned to the caller
// as a residual, element by element, to be kept in its unsent accumulator:
// nothing is lost, only delayed. The encoder computes each sent value's
// residual from exactly the value a decoder will produce.
//
// Error bounds of a sent value v (the residual is v minus the decoded value):
//   FP32  exact.
//   FP16  nearest: |err| <= 2^-11 |v| for 2^-14 <= |v| <= 65504, <= 2^-25
//         below (subnormal spacing); stochastic: < one spacing (2^-10 |v|,
//         2^-24 below 2^-14). |v| > 65504 saturates to +-65504.
//   BF16  nearest: |err| <= 2^-8 |v|; stochastic: < 2^-7 |v| (normal
//         floats). Values that would round past the largest finite bf16
//         saturate to it.
//   INT8  s = max|v| of the block / 127 (rounded up), q = round(v / s) in
//         [-127, 127], decoded q * s. Nearest: |err| <= s/2; stochastic
//         (unbiased): |err| < s; both plus float rounding (< 2^-15 s).
//   INT4  the same with 7 instead of 127, two values per byte.
//   INT2  four symmetric levels {-3, -1, 1, 3} * u, u = max|v| of the block
//         / 3 (rounded up), i.e. {-s, -s/3, s/3, s}: no zero level (the
//         values it is meant for are a top-k selection's, large by
//         construction; all four codes are levels, evenly spaced, so
//         stochastic rounding is unbiased for either sign). Nearest:
//         |err| <= u; stochastic (unbiased): |err| < 2u; both plus float
//         rounding. A 0 in a block with a non-zero scale decodes as +-u
//         (its residual says so); so INDEX_DENSE with INT2 is refused and
//         INDEX_AUTO does not pick it unless every element is sent.
// Saturated and out-of-range parts always go to the residual.
//
// Encoded buffer, format version 1 (integers little-endian; varint: LEB128,
// canonical, at most 10 bytes):
//   bytes 0-1  magic "MC"
//   byte  2    format version (1)
//   byte  3    bits 0-2 value coding (pb::ValueCoding 1..6), bits 3-5 index
//              coding (pb::IndexCoding 2..4, never AUTO), bit 6 zstd, bit 7 0
//   bytes 4-7  checksum: low 32 bits of XXH64(bytes 8.., seed = bytes 0-3
//              read as a little-endian u32)
//   varint     size: elements of the slice (< 2^32)
//   varint     count: entries sent (<= size; == size for INDEX_DENSE)
//   varint     block size (INT8/INT4/INT2 only; 1..kMaxCompressionBlockSize)
//   varint     index bytes (INDEX_DELTA_VARINT only)
//   body       [index section][value section]; with the zstd bit, exactly one
//              zstd frame whose declared content size is the body's size.
// Index section: DELTA_VARINT: count varints, the first index, then each gap
// minus one; BITMAP: ceil(size / 8) bytes, bit i % 8 of byte i / 8 set iff
// element i is sent, padding bits 0; DENSE: empty. Value section: count
// values in index order: FP32 4 bytes each; FP16 and BF16 2 bytes (IEEE
// binary16, bfloat16); INT8: ceil(count / block) fp32 scales, then one
// signed byte per value (-128 never used); INT4: the scales, then two
// values per byte (low nibble first, two's complement, -8 never used, a
// final padding nibble 0); INT2: the scales, then four codes per byte
// (lowest bits first; code c in 0..3 is the level (2c - 3) * u; padding
// bits 0). A decoder needs nothing but these bytes.
//
// Thread-safety: UpdateEncoder and UpdateDecoder are thread-compatible (one
// object per thread, or external locking); distinct objects are independent.
// The free functions are thread-safe. No function throws.
#ifndef MERIDIAN_COMPRESSION_COMPRESSION_H_
#define MERIDIAN_COMPRESSION_COMPRESSION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/core/status.h"

namespace meridian {

inline constexpr uint8_t kCompressionFormatVersion = 1;
// Slices are addressed with 32-bit indices: a larger tensor travels as
// several slices.
inline constexpr uint64_t kMaxCompressedSliceElements = 0xffffffffu;
inline constexpr uint32_t kMaxCompressionBlockSize = 1u << 16;
// Largest header an encoder writes: 8 fixed bytes and four varints.
inline constexpr size_t kMaxCompressionHeaderBytes = 8 + 4 * 10;

// OK when `config` names known stages with usable parameters: a selection,
// index coding, value coding and rounding other than *_UNSPECIFIED;
// top_k_fraction in (0, 1] for TOP_K*; block_size in
// [1, kMaxCompressionBlockSize]; zstd_level 0 or within zstd's levels.
Status ValidateCompressionConfig(const pb::CompressionConfig& config);

// "top-k 1% exact > delta-varint > int8/256 nearest > zstd 1": the stages of
// `config`, for logs and benchmark tables.
std::string DescribeCompressionConfig(const pb::CompressionConfig& config);

// A sparse update of a slice of `size` elements: entries (indices[j],
// values[j]), indices strictly increasing and < size.
struct SparseUpdate {
  uint64_t size = 0;
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

// What an encode did.
struct EncodeSummary {
  uint64_t size = 0;      // elements of the slice
  uint64_t selected = 0;  // entries chosen by the selection stage
  uint64_t sent = 0;      // values in the message (size with INDEX_DENSE)
  pb::IndexCoding index_coding = pb::INDEX_CODING_UNSPECIFIED;  // never AUTO
  bool zstd = false;        // the zstd stage was kept
  uint64_t body_bytes = 0;  // index + value sections before zstd
  uint64_t encoded_bytes = 0;
};

// The encoded bytes, borrowed from the encoder that made them: valid until
// that encoder's next Encode* call, move or destruction.
struct EncodedUpdate {
  std::span<const std::byte> bytes;
  EncodeSummary summary;
};

// Encodes updates with one pipeline. Holds reusable scratch buffers and a
// zstd context, so that encoding in steady state (inputs of similar sizes)
// does not allocate. Thread-compatible. Stochastic rounding and the sample
// of TOP_K_SAMPLED draw from a generator seeded with rounding_seed that
// advances with every call: a sequence of calls is reproducible.
class UpdateEncoder {
 public:
  // Fails when ValidateCompressionConfig fails or zstd cannot allocate.
  static Result<UpdateEncoder> Create(const pb::CompressionConfig& config);

  // A moved-from encoder may only be assigned to or destroyed.

  UpdateEncoder(UpdateEncoder&&) noexcept;
  UpdateEncoder& operator=(UpdateEncoder&&) noexcept;
  ~UpdateEncoder();

  // Encodes a dense slice. Every value must be finite (NaN or +-Inf:
  // InvalidArgument) and update.size() <= kMaxCompressedSliceElements.
  // `residual` is empty (the residual is dropped) or has update.size()
  // elements and then receives residual[i] = update[i] - decoded[i] (the
  // float difference), 0 where the message is exact; it may be the very
  // same span as `update` (the accumulator keeps its own residual), but
  // must not overlap it otherwise. On error neither residual nor the
  // encoder's previous output is touched.
  Result<EncodedUpdate> EncodeDense(std::span<const float> update,
                                    std::span<float> residual);

  // Encodes a sparse set of a slice of `size` elements: entries
  // (indices[j], values[j]), indices strictly increasing and < size,
  // values finite (else InvalidArgument). `residual` is empty or has
  // values.size() elements and receives residual[j] = values[j] -
  // decoded value of entry j (values[j] itself when the entry is not
  // sent); it may be the same span as `values`, no other overlap.
  Result<EncodedUpdate> EncodeSparse(uint64_t size,
                                     std::span<const uint32_t> indices,
                                     std::span<const float> values,
                                     std::span<float> residual);

  const pb::CompressionConfig& config() const;

  // Changes the fraction a TOP_K / TOP_K_SAMPLED selection keeps (a
  // controller's density knob) from the next encode on. InvalidArgument
  // for another selection or a fraction outside (0, 1]; nothing changes
  // then.
  Status SetTopKFraction(double fraction);

 private:
  struct State;
  explicit UpdateEncoder(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The header of an encoded buffer, validated.
struct EncodedInfo {
  uint8_t version = 0;
  pb::IndexCoding index_coding = pb::INDEX_CODING_UNSPECIFIED;
  pb::ValueCoding value_coding = pb::VALUE_CODING_UNSPECIFIED;
  bool zstd = false;
  uint64_t size = 0;         // elements of the slice
  uint64_t count = 0;        // entries carried
  uint32_t block_size = 0;   // INT8/INT4/INT2; 0 otherwise
  uint64_t index_bytes = 0;  // bytes of the index section
  uint64_t body_bytes = 0;   // index + value sections (before zstd)
  size_t header_bytes = 0;   // where the (possibly compressed) body starts
};

struct DecodeOptions {
  // Verify the checksum before anything else. Turn off only to exercise
  // the parser behind it (fuzzing, corruption tests).
  bool verify_checksum = true;
};

// Parses and checks the header of `encoded` without decoding the body:
// magic, version (a different one: InvalidArgument naming it), checksum,
// codings, field ranges and their consistency, and — without zstd — the
// exact body size. DataLoss for anything corrupt or truncated.
Result<EncodedInfo> InspectEncoded(std::span<const std::byte> encoded,
                                   const DecodeOptions& options = {});

// Decodes buffers of any pipeline (the header says which). Validates
// everything before trusting it: no length or count field is used before
// it is checked against the buffer and the caller's size limit, so a
// hostile buffer gets an error — never a crash, an out-of-bounds access or
// an allocation beyond the limit. Decoded values are all finite. Holds
// reusable scratch buffers and a zstd context. Thread-compatible.
class UpdateDecoder {
 public:
  explicit UpdateDecoder(DecodeOptions options = {});
  // A moved-from decoder may only be assigned to or destroyed.
  UpdateDecoder(UpdateDecoder&&) noexcept;
  UpdateDecoder& operator=(UpdateDecoder&&) noexcept;
  ~UpdateDecoder();

  // Decodes into `out`, which the caller sizes to the slice it expects
  // (the encoded size must equal out.size(), else InvalidArgument: the
  // caller's buffer is the size limit, and scratch stays under about 18
  // bytes per element of it). Elements not carried become 0. On error
  // `out` is unspecified.
  Status DecodeDense(std::span<const std::byte> encoded, std::span<float> out);

  // Adds the decoded update into `target` (target[i] += decoded[i] for
  // every carried entry); the encoded size must equal target.size(). On
  // error `target` is unchanged.
  Status DecodeAdd(std::span<const std::byte> encoded, std::span<float> target);

  // Decodes the carried entries (all `size` of them for INDEX_DENSE,
  // zeros included) into `out`, reusing its vectors' capacity. Buffers
  // whose slice has more than `max_elements` elements are refused
  // (OutOfRange) before anything is allocated; a buffer that passes makes
  // the decoder and `out` hold at most about 18 bytes per element of its
  // slice. On error `out` is unspecified.
  Status DecodeSparse(std::span<const std::byte> encoded, uint64_t max_elements,
                      SparseUpdate* out);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace meridian

#endif  // MERIDIAN_COMPRESSION_COMPRESSION_H_
