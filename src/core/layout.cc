#include "meridian/core/layout.h"

#include <algorithm>
#include <limits>

namespace meridian {

namespace {

struct ElementTypeSpelling {
  ElementType type;
  std::string_view name;
};
constexpr ElementTypeSpelling kElementTypeNames[] = {
    {ElementType::kF32, "F32"},   {ElementType::kF16, "F16"},
    {ElementType::kBF16, "BF16"}, {ElementType::kF64, "F64"},
    {ElementType::kI64, "I64"},   {ElementType::kI32, "I32"},
    {ElementType::kI16, "I16"},   {ElementType::kI8, "I8"},
    {ElementType::kU8, "U8"},     {ElementType::kBool, "BOOL"},
};

}  // namespace

std::string_view ElementTypeName(ElementType type) {
  for (const ElementTypeSpelling& entry : kElementTypeNames) {
    if (entry.type == type) return entry.name;
  }
  return "?";
}

std::optional<ElementType> ElementTypeFromName(std::string_view name) {
  for (const ElementTypeSpelling& entry : kElementTypeNames) {
    if (entry.name == name) return entry.type;
  }
  return std::nullopt;
}

size_t ElementSize(ElementType type) {
  switch (type) {
    case ElementType::kF64:
    case ElementType::kI64:
      return 8;
    case ElementType::kF32:
    case ElementType::kI32:
      return 4;
    case ElementType::kF16:
    case ElementType::kBF16:
    case ElementType::kI16:
      return 2;
    case ElementType::kI8:
    case ElementType::kU8:
    case ElementType::kBool:
      return 1;
  }
  return 0;
}

bool IsFloating(ElementType type) {
  return type == ElementType::kF32 || type == ElementType::kF16 ||
         type == ElementType::kBF16 || type == ElementType::kF64;
}

Status ModelLayout::Add(std::string name, std::vector<uint64_t> shape,
                        ElementType type) {
  if (name.empty()) return InvalidArgumentError("tensor name is empty");
  if (!IsFloating(type)) {
    return InvalidArgumentError("tensor '" + name +
                                "' is not floating-point: a model's layout "
                                "holds floating-point tensors only");
  }
  if (Find(name) != nullptr) {
    return InvalidArgumentError("duplicate tensor name '" + name + "'");
  }
  uint64_t size = 1;
  for (uint64_t dim : shape) {
    if (dim == 0) {
      return InvalidArgumentError("tensor '" + name + "' has a zero dimension");
    }
    // Keep every element index and byte offset representable.
    if (size > (std::numeric_limits<uint64_t>::max() / 8) / dim) {
      return InvalidArgumentError("tensor '" + name + "' is too large");
    }
    size *= dim;
  }
  if (num_elements_ > (std::numeric_limits<uint64_t>::max() / 8) - size) {
    return InvalidArgumentError("model is too large");
  }
  TensorInfo info;
  info.name = std::move(name);
  info.shape = std::move(shape);
  info.offset = num_elements_;
  info.size = size;
  info.type = type;
  num_elements_ += size;
  tensors_.push_back(std::move(info));
  return Status::Ok();
}

uint64_t ModelLayout::LargestTensorSize() const {
  uint64_t largest = 0;
  for (const TensorInfo& tensor : tensors_) {
    largest = std::max(largest, tensor.size);
  }
  return largest;
}

const TensorInfo* ModelLayout::Find(std::string_view name) const {
  // Models have a handful of tensors: a linear scan beats hashing here.
  for (const TensorInfo& info : tensors_) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::string ModelLayout::DebugString() const {
  std::string out;
  for (const TensorInfo& info : tensors_) {
    if (!out.empty()) out += ' ';
    out += info.name;
    out += '[';
    for (size_t i = 0; i < info.shape.size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string(info.shape[i]);
    }
    out += ']';
  }
  return out;
}

bool operator==(const ModelLayout& a, const ModelLayout& b) {
  if (a.tensors_.size() != b.tensors_.size()) return false;
  for (size_t i = 0; i < a.tensors_.size(); ++i) {
    if (a.tensors_[i].name != b.tensors_[i].name ||
        a.tensors_[i].shape != b.tensors_[i].shape ||
        a.tensors_[i].type != b.tensors_[i].type) {
      return false;
    }
  }
  return true;
}

}  // namespace meridian

namespace meridian {
namespace {

// "[128,784] F32"
std::string ShapeAndType(const TensorInfo& tensor) {
  std::string out = "[";
  for (size_t i = 0; i < tensor.shape.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(tensor.shape[i]);
  }
  out += "] ";
  out += ElementTypeName(tensor.type);
  return out;
}

}  // namespace

std::optional<std::string> ModelLayout::FirstDifference(
    const ModelLayout& other, std::string_view this_name,
    std::string_view other_name) const {
  const std::string ours(this_name), theirs(other_name);
  const size_t common = std::min(tensors_.size(), other.tensors_.size());
  for (size_t i = 0; i < common; ++i) {
    const TensorInfo& a = tensors_[i];
    const TensorInfo& b = other.tensors_[i];
    const std::string where = "tensor " + std::to_string(i) + " ";
    if (a.name != b.name) {
      const TensorInfo* elsewhere = other.Find(a.name);
      return where + "is '" + b.name + "' in " + theirs + ", '" + a.name +
             "' in " + ours +
             (elsewhere == nullptr ? " (" + theirs + " has no '" + a.name + "')"
                                   : " (the order differs)");
    }
    if (a.shape != b.shape || a.type != b.type) {
      return where + "'" + a.name + "': " + ShapeAndType(b) + " in " + theirs +
             ", " + ShapeAndType(a) + " in " + ours;
    }
  }
  if (tensors_.size() > common) {
    return theirs + " has no tensor '" + tensors_[common].name +
           "' (tensor " + std::to_string(common) + " of " +
           std::to_string(tensors_.size()) + " in " + ours + ")";
  }
  if (other.tensors_.size() > common) {
    return ours + " has no tensor '" + other.tensors_[common].name +
           "' (tensor " + std::to_string(common) + " of " +
           std::to_string(other.tensors_.size()) + " in " + theirs + ")";
  }
  return std::nullopt;
}

}  // namespace meridian
