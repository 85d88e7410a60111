// Partitioners: which samples of the training set go to which site (or,
// with IID, to which worker of a site).
//
// Random choices use std::mt19937_64 (whose output the standard fixes) and
// hand-written shuffling, bounded, normal and gamma draws, never the
// implementation-defined std::shuffle or std::*_distribution, so every
// process and platform computes the same partition from the same seed. The
// Dirichlet draws also use std::log, std::exp and std::sqrt: sqrt is exact
// (IEEE 754); log and exp are the C library's, so the processes of one job
// need the same one (as when they run one build on one distribution): a
// libm that differs in a last bit could, rarely, move a cut by a sample.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "meridian/core/format.h"
#include "meridian/train/dataset.h"
#include "train/random_draws.h"

namespace meridian {
namespace {

using Partitions = std::vector<std::vector<uint32_t>>;

using random_draws::StandardNormal;
using random_draws::UniformBelow;
using random_draws::UniformUnit;

// "{0,3,7}".
std::string FormatClasses(const std::vector<uint32_t>& classes) {
  std::string text = "{";
  for (size_t i = 0; i < classes.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(classes[i]);
  }
  return text + "}";
}

// log of a Gamma(shape, 1) draw. Marsaglia and Tsang (2000) for shape >= 1;
// below 1 the boost Gamma(shape) = Gamma(shape + 1) * U^(1/shape), kept in
// the log domain because for small shapes the draw itself underflows to 0
// (alpha 0.01 gives values like 1e-300). Requires shape finite and > 0.
double LogGamma(std::mt19937_64& rng, double shape) {
  if (shape < 1) {
    const double boosted = LogGamma(rng, shape + 1);
    const double u = 1 - UniformUnit(rng);  // (0, 1]: its log is finite
    return boosted + std::log(u) / shape;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1 / std::sqrt(9 * d);
  for (;;) {
    const double x = StandardNormal(rng);
    double v = 1 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = UniformUnit(rng);
    const double x2 = x * x;
    if (u < 1 - 0.0331 * x2 * x2 ||  // the squeeze: no log most of the time
        std::log(u) < 0.5 * x2 + d * (1 - v + std::log(v))) {
      return std::log(d) + std::log(v);
    }
  }
}

// Proportions over `num_parts` drawn from Dirichlet(alpha, ..., alpha):
// normalised gamma draws, exponentiated relative to the largest log so that
// none overflows and the largest share is never lost to underflow.
std::vector<double> DirichletShares(std::mt19937_64& rng, double alpha,
                                    int num_parts) {
  std::vector<double> logs(num_parts);
  for (double& value : logs) value = LogGamma(rng, alpha);
  const double top = *std::max_element(logs.begin(), logs.end());
  std::vector<double> shares(num_parts);
  double sum = 0;
  for (int p = 0; p < num_parts; ++p) {
    // Equal to the top (also when every log is -inf): weight 1, not NaN.
    shares[p] = logs[p] == top ? 1.0 : std::exp(logs[p] - top);
    sum += shares[p];
  }
  for (double& share : shares) share /= sum;
  return shares;
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

// DIRICHLET: see pb::PartitionKind and PartitionIndices.
Result<Partitions> Dirichlet(std::span<const uint8_t> labels, int num_classes,
                             int num_parts, const pb::PartitionConfig& config,
                             uint64_t seed) {
  // NIID-Bench draws again without bound; a bound turns a hopeless setting
  // (more partitions than alpha lets the classes reach) into an error.
  constexpr int kMaxDraws = 1000;
  const double alpha = config.alpha();
  if (!(std::isfinite(alpha) && alpha > 0)) {
    return InvalidArgumentError("DIRICHLET alpha must be finite and > 0, got " +
                                FormatReal(alpha));
  }
  const uint64_t min_samples = config.min_samples();
  if (labels.size() <
      uint64_t{static_cast<uint32_t>(num_parts)} * min_samples) {
    return InvalidArgumentError(
        "DIRICHLET min_samples " + std::to_string(min_samples) +
        " in each of " + std::to_string(num_parts) + " partitions needs " +
        std::to_string(num_parts * min_samples) + " samples, but there are " +
        std::to_string(labels.size()) + "; lower min_samples");
  }
  std::mt19937_64 rng(seed);
  // Each class's samples in a seeded order (Fisher-Yates), shuffled once;
  // the draws below only move the cuts.
  std::vector<std::vector<uint32_t>> by_class(num_classes);
  for (uint32_t i = 0; i < labels.size(); ++i) by_class[labels[i]].push_back(i);
  for (std::vector<uint32_t>& samples : by_class) {
    for (size_t i = samples.size(); i > 1; --i) {
      std::swap(samples[i - 1], samples[UniformBelow(rng, i)]);
    }
  }
  // ends[c][p]: partition p holds by_class[c][ends[c][p - 1], ends[c][p]).
  std::vector<std::vector<uint64_t>> ends(num_classes,
                                          std::vector<uint64_t>(num_parts));
  for (int draw = 0; draw < kMaxDraws; ++draw) {
    std::vector<uint64_t> totals(num_parts, 0);
    for (int c = 0; c < num_classes; ++c) {
      const std::vector<double> shares = DirichletShares(rng, alpha, num_parts);
      const uint64_t n = by_class[c].size();
      // Cuts at the rounded cumulative shares: monotone, and the last one is
      // n, so the counts sum to n exactly.
      double cumulative = 0;
      uint64_t begin = 0;
      for (int p = 0; p < num_parts; ++p) {
        cumulative += shares[p];
        uint64_t end = n;
        if (p + 1 < num_parts) {
          const double cut = std::round(cumulative * static_cast<double>(n));
          end = std::clamp(static_cast<uint64_t>(std::max(cut, 0.0)), begin, n);
        }
        ends[c][p] = end;
        totals[p] += end - begin;
        begin = end;
      }
    }
    if (*std::min_element(totals.begin(), totals.end()) < min_samples) {
      continue;
    }
    Partitions parts(num_parts);
    for (int p = 0; p < num_parts; ++p) parts[p].reserve(totals[p]);
    for (int c = 0; c < num_classes; ++c) {
      uint64_t begin = 0;
      for (int p = 0; p < num_parts; ++p) {
        parts[p].insert(parts[p].end(), by_class[c].begin() + begin,
                        by_class[c].begin() + ends[c][p]);
        begin = ends[c][p];
      }
    }
    for (auto& part : parts) std::sort(part.begin(), part.end());
    return parts;
  }
  return InvalidArgumentError(
      "DIRICHLET alpha " + FormatReal(alpha) + " left some of the " +
      std::to_string(num_parts) + " partitions with fewer than min_samples " +
      std::to_string(min_samples) + " samples in each of " +
      std::to_string(kMaxDraws) + " draws (" + std::to_string(num_classes) +
      " classes, " + std::to_string(labels.size()) +
      " samples); raise alpha or lower min_samples");
}

// CLASSES_PER_PART: the class lists of ClassesOfPartition, dealt by
// LabelSubset.
Result<Partitions> ClassesPerPart(std::span<const uint8_t> labels,
                                  int num_classes, int num_parts,
                                  const pb::PartitionConfig& config) {
  const uint64_t k = config.classes_per_part();
  if (k < 1 || k > static_cast<uint64_t>(num_classes)) {
    return InvalidArgumentError(
        "CLASSES_PER_PART classes_per_part must be in [1, " +
        std::to_string(num_classes) + "] (the number of classes), got " +
        std::to_string(k));
  }
  if (k * static_cast<uint64_t>(num_parts) <
      static_cast<uint64_t>(num_classes)) {
    return InvalidArgumentError(
        "CLASSES_PER_PART classes_per_part " + std::to_string(k) + " over " +
        std::to_string(num_parts) + " partitions holds " +
        std::to_string(k * num_parts) + " classes, fewer than the " +
        std::to_string(num_classes) +
        ": every class needs a partition (classes_per_part >= " +
        std::to_string((num_classes + num_parts - 1) / num_parts) + ")");
  }
  pb::PartitionConfig subset;
  subset.set_kind(pb::LABEL_SUBSET);
  for (int p = 0; p < num_parts; ++p) {
    pb::ClassList* list = subset.add_classes();
    for (uint32_t c : ClassesOfPartition(config, num_classes, num_parts, p)) {
      list->add_label(c);
    }
  }
  return LabelSubset(labels, num_classes, num_parts, subset);
}

}  // namespace

std::vector<uint32_t> ClassesOfPartition(const pb::PartitionConfig& config,
                                         int num_classes, int num_parts,
                                         int part) {
  std::vector<uint32_t> classes;
  if (num_classes < 1 || num_parts < 1 || part < 0 || part >= num_parts) {
    return classes;
  }
  switch (config.kind()) {
    case pb::LABEL_SUBSET:
      if (config.classes_size() == 0) {
        for (int c = part; c < num_classes; c += num_parts) {
          classes.push_back(c);
        }
      } else if (part < config.classes_size()) {
        for (uint32_t c : config.classes(part).label()) {
          if (c < static_cast<uint32_t>(num_classes)) classes.push_back(c);
        }
      }
      break;
    case pb::LABEL_SKEW:  // the home classes
      for (int c = part; c < num_classes; c += num_parts) {
        classes.push_back(c);
      }
      break;
    case pb::CLASSES_PER_PART: {
      const uint64_t k = std::min<uint64_t>(config.classes_per_part(),
                                            static_cast<uint64_t>(num_classes));
      for (uint64_t j = 0; j < k; ++j) {
        classes.push_back(
            static_cast<uint32_t>((static_cast<uint64_t>(part) * k + j) %
                                  static_cast<uint64_t>(num_classes)));
      }
      break;
    }
    default:  // IID and DIRICHLET: no fixed classes
      break;
  }
  std::sort(classes.begin(), classes.end());
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  return classes;
}

std::string DescribePartition(const pb::PartitionConfig& config,
                              int num_classes, int num_parts, int part) {
  const std::string classes =
      FormatClasses(ClassesOfPartition(config, num_classes, num_parts, part));
  switch (config.kind()) {
    case pb::LABEL_SUBSET:
      return "LABEL_SUBSET " + classes;
    case pb::LABEL_SKEW:
      return "LABEL_SKEW skew=" + FormatReal(config.skew()) + " home " +
             classes;
    case pb::DIRICHLET:
      return "DIRICHLET alpha=" + FormatReal(config.alpha()) +
             " min_samples=" + std::to_string(config.min_samples());
    case pb::CLASSES_PER_PART:
      return "CLASSES_PER_PART k=" + std::to_string(config.classes_per_part()) +
             " " + classes;
    default:
      return "IID";
  }
}

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
    case pb::DIRICHLET:
      return Dirichlet(labels, num_classes, num_parts, config, seed);
    case pb::CLASSES_PER_PART:
      return ClassesPerPart(labels, num_classes, num_parts, config);
    case pb::IID:
    default:  // PARTITION_KIND_UNSPECIFIED: the documented default, IID
      return Iid(static_cast<uint32_t>(labels.size()), num_parts, seed);
  }
}

}  // namespace meridian
