// The model's key space: named dense tensors laid end to end in one flat
// float vector. Shards, wire slices and updates all address this space.
#ifndef MERIDIAN_CORE_LAYOUT_H_
#define MERIDIAN_CORE_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/core/status.h"

namespace meridian {

// The element type of a tensor in the model as its owner (the worker's
// framework, the initial-weights file) holds it. Site servers keep, send and
// sync every tensor of a layout as float32 whatever its type; the type is
// part of the model's identity (a worker whose tensor has another type is
// refused), and tells a worker what to convert to and from.
enum class ElementType { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8,
                         kBool };

// "F32", "BF16", "I64" ... (the safetensors names) and back (nullopt for a
// name this build does not know).
std::string_view ElementTypeName(ElementType type);
std::optional<ElementType> ElementTypeFromName(std::string_view name);
// Bytes of one element of `type`.
size_t ElementSize(ElementType type);
// Whether `type` is a floating-point type (the types a layout may hold:
// integer tensors, such as BatchNorm's step counter, stay with the worker).
bool IsFloating(ElementType type);

// One named tensor inside the flat parameter vector.
struct TensorInfo {
  std::string name;
  std::vector<uint64_t> shape;  // row-major
  uint64_t offset = 0;          // first element in the flat vector
  uint64_t size = 0;            // product of shape
  ElementType type = ElementType::kF32;  // as its owner holds it
};

// Names, shapes and flat offsets of a model's tensors. Value type;
// thread-compatible.
class ModelLayout {
 public:
  // Appends a tensor after the existing ones; an empty shape is a scalar
  // (one element). Fails on an empty or duplicate name, a zero dimension
  // or a type that is not floating.
  Status Add(std::string name, std::vector<uint64_t> shape,
             ElementType type = ElementType::kF32);

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

  // nullopt when `other` equals this layout; otherwise the first
  // difference in words, naming the tensor, e.g. "tensor 2 'fc1.weight':
  // shape [128,784] F32 in <other_name>, [256,784] F32 in <this_name>", or
  // "<other_name> has no tensor 'bn.running_var' (tensor 4 in <this_name>)".
  std::optional<std::string> FirstDifference(const ModelLayout& other,
                                             std::string_view this_name,
                                             std::string_view other_name) const;

 private:
  std::vector<TensorInfo> tensors_;
  uint64_t num_elements_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_CORE_LAYOUT_H_
