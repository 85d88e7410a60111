// The generated rating matrix of matrix-factorisation jobs (Gaia's MF
// workload on Netflix, made here): Zipf item popularity and user activity,
// planted low-rank structure plus noise, integer ratings 1..5.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "meridian/train/dataset.h"
#include "train/random_draws.h"

namespace meridian {
namespace {

using random_draws::StandardNormal;
using random_draws::UniformBelow;
using random_draws::UniformUnit;

// Rounds of drawing more pairs before giving up on distinct ones.
constexpr int kMaxDrawRounds = 64;
// The planted ratings: mean, bias spreads, and the variance of the planted
// dot products (Netflix's ratings average about 3.6 with a spread of about
// 1.1).
constexpr double kMeanRating = 3.6;
constexpr double kUserBiasStddev = 0.3;
constexpr double kItemBiasStddev = 0.5;
constexpr double kDotVariance = 0.5;

// Cumulative Zipf weights 1 / (k + 1)^exponent over `n` ranks, scaled to 1.
std::vector<double> ZipfCdf(uint32_t n, double exponent) {
  std::vector<double> cdf(n);
  double sum = 0;
  for (uint32_t k = 0; k < n; ++k) {
    sum += std::pow(static_cast<double>(k) + 1, -exponent);
    cdf[k] = sum;
  }
  for (double& c : cdf) c /= sum;
  return cdf;
}

uint32_t DrawFrom(const std::vector<double>& cdf, std::mt19937_64& rng) {
  const double u = UniformUnit(rng);
  const auto it = std::upper_bound(cdf.begin(), cdf.end(), u);
  return static_cast<uint32_t>(
      std::min<ptrdiff_t>(it - cdf.begin(), std::ssize(cdf) - 1));
}

// A seeded permutation of [0, n): which row has popularity rank k.
std::vector<uint32_t> Permutation(uint32_t n, std::mt19937_64& rng) {
  std::vector<uint32_t> p(n);
  for (uint32_t i = 0; i < n; ++i) p[i] = i;
  for (uint32_t i = n; i > 1; --i) {
    std::swap(p[i - 1], p[UniformBelow(rng, i)]);
  }
  return p;
}

std::vector<float> Normals(uint64_t n, double stddev, std::mt19937_64& rng) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(stddev * StandardNormal(rng));
  return v;
}

Status CheckRatingsConfig(const pb::RatingsConfig& c) {
  auto bad = [](const std::string& field, const std::string& why) {
    return InvalidArgumentError("data.ratings." + field + " " + why);
  };
  if (c.users() < 1 || c.users() > kMaxMatrixRows) {
    return bad("users",
               "must be in [1, 2^24], got " + std::to_string(c.users()));
  }
  if (c.items() < 1 || c.items() > kMaxMatrixRows) {
    return bad("items",
               "must be in [1, 2^24], got " + std::to_string(c.items()));
  }
  if (c.rank() < 1 || c.rank() > kMaxFactorRank) {
    return bad("rank", "must be in [1, 1024], got " + std::to_string(c.rank()));
  }
  const uint64_t cells = uint64_t{c.users()} * c.items();
  if (c.ratings() < 2 || c.ratings() > cells / 2) {
    return bad("ratings", "must be in [2, users x items / 2 = " +
                              std::to_string(cells / 2) + "], got " +
                              std::to_string(c.ratings()));
  }
  if (!std::isfinite(c.zipf_exponent()) || c.zipf_exponent() < 0) {
    return bad("zipf_exponent", "must be a finite number >= 0");
  }
  if (!std::isfinite(c.user_zipf_exponent()) || c.user_zipf_exponent() < 0) {
    return bad("user_zipf_exponent", "must be a finite number >= 0");
  }
  if (!std::isfinite(c.noise_stddev()) || c.noise_stddev() < 0) {
    return bad("noise_stddev", "must be a finite number >= 0");
  }
  if (!(c.test_fraction() > 0 && c.test_fraction() < 1)) {
    return bad("test_fraction", "must be in (0, 1)");
  }
  return Status::Ok();
}

}  // namespace

Result<RawData> GenerateRatings(const pb::RatingsConfig& config) {
  MERIDIAN_RETURN_IF_ERROR(CheckRatingsConfig(config));
  const uint32_t users = config.users();
  const uint32_t items = config.items();
  const uint32_t rank = config.rank();
  std::mt19937_64 rng(config.seed());

  // The planted model.
  const double factor_stddev = std::pow(kDotVariance / rank, 0.25);
  const std::vector<float> user_factors =
      Normals(uint64_t{users} * rank, factor_stddev, rng);
  const std::vector<float> item_factors =
      Normals(uint64_t{items} * rank, factor_stddev, rng);
  const std::vector<float> user_bias = Normals(users, kUserBiasStddev, rng);
  const std::vector<float> item_bias = Normals(items, kItemBiasStddev, rng);

  // Distinct (user, item) pairs by popularity, drawn until there are
  // enough: sorted and deduplicated after each round.
  const std::vector<double> user_cdf =
      ZipfCdf(users, config.user_zipf_exponent());
  const std::vector<double> item_cdf = ZipfCdf(items, config.zipf_exponent());
  const std::vector<uint32_t> user_of_rank = Permutation(users, rng);
  const std::vector<uint32_t> item_of_rank = Permutation(items, rng);
  const uint64_t wanted = config.ratings();
  std::vector<uint64_t> pairs;
  pairs.reserve(wanted + wanted / 8);
  for (int round = 0; pairs.size() < wanted; ++round) {
    if (round == kMaxDrawRounds) {
      return ResourceExhaustedError(
          "data.ratings: found only " + std::to_string(pairs.size()) +
          " distinct (user, item) pairs of the " + std::to_string(wanted) +
          " asked for after " + std::to_string(kMaxDrawRounds) +
          " rounds: popularity is too concentrated; lower zipf_exponent, "
          "user_zipf_exponent or ratings");
    }
    const uint64_t missing = wanted - pairs.size();
    for (uint64_t k = 0; k < missing + missing / 16 + 16; ++k) {
      const uint32_t u = user_of_rank[DrawFrom(user_cdf, rng)];
      const uint32_t i = item_of_rank[DrawFrom(item_cdf, rng)];
      pairs.push_back(uint64_t{u} << 32 | i);
    }
    std::sort(pairs.begin(), pairs.end());
    pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  }
  // Which pairs are kept (the first `wanted` of a seeded shuffle) and in
  // what order: the shuffle makes the order independent of the indices.
  for (uint64_t k = pairs.size(); k > 1; --k) {
    std::swap(pairs[k - 1], pairs[UniformBelow(rng, k)]);
  }
  pairs.resize(wanted);

  const auto test_count = static_cast<uint64_t>(std::clamp<double>(
      std::round(config.test_fraction() * static_cast<double>(wanted)), 1,
      static_cast<double>(wanted - 1)));
  RawData raw;
  raw.ratings = true;
  raw.test_pairs.reserve(2 * test_count);
  raw.train_pairs.reserve(2 * (wanted - test_count));
  raw.test_labels.reserve(test_count);
  raw.train_labels.reserve(wanted - test_count);
  for (uint64_t k = 0; k < wanted; ++k) {
    const auto u = static_cast<uint32_t>(pairs[k] >> 32);
    const auto i = static_cast<uint32_t>(pairs[k]);
    const float* pu = user_factors.data() + uint64_t{u} * rank;
    const float* pv = item_factors.data() + uint64_t{i} * rank;
    double dot = 0;
    for (uint32_t r = 0; r < rank; ++r) dot += double{pu[r]} * pv[r];
    const double value = kMeanRating + user_bias[u] + item_bias[i] + dot +
                         config.noise_stddev() * StandardNormal(rng);
    const auto rating =
        static_cast<uint8_t>(std::clamp<double>(std::round(value), 1, 5));
    const bool test = k < test_count;
    std::vector<uint32_t>& out = test ? raw.test_pairs : raw.train_pairs;
    out.push_back(u);
    out.push_back(i);
    (test ? raw.test_labels : raw.train_labels).push_back(rating);
  }
  return raw;
}

int RawData::input_dim() const {
  if (ratings) return 2;
  return static_cast<int>(train_images.count > 0 ? train_images.dim()
                                                 : test_images.dim());
}

namespace {

Dataset MakeRatingsDataset(std::span<const uint32_t> pairs,
                           std::span<const uint8_t> ratings,
                           std::span<const uint32_t> indices) {
  const uint64_t available =
      std::min<uint64_t>(pairs.size() / 2, ratings.size());
  uint64_t kept = indices.empty() ? available : 0;
  for (uint32_t index : indices) kept += index < available;
  Dataset data;
  data.num_classes = 6;
  data.features.resize(2, static_cast<Eigen::Index>(kept));
  data.labels.reserve(kept);
  auto add = [&](uint64_t index) {
    const auto column = static_cast<Eigen::Index>(data.labels.size());
    data.features(0, column) = static_cast<float>(pairs[2 * index]);
    data.features(1, column) = static_cast<float>(pairs[2 * index + 1]);
    data.labels.push_back(ratings[index]);
  };
  if (indices.empty()) {
    for (uint64_t k = 0; k < available; ++k) add(k);
  } else {
    for (uint32_t index : indices) {
      if (index < available) add(index);
    }
  }
  return data;
}

}  // namespace

Dataset MakeTrainDataset(const RawData& raw, std::span<const uint32_t> indices,
                         pb::Normalization normalization) {
  if (raw.ratings) {
    return MakeRatingsDataset(raw.train_pairs, raw.train_labels, indices);
  }
  return MakeDataset(raw.train_images, raw.train_labels, indices, normalization,
                     raw.stats);
}

Dataset MakeTestDataset(const RawData& raw, pb::Normalization normalization) {
  if (raw.ratings)
    return MakeRatingsDataset(raw.test_pairs, raw.test_labels, {});
  return MakeDataset(raw.test_images, raw.test_labels, {}, normalization,
                     raw.stats);
}

}  // namespace meridian
