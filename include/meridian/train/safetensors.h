// Tensor files in the safetensors format (the format of Hugging Face's
// `safetensors` library, which PyTorch users write from a state_dict):
//
//   8 bytes   N, the header's length, unsigned little-endian
//   N bytes   a JSON object: {"<tensor name>": {"dtype": "F32",
//             "shape": [d0, d1, ...], "data_offsets": [begin, end]}, ...,
//             "__metadata__": {"<key>": "<value>", ...}}  (metadata optional)
//   the rest  the tensors' bytes, row-major, little-endian; each tensor at
//             [begin, end) of this buffer
//
// The reader is strict, because every site must derive the same model from
// the same file and a hostile or damaged file must not crash a site server:
// the header must be valid JSON of that shape, at most kMaxHeaderBytes;
// every dtype known; every size product(shape) x element size; the
// tensors' byte ranges must tile the buffer exactly (no gaps, no overlap,
// nothing after the last), names unique and non-empty. Errors name the
// file, the tensor and what is wrong.
//
// Order: a file's tensors are listed in the order of their data (ascending
// begin). That order is the model's layout order, so every reader of the
// same file lays the model out identically.
#ifndef MERIDIAN_TRAIN_SAFETENSORS_H_
#define MERIDIAN_TRAIN_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/core/layout.h"
#include "meridian/core/status.h"

namespace meridian {

// Header limit: a header is names and shapes, never values (the reference
// implementation refuses headers over 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// One tensor of a file: where its bytes are in the data buffer.
struct FileTensor {
  std::string name;
  ElementType type = ElementType::kF32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;  // byte offsets into TensorFile::data
  uint64_t end = 0;
};

// A parsed file: its tensors in data order, its metadata and its data
// buffer (owned).
struct TensorFile {
  std::vector<FileTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string data;

  // The bytes of `tensor` (one of tensors).
  std::span<const std::byte> Bytes(const FileTensor& tensor) const;
  const FileTensor* Find(std::string_view name) const;
};

// Parses the bytes of a whole file; `what` names it in errors (e.g. the
// path). DataLoss for anything malformed or truncated.
Result<TensorFile> ParseSafetensors(std::string bytes, std::string_view what);

// Reads and parses the file at `path` (NotFound when it does not exist).
Result<TensorFile> ReadSafetensors(const std::string& path);

// Writes `tensors` (name, type, shape, bytes: each exactly
// product(shape) x ElementSize(type) long) in the given order with
// `metadata`, atomically (a temporary file renamed over `path`).
struct TensorToWrite {
  std::string name;
  ElementType type = ElementType::kF32;
  std::vector<uint64_t> shape;
  std::span<const std::byte> bytes;
};
Status WriteSafetensors(const std::string& path,
                        std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata);

// The safetensors dtype name of `type` ("F32", "BF16", "I64", ...) and
// back (nullopt for a name this build does not know).
std::string_view SafetensorsDType(ElementType type);
std::optional<ElementType> ElementTypeFromSafetensors(std::string_view name);

}  // namespace meridian

#endif  // MERIDIAN_TRAIN_SAFETENSORS_H_
