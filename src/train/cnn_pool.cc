// Pooling (MAX_POOL, AVG_POOL) over windows of channel-major activations.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "train/cnn_layer.h"
#include "train/model_internal.h"

namespace meridian::cnn_internal {
namespace {

class Pool final : public Layer {
 public:
  Pool(Shape in, Shape out, int64_t kernel, int64_t stride, bool max)
      : Layer(in, out), kernel_(kernel), stride_(stride), max_(max) {}

  bool OutputChannelMajor(bool) const override { return true; }

  void Forward(const float*, const float* in, float* out, bool, LayerWork& work,
               const Pass& pass) override {
    const Shape& is = input_shape();
    const Shape& os = output_shape();
    const int64_t planes = is.c * pass.n;
    if (max_ && pass.train) {
      if (static_cast<int64_t>(work.index.size()) < planes * os.plane()) {
        work.index.resize(static_cast<size_t>(planes * os.plane()));
      }
    }
    const float inv_area = 1.0f / static_cast<float>(kernel_ * kernel_);
    for (int64_t q = 0; q < planes; ++q) {
      const float* src = in + q * is.plane();
      float* dst = out + q * os.plane();
      int32_t* index =
          max_ && pass.train ? work.index.data() + q * os.plane() : nullptr;
      for (int64_t oh = 0; oh < os.h; ++oh) {
        for (int64_t ow = 0; ow < os.w; ++ow) {
          const int64_t top = oh * stride_ * is.w + ow * stride_;
          if (max_) {
            int64_t best = top;
            float value = src[top];
            for (int64_t i = 0; i < kernel_; ++i) {
              for (int64_t j = 0; j < kernel_; ++j) {
                const int64_t at = top + i * is.w + j;
                if (src[at] > value) {
                  value = src[at];
                  best = at;
                }
              }
            }
            dst[oh * os.w + ow] = value;
            if (index != nullptr) {
              index[oh * os.w + ow] = static_cast<int32_t>(best);
            }
          } else {
            float sum = 0;
            for (int64_t i = 0; i < kernel_; ++i) {
              for (int64_t j = 0; j < kernel_; ++j) {
                sum += src[top + i * is.w + j];
              }
            }
            dst[oh * os.w + ow] = sum * inv_area;
          }
        }
      }
    }
  }

  void Backward(const float*, const float*, const float*, const float* d_out,
                float* d_in, float*, bool, LayerWork& work,
                const Pass& pass) override {
    if (d_in == nullptr) return;
    const Shape& is = input_shape();
    const Shape& os = output_shape();
    const int64_t planes = is.c * pass.n;
    std::fill_n(d_in, planes * is.plane(), 0.0f);
    const float inv_area = 1.0f / static_cast<float>(kernel_ * kernel_);
    for (int64_t q = 0; q < planes; ++q) {
      const float* src = d_out + q * os.plane();
      float* dst = d_in + q * is.plane();
      if (max_) {
        const int32_t* index = work.index.data() + q * os.plane();
        for (int64_t o = 0; o < os.plane(); ++o) dst[index[o]] += src[o];
        continue;
      }
      for (int64_t oh = 0; oh < os.h; ++oh) {
        for (int64_t ow = 0; ow < os.w; ++ow) {
          const int64_t top = oh * stride_ * is.w + ow * stride_;
          const float share = src[oh * os.w + ow] * inv_area;
          for (int64_t i = 0; i < kernel_; ++i) {
            for (int64_t j = 0; j < kernel_; ++j) {
              dst[top + i * is.w + j] += share;
            }
          }
        }
      }
    }
  }

 private:
  int64_t kernel_;
  int64_t stride_;
  bool max_;
};

}  // namespace

Result<std::unique_ptr<Layer>> BuildPool(const LayerSpec& spec) {
  const pb::LayerConfig& config = spec.config;
  const std::string& where = spec.where;
  const Shape& in = spec.in;
  const uint64_t kernel = config.has_kernel() ? config.kernel() : 2;
  MERIDIAN_RETURN_IF_ERROR(
      CheckRange(kernel, 1, kMaxKernel, where + ".kernel"));
  const uint64_t stride = config.has_stride() ? config.stride() : kernel;
  MERIDIAN_RETURN_IF_ERROR(
      CheckRange(stride, 1, kMaxKernel, where + ".stride"));
  const auto k = static_cast<int64_t>(kernel);
  const auto s = static_cast<int64_t>(stride);
  if (in.h < k || in.w < k) {
    return InvalidArgumentError(where + ": window " + std::to_string(k) +
                                " is larger than its input " + ShapeText(in));
  }
  const Shape out{in.c, (in.h - k) / s + 1, (in.w - k) / s + 1};
  return std::unique_ptr<Layer>(
      new Pool(in, out, k, s, config.kind() == pb::MAX_POOL));
}

}  // namespace meridian::cnn_internal
