// Partitioners: which samples of the training set go to which site (or,
// with IID, to which worker of a site).
//
// Random choices use std::mt19937_64 (whose output the standard fixes) and
// hand-written shuffling and bounded draws, never the implementation-defined
// std::shuffle or std::uniform_*_distribution, so every process and
// platform computes the same partition from the same seed.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "meridian/dataset.h"

namespace meridian {
namespace {

using Partitions = std::vector<std::vector<uint32_t>>;

// Uniform integer in [0, bound), bound > 0, without modulo bias.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

// Uniform double in [0, 1) from 53 random bits.
double UniformUnit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

Partitions Iid(uint32_t num_samples, int num_parts, uint64_t seed) {
  std::vector<uint32_t> order(num_samples);
  for (uint32_t i = 0; i < num_samples; ++i) order[i] = i;
  std::mt19937_64 rng(seed);
  // Fisher-Yates.
  for (uint32_t i = num_samples; i > 1; --i) {
    const uint32_t j = static_cast<uint32_t>(UniformBelow(rng, i));
    std::swap(order[i - 1], order[j]);
  }
  Partitions parts(num_parts);
  for (auto& part : parts) part.reserve(num_samples / num_parts + 1);
  // Round-robin deal: shares differ by at most one.
  for (uint32_t k = 0; k < num_samples; ++k) {
    parts[k % num_parts].push_back(order[k]);
  }
  for (auto& part : parts) std::sort(part.begin(), part.end());
  return parts;
}

Result<Partitions> LabelSubset(std::span<const uint8_t> labels, int num_classes,
                               int num_parts,
                               const pb::PartitionConfig& config) {
  // owners[c]: the partitions that hold class c, in partition order.
  std::vector<std::vector<int>> owners(num_classes);
  if (config.classes_size() == 0) {
    for (int c = 0; c < num_classes; ++c) owners[c].push_back(c % num_parts);
  } else {
    if (config.classes_size() != num_parts) {
      return InvalidArgumentError(
          "LABEL_SUBSET partition lists classes for " +
          std::to_string(config.classes_size()) + " partitions but there are " +
          std::to_string(num_parts) + " (one list per partition, in order)");
    }
    for (int p = 0; p < num_parts; ++p) {
      const pb::ClassList& list = config.classes(p);
      if (list.label_size() == 0) {
        return InvalidArgumentError("LABEL_SUBSET class list " +
                                    std::to_string(p) + " is empty");
      }
      for (uint32_t label : list.label()) {
        if (label >= static_cast<uint32_t>(num_classes)) {
          return InvalidArgumentError(
              "LABEL_SUBSET class list " + std::to_string(p) + " names class " +
              std::to_string(label) + ", but labels are in [0, " +
              std::to_string(num_classes) + ")");
        }
        // A class repeated in one list counts once.
        if (owners[label].empty() || owners[label].back() != p) {
          owners[label].push_back(p);
        }
      }
    }
  }
  Partitions parts(num_parts);
  // A class held by several partitions is dealt among them in sample order,
  // so their shares of it differ by at most one.
  std::vector<uint64_t> seen(num_classes, 0);
  for (uint32_t i = 0; i < labels.size(); ++i) {
    const std::vector<int>& holders = owners[labels[i]];
    if (holders.empty()) continue;  // a class no partition holds
    parts[holders[seen[labels[i]]++ % holders.size()]].push_back(i);
  }
  return parts;
}

Result<Partitions> LabelSkew(std::span<const uint8_t> labels, int num_parts,
                             const pb::PartitionConfig& config, uint64_t seed) {
  const double skew = config.skew();
  if (!(skew >= 0.0 && skew <= 1.0)) {
    return InvalidArgumentError("LABEL_SKEW skew must be in [0, 1], got " +
                                std::to_string(skew));
  }
  std::mt19937_64 rng(seed);
  Partitions parts(num_parts);
  for (uint32_t i = 0; i < labels.size(); ++i) {
    const bool home = UniformUnit(rng) < skew;
    const int part = home ? labels[i] % num_parts
                          : static_cast<int>(UniformBelow(rng, num_parts));
    parts[part].push_back(i);
  }
  return parts;
}

}  // namespace

Result<std::vector<std::vector<uint32_t>>> PartitionIndices(
    std::span<const uint8_t> labels, int num_classes, int num_parts,
    const pb::PartitionConfig& config, uint64_t seed) {
  constexpr int kMaxParts = 1 << 20;
  if (num_parts < 1 || num_parts > kMaxParts) {
    return InvalidArgumentError(
        "cannot split samples into " + std::to_string(num_parts) +
        " partitions (allowed: 1 to " + std::to_string(kMaxParts) + ")");
  }
  if (num_classes < 1) {
    return InvalidArgumentError("number of classes must be positive, got " +
                                std::to_string(num_classes));
  }
  if (labels.size() > std::numeric_limits<uint32_t>::max()) {
    return InvalidArgumentError("too many samples to partition: " +
                                std::to_string(labels.size()));
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= num_classes) {
      return InvalidArgumentError("sample " + std::to_string(i) +
                                  " has label " + std::to_string(labels[i]) +
                                  ", outside [0, " +
                                  std::to_string(num_classes) + ")");
    }
  }
  switch (config.kind()) {
    case pb::LABEL_SUBSET:
      return LabelSubset(labels, num_classes, num_parts, config);
    case pb::LABEL_SKEW:
      return LabelSkew(labels, num_parts, config, seed);
    case pb::IID:
    default:  // PARTITION_KIND_UNSPECIFIED: the documented default, IID
      return Iid(static_cast<uint32_t>(labels.size()), num_parts, seed);
  }
}

}  // namespace meridian
