#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "meridian/train/dataset.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

// Whether `text` contains `part`, with both in the failure message.
::testing::AssertionResult Contains(const std::string& text,
                                    const std::string& part) {
  if (text.find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "\"" << text << "\" does not contain \"" << part << "\"";
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir();
    if (pattern.empty() || pattern.back() != '/') pattern += '/';
    pattern += "meridian_idx_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  static void WriteRaw(const std::string& path,
                       const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }

  static std::vector<uint8_t> ReadRaw(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  }

  static void Append32(uint32_t v, std::vector<uint8_t>* out) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      out->push_back(static_cast<uint8_t>(v >> shift));
    }
  }

  static std::vector<uint8_t> ImageHeader(uint32_t count, uint32_t rows,
                                          uint32_t cols,
                                          uint32_t magic = 0x803) {
    std::vector<uint8_t> bytes;
    Append32(magic, &bytes);
    Append32(count, &bytes);
    Append32(rows, &bytes);
    Append32(cols, &bytes);
    return bytes;
  }

  static IdxImages SomeImages(uint32_t count, uint32_t rows, uint32_t cols) {
    IdxImages images;
    images.count = count;
    images.rows = rows;
    images.cols = cols;
    for (uint64_t i = 0; i < uint64_t{count} * rows * cols; ++i) {
      images.pixels.push_back(static_cast<uint8_t>((i * 37 + 11) % 256));
    }
    return images;
  }

  static std::vector<uint8_t> SomeLabels(uint32_t count) {
    std::vector<uint8_t> labels;
    for (uint32_t i = 0; i < count; ++i) {
      labels.push_back(static_cast<uint8_t>((i * 7) % 10));
    }
    return labels;
  }

  // Writes a train/test pair of IDX files into the temp dir and returns a
  // DataConfig naming them.
  pb::DataConfig WriteDataSet(uint32_t train, uint32_t test) {
    EXPECT_OK(WriteIdxImages(Path("train-img.gz"), SomeImages(train, 4, 3)));
    EXPECT_OK(WriteIdxLabels(Path("train-lbl.gz"), SomeLabels(train)));
    IdxImages test_images = SomeImages(test, 4, 3);
    for (uint8_t& pixel : test_images.pixels) pixel = 255 - pixel;
    EXPECT_OK(WriteIdxImages(Path("test-img.gz"), test_images));
    EXPECT_OK(WriteIdxLabels(Path("test-lbl.gz"), SomeLabels(test)));
    pb::DataConfig config;
    config.set_dir(dir_);
    config.set_train_images("train-img.gz");
    config.set_train_labels("train-lbl.gz");
    config.set_test_images("test-img.gz");
    config.set_test_labels("test-lbl.gz");
    return config;
  }

  std::string dir_;
};

TEST_F(IdxTest, GzipRoundTrip) {
  const IdxImages images = SomeImages(5, 28, 28);
  const std::vector<uint8_t> labels = SomeLabels(5);
  ASSERT_OK(WriteIdxImages(Path("img.gz"), images));
  ASSERT_OK(WriteIdxLabels(Path("lbl.gz"), labels));
  // Written compressed.
  const std::vector<uint8_t> raw = ReadRaw(Path("img.gz"));
  ASSERT_GE(raw.size(), 2u);
  EXPECT_EQ(raw[0], 0x1f);
  EXPECT_EQ(raw[1], 0x8b);

  Result<IdxImages> read = ReadIdxImages(Path("img.gz"));
  ASSERT_OK(read);
  EXPECT_EQ(read->count, 5u);
  EXPECT_EQ(read->rows, 28u);
  EXPECT_EQ(read->cols, 28u);
  EXPECT_EQ(read->dim(), 784u);
  EXPECT_EQ(read->pixels, images.pixels);
  Result<std::vector<uint8_t>> read_labels = ReadIdxLabels(Path("lbl.gz"));
  ASSERT_OK(read_labels);
  EXPECT_EQ(*read_labels, labels);
}

TEST_F(IdxTest, EmptyFilesRoundTrip) {
  ASSERT_OK(WriteIdxImages(Path("img.gz"), SomeImages(0, 2, 2)));
  ASSERT_OK(WriteIdxLabels(Path("lbl.gz"), {}));
  Result<IdxImages> images = ReadIdxImages(Path("img.gz"));
  ASSERT_OK(images);
  EXPECT_EQ(images->count, 0u);
  Result<std::vector<uint8_t>> labels = ReadIdxLabels(Path("lbl.gz"));
  ASSERT_OK(labels);
  EXPECT_TRUE(labels->empty());
}

TEST_F(IdxTest, ReadsPlainUncompressedFiles) {
  std::vector<uint8_t> bytes = ImageHeader(2, 2, 3);
  for (uint8_t v = 0; v < 12; ++v) bytes.push_back(v * 20);
  WriteRaw(Path("plain-img"), bytes);
  Result<IdxImages> images = ReadIdxImages(Path("plain-img"));
  ASSERT_OK(images);
  EXPECT_EQ(images->count, 2u);
  EXPECT_EQ(images->rows, 2u);
  EXPECT_EQ(images->cols, 3u);
  EXPECT_EQ(images->pixels[11], 220);

  std::vector<uint8_t> label_bytes;
  Append32(0x801, &label_bytes);
  Append32(3, &label_bytes);
  label_bytes.insert(label_bytes.end(), {9, 0, 4});
  WriteRaw(Path("plain-lbl"), label_bytes);
  Result<std::vector<uint8_t>> labels = ReadIdxLabels(Path("plain-lbl"));
  ASSERT_OK(labels);
  EXPECT_EQ(*labels, (std::vector<uint8_t>{9, 0, 4}));
}

TEST_F(IdxTest, MissingFileNamesThePath) {
  const std::string path = Path("nope/absent-images.gz");
  Result<IdxImages> images = ReadIdxImages(path);
  ASSERT_FALSE(images.ok());
  EXPECT_EQ(images.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(images.status().message(), path));
  EXPECT_FALSE(Contains(images.status().message(), "dataset-fashion-mnist"));
  Result<std::vector<uint8_t>> labels = ReadIdxLabels(Path("absent-labels"));
  EXPECT_EQ(labels.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(labels.status().message(), Path("absent-labels")));
}

TEST_F(IdxTest, MissingFileInDefaultDirNamesThePackage) {
  const std::string path =
      "/usr/share/datasets/fashion-mnist/no-such-file-for-meridian-tests.gz";
  Result<IdxImages> images = ReadIdxImages(path);
  ASSERT_FALSE(images.ok());
  EXPECT_EQ(images.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(images.status().message(), path));
  EXPECT_TRUE(Contains(images.status().message(),
                       "apt-get install dataset-fashion-mnist"));
  EXPECT_TRUE(Contains(images.status().message(), "data.dir"));

  // Through LoadRawData with the default directory.
  pb::DataConfig config;
  config.set_train_images("no-such-file-for-meridian-tests.gz");
  Result<RawData> raw = LoadRawData(config, true, false);
  ASSERT_FALSE(raw.ok());
  EXPECT_EQ(raw.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(raw.status().message(), path));
  EXPECT_TRUE(Contains(raw.status().message(), "dataset-fashion-mnist"));
}

TEST_F(IdxTest, DirectoryIsAnError) {
  Result<IdxImages> images = ReadIdxImages(dir_);
  ASSERT_FALSE(images.ok());
  EXPECT_TRUE(Contains(images.status().message(), dir_));
}

TEST_F(IdxTest, TruncatedFilesAreDataLoss) {
  // Plain file: header says 10 images of 28x28, 100 bytes follow.
  std::vector<uint8_t> bytes = ImageHeader(10, 28, 28);
  bytes.resize(bytes.size() + 100, 7);
  WriteRaw(Path("short"), bytes);
  Result<IdxImages> images = ReadIdxImages(Path("short"));
  ASSERT_FALSE(images.ok());
  EXPECT_EQ(images.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(images.status().message(), Path("short")));
  EXPECT_TRUE(Contains(images.status().message(), "truncated"));

  // Header itself cut short.
  WriteRaw(Path("tiny"), {0, 0, 8, 3, 0, 0});
  EXPECT_EQ(ReadIdxImages(Path("tiny")).status().code(), StatusCode::kDataLoss);
  WriteRaw(Path("empty"), {});
  EXPECT_EQ(ReadIdxLabels(Path("empty")).status().code(),
            StatusCode::kDataLoss);

  // Gzip stream cut in the middle.
  ASSERT_OK(WriteIdxImages(Path("full.gz"), SomeImages(200, 28, 28)));
  std::vector<uint8_t> gz = ReadRaw(Path("full.gz"));
  gz.resize(gz.size() / 2);
  WriteRaw(Path("cut.gz"), gz);
  Result<IdxImages> cut = ReadIdxImages(Path("cut.gz"));
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(cut.status().message(), Path("cut.gz")));
}

TEST_F(IdxTest, TrailingBytesAreDataLoss) {
  std::vector<uint8_t> bytes = ImageHeader(1, 2, 2);
  bytes.insert(bytes.end(), {1, 2, 3, 4, 5});
  WriteRaw(Path("long"), bytes);
  Result<IdxImages> images = ReadIdxImages(Path("long"));
  EXPECT_EQ(images.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(images.status().message(), Path("long")));
}

TEST_F(IdxTest, WrongMagicIsDataLoss) {
  ASSERT_OK(WriteIdxLabels(Path("lbl.gz"), SomeLabels(4)));
  ASSERT_OK(WriteIdxImages(Path("img.gz"), SomeImages(4, 2, 2)));
  Result<IdxImages> images = ReadIdxImages(Path("lbl.gz"));
  ASSERT_FALSE(images.ok());
  EXPECT_EQ(images.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(images.status().message(), Path("lbl.gz")));
  EXPECT_TRUE(Contains(images.status().message(), "0x00000801"));
  EXPECT_EQ(ReadIdxLabels(Path("img.gz")).status().code(),
            StatusCode::kDataLoss);

  WriteRaw(Path("junk"), {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd',
                          '!', '!', '!', '!', '!', '!'});
  EXPECT_EQ(ReadIdxImages(Path("junk")).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ReadIdxLabels(Path("junk")).status().code(), StatusCode::kDataLoss);
}

TEST_F(IdxTest, AbsurdHeadersAreRejectedWithoutAllocating) {
  struct Case {
    uint32_t count, rows, cols;
  };
  for (const Case& c :
       {Case{0xFFFFFFFFu, 28, 28}, Case{1u << 30, 28, 28}, Case{10, 0, 28},
        Case{10, 28, 0}, Case{1, 0xFFFFFFFFu, 0xFFFFFFFFu},
        Case{1, 1u << 17, 1}}) {
    std::vector<uint8_t> bytes = ImageHeader(c.count, c.rows, c.cols);
    bytes.resize(bytes.size() + 64, 1);
    WriteRaw(Path("absurd"), bytes);
    Result<IdxImages> images = ReadIdxImages(Path("absurd"));
    ASSERT_FALSE(images.ok()) << c.count << " " << c.rows << " " << c.cols;
    EXPECT_EQ(images.status().code(), StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(images.status().message(), Path("absurd")));
  }
  // Plausible but far larger than the file: truncated, found quickly and
  // without allocating the announced 2 GB.
  std::vector<uint8_t> bytes = ImageHeader(2'000'000, 32, 32);
  bytes.resize(bytes.size() + 1000, 1);
  WriteRaw(Path("big"), bytes);
  EXPECT_EQ(ReadIdxImages(Path("big")).status().code(), StatusCode::kDataLoss);

  std::vector<uint8_t> label_bytes;
  Append32(0x801, &label_bytes);
  Append32(0xFFFFFFFFu, &label_bytes);
  label_bytes.resize(label_bytes.size() + 10, 1);
  WriteRaw(Path("labels"), label_bytes);
  EXPECT_EQ(ReadIdxLabels(Path("labels")).status().code(),
            StatusCode::kDataLoss);
}

TEST_F(IdxTest, WriteRejectsInconsistentImages) {
  IdxImages images = SomeImages(2, 3, 3);
  images.pixels.pop_back();
  EXPECT_EQ(WriteIdxImages(Path("bad.gz"), images).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(WriteIdxLabels(Path("no/such/dir/lbl.gz"), SomeLabels(2)).ok());
}

TEST_F(IdxTest, LoadRawDataReadsBothSets) {
  const pb::DataConfig config = WriteDataSet(20, 8);
  Result<RawData> raw = LoadRawData(config, true, true);
  ASSERT_OK(raw);
  EXPECT_EQ(raw->train_images.count, 20u);
  EXPECT_EQ(raw->train_labels, SomeLabels(20));
  EXPECT_EQ(raw->test_images.count, 8u);
  EXPECT_EQ(raw->test_labels, SomeLabels(8));
  const PixelStats expected = ComputePixelStats(SomeImages(20, 4, 3));
  EXPECT_FLOAT_EQ(raw->stats.mean, expected.mean);
  EXPECT_FLOAT_EQ(raw->stats.stddev, expected.stddev);
}

TEST_F(IdxTest, LoadRawDataAppliesLimits) {
  pb::DataConfig config = WriteDataSet(20, 8);
  config.set_train_limit(5);
  config.set_test_limit(100);  // more than there is: all
  Result<RawData> raw = LoadRawData(config, true, true);
  ASSERT_OK(raw);
  EXPECT_EQ(raw->train_images.count, 5u);
  EXPECT_EQ(raw->train_images.pixels.size(), 5u * 12);
  EXPECT_EQ(raw->train_labels, SomeLabels(5));
  EXPECT_EQ(raw->test_images.count, 8u);
  // Stats of the limited training images.
  const PixelStats expected = ComputePixelStats(SomeImages(5, 4, 3));
  EXPECT_FLOAT_EQ(raw->stats.mean, expected.mean);
  EXPECT_FLOAT_EQ(raw->stats.stddev, expected.stddev);
}

TEST_F(IdxTest, LoadRawDataTestOnlyStillHasTrainingStats) {
  pb::DataConfig config = WriteDataSet(20, 8);
  config.set_train_limit(6);
  Result<RawData> raw = LoadRawData(config, false, true);
  ASSERT_OK(raw);
  EXPECT_EQ(raw->train_images.count, 0u);
  EXPECT_TRUE(raw->train_labels.empty());
  EXPECT_EQ(raw->test_images.count, 8u);
  const PixelStats expected = ComputePixelStats(SomeImages(6, 4, 3));
  EXPECT_FLOAT_EQ(raw->stats.mean, expected.mean);
  EXPECT_FLOAT_EQ(raw->stats.stddev, expected.stddev);

  // SCALE needs no statistics: the training files are not touched.
  config.set_normalization(pb::SCALE);
  config.set_train_images("absent.gz");
  raw = LoadRawData(config, false, true);
  ASSERT_OK(raw);
  EXPECT_FLOAT_EQ(raw->stats.mean, 0.0f);
  EXPECT_FLOAT_EQ(raw->stats.stddev, 1.0f);
}

TEST_F(IdxTest, LoadRawDataCountMismatchNamesBothFiles) {
  pb::DataConfig config = WriteDataSet(20, 8);
  ASSERT_OK(WriteIdxLabels(Path("train-lbl.gz"), SomeLabels(19)));
  Result<RawData> raw = LoadRawData(config, true, false);
  ASSERT_FALSE(raw.ok());
  EXPECT_EQ(raw.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(raw.status().message(), Path("train-img.gz")));
  EXPECT_TRUE(Contains(raw.status().message(), Path("train-lbl.gz")));
  // Even with a limit below both counts.
  config.set_train_limit(3);
  EXPECT_EQ(LoadRawData(config, true, false).status().code(),
            StatusCode::kInvalidArgument);
  // The test set alone is fine.
  EXPECT_OK(LoadRawData(config, false, true));
}

TEST_F(IdxTest, LoadRawDataRejectsDifferentImageSizes) {
  pb::DataConfig config = WriteDataSet(4, 4);
  ASSERT_OK(WriteIdxImages(Path("test-img.gz"), SomeImages(4, 3, 4)));
  EXPECT_EQ(LoadRawData(config, true, true).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(PixelStatsTest, MeanAndStddevAfterScaling) {
  IdxImages images;
  images.count = 1;
  images.rows = 2;
  images.cols = 2;
  images.pixels = {0, 255, 0, 255};
  PixelStats stats = ComputePixelStats(images);
  EXPECT_FLOAT_EQ(stats.mean, 0.5f);
  EXPECT_FLOAT_EQ(stats.stddev, 0.5f);

  images.pixels = {51, 51, 51, 51};  // constant: stddev falls back to 1
  stats = ComputePixelStats(images);
  EXPECT_FLOAT_EQ(stats.mean, 0.2f);
  EXPECT_FLOAT_EQ(stats.stddev, 1.0f);

  EXPECT_FLOAT_EQ(ComputePixelStats(IdxImages()).stddev, 1.0f);
}

TEST(MakeDatasetTest, ScaleAndStandardize) {
  IdxImages images;
  images.count = 3;
  images.rows = 1;
  images.cols = 2;
  images.pixels = {0, 255, 51, 102, 204, 153};
  const std::vector<uint8_t> labels = {4, 5, 6};
  PixelStats stats;
  stats.mean = 0.5f;
  stats.stddev = 0.25f;

  Dataset scaled = MakeDataset(images, labels, {}, pb::SCALE, stats);
  ASSERT_EQ(scaled.size(), 3u);
  EXPECT_EQ(scaled.input_dim(), 2);
  EXPECT_EQ(scaled.num_classes, 10);
  EXPECT_FLOAT_EQ(scaled.features(0, 0), 0.0f);
  EXPECT_FLOAT_EQ(scaled.features(1, 0), 1.0f);
  EXPECT_FLOAT_EQ(scaled.features(0, 1), 0.2f);
  EXPECT_FLOAT_EQ(scaled.features(1, 2), 0.6f);
  EXPECT_EQ(scaled.labels, labels);

  Dataset standard = MakeDataset(images, labels, {}, pb::STANDARDIZE, stats);
  EXPECT_FLOAT_EQ(standard.features(0, 0), -2.0f);
  EXPECT_FLOAT_EQ(standard.features(1, 0), 2.0f);
  EXPECT_NEAR(standard.features(0, 1), (0.2f - 0.5f) / 0.25f, 1e-6);
  Dataset unspecified =
      MakeDataset(images, labels, {}, pb::NORMALIZATION_UNSPECIFIED, stats);
  EXPECT_EQ(unspecified.features, standard.features);

  // Selected samples, in the given order, out-of-range indices skipped.
  const std::vector<uint32_t> indices = {2, 0, 7};
  Dataset some = MakeDataset(images, labels, indices, pb::SCALE, stats, 7);
  ASSERT_EQ(some.size(), 2u);
  EXPECT_EQ(some.labels, (std::vector<uint8_t>{6, 4}));
  EXPECT_FLOAT_EQ(some.features(0, 0), 0.8f);
  EXPECT_FLOAT_EQ(some.features(1, 1), 1.0f);
  EXPECT_EQ(some.num_classes, 7);
}

TEST_F(IdxTest, NormalisedDataFromFilesHasZeroMeanUnitVariance) {
  const pb::DataConfig config = WriteDataSet(50, 4);
  Result<RawData> raw = LoadRawData(config, true, false);
  ASSERT_OK(raw);
  const Dataset data = MakeDataset(raw->train_images, raw->train_labels, {},
                                   config.normalization(), raw->stats);
  const double mean = data.features.mean();
  const double variance = (data.features.array() - mean).square().mean();
  EXPECT_NEAR(mean, 0.0, 1e-5);
  EXPECT_NEAR(variance, 1.0, 1e-4);
}

}  // namespace
}  // namespace meridian
