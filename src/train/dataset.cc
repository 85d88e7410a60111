// Normalisation, loading a job's raw data and the per-worker sample split.

#include "meridian/train/dataset.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meridian/config/config.h"

namespace meridian {
namespace {

// Classes assumed when the labels do not show more (Fashion-MNIST has 10).
constexpr int kDefaultNumClasses = 10;

std::string JoinPath(const std::string& dir, const std::string& file) {
  if (dir.empty()) return file;
  if (dir.back() == '/') return dir + file;
  return dir + "/" + file;
}

bool NeedsStats(pb::Normalization normalization) {
  return normalization != pb::SCALE;  // STANDARDIZE and UNSPECIFIED
}

// Keeps the first `limit` samples (all when 0).
void LimitImages(uint32_t limit, IdxImages* images) {
  if (limit == 0 || limit >= images->count) return;
  images->count = limit;
  images->pixels.resize(uint64_t{limit} * images->dim());
  images->pixels.shrink_to_fit();
}

void LimitLabels(uint32_t limit, std::vector<uint8_t>* labels) {
  if (limit == 0 || limit >= labels->size()) return;
  labels->resize(limit);
  labels->shrink_to_fit();
}

// Reads one image/label file pair and checks that they agree.
Status LoadPair(const std::string& images_path, const std::string& labels_path,
                uint32_t limit, IdxImages* images,
                std::vector<uint8_t>* labels) {
  MERIDIAN_ASSIGN_OR_RETURN(*images, ReadIdxImages(images_path));
  MERIDIAN_ASSIGN_OR_RETURN(*labels, ReadIdxLabels(labels_path));
  if (images->count != labels->size()) {
    return InvalidArgumentError("image file " + images_path + " holds " +
                                std::to_string(images->count) +
                                " samples but label file " + labels_path +
                                " holds " + std::to_string(labels->size()) +
                                " labels; they must describe the same samples");
  }
  LimitImages(limit, images);
  LimitLabels(limit, labels);
  return Status::Ok();
}

// A well-mixed 64-bit value from `x` (SplitMix64 finaliser).
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Status CheckSiteIndex(const pb::JobConfig& config, int site_index) {
  const int num_sites = config.site_size();
  if (site_index < 0 || site_index >= num_sites) {
    return OutOfRangeError("site index " + std::to_string(site_index) +
                           " is outside [0, " + std::to_string(num_sites) +
                           ")");
  }
  return Status::Ok();
}

}  // namespace

PixelStats ComputePixelStats(const IdxImages& images) {
  // A histogram of byte values gives exact statistics in one cheap pass.
  std::array<uint64_t, 256> histogram{};
  for (uint8_t pixel : images.pixels) ++histogram[pixel];
  const double total = static_cast<double>(images.pixels.size());
  PixelStats stats;
  if (images.pixels.empty()) return stats;
  double sum = 0;
  for (int v = 0; v < 256; ++v) sum += v / 255.0 * histogram[v];
  const double mean = sum / total;
  double squares = 0;
  for (int v = 0; v < 256; ++v) {
    const double d = v / 255.0 - mean;
    squares += d * d * histogram[v];
  }
  const double stddev = std::sqrt(squares / total);
  stats.mean = static_cast<float>(mean);
  // Constant images: keep the scale rather than divide by zero.
  stats.stddev = stddev > 1e-6 ? static_cast<float>(stddev) : 1.0f;
  return stats;
}

Dataset MakeDataset(const IdxImages& images, std::span<const uint8_t> labels,
                    std::span<const uint32_t> indices,
                    pb::Normalization normalization, const PixelStats& stats,
                    int num_classes) {
  // Samples that have both pixels and a label; other indices are skipped.
  const uint64_t available = std::min<uint64_t>(
      {uint64_t{images.count}, labels.size(),
       images.dim() == 0 ? 0 : images.pixels.size() / images.dim()});
  std::vector<uint32_t> all;
  if (indices.empty()) {
    all.resize(available);
    for (uint64_t i = 0; i < available; ++i) all[i] = static_cast<uint32_t>(i);
    indices = all;
  }
  uint64_t kept = 0;
  for (uint32_t index : indices) kept += index < available;

  // One lookup per pixel: 256 possible inputs.
  std::array<float, 256> table;
  const bool standardize = NeedsStats(normalization);
  const float inv_stddev = stats.stddev != 0 ? 1.0f / stats.stddev : 1.0f;
  for (int v = 0; v < 256; ++v) {
    const float scaled = static_cast<float>(v) / 255.0f;
    table[v] = standardize ? (scaled - stats.mean) * inv_stddev : scaled;
  }

  const uint32_t dim = images.dim();
  Dataset data;
  data.num_classes = num_classes;
  data.features.resize(dim, static_cast<Eigen::Index>(kept));
  data.labels.reserve(kept);
  Eigen::Index column = 0;
  for (uint32_t index : indices) {
    if (index >= available) continue;
    const uint8_t* pixels = images.pixels.data() + uint64_t{index} * dim;
    float* out = data.features.col(column).data();
    for (uint32_t i = 0; i < dim; ++i) out[i] = table[pixels[i]];
    data.labels.push_back(labels[index]);
    ++column;
  }
  return data;
}

Result<std::vector<uint8_t>> LoadTrainLabels(const pb::DataConfig& config) {
  if (config.has_ratings()) {
    return InvalidArgumentError(
        "data.ratings is a generated rating matrix, not labelled images");
  }
  MERIDIAN_ASSIGN_OR_RETURN(
      std::vector<uint8_t> labels,
      ReadIdxLabels(JoinPath(config.dir(), config.train_labels())));
  LimitLabels(config.train_limit(), &labels);
  return labels;
}

Result<RawData> LoadRawData(const pb::DataConfig& config, bool load_train,
                            bool load_test) {
  if (config.has_ratings()) {
    MERIDIAN_ASSIGN_OR_RETURN(RawData raw, GenerateRatings(config.ratings()));
    if (config.train_limit() > 0 &&
        raw.train_labels.size() > config.train_limit()) {
      raw.train_labels.resize(config.train_limit());
      raw.train_pairs.resize(2 * uint64_t{config.train_limit()});
    }
    if (config.test_limit() > 0 &&
        raw.test_labels.size() > config.test_limit()) {
      raw.test_labels.resize(config.test_limit());
      raw.test_pairs.resize(2 * uint64_t{config.test_limit()});
    }
    return raw;
  }
  RawData raw;
  if (load_train) {
    MERIDIAN_RETURN_IF_ERROR(
        LoadPair(JoinPath(config.dir(), config.train_images()),
                 JoinPath(config.dir(), config.train_labels()),
                 config.train_limit(), &raw.train_images, &raw.train_labels));
  }
  if (load_test) {
    MERIDIAN_RETURN_IF_ERROR(
        LoadPair(JoinPath(config.dir(), config.test_images()),
                 JoinPath(config.dir(), config.test_labels()),
                 config.test_limit(), &raw.test_images, &raw.test_labels));
  }
  if (load_train && load_test &&
      (raw.train_images.rows != raw.test_images.rows ||
       raw.train_images.cols != raw.test_images.cols)) {
    return InvalidArgumentError(
        "training images are " + std::to_string(raw.train_images.rows) + "x" +
        std::to_string(raw.train_images.cols) + " but test images are " +
        std::to_string(raw.test_images.rows) + "x" +
        std::to_string(raw.test_images.cols));
  }
  if (NeedsStats(config.normalization())) {
    if (load_train) {
      raw.stats = ComputePixelStats(raw.train_images);
    } else {
      // Standardising the test set needs the training set's statistics:
      // read the (limited) training images for them, then drop them.
      const std::string path = JoinPath(config.dir(), config.train_images());
      MERIDIAN_ASSIGN_OR_RETURN(IdxImages train_images, ReadIdxImages(path));
      LimitImages(config.train_limit(), &train_images);
      raw.stats = ComputePixelStats(train_images);
    }
  }
  return raw;
}

int PartitionClassCount(std::span<const uint8_t> train_labels) {
  int num_classes = kDefaultNumClasses;
  for (uint8_t label : train_labels) {
    num_classes = std::max(num_classes, int{label} + 1);
  }
  return num_classes;
}

Result<std::vector<uint32_t>> SiteSampleIndices(
    const pb::JobConfig& config, std::span<const uint8_t> train_labels,
    int site_index) {
  MERIDIAN_RETURN_IF_ERROR(CheckSiteIndex(config, site_index));
  MERIDIAN_ASSIGN_OR_RETURN(
      std::vector<std::vector<uint32_t>> sites,
      PartitionIndices(train_labels, PartitionClassCount(train_labels),
                       config.site_size(), config.data().site_partition(),
                       config.seed()));
  return std::move(sites[site_index]);
}

Result<std::vector<uint64_t>> SiteLabelHistogram(
    const pb::JobConfig& config, std::span<const uint8_t> train_labels,
    int site_index) {
  MERIDIAN_ASSIGN_OR_RETURN(
      const std::vector<uint32_t> share,
      SiteSampleIndices(config, train_labels, site_index));
  std::vector<uint64_t> histogram(PartitionClassCount(train_labels), 0);
  for (uint32_t index : share) ++histogram[train_labels[index]];
  return histogram;
}

Result<std::vector<uint32_t>> WorkerSampleIndices(
    const pb::JobConfig& config, std::span<const uint8_t> train_labels,
    int site_index, int worker_index) {
  MERIDIAN_RETURN_IF_ERROR(CheckSiteIndex(config, site_index));
  const uint32_t num_workers = SiteWorkerCount(config.site(site_index));
  if (worker_index < 0 || static_cast<uint32_t>(worker_index) >= num_workers) {
    return OutOfRangeError("worker index " + std::to_string(worker_index) +
                           " is outside [0, " + std::to_string(num_workers) +
                           ") for site '" + config.site(site_index).name() +
                           "'");
  }
  MERIDIAN_ASSIGN_OR_RETURN(
      const std::vector<uint32_t> share,
      SiteSampleIndices(config, train_labels, site_index));

  // IID split of the site's share; labels do not matter for IID.
  std::vector<uint8_t> share_labels(share.size());
  for (size_t i = 0; i < share.size(); ++i) {
    share_labels[i] = train_labels[share[i]];
  }
  const uint64_t worker_seed =
      Mix(config.seed() ^ Mix(static_cast<uint64_t>(site_index) + 1));
  MERIDIAN_ASSIGN_OR_RETURN(
      std::vector<std::vector<uint32_t>> workers,
      PartitionIndices(share_labels, PartitionClassCount(share_labels),
                       static_cast<int>(num_workers), pb::PartitionConfig(),
                       worker_seed));
  std::vector<uint32_t> indices;
  indices.reserve(workers[worker_index].size());
  // Positions in the share back to training-set indices; the share is
  // sorted and so are the positions, hence the result is sorted too.
  for (uint32_t position : workers[worker_index]) {
    indices.push_back(share[position]);
  }
  return indices;
}

}  // namespace meridian
