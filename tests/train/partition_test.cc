#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "meridian/dataset.h"

namespace meridian {
namespace {

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
  ASSERT_TRUE(parts.ok()) << parts.status();
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
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
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
  ASSERT_TRUE(iid.ok() && defaults.ok() && unspecified.ok());
  EXPECT_EQ(*iid, *defaults);
  EXPECT_EQ(*iid, *unspecified);
}

TEST(PartitionTest, IidWithMorePartsThanSamples) {
  const std::vector<uint8_t> labels = Labels(3);
  Result<Partitions> parts = PartitionIndices(labels, 10, 5, Kind(pb::IID), 1);
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(CheckWellFormed(*parts, 3), 3u);
  Result<Partitions> none = PartitionIndices({}, 10, 2, Kind(pb::IID), 1);
  ASSERT_TRUE(none.ok());
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
  ASSERT_TRUE(parts.ok()) << parts.status();
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
  ASSERT_TRUE(parts.ok()) << parts.status();
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
  ASSERT_TRUE(parts.ok()) << parts.status();
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
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size());
  EXPECT_DOUBLE_EQ(HomeFraction(*parts, labels), 1.0);
}

TEST(PartitionTest, LabelSkewZeroSpreadsEveryClass) {
  const std::vector<uint8_t> labels = Labels(20000);
  pb::PartitionConfig config = Kind(pb::LABEL_SKEW);
  config.set_skew(0.0);
  Result<Partitions> parts = PartitionIndices(labels, 10, 4, config, 4);
  ASSERT_TRUE(parts.ok()) << parts.status();
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
  ASSERT_TRUE(parts.ok()) << parts.status();
  EXPECT_EQ(CheckWellFormed(*parts, labels.size()), labels.size());
  // 0.8 directly, plus 1/5 of the remaining 0.2 by chance.
  EXPECT_NEAR(HomeFraction(*parts, labels), 0.8 + 0.2 / 5, 0.015);
  Result<Partitions> again = PartitionIndices(labels, 10, 5, config, 8);
  ASSERT_TRUE(again.ok());
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
  for (pb::PartitionKind kind : {pb::IID, pb::LABEL_SUBSET, pb::LABEL_SKEW}) {
    pb::JobConfig job = ThreeSiteJob();
    job.mutable_data()->mutable_site_partition()->set_kind(kind);
    Result<Partitions> sites = PartitionIndices(
        labels, 10, 3, job.data().site_partition(), job.seed());
    ASSERT_TRUE(sites.ok()) << sites.status();
    Partitions all_workers;
    for (int s = 0; s < 3; ++s) {
      const int workers = s == 0 ? 2 : s == 1 ? 3 : 1;
      std::vector<uint32_t> site_union;
      size_t smallest = labels.size(), largest = 0;
      for (int w = 0; w < workers; ++w) {
        Result<std::vector<uint32_t>> mine =
            WorkerSampleIndices(job, labels, s, w);
        ASSERT_TRUE(mine.ok()) << mine.status();
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
      ASSERT_TRUE(mine.ok()) << mine.status();
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
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  job.set_seed(4);
  Result<std::vector<uint32_t>> c = WorkerSampleIndices(job, labels, 1, 2);
  ASSERT_TRUE(c.ok());
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
    ASSERT_TRUE(mine.ok()) << mine.status();
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
  EXPECT_TRUE(WorkerSampleIndices(job, labels, 1, 2).ok());
}

}  // namespace
}  // namespace meridian
