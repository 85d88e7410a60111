// Value sections: fp32, fp16, bf16, and int8 / int4 / int2 with one fp32
// scale per block (see include/meridian/compression.h for the layout and the error
// bounds). Encoders report each value's residual (value - decoded value) so
// that error feedback keeps what the message lost.
#ifndef MERIDIAN_COMPRESSION_VALUE_CODING_H_
#define MERIDIAN_COMPRESSION_VALUE_CODING_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "meridian/job.pb.h"
#include "meridian/core/status.h"

namespace meridian::compression {

// A counter-based source of uniform 32-bit numbers: number j of a stream is
// a hash of (key, j), so encoding is reproducible and order-independent.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline uint32_t RandomAt(uint64_t key, uint64_t j) {
  return static_cast<uint32_t>(Mix64(key + j * 0xD1B54A32D192ED03ull) >> 32);
}

struct RoundingMode {
  bool stochastic = false;
  uint64_t key = 0;  // stream of the stochastic rounding of one message
};

// True for the codings with per-block scales.
inline bool HasScales(pb::ValueCoding coding) {
  return coding == pb::VALUE_INT8 || coding == pb::VALUE_INT4 ||
         coding == pb::VALUE_INT2;
}

// False for VALUE_INT2, whose four levels exclude 0: a zero value of a
// block with a non-zero scale decodes as +-s/3. Encoders do not pick
// INDEX_DENSE for it on their own (the unselected elements would arrive
// as noise), and ValidateCompressionConfig refuses it forced.
inline bool HasZeroLevel(pb::ValueCoding coding) {
  return coding != pb::VALUE_INT2;
}

// Bytes of the value section of `count` values; `block` (>= 1) matters for
// INT8/INT4/INT2 only. Exact for count < 2^32 (no overflow).
uint64_t ValueSectionBytes(pb::ValueCoding coding, uint64_t count,
                           uint32_t block);

// Writes the value section of values[0, count) to `out` (exactly
// ValueSectionBytes bytes). Values must be finite. When `residual` is not
// null it receives residual[j] = values[j] - decoded_j; it may equal
// `values` (each value is read before its residual is written) but must not
// overlap it otherwise.
void EncodeValues(pb::ValueCoding coding, uint32_t block, RoundingMode rounding,
                  const float* values, size_t count, std::byte* out,
                  float* residual);

// Decodes `count` values from `section` (which must be exactly
// ValueSectionBytes long) into out[0, count). DataLoss on any encoding a
// conforming encoder never writes: NaN/Inf values or scales, negative or
// oversized scales, the unused codes -128 (int8) and -8 (int4), a
// non-zero padding nibble or int2 padding bits. Never reads outside
// `section`. (Every int2 code is a level: only its scales and padding can
// be wrong.)
Status DecodeValues(pb::ValueCoding coding, uint32_t block,
                    std::span<const std::byte> section, size_t count,
                    float* out);

}  // namespace meridian::compression

#endif  // MERIDIAN_COMPRESSION_VALUE_CODING_H_
