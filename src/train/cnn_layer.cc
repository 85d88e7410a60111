#include "train/cnn_layer.h"

#include <cstring>

namespace meridian::cnn_internal {

// sample-major (n x C*P) <- channel-major, and back.
void ChannelToSampleMajor(const float* in, const Shape& shape, int64_t n,
                          float* out) {
  const int64_t p = shape.plane();
  for (int64_t c = 0; c < shape.c; ++c) {
    for (int64_t b = 0; b < n; ++b) {
      std::memcpy(out + b * shape.size() + c * p, in + (c * n + b) * p,
                  static_cast<size_t>(p) * sizeof(float));
    }
  }
}

void SampleToChannelMajor(const float* in, const Shape& shape, int64_t n,
                          float* out) {
  const int64_t p = shape.plane();
  for (int64_t c = 0; c < shape.c; ++c) {
    for (int64_t b = 0; b < n; ++b) {
      std::memcpy(out + (c * n + b) * p, in + b * shape.size() + c * p,
                  static_cast<size_t>(p) * sizeof(float));
    }
  }
}

Status CheckRange(uint64_t value, uint64_t low, uint64_t high,
                  const std::string& where) {
  if (value < low || value > high) {
    return InvalidArgumentError(where + " must be in [" + std::to_string(low) +
                                ", " + std::to_string(high) + "], got " +
                                std::to_string(value));
  }
  return Status::Ok();
}

std::string ShapeText(const Shape& shape) {
  return std::to_string(shape.c) + "x" + std::to_string(shape.h) + "x" +
         std::to_string(shape.w);
}

}  // namespace meridian::cnn_internal
