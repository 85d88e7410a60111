// The model's key space: named dense tensors laid end to end in one flat
// float vector. Shards, wire slices and updates all address this space.
#ifndef MERIDIAN_CORE_LAYOUT_H_
#define MERIDIAN_CORE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/core/status.h"

namespace meridian {

// One named tensor inside the flat parameter vector.
struct TensorInfo {
  std::string name;
  std::vector<uint64_t> shape;  // row-major
  uint64_t offset = 0;          // first element in the flat vector
  uint64_t size = 0;            // product of shape
};

// Names, shapes and flat offsets of a model's tensors. Value type;
// thread-compatible.
class ModelLayout {
 public:
  // Appends a tensor after the existing ones. Fails on an empty or duplicate
  // name, an empty shape or a zero dimension.
  Status Add(std::string name, std::vector<uint64_t> shape);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  uint64_t num_elements() const { return num_elements_; }
  // Elements of the largest tensor (0 for an empty layout): what one
  // payload frame of a whole-tensor slice carries at most.
  uint64_t LargestTensorSize() const;
  // nullptr when no tensor has that name.
  const TensorInfo* Find(std::string_view name) const;


  // "name[d0,d1] name2[d0]".
  std::string DebugString() const;

  friend bool operator==(const ModelLayout& a, const ModelLayout& b);

 private:
  std::vector<TensorInfo> tensors_;
  uint64_t num_elements_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_CORE_LAYOUT_H_
