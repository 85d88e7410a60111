// Dense (FULLY_CONNECTED) layers: hidden ones and the output layer to the
// classes; they flatten channel-major input to sample-major.

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

using model_internal::UniformSymmetric;

class Dense final : public Layer {
 public:
  Dense(Shape in, int64_t units, uint64_t weight_offset, uint64_t bias_offset)
      : Layer(in, Shape{units, 1, 1}),
        weight_offset_(weight_offset),
        bias_offset_(bias_offset) {}

  bool OutputChannelMajor(bool) const override { return false; }

  void Initialize(std::mt19937_64& rng, float* params,
                  bool last) const override {
    // He-uniform for hidden layers (ReLUs follow), Glorot-uniform for the
    // output layer.
    const double fan_in = static_cast<double>(input_shape().size());
    const double fan_out = static_cast<double>(output_shape().c);
    const float limit = static_cast<float>(
        last ? std::sqrt(6.0 / (fan_in + fan_out)) : std::sqrt(6.0 / fan_in));
    float* weight = params + weight_offset_;
    for (int64_t i = 0; i < output_shape().c * input_shape().size(); ++i) {
      weight[i] = UniformSymmetric(rng, limit);
    }
    std::fill_n(params + bias_offset_, output_shape().c, 0.0f);
  }

  int64_t PackSize(int64_t n) const override {
    return std::max(kernels::OuterPackSize(output_shape().c, n),
                    kernels::OuterPackSize(n, output_shape().c));
  }

  void Forward(const float* params, const float* in, float* out,
               bool channel_major, LayerWork& work, const Pass& pass) override {
    const float* x = Flat(in, channel_major, work, pass.n);
    const int64_t f = input_shape().size();
    // out[o + b * O] = bias[o] + sum_i weight[o][i] * x[b][i].
    kernels::DotProduct(pass.isa, output_shape().c, pass.n, f,
                        params + weight_offset_, f, x, f, params + bias_offset_,
                        false, out, output_shape().c);
  }

  void Backward(const float* params, const float* in, const float*,
                const float* d_out, float* d_in, float* grad,
                bool channel_major, LayerWork& work,
                const Pass& pass) override {
    const int64_t f = input_shape().size();
    const int64_t units = output_shape().c;
    // Forward left the flattened input in work.a when it made one.
    const float* x = NeedsFlattening(channel_major) ? work.a.data() : in;
    float* grad_bias = grad + bias_offset_;
    for (int64_t o = 0; o < units; ++o) grad_bias[o] = 0;
    for (int64_t b = 0; b < pass.n; ++b) {
      for (int64_t o = 0; o < units; ++o) grad_bias[o] += d_out[b * units + o];
    }
    // grad_weight[o][i] = sum_b d_out[b][o] * x[b][i].
    kernels::OuterProduct(pass.isa, units, f, pass.n, d_out, 1, units, x, f,
                          grad + weight_offset_, f, pass.pack);
    if (d_in == nullptr) return;
    float* d_x = d_in;
    if (NeedsFlattening(channel_major)) {
      Grow(work.b, pass.n * f);
      d_x = work.b.data();
    }
    // d_x[b][i] = sum_o d_out[b][o] * weight[o][i].
    kernels::OuterProduct(pass.isa, pass.n, f, units, d_out, units, 1,
                          params + weight_offset_, f, d_x, f, pass.pack);
    if (d_x != d_in) SampleToChannelMajor(d_x, input_shape(), pass.n, d_in);
  }

 private:
  bool NeedsFlattening(bool channel_major) const {
    // Channel-major with one channel is already sample-major.
    return channel_major && input_shape().c > 1;
  }

  const float* Flat(const float* in, bool channel_major, LayerWork& work,
                    int64_t n) const {
    if (!NeedsFlattening(channel_major)) return in;
    Grow(work.a, n * input_shape().size());
    ChannelToSampleMajor(in, input_shape(), n, work.a.data());
    return work.a.data();
  }

  uint64_t weight_offset_;
  uint64_t bias_offset_;
};

}  // namespace

Result<std::unique_ptr<Layer>> BuildDense(const LayerSpec& spec,
                                          ModelLayout& layout) {
  MERIDIAN_RETURN_IF_ERROR(CheckRange(spec.config.channels(), 1, kMaxDenseWidth,
                                      spec.where + ".channels"));
  const auto units = static_cast<uint64_t>(spec.config.channels());
  const uint64_t weight_offset = layout.num_elements();
  MERIDIAN_RETURN_IF_ERROR(
      layout.Add("fc" + spec.id + ".weight",
                 {units, static_cast<uint64_t>(spec.in.size())}));
  const uint64_t bias_offset = layout.num_elements();
  MERIDIAN_RETURN_IF_ERROR(layout.Add("fc" + spec.id + ".bias", {units}));
  return std::unique_ptr<Layer>(new Dense(spec.in, static_cast<int64_t>(units),
                                          weight_offset, bias_offset));
}

}  // namespace meridian::cnn_internal
