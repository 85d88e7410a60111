// libFuzzer target for the reader of initial-weights files
// (include/meridian/train/safetensors.h): every site server parses the job's
// weights file before it serves, and a damaged or hostile file must be
// refused with an error, never crash or over-allocate. Besides "no crash,
// no leak, no out-of-bounds access", it checks what an accepted file
// promises: the tensors tile the data buffer in order, each tensor's bytes
// match its shape and type, and writing the parsed file back and reading
// it again gives the same tensors and bytes.
// The seed corpus is tests/fuzz/corpus/safetensors/.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>
#include <vector>

#include "meridian/train/safetensors.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "safetensors_fuzz: %s\n", what);
  std::abort();
}

void Require(bool condition, const char* what) {
  if (!condition) Fail(what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  meridian::Result<meridian::TensorFile> file = meridian::ParseSafetensors(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!file.ok()) {
    Require(!file.status().message().empty(), "refusal without a reason");
    return 0;
  }
  uint64_t next = 0;
  std::vector<meridian::TensorToWrite> again;
  for (const meridian::FileTensor& tensor : file->tensors) {
    Require(tensor.begin == next, "accepted a gap or overlap");
    uint64_t elements = 1;
    for (uint64_t dim : tensor.shape) elements *= dim;
    Require(tensor.end - tensor.begin ==
                elements * meridian::ElementSize(tensor.type),
            "accepted bytes that do not match the shape");
    next = tensor.end;
    again.push_back({tensor.name, tensor.type, tensor.shape,
                     file->Bytes(tensor)});
  }
  Require(next == file->data.size(), "accepted data after the last tensor");

  // Round trip through the writer (into a private temporary file).
  char path[] = "/tmp/safetensors_fuzz_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return 0;
  close(fd);
  Require(meridian::WriteSafetensors(path, again, file->metadata).ok(),
          "cannot write an accepted file back");
  meridian::Result<meridian::TensorFile> read = meridian::ReadSafetensors(path);
  std::remove(path);
  Require(read.ok(), "a written file does not read back");
  Require(read->tensors.size() == file->tensors.size(), "tensor count");
  Require(read->data == file->data, "data differs after a round trip");
  Require(read->metadata == file->metadata, "metadata differs");
  for (size_t i = 0; i < read->tensors.size(); ++i) {
    Require(read->tensors[i].name == file->tensors[i].name &&
                read->tensors[i].shape == file->tensors[i].shape &&
                read->tensors[i].type == file->tensors[i].type,
            "tensor differs after a round trip");
  }
  return 0;
}
