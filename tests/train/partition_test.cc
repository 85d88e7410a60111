#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "meridian/train/dataset.h"
#include "testing/status_matchers.h"
#include "testing/text.h"

namespace meridian {
namespace {

using ::meridian::testing::Contains;

using Partitions = std::vector<std::vector<uint32_t>>;

// Labels 0..num_classes-1 in a scrambled but fixed order.
std::vector<uint8_t> Labels(uint32_t count, int num_classes = 10) {
  std::vector<uint8_t> labels(count);
  for (uint32_t i = 0; i < count; ++i) {
    labels[i] = static_cast<uint8_t>((i * 7 + i / 13) % num_classes);
  }
  return labels;
}

pb::PartitionConfig Kind(pb::PartitionKind kind) {
  pb::PartitionConfig config;
  config.set_kind(kind);
  return config;
}

// Every partition sorted, no index twice, all < n; returns how many
// indices there are in total.
size_t CheckWellFormed(const Partitions& parts, size_t n) {
  std::vector<bool> seen(n, false);
  size_t total = 0;
  for (const std::vector<uint32_t>& part : parts) {
    EXPECT_TRUE(std::is_sorted(part.begin(), part.end()));
    for (uint32_t index : part) {
      EXPECT_LT(index, n);
      if (index >= n) continue;
      EXPECT_FALSE(seen[index]) << "index " << index << " appears twice";
      seen[index] = true;
      ++total;
    }
  }
  return total;
}

TEST(PartitionTest, IidSharesAreBalancedDisjointAndComplete) {
  const std::vector<uint8_t> labels = Labels(103);
  Result<Partitions> parts = PartitionIndices(labels, 10, 4, Kind(pb::IID), 17);
  ASSERT_OK(parts);
  ASSERT_EQ(parts->size(), 4u);
  EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size());
  size_t smallest = labels.size(), largest = 0;
  for (const auto& part : *parts) {
    smallest = std::min(smallest, part.size());
    largest = std::max(largest, part.size());
  }
  EXPECT_LE(largest - smallest, 1u);
  EXPECT_EQ(largest, 26u);
  // Shuffled, not contiguous blocks.
  EXPECT_NE((*parts)[0][1], (*parts)[0][0] + 1);
}

TEST(PartitionTest, IidIsDeterministicInTheSeed) {
  const std::vector<uint8_t> labels = Labels(500);
  Result<Partitions> a = PartitionIndices(labels, 10, 3, Kind(pb::IID), 5);
  Result<Partitions> b = PartitionIndices(labels, 10, 3, Kind(pb::IID), 5);
  Result<Partitions> c = PartitionIndices(labels, 10, 3, Kind(pb::IID), 6);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_OK(c);
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
}

TEST(PartitionTest, DefaultAndUnspecifiedKindsAreIid) {
  const std::vector<uint8_t> labels = Labels(50);
  Result<Partitions> iid = PartitionIndices(labels, 10, 3, Kind(pb::IID), 9);
  Result<Partitions> defaults =
      PartitionIndices(labels, 10, 3, pb::PartitionConfig(), 9);
  Result<Partitions> unspecified =
      PartitionIndices(labels, 10, 3, Kind(pb::PARTITION_KIND_UNSPECIFIED), 9);
  ASSERT_OK(iid);
  ASSERT_OK(defaults);
  ASSERT_OK(unspecified);
  EXPECT_EQ(*iid, *defaults);
  EXPECT_EQ(*iid, *unspecified);
}

TEST(PartitionTest, IidWithMorePartsThanSamples) {
  const std::vector<uint8_t> labels = Labels(3);
  Result<Partitions> parts = PartitionIndices(labels, 10, 5, Kind(pb::IID), 1);
  ASSERT_OK(parts);
  EXPECT_EQ(CheckWellFormed(*parts, 3), 3u);
  Result<Partitions> none = PartitionIndices({}, 10, 2, Kind(pb::IID), 1);
  ASSERT_OK(none);
  EXPECT_EQ(none->size(), 2u);
  EXPECT_TRUE((*none)[0].empty());
}

TEST(PartitionTest, LabelSubsetWithLists) {
  const std::vector<uint8_t> labels = Labels(400);
  pb::PartitionConfig config = Kind(pb::LABEL_SUBSET);
  const std::vector<std::set<int>> lists = {{0, 1}, {2, 3, 4}, {5}};
  for (const auto& list : lists) {
    pb::ClassList* classes = config.add_classes();
    for (int label : list) classes->add_label(label);
  }
  Result<Partitions> parts = PartitionIndices(labels, 10, 3, config, 1);
  ASSERT_OK(parts);
  CheckWellFormed(*parts, labels.size());
  for (int p = 0; p < 3; ++p) {
    std::set<int> found;
    for (uint32_t index : (*parts)[p]) found.insert(labels[index]);
    EXPECT_EQ(found, lists[p]) << "partition " << p;
  }
  // Every sample of a listed class is somewhere; unlisted classes nowhere.
  size_t listed = 0;
  for (uint8_t label : labels) listed += label <= 5;
  size_t total = 0;
  for (const auto& part : *parts) total += part.size();
  EXPECT_EQ(total, listed);
}

TEST(PartitionTest, LabelSubsetDefaultIsLabelModParts) {
  const std::vector<uint8_t> labels = Labels(300);
  Result<Partitions> parts =
      PartitionIndices(labels, 10, 4, Kind(pb::LABEL_SUBSET), 1);
  ASSERT_OK(parts);
  EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size());
  for (int p = 0; p < 4; ++p) {
    for (uint32_t index : (*parts)[p]) EXPECT_EQ(labels[index] % 4, p);
  }
}

TEST(PartitionTest, LabelSubsetSharedClassIsSplitEvenly) {
  const std::vector<uint8_t> labels = Labels(1000);
  pb::PartitionConfig config = Kind(pb::LABEL_SUBSET);
  pb::ClassList* first = config.add_classes();
  first->add_label(0);
  first->add_label(1);
  pb::ClassList* second = config.add_classes();
  second->add_label(1);
  second->add_label(2);
  Result<Partitions> parts = PartitionIndices(labels, 10, 2, config, 1);
  ASSERT_OK(parts);
  CheckWellFormed(*parts, labels.size());
  int class1[2] = {0, 0};
  for (int p = 0; p < 2; ++p) {
    for (uint32_t index : (*parts)[p]) {
      if (labels[index] == 1) ++class1[p];
      EXPECT_TRUE(labels[index] == 1 || labels[index] == (p == 0 ? 0 : 2));
    }
  }
  const int total1 =
      static_cast<int>(std::count(labels.begin(), labels.end(), 1));
  EXPECT_EQ(class1[0] + class1[1], total1);
  EXPECT_LE(std::abs(class1[0] - class1[1]), 1);
}

TEST(PartitionTest, LabelSubsetRejectsBadLists) {
  const std::vector<uint8_t> labels = Labels(100);
  pb::PartitionConfig config = Kind(pb::LABEL_SUBSET);
  config.add_classes()->add_label(0);
  config.add_classes()->add_label(1);
  // Two lists for three partitions.
  EXPECT_EQ(PartitionIndices(labels, 10, 3, config, 1).status().code(),
            StatusCode::kInvalidArgument);
  // A class that does not exist.
  config.add_classes()->add_label(10);
  EXPECT_EQ(PartitionIndices(labels, 10, 3, config, 1).status().code(),
            StatusCode::kInvalidArgument);
  // An empty list.
  config.mutable_classes(2)->clear_label();
  EXPECT_EQ(PartitionIndices(labels, 10, 3, config, 1).status().code(),
            StatusCode::kInvalidArgument);
}

// Fraction of samples in their home partition (label % parts).
double HomeFraction(const Partitions& parts,
                    const std::vector<uint8_t>& labels) {
  size_t home = 0, total = 0;
  for (size_t p = 0; p < parts.size(); ++p) {
    for (uint32_t index : parts[p]) {
      home += labels[index] % parts.size() == p;
      ++total;
    }
  }
  return static_cast<double>(home) / static_cast<double>(total);
}

TEST(PartitionTest, LabelSkewPure) {
  const std::vector<uint8_t> labels = Labels(2000);
  pb::PartitionConfig config = Kind(pb::LABEL_SKEW);
  config.set_skew(1.0);
  Result<Partitions> parts = PartitionIndices(labels, 10, 3, config, 4);
  ASSERT_OK(parts);
  EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size());
  EXPECT_DOUBLE_EQ(HomeFraction(*parts, labels), 1.0);
}

TEST(PartitionTest, LabelSkewZeroSpreadsEveryClass) {
  const std::vector<uint8_t> labels = Labels(20000);
  pb::PartitionConfig config = Kind(pb::LABEL_SKEW);
  config.set_skew(0.0);
  Result<Partitions> parts = PartitionIndices(labels, 10, 4, config, 4);
  ASSERT_OK(parts);
  EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size());
  EXPECT_NEAR(HomeFraction(*parts, labels), 0.25, 0.02);
  // Each partition holds about a quarter of each class.
  std::vector<int> class_total(10, 0);
  for (uint8_t label : labels) ++class_total[label];
  for (const auto& part : *parts) {
    std::vector<int> per_class(10, 0);
    for (uint32_t index : part) ++per_class[labels[index]];
    for (int c = 0; c < 10; ++c) {
      EXPECT_NEAR(per_class[c], class_total[c] / 4.0, 100) << "class " << c;
    }
  }
}

TEST(PartitionTest, LabelSkewFraction) {
  const std::vector<uint8_t> labels = Labels(20000);
  pb::PartitionConfig config = Kind(pb::LABEL_SKEW);  // default skew 0.8
  Result<Partitions> parts = PartitionIndices(labels, 10, 5, config, 8);
  ASSERT_OK(parts);
  EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size());
  // 0.8 directly, plus 1/5 of the remaining 0.2 by chance.
  EXPECT_NEAR(HomeFraction(*parts, labels), 0.8 + 0.2 / 5, 0.015);
  Result<Partitions> again = PartitionIndices(labels, 10, 5, config, 8);
  ASSERT_OK(again);
  EXPECT_EQ(*parts, *again);
}

TEST(PartitionTest, LabelSkewOutOfRange) {
  const std::vector<uint8_t> labels = Labels(10);
  pb::PartitionConfig config = Kind(pb::LABEL_SKEW);
  for (double skew : {-0.1, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    config.set_skew(skew);
    EXPECT_EQ(PartitionIndices(labels, 10, 2, config, 1).status().code(),
              StatusCode::kInvalidArgument)
        << skew;
  }
}

TEST(PartitionTest, InvalidInputs) {
  const std::vector<uint8_t> labels = Labels(10);
  EXPECT_EQ(PartitionIndices(labels, 10, 0, Kind(pb::IID), 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionIndices(labels, 10, -2, Kind(pb::IID), 1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PartitionIndices(labels, 0, 2, Kind(pb::IID), 1).status().code(),
            StatusCode::kInvalidArgument);
  // A label outside [0, num_classes).
  EXPECT_EQ(
      PartitionIndices(labels, 5, 2, Kind(pb::LABEL_SUBSET), 1).status().code(),
      StatusCode::kInvalidArgument);
}

// counts[p][c]: samples of class c in partition p.
std::vector<std::vector<size_t>> ClassCounts(const Partitions& parts,
                                             const std::vector<uint8_t>& labels,
                                             int num_classes = 10) {
  std::vector<std::vector<size_t>> counts(parts.size(),
                                          std::vector<size_t>(num_classes, 0));
  for (size_t p = 0; p < parts.size(); ++p) {
    for (uint32_t index : parts[p]) ++counts[p][labels[index]];
  }
  return counts;
}

pb::PartitionConfig Dirichlet(double alpha, uint32_t min_samples = 10) {
  pb::PartitionConfig config = Kind(pb::DIRICHLET);
  config.set_alpha(alpha);
  config.set_min_samples(min_samples);
  return config;
}


TEST(PartitionTest, DirichletPlacesEverySampleExactlyOnce) {
  const std::vector<uint8_t> labels = Labels(5003);
  for (double alpha : {0.05, 0.5, 100.0}) {
    for (int parts_count : {1, 2, 7}) {
      Result<Partitions> parts =
          PartitionIndices(labels, 10, parts_count, Dirichlet(alpha), 11);
      ASSERT_OK(parts);
      ASSERT_EQ(parts->size(), static_cast<size_t>(parts_count));
      EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size())
          << "alpha " << alpha << ", " << parts_count << " partitions";
      for (const auto& part : *parts) EXPECT_GE(part.size(), 10u);
    }
  }
  // The defaults (alpha 0.5, min_samples 10) also work.
  Result<Partitions> defaults =
      PartitionIndices(labels, 10, 4, Kind(pb::DIRICHLET), 11);
  ASSERT_OK(defaults);
  EXPECT_EQ(CheckWellFormed(*defaults, labels.size()), labels.size());
}

TEST(PartitionTest, DirichletIsDeterministicInTheSeed) {
  const std::vector<uint8_t> labels = Labels(3000);
  Result<Partitions> a = PartitionIndices(labels, 10, 4, Dirichlet(0.3), 5);
  Result<Partitions> b = PartitionIndices(labels, 10, 4, Dirichlet(0.3), 5);
  Result<Partitions> c = PartitionIndices(labels, 10, 4, Dirichlet(0.3), 6);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_OK(c);
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
}

// Pinned sizes: the draws are hand-written on std::mt19937_64, so every
// platform gets these; a change here changes every DIRICHLET job's data.
TEST(PartitionTest, DirichletSizesArePinned) {
  const std::vector<uint8_t> labels = Labels(2000);
  Result<Partitions> parts =
      PartitionIndices(labels, 10, 4, Dirichlet(0.5), 42);
  ASSERT_OK(parts);
  std::vector<size_t> sizes;
  for (const auto& part : *parts) sizes.push_back(part.size());
  EXPECT_EQ(sizes, (std::vector<size_t>{417, 588, 424, 571}));
}

// alpha 100: every partition holds close to a tenth of each class's share.
TEST(PartitionTest, DirichletLargeAlphaIsNearlyIid) {
  const std::vector<uint8_t> labels = Labels(20000);
  Result<Partitions> parts = PartitionIndices(labels, 10, 4, Dirichlet(100), 3);
  ASSERT_OK(parts);
  const auto counts = ClassCounts(*parts, labels);
  for (size_t p = 0; p < counts.size(); ++p) {
    const double size = static_cast<double>((*parts)[p].size());
    EXPECT_NEAR(size, 5000, 500) << "partition " << p;
    for (int c = 0; c < 10; ++c) {
      EXPECT_NEAR(counts[p][c] / size, 0.1, 0.03)
          << "partition " << p << " class " << c;
    }
  }
}

// alpha 0.1: a partition is dominated by few classes.
TEST(PartitionTest, DirichletSmallAlphaIsSkewed) {
  const std::vector<uint8_t> labels = Labels(20000);
  Result<Partitions> parts =
      PartitionIndices(labels, 10, 10, Dirichlet(0.1), 3);
  ASSERT_OK(parts);
  const auto counts = ClassCounts(*parts, labels);
  double max_share_sum = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    const size_t largest =
        *std::max_element(counts[p].begin(), counts[p].end());
    max_share_sum += static_cast<double>(largest) / (*parts)[p].size();
  }
  // Measured with this seed: 0.584 (IID would give about 0.1).
  EXPECT_GT(max_share_sum / counts.size(), 0.5);
}

TEST(PartitionTest, DirichletDrawsAgainUntilMinSamples) {
  const std::vector<uint8_t> labels = Labels(1000);
  // Without a minimum, this seed's first draw leaves a partition empty...
  Result<Partitions> first =
      PartitionIndices(labels, 10, 10, Dirichlet(0.1, 0), 12);
  ASSERT_OK(first);
  size_t smallest = labels.size();
  for (const auto& part : *first) smallest = std::min(smallest, part.size());
  EXPECT_EQ(smallest, 0u);
  // ...with one, the partitions are drawn again until none is.
  Result<Partitions> parts =
      PartitionIndices(labels, 10, 10, Dirichlet(0.1, 30), 12);
  ASSERT_OK(parts);
  EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size());
  for (const auto& part : *parts) EXPECT_GE(part.size(), 30u);
}

TEST(PartitionTest, DirichletRejectsBadSettings) {
  const std::vector<uint8_t> labels = Labels(1000);
  for (double alpha : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                       std::numeric_limits<double>::infinity()}) {
    Result<Partitions> parts =
        PartitionIndices(labels, 10, 3, Dirichlet(alpha), 1);
    ASSERT_EQ(parts.status().code(), StatusCode::kInvalidArgument) << alpha;
    EXPECT_TRUE(Contains(parts.status().message(), "alpha")) << parts.status();
  }
  // Fewer samples than partitions times the minimum.
  Result<Partitions> few =
      PartitionIndices(labels, 10, 11, Dirichlet(1, 91), 1);
  ASSERT_EQ(few.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(few.status().message(), "1001 samples")) << few.status();
  EXPECT_TRUE(Contains(few.status().message(), "there are 1000"))
      << few.status();
  // alpha so small that each class goes to one partition: 20 partitions
  // cannot all get samples of 10 classes, however often it is drawn.
  Result<Partitions> hopeless =
      PartitionIndices(labels, 10, 20, Dirichlet(0.001, 1), 1);
  ASSERT_EQ(hopeless.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(hopeless.status().message(), "alpha 0.001"))
      << hopeless.status();
}

pb::PartitionConfig ClassesPerPart(uint32_t k) {
  pb::PartitionConfig config = Kind(pb::CLASSES_PER_PART);
  config.set_classes_per_part(k);
  return config;
}

TEST(PartitionTest, ClassesPerPartHoldsExactlyKClassesEach) {
  const std::vector<uint8_t> labels = Labels(3000);
  struct Case {
    int parts;
    uint32_t k;
  };
  for (const Case& c : {Case{5, 2}, Case{3, 4}, Case{4, 3}, Case{10, 1},
                        Case{2, 10}, Case{7, 3}, Case{1, 10}}) {
    Result<Partitions> parts =
        PartitionIndices(labels, 10, c.parts, ClassesPerPart(c.k), 1);
    ASSERT_OK(parts);
    EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size());
    const auto counts = ClassCounts(*parts, labels);
    std::vector<int> holders(10, 0);
    for (int p = 0; p < c.parts; ++p) {
      std::vector<uint32_t> held;
      for (uint32_t cls = 0; cls < 10; ++cls) {
        if (counts[p][cls] > 0) held.push_back(cls);
      }
      EXPECT_EQ(held.size(), c.k) << c.parts << " parts, k " << c.k;
      EXPECT_EQ(held, ClassesOfPartition(ClassesPerPart(c.k), 10, c.parts, p));
      for (uint32_t cls : held) ++holders[cls];
    }
    // Every class held, by floor or ceil of parts * k / 10 partitions, and
    // its samples split evenly among them.
    const int lo = c.parts * static_cast<int>(c.k) / 10;
    const int hi = (c.parts * static_cast<int>(c.k) + 9) / 10;
    for (int cls = 0; cls < 10; ++cls) {
      EXPECT_GE(holders[cls], std::max(lo, 1)) << "class " << cls;
      EXPECT_LE(holders[cls], hi) << "class " << cls;
      size_t smallest = labels.size(), largest = 0;
      for (int p = 0; p < c.parts; ++p) {
        if (counts[p][cls] == 0) continue;
        smallest = std::min(smallest, counts[p][cls]);
        largest = std::max(largest, counts[p][cls]);
      }
      EXPECT_LE(largest - smallest, 1u) << "class " << cls;
    }
  }
}

TEST(PartitionTest, ClassesPerPartBlocksWrapAround) {
  EXPECT_EQ(ClassesOfPartition(ClassesPerPart(4), 10, 3, 0),
            (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(ClassesOfPartition(ClassesPerPart(4), 10, 3, 2),
            (std::vector<uint32_t>{0, 1, 8, 9}));
  EXPECT_EQ(ClassesOfPartition(ClassesPerPart(2), 10, 5, 4),
            (std::vector<uint32_t>{8, 9}));
}

// The classes are fixed by the config; the seed does not move them (nor,
// as with LABEL_SUBSET, the samples).
TEST(PartitionTest, ClassesPerPartIsDeterministicAndIndependentOfTheSeed) {
  const std::vector<uint8_t> labels = Labels(900);
  Result<Partitions> a = PartitionIndices(labels, 10, 4, ClassesPerPart(3), 1);
  Result<Partitions> b = PartitionIndices(labels, 10, 4, ClassesPerPart(3), 1);
  Result<Partitions> c = PartitionIndices(labels, 10, 4, ClassesPerPart(3), 2);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_OK(c);
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(*a, *c);
}

TEST(PartitionTest, ClassesPerPartRejectsBadK) {
  const std::vector<uint8_t> labels = Labels(100);
  for (uint32_t k : {0u, 11u}) {
    Result<Partitions> parts =
        PartitionIndices(labels, 10, 5, ClassesPerPart(k), 1);
    ASSERT_EQ(parts.status().code(), StatusCode::kInvalidArgument) << k;
    EXPECT_TRUE(Contains(parts.status().message(), "in [1, 10]"))
        << parts.status();
  }
  // 3 partitions of 3 classes leave a class without a partition.
  Result<Partitions> short_of_one =
      PartitionIndices(labels, 10, 3, ClassesPerPart(3), 1);
  ASSERT_EQ(short_of_one.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(short_of_one.status().message(),
                       "classes_per_part 3 over 3 partitions holds 9 classes"))
      << short_of_one.status();
}

TEST(PartitionTest, DescribePartition) {
  pb::PartitionConfig subset = Kind(pb::LABEL_SUBSET);
  subset.add_classes()->add_label(4);
  pb::ClassList* second = subset.add_classes();
  for (uint32_t c : {2u, 0u, 1u}) second->add_label(c);
  EXPECT_EQ(DescribePartition(subset, 10, 2, 1), "LABEL_SUBSET {0,1,2}");
  EXPECT_EQ(DescribePartition(Kind(pb::LABEL_SUBSET), 10, 4, 1),
            "LABEL_SUBSET {1,5,9}");
  EXPECT_EQ(DescribePartition(Kind(pb::LABEL_SKEW), 10, 3, 1),
            "LABEL_SKEW skew=0.8 home {1,4,7}");
  EXPECT_EQ(DescribePartition(Dirichlet(0.1), 10, 3, 0),
            "DIRICHLET alpha=0.1 min_samples=10");
  EXPECT_EQ(DescribePartition(ClassesPerPart(2), 10, 5, 1),
            "CLASSES_PER_PART k=2 {2,3}");
  EXPECT_EQ(DescribePartition(pb::PartitionConfig(), 10, 3, 0), "IID");
}

pb::JobConfig ThreeSiteJob() {
  pb::JobConfig job;
  job.set_seed(3);
  const std::vector<std::vector<uint32_t>> groups = {{2}, {1, 2}, {1}};
  const char* names[] = {"a", "b", "c"};
  for (size_t s = 0; s < groups.size(); ++s) {
    pb::SiteConfig* site = job.add_site();
    site->set_name(names[s]);
    for (uint32_t count : groups[s]) site->add_workers()->set_count(count);
  }
  return job;
}

TEST(WorkerSampleIndicesTest, WorkersCoverEachSampleAtMostOnce) {
  const std::vector<uint8_t> labels = Labels(1001);
  for (pb::PartitionKind kind : {pb::IID, pb::LABEL_SUBSET, pb::LABEL_SKEW,
                                 pb::DIRICHLET, pb::CLASSES_PER_PART}) {
    pb::JobConfig job = ThreeSiteJob();
    job.mutable_data()->mutable_site_partition()->set_kind(kind);
    if (kind == pb::CLASSES_PER_PART) {
      job.mutable_data()->mutable_site_partition()->set_classes_per_part(4);
    }
    Result<Partitions> sites = PartitionIndices(
        labels, 10, 3, job.data().site_partition(), job.seed());
    ASSERT_OK(sites);
    Partitions all_workers;
    for (int s = 0; s < 3; ++s) {
      const int workers = s == 0 ? 2 : s == 1 ? 3 : 1;
      std::vector<uint32_t> site_union;
      size_t smallest = labels.size(), largest = 0;
      for (int w = 0; w < workers; ++w) {
        Result<std::vector<uint32_t>> mine =
            WorkerSampleIndices(job, labels, s, w);
        ASSERT_OK(mine);
        EXPECT_TRUE(std::is_sorted(mine->begin(), mine->end()));
        smallest = std::min(smallest, mine->size());
        largest = std::max(largest, mine->size());
        site_union.insert(site_union.end(), mine->begin(), mine->end());
        all_workers.push_back(*mine);
      }
      EXPECT_LE(largest - smallest, 1u) << "site " << s;
      std::sort(site_union.begin(), site_union.end());
      // The site's workers together hold exactly the site's share.
      EXPECT_EQ(site_union, (*sites)[s]) << "site " << s << " kind " << kind;
    }
    CheckWellFormed(all_workers, labels.size());
  }
}

TEST(WorkerSampleIndicesTest, IidSitesTogetherCoverEverything) {
  const std::vector<uint8_t> labels = Labels(600);
  const pb::JobConfig job = ThreeSiteJob();
  Partitions all_workers;
  for (int s = 0; s < 3; ++s) {
    const int workers = s == 0 ? 2 : s == 1 ? 3 : 1;
    for (int w = 0; w < workers; ++w) {
      Result<std::vector<uint32_t>> mine =
          WorkerSampleIndices(job, labels, s, w);
      ASSERT_OK(mine);
      all_workers.push_back(*mine);
    }
  }
  EXPECT_EQ(CheckWellFormed(all_workers, labels.size()), labels.size());
  // Site shares are equal; a site's share is split over its workers.
  EXPECT_EQ(all_workers[5].size(), 200u);                          // c/0
  EXPECT_EQ(all_workers[0].size() + all_workers[1].size(), 200u);  // a
}

TEST(WorkerSampleIndicesTest, Deterministic) {
  const std::vector<uint8_t> labels = Labels(500);
  pb::JobConfig job = ThreeSiteJob();
  Result<std::vector<uint32_t>> a = WorkerSampleIndices(job, labels, 1, 2);
  Result<std::vector<uint32_t>> b = WorkerSampleIndices(job, labels, 1, 2);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ(*a, *b);
  job.set_seed(4);
  Result<std::vector<uint32_t>> c = WorkerSampleIndices(job, labels, 1, 2);
  ASSERT_OK(c);
  EXPECT_NE(*a, *c);
}

TEST(WorkerSampleIndicesTest, LabelSubsetSitesSeeOnlyTheirClasses) {
  const std::vector<uint8_t> labels = Labels(500);
  pb::JobConfig job = ThreeSiteJob();
  pb::PartitionConfig* partition = job.mutable_data()->mutable_site_partition();
  partition->set_kind(pb::LABEL_SUBSET);
  for (int s = 0; s < 3; ++s) partition->add_classes()->add_label(s + 3);
  for (int w = 0; w < 3; ++w) {
    Result<std::vector<uint32_t>> mine = WorkerSampleIndices(job, labels, 1, w);
    ASSERT_OK(mine);
    EXPECT_FALSE(mine->empty());
    for (uint32_t index : *mine) EXPECT_EQ(labels[index], 4);
  }
  // A bad site partition is reported, not hidden.
  partition->add_classes()->add_label(0);
  EXPECT_EQ(WorkerSampleIndices(job, labels, 0, 0).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(WorkerSampleIndicesTest, OutOfRangeIndices) {
  const std::vector<uint8_t> labels = Labels(100);
  const pb::JobConfig job = ThreeSiteJob();
  EXPECT_EQ(WorkerSampleIndices(job, labels, 3, 0).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(WorkerSampleIndices(job, labels, -1, 0).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(WorkerSampleIndices(job, labels, 0, 2).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(WorkerSampleIndices(job, labels, 2, -1).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_OK(WorkerSampleIndices(job, labels, 1, 2));
}

TEST(SiteLabelHistogramTest, CountsTheSiteShareByClass) {
  const std::vector<uint8_t> labels = Labels(2000);
  pb::JobConfig job = ThreeSiteJob();
  *job.mutable_data()->mutable_site_partition() = Dirichlet(0.2);
  const int workers[] = {2, 3, 1};
  std::vector<uint64_t> all(10, 0);
  for (int s = 0; s < 3; ++s) {
    Result<std::vector<uint64_t>> histogram =
        SiteLabelHistogram(job, labels, s);
    ASSERT_OK(histogram);
    ASSERT_EQ(histogram->size(), 10u);
    Result<std::vector<uint32_t>> share = SiteSampleIndices(job, labels, s);
    ASSERT_OK(share);
    uint64_t total = 0;
    for (uint64_t count : *histogram) total += count;
    EXPECT_EQ(total, share->size());
    // The same counts as the site's workers' samples together.
    std::vector<uint64_t> from_workers(10, 0);
    for (int w = 0; w < workers[s]; ++w) {
      Result<std::vector<uint32_t>> mine =
          WorkerSampleIndices(job, labels, s, w);
      ASSERT_OK(mine);
      for (uint32_t index : *mine) ++from_workers[labels[index]];
    }
    EXPECT_EQ(*histogram, from_workers) << "site " << s;
    for (int c = 0; c < 10; ++c) all[c] += (*histogram)[c];
  }
  // DIRICHLET places every sample: the sites' histograms add up to the
  // training set's.
  std::vector<uint64_t> expected(10, 0);
  for (uint8_t label : labels) ++expected[label];
  EXPECT_EQ(all, expected);
  EXPECT_EQ(SiteLabelHistogram(job, labels, 3).status().code(),
            StatusCode::kOutOfRange);
  // Labels beyond 10 classes widen the histogram.
  std::vector<uint8_t> wide = labels;
  wide[0] = 11;
  Result<std::vector<uint64_t>> widened = SiteLabelHistogram(job, wide, 0);
  ASSERT_OK(widened);
  EXPECT_EQ(widened->size(), 12u);
}

}  // namespace
}  // namespace meridian
