// Shared helpers of the compression tests: random updates, configs, and
// hand-made encoded buffers.
#ifndef MERIDIAN_TESTS_COMPRESSION_TEST_UTIL_H_
#define MERIDIAN_TESTS_COMPRESSION_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <span>
#include <vector>

#include "compression/format.h"
#include "compression/varint.h"
#include "meridian/compression/compression.h"
#include "meridian/job.pb.h"

namespace meridian::testing {

inline pb::CompressionConfig MakeConfig(
    pb::SelectionKind selection, pb::IndexCoding index, pb::ValueCoding value,
    int zstd_level, pb::Rounding rounding = pb::ROUND_NEAREST,
    uint32_t block_size = 256, double top_k_fraction = 0.01) {
  pb::CompressionConfig config;
  config.set_selection(selection);
  config.set_index_coding(index);
  config.set_value_coding(value);
  config.set_zstd_level(zstd_level);
  config.set_rounding(rounding);
  config.set_block_size(block_size);
  config.set_top_k_fraction(top_k_fraction);
  return config;
}

// A dense slice of n elements, each non-zero with probability `density`
// (exactly one non-zero when density < 0), values normal * scale.
inline std::vector<float> RandomUpdate(size_t n, double density, uint32_t seed,
                                       float scale = 1e-3f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> value(0.0f, scale);
  std::vector<float> x(n, 0.0f);
  if (density < 0) {
    if (n > 0) x[rng() % n] = scale;
    return x;
  }
  std::bernoulli_distribution keep(density);
  for (float& v : x) {
    if (!keep(rng)) continue;
    do {
      v = value(rng);
    } while (v == 0.0f);
  }
  return x;
}

inline SparseUpdate ToSparse(std::span<const float> dense) {
  SparseUpdate sparse;
  sparse.size = dense.size();
  for (size_t i = 0; i < dense.size(); ++i) {
    if (dense[i] == 0.0f) continue;
    sparse.indices.push_back(static_cast<uint32_t>(i));
    sparse.values.push_back(dense[i]);
  }
  return sparse;
}

inline std::vector<std::byte> ToVector(std::span<const std::byte> bytes) {
  return std::vector<std::byte>(bytes.begin(), bytes.end());
}

inline std::vector<std::byte> Bytes(std::initializer_list<int> values) {
  std::vector<std::byte> bytes;
  for (int v : values) bytes.push_back(static_cast<std::byte>(v));
  return bytes;
}

inline uint8_t Codings(pb::ValueCoding value, pb::IndexCoding index,
                       bool zstd) {
  return static_cast<uint8_t>(value | (index << 3) | (zstd ? 0x40 : 0));
}

// A buffer with the given fixed header fields, header varints and body,
// with a correct checksum unless `seal` is false.
inline std::vector<std::byte> HandMade(uint8_t version, uint8_t codings,
                                       std::initializer_list<uint64_t> varints,
                                       std::span<const std::byte> body,
                                       bool seal = true) {
  std::vector<std::byte> buffer = {std::byte{'M'},
                                   std::byte{'C'},
                                   static_cast<std::byte>(version),
                                   static_cast<std::byte>(codings),
                                   std::byte{0},
                                   std::byte{0},
                                   std::byte{0},
                                   std::byte{0}};
  for (uint64_t v : varints) {
    std::byte tmp[compression::kMaxVarint64Bytes];
    std::byte* end = compression::WriteVarint(v, tmp);
    buffer.insert(buffer.end(), &tmp[0], end);
  }
  buffer.insert(buffer.end(), body.begin(), body.end());
  if (seal) compression::SealChecksum(buffer);
  return buffer;
}

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_COMPRESSION_TEST_UTIL_H_
