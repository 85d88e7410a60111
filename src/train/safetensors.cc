#include "meridian/train/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

namespace meridian {
namespace {

// nlohmann::json, not protobuf's Struct: the Struct type is compiled into
// libprotobuf, whose map layout differs from the one its headers give a
// ThreadSanitizer build (map_field.h), so reading one from our code crashes
// there. A header-only parser is compiled with our own flags.
using Json = nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";

// A non-negative integer held exactly by a JSON number (a double).
std::optional<uint64_t> WholeNumber(const Json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (!value.is_number_float()) return std::nullopt;
  const double number = value.get<double>();
  // 2^53: beyond it a double no longer holds every integer.
  if (!(number >= 0) || number > 9007199254740992.0 ||
      std::floor(number) != number) {
    return std::nullopt;
  }
  return static_cast<uint64_t>(number);
}

// One entry of the header: {"dtype": ..., "shape": [...],
// "data_offsets": [b, e]}, checked against itself (not yet against the
// buffer).
Result<FileTensor> ParseEntry(const std::string& name, const Json& value,
                              std::string_view what) {
  const std::string where =
      std::string(what) + ": tensor '" + name + "'";
  if (name.empty()) {
    return DataLossError(std::string(what) + ": a tensor has an empty name");
  }
  if (!value.is_object()) {
    return DataLossError(where + ": its entry is not an object");
  }
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return DataLossError(where + ": unknown field '" + key + "'");
    }
  }
  FileTensor tensor;
  tensor.name = name;
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return DataLossError(where + ": no dtype");
  }
  const std::string& dtype_name = dtype->get_ref<const std::string&>();
  const std::optional<ElementType> type =
      ElementTypeFromSafetensors(dtype_name);
  if (!type) {
    return DataLossError(where + ": dtype '" + dtype_name +
                         "' is not one this build reads (F32, F16, BF16, "
                         "F64, I64, I32, I16, I8, U8, BOOL)");
  }
  tensor.type = *type;
  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) {
    return DataLossError(where + ": no shape");
  }
  uint64_t elements = 1;
  for (const Json& dim : *shape) {
    const std::optional<uint64_t> size = WholeNumber(dim);
    if (!size) {
      return DataLossError(where + ": a shape entry is not a whole number");
    }
    if (*size != 0 &&
        elements > std::numeric_limits<uint64_t>::max() / 16 / *size) {
      return DataLossError(where + ": the shape is too large");
    }
    elements *= *size;
    tensor.shape.push_back(*size);
  }
  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) {
    return DataLossError(where + ": data_offsets is not [begin, end]");
  }
  const std::optional<uint64_t> begin = WholeNumber((*offsets)[0]);
  const std::optional<uint64_t> end = WholeNumber((*offsets)[1]);
  if (!begin || !end || *end < *begin) {
    return DataLossError(where + ": data_offsets is not [begin, end] with "
                                 "begin <= end");
  }
  tensor.begin = *begin;
  tensor.end = *end;
  const uint64_t bytes = elements * ElementSize(tensor.type);
  if (*end - *begin != bytes) {
    return DataLossError(where + ": " + std::to_string(*end - *begin) +
                         " bytes of data for " + std::to_string(elements) +
                         " elements of " +
                         std::string(SafetensorsDType(tensor.type)) +
                         " (" + std::to_string(bytes) + " bytes)");
  }
  return tensor;
}

uint64_t ReadU64Le(const std::string& bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) {
    value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  }
  return value;
}

std::string U64Le(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
  return out;
}

// A JSON string literal of `text` (names are the user's: escape them).
std::string JsonString(std::string_view text) {
  // Strict: a name that is not UTF-8 gives "" (the header would not parse).
  try {
    return Json(std::string(text)).dump();
  } catch (const Json::exception&) {
    return "\"\"";
  }
}

}  // namespace

// The element types are named as safetensors names them (layout.h).
std::string_view SafetensorsDType(ElementType type) {
  return ElementTypeName(type);
}

std::optional<ElementType> ElementTypeFromSafetensors(std::string_view name) {
  return ElementTypeFromName(name);
}

std::span<const std::byte> TensorFile::Bytes(const FileTensor& tensor) const {
  return std::as_bytes(std::span(data)).subspan(tensor.begin,
                                                tensor.end - tensor.begin);
}

const FileTensor* TensorFile::Find(std::string_view name) const {
  for (const FileTensor& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

Result<TensorFile> ParseSafetensors(std::string bytes, std::string_view what) {
  const std::string file(what);
  if (bytes.size() < 8) {
    return DataLossError(file + ": " + std::to_string(bytes.size()) +
                         " bytes: too short for a safetensors file (it "
                         "starts with an 8-byte header length)");
  }
  const uint64_t header_bytes = ReadU64Le(bytes);
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    return DataLossError(file + ": a header of " +
                         std::to_string(header_bytes) +
                         " bytes exceeds the limit of " +
                         std::to_string(kMaxSafetensorsHeaderBytes) +
                         " (not a safetensors file?)");
  }
  if (header_bytes > bytes.size() - 8) {
    return DataLossError(file + ": the header says " +
                         std::to_string(header_bytes) + " bytes, the file has " +
                         std::to_string(bytes.size() - 8) +
                         " after the length (truncated?)");
  }
  // Parsed without exceptions: a malformed header gives a discarded value.
  // The parser is iterative, so a deeply nested header does not recurse;
  // its size is bounded above.
  const Json header = Json::parse(
      std::string_view(bytes).substr(8, header_bytes), /*cb=*/nullptr,
      /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return DataLossError(file + ": the header is not a JSON object");
  }
  TensorFile out;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) {
        return DataLossError(file + ": __metadata__ is not an object");
      }
      for (const auto& [key, entry] : value.items()) {
        if (!entry.is_string()) {
          return DataLossError(file + ": __metadata__ '" + key +
                               "' is not a string");
        }
        out.metadata[key] = entry.get<std::string>();
      }
      continue;
    }
    Result<FileTensor> tensor = ParseEntry(name, value, file);
    if (!tensor.ok()) return tensor.status();
    out.tensors.push_back(std::move(tensor).value());
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const FileTensor& a, const FileTensor& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  // The byte ranges tile the buffer: each starts where the last ended.
  const uint64_t data_bytes = bytes.size() - 8 - header_bytes;
  uint64_t next = 0;
  for (const FileTensor& tensor : out.tensors) {
    if (tensor.begin != next) {
      return DataLossError(
          file + ": tensor '" + tensor.name + "' starts at byte " +
          std::to_string(tensor.begin) + ", expected " + std::to_string(next) +
          (tensor.begin < next ? " (it overlaps the tensor before)"
                               : " (a gap before it)"));
    }
    next = tensor.end;
  }
  if (next != data_bytes) {
    return DataLossError(file + ": the tensors hold " + std::to_string(next) +
                         " bytes of data, the file has " +
                         std::to_string(data_bytes) +
                         (next > data_bytes ? " (truncated)"
                                            : " (bytes after the last tensor)"));
  }
  out.data = bytes.substr(8 + header_bytes);
  return out;
}

Result<TensorFile> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFoundError(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return InvalidArgumentError(path + ": is a directory, not a tensor file");
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) {
    return DataLossError(path + ": read failed: " + std::strerror(errno));
  }
  return ParseSafetensors(std::move(bytes).str(), path);
}

Status WriteSafetensors(const std::string& path,
                        std::span<const TensorToWrite> tensors,
                        const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += JsonString(kMetadataKey) + ":{";
    for (const auto& [key, value] : metadata) {
      if (!first) header += ',';
      first = false;
      header += JsonString(key) + ':' + JsonString(value);
    }
    header += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const TensorToWrite& tensor : tensors) {
    uint64_t elements = 1;
    for (uint64_t dim : tensor.shape) elements *= dim;
    if (tensor.bytes.size() != elements * ElementSize(tensor.type)) {
      return InvalidArgumentError(
          "tensor '" + tensor.name + "': " +
          std::to_string(tensor.bytes.size()) + " bytes for its shape and " +
          std::string(SafetensorsDType(tensor.type)));
    }
    if (!first) header += ',';
    first = false;
    header += JsonString(tensor.name) + ":{\"dtype\":\"" +
              std::string(SafetensorsDType(tensor.type)) + "\",\"shape\":[";
    for (size_t i = 0; i < tensor.shape.size(); ++i) {
      if (i > 0) header += ',';
      header += std::to_string(tensor.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + ',' +
              std::to_string(offset + tensor.bytes.size()) + "]}";
    offset += tensor.bytes.size();
  }
  header += '}';
  // Pad the header with spaces to a multiple of 8 bytes, as the reference
  // writer does, so that the data starts aligned.
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return UnavailableError(temp + ": cannot create: " +
                              std::strerror(errno));
    }
    out << U64Le(header.size()) << header;
    for (const TensorToWrite& tensor : tensors) {
      out.write(reinterpret_cast<const char*>(tensor.bytes.data()),
                static_cast<std::streamsize>(tensor.bytes.size()));
    }
    out.flush();
    if (!out) {
      return UnavailableError(temp + ": write failed: " +
                              std::strerror(errno));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return UnavailableError(path + ": rename failed: " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace meridian
