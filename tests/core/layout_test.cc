#include "meridian/core/layout.h"
#include "testing/status_matchers.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace meridian {
namespace {

ModelLayout TwoLayerLayout() {
  ModelLayout layout;
  EXPECT_OK(layout.Add("fc1.w", {784, 128}));
  EXPECT_OK(layout.Add("fc1.b", {128}));
  EXPECT_OK(layout.Add("fc2.w", {128, 10}));
  EXPECT_OK(layout.Add("fc2.b", {10}));
  return layout;
}

TEST(ModelLayoutTest, EmptyLayout) {
  const ModelLayout layout;
  EXPECT_TRUE(layout.tensors().empty());
  EXPECT_EQ(layout.num_elements(), 0u);
  EXPECT_EQ(layout.DebugString(), "");
  EXPECT_EQ(layout.Find("x"), nullptr);
  EXPECT_EQ(layout.LargestTensorSize(), 0u);
}

TEST(ModelLayoutTest, AddLaysTensorsEndToEnd) {
  const ModelLayout layout = TwoLayerLayout();
  ASSERT_EQ(layout.tensors().size(), 4u);
  const uint64_t offsets[] = {0, 100352, 100480, 101760};
  const uint64_t sizes[] = {100352, 128, 1280, 10};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(layout.tensors()[i].offset, offsets[i]) << i;
    EXPECT_EQ(layout.tensors()[i].size, sizes[i]) << i;
  }
  EXPECT_EQ(layout.tensors()[2].name, "fc2.w");
  EXPECT_EQ(layout.tensors()[2].shape, (std::vector<uint64_t>{128, 10}));
  EXPECT_EQ(layout.num_elements(), 101770u);
  EXPECT_EQ(layout.LargestTensorSize(), 100352u);
}

TEST(ModelLayoutTest, RejectsBadTensorsAndStaysUnchanged) {
  ModelLayout layout;
  ASSERT_OK(layout.Add("w", {2, 3}));

  const Status duplicate = layout.Add("w", {4});
  EXPECT_EQ(duplicate.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(duplicate.message().find("'w'"), std::string::npos);
  EXPECT_EQ(layout.Add("", {4}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(layout.Add("z", {3, 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(layout.Add("steps", {}, ElementType::kI64).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(layout.Add("z0", {0}).code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(layout.tensors().size(), 1u);
  EXPECT_EQ(layout.num_elements(), 6u);
  EXPECT_EQ(layout.Find("z"), nullptr);

  // Still usable after the failures.
  ASSERT_OK(layout.Add("b", {3}));
  EXPECT_EQ(layout.Find("b")->offset, 6u);
}

TEST(ModelLayoutTest, ScalarsHoldOneElement) {
  ModelLayout layout;
  ASSERT_OK(layout.Add("temperature", {}, ElementType::kF16));
  ASSERT_OK(layout.Add("w", {2}));
  EXPECT_EQ(layout.tensors()[0].size, 1u);
  EXPECT_EQ(layout.Find("w")->offset, 1u);
}

TEST(ModelLayoutTest, FirstDifferenceNamesTheTensor) {
  ModelLayout site, worker;
  ASSERT_OK(site.Add("fc1.weight", {256, 784}));
  ASSERT_OK(site.Add("fc1.bias", {256}));
  ASSERT_OK(worker.Add("fc1.weight", {128, 784}));
  ASSERT_OK(worker.Add("fc1.bias", {128}));
  std::optional<std::string> difference =
      site.FirstDifference(worker, "the site's", "the worker's");
  ASSERT_TRUE(difference.has_value());
  EXPECT_EQ(*difference,
            "tensor 0 'fc1.weight': [128,784] F32 in the worker's, "
            "[256,784] F32 in the site's");

  ModelLayout typed;
  ASSERT_OK(typed.Add("fc1.weight", {256, 784}, ElementType::kBF16));
  difference = site.FirstDifference(typed, "site", "worker");
  ASSERT_TRUE(difference.has_value());
  EXPECT_NE(difference->find("BF16 in worker"), std::string::npos) << *difference;

  ModelLayout shorter;
  ASSERT_OK(shorter.Add("fc1.weight", {256, 784}));
  difference = site.FirstDifference(shorter, "site", "worker");
  ASSERT_TRUE(difference.has_value());
  EXPECT_EQ(*difference, "worker has no tensor 'fc1.bias' (tensor 1 of 2 in site)");

  EXPECT_FALSE(site.FirstDifference(site, "a", "b").has_value());
}

TEST(ModelLayoutTest, RejectsSizesThatOverflow) {
  constexpr uint64_t kHuge = uint64_t{1} << 40;
  ModelLayout layout;
  EXPECT_EQ(layout.Add("t", {kHuge, kHuge}).code(),
            StatusCode::kInvalidArgument);
  const uint64_t max_elements = std::numeric_limits<uint64_t>::max() / 8;
  ASSERT_OK(layout.Add("a", {max_elements / 2 + 1}));
  const Status total = layout.Add("b", {max_elements / 2 + 1});
  EXPECT_EQ(total.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(layout.tensors().size(), 1u);
  EXPECT_EQ(layout.num_elements(), max_elements / 2 + 1);
}

TEST(ModelLayoutTest, Find) {
  const ModelLayout layout = TwoLayerLayout();
  const TensorInfo* info = layout.Find("fc2.w");
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->name, "fc2.w");
  EXPECT_EQ(info->offset, 100480u);
  EXPECT_EQ(info->size, 1280u);
  EXPECT_EQ(info, &layout.tensors()[2]);
  EXPECT_EQ(layout.Find("fc2"), nullptr);
  EXPECT_EQ(layout.Find(""), nullptr);
}


TEST(ModelLayoutTest, Equality) {
  ModelLayout a;
  ASSERT_OK(a.Add("w", {2, 3}));
  ASSERT_OK(a.Add("b", {3}));
  ModelLayout same;
  ASSERT_OK(same.Add("w", {2, 3}));
  ASSERT_OK(same.Add("b", {3}));
  EXPECT_TRUE(a == same);

  ModelLayout reshaped;  // same element count, other shape
  ASSERT_OK(reshaped.Add("w", {3, 2}));
  ASSERT_OK(reshaped.Add("b", {3}));
  EXPECT_FALSE(a == reshaped);

  ModelLayout reordered;
  ASSERT_OK(reordered.Add("b", {3}));
  ASSERT_OK(reordered.Add("w", {2, 3}));
  EXPECT_FALSE(a == reordered);

  ModelLayout renamed;
  ASSERT_OK(renamed.Add("w", {2, 3}));
  ASSERT_OK(renamed.Add("bias", {3}));
  EXPECT_FALSE(a == renamed);

  ModelLayout shorter;
  ASSERT_OK(shorter.Add("w", {2, 3}));
  EXPECT_FALSE(a == shorter);
  EXPECT_FALSE(shorter == a);
  EXPECT_TRUE(ModelLayout() == ModelLayout());
}

TEST(ModelLayoutTest, DebugString) {
  ModelLayout layout;
  ASSERT_OK(layout.Add("w", {2, 3}));
  EXPECT_EQ(layout.DebugString(), "w[2,3]");
  ASSERT_OK(layout.Add("b", {3}));
  ASSERT_OK(layout.Add("t", {1, 2, 4}));
  EXPECT_EQ(layout.DebugString(), "w[2,3] b[3] t[1,2,4]");
}

}  // namespace
}  // namespace meridian
