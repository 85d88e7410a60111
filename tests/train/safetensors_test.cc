#include "meridian/train/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "testing/status_matchers.h"
#include "testing/test_data.h"

namespace meridian {
namespace {

using ::meridian::testing::StatusIs;
using ::testing::HasSubstr;

std::string U64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A file of `header` (JSON) and `data` bytes.
std::string File(const std::string& header, const std::string& data) {
  return U64(header.size()) + header + data;
}

std::string Floats(std::vector<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

TEST(SafetensorsTest, ParsesTensorsInDataOrderWithMetadata) {
  // JSON order b, a; data order a, b: the layout follows the data.
  const std::string header =
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},)"
      R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
      R"("__metadata__":{"format":"pt"}})";
  Result<TensorFile> file =
      ParseSafetensors(File(header, Floats({1, 2, 3, 4, 5})), "m");
  ASSERT_OK(file);
  ASSERT_EQ(file->tensors.size(), 2u);
  EXPECT_EQ(file->tensors[0].name, "a");
  EXPECT_EQ(file->tensors[1].name, "b");
  EXPECT_EQ(file->tensors[1].shape, (std::vector<uint64_t>{2}));
  EXPECT_EQ(file->metadata.at("format"), "pt");
  float b[2];
  std::memcpy(b, file->Bytes(file->tensors[1]).data(), 8);
  EXPECT_EQ(b[0], 4);
  EXPECT_EQ(b[1], 5);
}

TEST(SafetensorsTest, WriteThenReadRoundTripsEveryTypeAndScalars) {
  const std::string dir = ::meridian::testing::MakeTempDir("safetensors");
  const std::string path = dir + "/m.safetensors";
  const std::string w = Floats({1.5f, -2, 3, 4, 5, 6});
  const std::string steps(8, '\x07');
  const std::string half(4, '\x3c');
  const std::vector<TensorToWrite> tensors = {
      {"fc.weight", ElementType::kF32, {2, 3}, std::as_bytes(std::span(w))},
      {"bn.num_batches_tracked", ElementType::kI64, {},
       std::as_bytes(std::span(steps))},
      {"emb", ElementType::kF16, {2}, std::as_bytes(std::span(half))},
  };
  ASSERT_OK(WriteSafetensors(path, tensors, {{"written by", "test \"q\""}}));
  Result<TensorFile> file = ReadSafetensors(path);
  ASSERT_OK(file);
  ASSERT_EQ(file->tensors.size(), 3u);
  EXPECT_EQ(file->tensors[0].name, "fc.weight");
  EXPECT_EQ(file->tensors[1].type, ElementType::kI64);
  EXPECT_TRUE(file->tensors[1].shape.empty());
  EXPECT_EQ(file->tensors[2].type, ElementType::kF16);
  EXPECT_EQ(file->metadata.at("written by"), "test \"q\"");
  const std::span<const std::byte> bytes = file->Bytes(file->tensors[0]);
  EXPECT_EQ(std::memcmp(bytes.data(), w.data(), w.size()), 0);
}

TEST(SafetensorsTest, MissingFileIsNotFoundNamingThePath) {
  EXPECT_THAT(ReadSafetensors("/nonexistent/model.safetensors"),
              StatusIs(StatusCode::kNotFound, HasSubstr("/nonexistent")));
}

TEST(SafetensorsTest, RefusesEveryMalformedFileNamingTheProblem) {
  const std::string ok_entry =
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    std::string bytes;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"", "too short"},
      {U64(1000) + "{}", "truncated"},
      {U64(uint64_t{1} << 40) + "{}", "exceeds the limit"},
      {File("not json", ""), "not a JSON object"},
      {File("[1,2]", ""), "not a JSON object"},
      {File("{" + ok_entry + "}", Floats({1})), "truncated"},
      {File("{" + ok_entry + "}", Floats({1, 2, 3})), "after the last"},
      {File(R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})",
            Floats({1, 2})),
       "dtype 'Q7'"},
      {File(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
            Floats({1, 2})),
       "3 elements"},
      {File(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})",
            Floats({1, 2})),
       "whole number"},
      {File(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
            Floats({1, 2})),
       "whole number"},
      {File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",
            Floats({1, 2})),
       "begin <= end"},
      {File(R"({"a":{"dtype":"F32","shape":[2]}})", Floats({1, 2})),
       "data_offsets"},
      {File(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", Floats({1, 2})),
       "no dtype"},
      {File(R"({"a":5})", ""), "not an object"},
      {File(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
            Floats({1})),
       "empty name"},
      {File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
            Floats({1})),
       "overlaps"},
      {File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            Floats({1, 2})),
       "gap"},
      {File(R"({"__metadata__":{"k":1}})", ""), "not a string"},
      {File(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],)"
            R"("extra":1}})",
            Floats({1})),
       "unknown field"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseSafetensors(c.bytes, "file.st"),
                StatusIs(StatusCode::kDataLoss,
                         ::testing::AllOf(HasSubstr("file.st"),
                                          HasSubstr(c.says))))
        << c.says;
  }
}

}  // namespace
}  // namespace meridian
