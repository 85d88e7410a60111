// XXH64 (xxHash, 64-bit variant, as specified by its reference
// implementation): the integrity check of encoded buffers. Not
// cryptographic: it catches corruption, not forgery.
#ifndef MERIDIAN_COMPRESSION_CHECKSUM_H_
#define MERIDIAN_COMPRESSION_CHECKSUM_H_

#include <cstddef>
#include <cstdint>
#include <span>

namespace meridian::compression {

// XXH64 of `bytes` with `seed`. Thread-safe; reads `bytes` only.
uint64_t Xxh64(std::span<const std::byte> bytes, uint64_t seed);

}  // namespace meridian::compression

#endif  // MERIDIAN_COMPRESSION_CHECKSUM_H_
