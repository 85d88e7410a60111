// Cutting an update into messages a slow link carries in a fraction of a
// second (SplitIntoMessages, src/sync/update_codec.h).
#include "sync/update_codec.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace meridian {
namespace {

// An update of one slice per payload size in `bytes`, slice i changing
// i + 1 parameters.
EncodedSlices UpdateOf(const std::vector<size_t>& bytes) {
  EncodedSlices update;
  for (size_t i = 0; i < bytes.size(); ++i) {
    pb::TensorSlice slice;
    std::string name = "t";
    name += std::to_string(i);
    slice.set_tensor(name);
    update.slices.push_back(slice);
    update.frames.emplace_back(bytes[i], 'x');
    update.slice_entries.push_back(i + 1);
    update.entries += i + 1;
    update.bytes += bytes[i];
  }
  return update;
}

TEST(SplitIntoMessagesTest, AnUpdateThatFitsIsOneMessage) {
  const std::vector<EncodedSlices> messages =
      SplitIntoMessages(UpdateOf({5, 5}), 10);
  ASSERT_EQ(messages.size(), 1u);
  EXPECT_EQ(messages[0].slices.size(), 2u);
  EXPECT_EQ(messages[0].bytes, 10u);
  EXPECT_EQ(SplitIntoMessages(UpdateOf({50}), 0).size(), 1u);  // no limit
  EXPECT_TRUE(SplitIntoMessages(EncodedSlices(), 10).empty());
}

TEST(SplitIntoMessagesTest, SlicesGoTogetherWhileTheyFitAndNoneIsLost) {
  const std::vector<EncodedSlices> messages =
      SplitIntoMessages(UpdateOf({4, 4, 4, 20, 3}), 10);
  ASSERT_EQ(messages.size(), 4u);
  const std::vector<size_t> slices = {2, 1, 1, 1};
  const std::vector<uint64_t> bytes = {8, 4, 20, 3};
  const std::vector<uint64_t> entries = {1 + 2, 3, 4, 5};
  std::vector<std::string> tensors;
  for (size_t m = 0; m < messages.size(); ++m) {
    EXPECT_EQ(messages[m].slices.size(), slices[m]) << m;
    EXPECT_EQ(messages[m].frames.size(), slices[m]) << m;
    EXPECT_EQ(messages[m].bytes, bytes[m]) << m;
    EXPECT_EQ(messages[m].entries, entries[m]) << m;
    for (const pb::TensorSlice& slice : messages[m].slices) {
      tensors.push_back(slice.tensor());
    }
  }
  EXPECT_EQ(tensors, (std::vector<std::string>{"t0", "t1", "t2", "t3", "t4"}));
}

}  // namespace
}  // namespace meridian
