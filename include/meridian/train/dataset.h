// Data: IDX files (gzip or plain, through zlib), normalisation, and the
// partitioners that decide which samples live at which site and worker.
#ifndef MERIDIAN_TRAIN_DATASET_H_
#define MERIDIAN_TRAIN_DATASET_H_

#include <Eigen/Core>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/core/status.h"

namespace meridian {

// Raw images of an IDX3 file: count x rows x cols unsigned bytes.
struct IdxImages {
  uint32_t count = 0;
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols, sample-major
  uint32_t dim() const { return rows * cols; }
};

// Reads an IDX3 ubyte image file (magic 0x00000803), gzip-compressed or
// not. Errors name the path: NotFound for a missing file (under the default
// data directory it also names the Debian package dataset-fashion-mnist);
// DataLoss for a wrong magic number, implausible dimensions, a file shorter
// or longer than its header says, or a corrupt gzip stream. Memory grows
// with the bytes actually read, never with what a header claims.
Result<IdxImages> ReadIdxImages(const std::string& path);
// Reads an IDX1 ubyte label file (magic 0x00000801).
Result<std::vector<uint8_t>> ReadIdxLabels(const std::string& path);

// Writes gzip-compressed IDX files (tests and generated data sets).
Status WriteIdxImages(const std::string& path, const IdxImages& images);
Status WriteIdxLabels(const std::string& path, std::span<const uint8_t> labels);

// Global pixel statistics after scaling to [0, 1] (population stddev; 1 when
// there are no pixels or they are all equal).
struct PixelStats {
  float mean = 0;
  float stddev = 1;
};
PixelStats ComputePixelStats(const IdxImages& images);

// Samples ready for a model: one column per sample.
struct Dataset {
  Eigen::MatrixXf features;  // dim x size
  std::vector<uint8_t> labels;
  int num_classes = 10;

  uint64_t size() const { return labels.size(); }
  int input_dim() const { return static_cast<int>(features.rows()); }
};

// Builds a Dataset from the samples `indices` (all when empty) of the raw
// images, in that order, normalised as `normalization` says (STANDARDIZE and
// NORMALIZATION_UNSPECIFIED use `stats`). Indices without both pixels and a
// label are skipped.
Dataset MakeDataset(const IdxImages& images, std::span<const uint8_t> labels,
                    std::span<const uint32_t> indices,
                    pb::Normalization normalization, const PixelStats& stats,
                    int num_classes = 10);

// Splits the sample indices [0, labels.size()) into `num_parts` partitions
// as `config` says (see pb::PartitionKind). Deterministic in `seed` (on every
// platform); every sample lands in at most one partition; each partition is
// sorted; IID shares differ by at most one. LABEL_SUBSET: a class listed
// for several partitions is dealt among them in sample order (shares differ
// by at most one), samples of unlisted classes are left out. LABEL_SKEW:
// each sample goes home (label % num_parts) with probability skew, else to a
// uniformly random partition. DIRICHLET: every sample lands in exactly one
// partition; for each class, shares p ~ Dirichlet(alpha) over the partitions
// cut the class's seeded shuffle at the rounded cumulative shares; all
// classes are drawn again (at most 1000 times, the draws continuing the
// seeded stream) until every partition holds at least min_samples.
// CLASSES_PER_PART: partition p holds the classes ClassesOfPartition names,
// each dealt among its holders as with LABEL_SUBSET; every sample lands in
// exactly one partition. PARTITION_KIND_UNSPECIFIED is IID.
// InvalidArgument for num_parts outside [1, 2^20], num_classes < 1, a label
// >= num_classes, a LABEL_SUBSET list count other than num_parts (when any
// are given), an empty list or an unknown class, a skew outside [0, 1], an
// alpha not finite and > 0, fewer samples than num_parts * min_samples,
// min_samples still not reached after 1000 draws (the message names alpha),
// a classes_per_part k outside [1, num_classes] or with num_parts * k <
// num_classes (some class would have no partition).
Result<std::vector<std::vector<uint32_t>>> PartitionIndices(
    std::span<const uint8_t> labels, int num_classes, int num_parts,
    const pb::PartitionConfig& config, uint64_t seed);

// The classes partition `part` holds by construction, sorted: LABEL_SUBSET
// its list (label % num_parts == part without lists), LABEL_SKEW its home
// classes (the same), CLASSES_PER_PART (part * k + j) % num_classes for
// j < k (k = classes_per_part, at most num_classes), so consecutive
// partitions take consecutive blocks of classes, wrapping around, and each
// class has floor or ceil of num_parts * k / num_classes holders. Empty for
// IID, DIRICHLET and arguments out of range.
std::vector<uint32_t> ClassesOfPartition(const pb::PartitionConfig& config,
                                         int num_classes, int num_parts,
                                         int part);

// Partition `part` in words for reports: "IID", "DIRICHLET alpha=0.1
// min_samples=10", "LABEL_SUBSET {0,1,2}", "LABEL_SKEW skew=0.8 home {1,4}",
// "CLASSES_PER_PART k=2 {2,3}".
std::string DescribePartition(const pb::PartitionConfig& config,
                              int num_classes, int num_parts, int part);

// Limits of rating matrices and their factorisation: users and items are
// exact as floats (a rating's features), ranks stay small.
inline constexpr uint32_t kMaxMatrixRows = uint32_t{1} << 24;
inline constexpr uint32_t kMaxFactorRank = 1024;

// The raw training and test sets of a job, read once per process.
struct RawData {
  IdxImages train_images;
  std::vector<uint8_t> train_labels;
  IdxImages test_images;
  std::vector<uint8_t> test_labels;
  PixelStats stats;  // of the (limited) training images

  // A generated rating matrix (data.ratings) instead of images: rating k
  // of the training set is train_labels[k] (1..5) by user
  // train_pairs[2k] of item train_pairs[2k + 1]; the same for test. The
  // images stay empty.
  bool ratings = false;
  std::vector<uint32_t> train_pairs;
  std::vector<uint32_t> test_pairs;

  // Features per sample: 2 (user, item) for ratings, else pixels per image.
  int input_dim() const;
};

// Generates the rating matrix `config` describes (see pb::RatingsConfig)
// into a RawData: its training and test ratings, in a seeded random order.
// Deterministic in config.seed() on every platform. InvalidArgument naming
// the field for users or items outside [1, 2^24], rank outside [1, 1024],
// ratings < 2 or more than half the matrix's cells, exponents negative or
// not finite, noise negative or not finite, test_fraction outside (0, 1);
// ResourceExhausted when the popularity is so concentrated that `ratings`
// distinct pairs are not found (the message says to lower the exponents).
Result<RawData> GenerateRatings(const pb::RatingsConfig& config);

// The training (or test) samples `indices` of `raw` (all when empty) as a
// Dataset: MakeDataset over the images, or for ratings one column (user,
// item) per rating with the rating as its label. Indices out of range are
// skipped.
Dataset MakeTrainDataset(const RawData& raw, std::span<const uint32_t> indices,
                         pb::Normalization normalization);
Dataset MakeTestDataset(const RawData& raw, pb::Normalization normalization);

// Reads the files `config` names (train and/or test; for data.ratings
// generates the matrix, both sets, whatever is asked for), checks that image
// and label counts agree (InvalidArgument naming both files) and that train and
// test images have the same size, applies train_limit / test_limit. `stats`
// is always that of the (limited) training images when the normalisation
// needs it (not SCALE): with load_train false the training images are read
// for it and dropped, so train_* stay empty.
Result<RawData> LoadRawData(const pb::DataConfig& config, bool load_train,
                            bool load_test);

// The training labels alone of the files `config` names (train_limit
// applied): what a site server describes its share of the data with when
// the model is not its own (an external model's programs read the images).
// Errors of ReadIdxLabels; InvalidArgument for data.ratings (no label file).
Result<std::vector<uint8_t>> LoadTrainLabels(const pb::DataConfig& config);

// The training samples of one worker: the job's site partition
// (config.data().site_partition() over all sites, in config order), then an
// IID split of that site's share over its workers (seeded from
// config.seed() and the site index). Deterministic in config.seed(); sorted.
// OutOfRange for a site or worker index outside the config; errors of
// PartitionIndices pass through.
Result<std::vector<uint32_t>> WorkerSampleIndices(
    const pb::JobConfig& config, std::span<const uint8_t> train_labels,
    int site_index, int worker_index);

// Classes the site partition assumes for `train_labels`: the largest label
// plus one, at least 10 (Fashion-MNIST's).
int PartitionClassCount(std::span<const uint8_t> train_labels);

// The training samples of one site, all its workers' together: its share of
// the job's site partition (as WorkerSampleIndices computes it). Sorted.
// OutOfRange for a site index outside the config; errors of
// PartitionIndices pass through.
Result<std::vector<uint32_t>> SiteSampleIndices(
    const pb::JobConfig& config, std::span<const uint8_t> train_labels,
    int site_index);

// Training samples per class held by one site's workers (index = class,
// PartitionClassCount(train_labels) entries), summing to the size of
// SiteSampleIndices. Errors as SiteSampleIndices.
Result<std::vector<uint64_t>> SiteLabelHistogram(
    const pb::JobConfig& config, std::span<const uint8_t> train_labels,
    int site_index);

}  // namespace meridian

#endif  // MERIDIAN_TRAIN_DATASET_H_
