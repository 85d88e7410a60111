// Convolution (CONV): im2col + the outer-product kernel over chunks of
// samples that stay in cache, or, for stride 1, an implicit GEMM over
// bordered buffers (cnn_layer.h has the activation layouts).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/cnn_layer.h"
#include "train/model_internal.h"

namespace meridian::cnn_internal {
namespace {

using model_internal::UniformSymmetric;

// im2col columns per convolution chunk (floats): 512 KiB, about an L2.
constexpr int64_t kChunkFloats = int64_t{1} << 17;
// The largest bordered buffer of one implicit-GEMM group (floats): 128 KiB,
// so that the group's buffers stay in L2 (larger groups measured slower).
constexpr int64_t kGroupFloats = int64_t{1} << 15;

struct ConvGeometry {
  int64_t kernel = 1;
  int64_t stride = 1;
  int64_t padding = 0;
};

class Conv final : public Layer {
 public:
  Conv(Shape in, Shape out, ConvGeometry geometry, uint64_t weight_offset,
       uint64_t bias_offset)
      : Layer(in, out),
        g_(geometry),
        k_(in.c * geometry.kernel * geometry.kernel),
        weight_offset_(weight_offset),
        bias_offset_(bias_offset) {}

  bool OutputChannelMajor(bool) const override { return true; }

  void Initialize(std::mt19937_64& rng, float* params, bool) const override {
    // He-uniform: convolutions feed ReLUs (possibly through a norm).
    const float limit =
        static_cast<float>(std::sqrt(6.0 / static_cast<double>(k_)));
    float* weight = params + weight_offset_;
    for (int64_t i = 0; i < output_shape().c * k_; ++i) {
      weight[i] = UniformSymmetric(rng, limit);
    }
    std::fill_n(params + bias_offset_, output_shape().c, 0.0f);
  }

  int64_t PackSize(int64_t) const override {
    const int64_t flipped = output_shape().c * g_.kernel * g_.kernel;
    return std::max({kernels::OuterPackSize(output_shape().c, k_),
                     kernels::OuterPackSize(k_, output_shape().c),
                     kernels::OuterPackSize(input_shape().c, flipped)});
  }

  void Forward(const float* params, const float* in, float* out,
               bool /*channel_major: always*/, LayerWork& work,
               const Pass& pass) override {
    if (g_.stride == 1) {
      ImplicitForward(params, in, out, work, pass);
      return;
    }
    const int64_t positions = output_shape().plane();
    const int64_t row = pass.n * positions;  // one output channel's length
    const int64_t chunk = ChunkSamples();
    Grow(work.a, k_ * chunk * positions);
    const float* weight = params + weight_offset_;
    for (int64_t b0 = 0; b0 < pass.n; b0 += chunk) {
      const int64_t nb = std::min(chunk, pass.n - b0);
      const int64_t columns = nb * positions;
      Im2Col(in, pass.n, b0, nb, work.a.data());
      // out[oc][b0 * P + j] = sum_k weight[oc][k] * cols[k][j].
      kernels::OuterProduct(pass.isa, output_shape().c, columns, k_, weight, k_,
                            1, work.a.data(), columns, out + b0 * positions,
                            row, pass.pack);
    }
    const float* bias = params + bias_offset_;
    for (int64_t c = 0; c < output_shape().c; ++c) {
      float* r = out + c * row;
      const float value = bias[c];
      for (int64_t j = 0; j < row; ++j) r[j] += value;
    }
  }

  void Backward(const float* params, const float* in, const float* /*out*/,
                const float* d_out, float* d_in, float* grad, bool,
                LayerWork& work, const Pass& pass) override {
    const int64_t positions = output_shape().plane();
    const int64_t row = pass.n * positions;
    float* grad_bias = grad + bias_offset_;
    for (int64_t c = 0; c < output_shape().c; ++c) {
      grad_bias[c] = ConstSegment(d_out + c * row, row).sum();
    }
    if (g_.stride == 1) {
      ImplicitBackward(params, in, d_out, d_in, grad, work, pass);
      return;
    }
    const int64_t chunk = ChunkSamples();
    Grow(work.a, k_ * chunk * positions);
    // work.b: a chunk's weight gradient, then its column gradients.
    Grow(work.b, std::max(output_shape().c * k_,
                          d_in != nullptr ? k_ * chunk * positions : 0));
    if (d_in != nullptr) std::fill_n(d_in, pass.n * input_shape().size(), 0.0f);
    const float* weight = params + weight_offset_;
    float* grad_weight = grad + weight_offset_;
    for (int64_t b0 = 0; b0 < pass.n; b0 += chunk) {
      const int64_t nb = std::min(chunk, pass.n - b0);
      const int64_t columns = nb * positions;
      Im2Col(in, pass.n, b0, nb, work.a.data());
      // grad_weight[oc][k] += sum_j cols[k][j] * d_out[oc][b0 * P + j].
      kernels::DotProduct(pass.isa, k_, output_shape().c, columns,
                          work.a.data(), columns, d_out + b0 * positions, row,
                          nullptr, false, b0 == 0 ? grad_weight : work.b.data(),
                          k_);
      if (b0 > 0) {
        // DotProduct overwrites: add this chunk's share.
        for (int64_t i = 0; i < output_shape().c * k_; ++i) {
          grad_weight[i] += work.b[static_cast<size_t>(i)];
        }
      }
      if (d_in != nullptr) {
        // d_cols[k][j] = sum_oc weight[oc][k] * d_out[oc][b0 * P + j].
        kernels::OuterProduct(pass.isa, k_, columns, output_shape().c, weight,
                              1, k_, d_out + b0 * positions, row, work.b.data(),
                              columns, pass.pack);
        Col2Im(work.b.data(), pass.n, b0, nb, d_in);
      }
    }
  }

 private:
  // Stride 1: an implicit GEMM, one sample at a time. The sample's planes
  // are copied into a zero-bordered buffer (Hp x Wp each, plus `kernel`
  // floats of slack), and row s = (c, ki, kj) of the virtual im2col matrix
  // is that buffer read from c's plane + ki * Wp + kj: the product runs over
  // "wide" rows of Wp positions per output row, of which the last
  // Wp - OW are discarded. No column matrix is written, so the layer's
  // memory traffic is its input and output instead of kernel^2 times them.
  struct Padded {
    int64_t h, w, plane;  // rows, row length, floats per plane (with slack)
  };
  Padded InputPadding() const {
    const int64_t h = input_shape().h + 2 * g_.padding;
    const int64_t w = input_shape().w + 2 * g_.padding;
    return {h, w, h * w + g_.kernel};
  }
  // The output gradient bordered by kernel - 1 on every side: the input
  // gradient is its correlation with the flipped kernel.
  Padded GradientPadding() const {
    const int64_t h = output_shape().h + 2 * (g_.kernel - 1);
    const int64_t w = output_shape().w + 2 * (g_.kernel - 1);
    return {h, w, h * w + g_.kernel};
  }

  // Samples per implicit-GEMM call: as many as keep the largest bordered
  // buffer within kGroupFloats (one product then covers them all, and the
  // weights are packed once per group), at least 1.
  int64_t GroupSamples(int64_t n) const {
    const Padded pad = InputPadding();
    const Padded gpad = GradientPadding();
    const int64_t per_sample =
        std::max({input_shape().c * pad.plane, output_shape().c * pad.plane,
                  output_shape().c * gpad.plane, input_shape().c * gpad.plane});
    return std::clamp<int64_t>(kGroupFloats / per_sample, 1, n);
  }

  // Copies sample b's planes of `in` (channel-major, n samples) into slot
  // `slot` of `padded` (channel c's slots start at c * stride), inside a
  // border of `border` (never written, so it stays zero).
  static void PadSample(const float* in, const Shape& shape, int64_t n,
                        int64_t b, const Padded& pad, int64_t border,
                        int64_t slot, int64_t stride, float* padded) {
    for (int64_t c = 0; c < shape.c; ++c) {
      const float* src = in + (c * n + b) * shape.plane();
      float* dst =
          padded + c * stride + slot * pad.plane + border * pad.w + border;
      for (int64_t y = 0; y < shape.h; ++y) {
        std::copy_n(src + y * shape.w, shape.w, dst + y * pad.w);
      }
    }
  }

  // rows[(c * K + ki) * K + kj] = padded + c * stride + ki * w + kj.
  void RowTable(const float* padded, const Padded& pad, int64_t channels,
                int64_t stride, std::vector<const float*>& rows) const {
    rows.resize(static_cast<size_t>(channels * g_.kernel * g_.kernel));
    size_t s = 0;
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t ki = 0; ki < g_.kernel; ++ki) {
        for (int64_t kj = 0; kj < g_.kernel; ++kj) {
          rows[s++] = padded + c * stride + ki * pad.w + kj;
        }
      }
    }
  }

  // A group of `group` samples' bordered planes per channel, one after the
  // other: the product's positions run across them (those between one
  // sample's last output row and the next sample's first are discarded).
  // Positions of a group of `count` samples: up to the last one's last
  // output row.
  static int64_t GroupPositions(const Padded& pad, int64_t count,
                                int64_t rows) {
    return (count - 1) * pad.plane + rows * pad.w;
  }

  void ImplicitForward(const float* params, const float* in, float* out,
                       LayerWork& work, const Pass& pass) const {
    const Shape& os = output_shape();
    const Padded pad = InputPadding();
    const int64_t group = GroupSamples(pass.n);
    const int64_t stride = group * pad.plane;  // one channel's group
    Grow(work.a, input_shape().c * stride);
    Grow(work.b, os.c * stride);
    RowTable(work.a.data(), pad, input_shape().c, stride, work.rows);
    const float* weight = params + weight_offset_;
    const float* bias = params + bias_offset_;
    for (int64_t b0 = 0; b0 < pass.n; b0 += group) {
      const int64_t count = std::min(group, pass.n - b0);
      for (int64_t j = 0; j < count; ++j) {
        PadSample(in, input_shape(), pass.n, b0 + j, pad, g_.padding, j, stride,
                  work.a.data());
      }
      // wide[oc][i] = sum_s weight[oc][s] * rows[s][i].
      kernels::OuterProductRows(
          pass.isa, os.c, GroupPositions(pad, count, os.h), k_, weight, k_, 1,
          work.rows.data(), work.b.data(), stride, pass.pack);
      for (int64_t oc = 0; oc < os.c; ++oc) {
        for (int64_t j = 0; j < count; ++j) {
          const float* src = work.b.data() + oc * stride + j * pad.plane;
          float* dst = out + (oc * pass.n + b0 + j) * os.plane();
          for (int64_t y = 0; y < os.h; ++y) {
            Segment(dst + y * os.w, os.w) =
                ConstSegment(src + y * pad.w, os.w) + bias[oc];
          }
        }
      }
    }
  }

  void ImplicitBackward(const float* params, const float* in,
                        const float* d_out, float* d_in, float* grad,
                        LayerWork& work, const Pass& pass) const {
    const Shape& is = input_shape();
    const Shape& os = output_shape();
    const Padded pad = InputPadding();
    const Padded gpad = GradientPadding();
    const int64_t group = GroupSamples(pass.n);
    const int64_t stride = group * pad.plane;
    const int64_t gstride = group * gpad.plane;
    const int64_t flipped = os.c * g_.kernel * g_.kernel;
    // work.c holds the output gradient at the wide positions; those that
    // are discarded are never written, stay zero and add nothing to the
    // weight gradient.
    Grow(work.a, is.c * stride);
    Grow(work.c, os.c * stride);
    RowTable(work.a.data(), pad, is.c, stride, work.rows);
    const float* weight = params + weight_offset_;
    if (d_in != nullptr) {
      Grow(work.d, os.c * gstride);
      // work.e: the flipped, transposed weights [c][(oc, ki', kj')], then
      // the wide input gradient.
      Grow(work.e, is.c * flipped + is.c * gstride);
      float* flip = work.e.data();
      for (int64_t c = 0; c < is.c; ++c) {
        for (int64_t oc = 0; oc < os.c; ++oc) {
          for (int64_t ki = 0; ki < g_.kernel; ++ki) {
            for (int64_t kj = 0; kj < g_.kernel; ++kj) {
              flip[c * flipped + (oc * g_.kernel + ki) * g_.kernel + kj] =
                  weight[oc * k_ +
                         (c * g_.kernel + (g_.kernel - 1 - ki)) * g_.kernel +
                         (g_.kernel - 1 - kj)];
            }
          }
        }
      }
      RowTable(work.d.data(), gpad, os.c, gstride, work.grad_rows);
    }
    float* grad_weight = grad + weight_offset_;
    for (int64_t b0 = 0; b0 < pass.n; b0 += group) {
      const int64_t count = std::min(group, pass.n - b0);
      for (int64_t j = 0; j < count; ++j) {
        PadSample(in, is, pass.n, b0 + j, pad, g_.padding, j, stride,
                  work.a.data());
        // The output gradient at the wide positions of the forward product.
        PadSample(d_out, os, pass.n, b0 + j, pad, 0, j, stride, work.c.data());
      }
      // grad_weight[oc][s] += sum_i rows[s][i] * d_wide[oc][i].
      kernels::DotProductRowsAccumulate(
          pass.isa, k_, os.c, GroupPositions(pad, count, os.h),
          work.rows.data(), work.c.data(), stride, grad_weight, k_);
      if (d_in == nullptr) continue;
      for (int64_t j = 0; j < count; ++j) {
        PadSample(d_out, os, pass.n, b0 + j, gpad, g_.kernel - 1, j, gstride,
                  work.d.data());
      }
      // The input gradient over the bordered input grid (Hp rows of
      // gpad.w positions per sample): the output gradient's correlation
      // with the flipped kernel.
      float* d_wide = work.e.data() + is.c * flipped;
      kernels::OuterProductRows(
          pass.isa, is.c, GroupPositions(gpad, count, pad.h), flipped,
          work.e.data(), flipped, 1, work.grad_rows.data(), d_wide, gstride,
          pass.pack);
      for (int64_t c = 0; c < is.c; ++c) {
        for (int64_t j = 0; j < count; ++j) {
          const float* src = d_wide + c * gstride + j * gpad.plane +
                             g_.padding * gpad.w + g_.padding;
          float* dst = d_in + (c * pass.n + b0 + j) * is.plane();
          for (int64_t y = 0; y < is.h; ++y) {
            std::copy_n(src + y * gpad.w, is.w, dst + y * is.w);
          }
        }
      }
    }
  }

  // Samples per chunk: as many as fit kChunkFloats of columns, at least 1.
  int64_t ChunkSamples() const {
    return std::max<int64_t>(1, kChunkFloats / (k_ * output_shape().plane()));
  }

  // Visits every row of output positions of the column matrix of samples
  // [b0, b0 + nb) of n: fn(col, image, shift) for each channel c, kernel
  // offset (ki, kj), sample bb and output row oh, where `col` is the offset
  // of the row's OW positions in the matrix, `image` the offset of the
  // input row oh * s - pad + ki they read in the input (-1: a row of the
  // padding), and output column ow reads input column ow * s + shift.
  template <typename Fn>
  void ForEachPatchRow(int64_t n, int64_t b0, int64_t nb, Fn fn) const {
    const Shape& is = input_shape();
    const Shape& os = output_shape();
    const int64_t positions = os.plane();
    const int64_t ld = nb * positions;
    for (int64_t c = 0; c < is.c; ++c) {
      for (int64_t ki = 0; ki < g_.kernel; ++ki) {
        for (int64_t kj = 0; kj < g_.kernel; ++kj) {
          const int64_t row = ((c * g_.kernel + ki) * g_.kernel + kj) * ld;
          const int64_t shift = kj - g_.padding;
          for (int64_t bb = 0; bb < nb; ++bb) {
            const int64_t plane = (c * n + b0 + bb) * is.plane();
            const int64_t col = row + bb * positions;
            for (int64_t oh = 0; oh < os.h; ++oh) {
              const int64_t ih = oh * g_.stride - g_.padding + ki;
              const bool inside = ih >= 0 && ih < is.h;
              fn(col + oh * os.w, inside ? plane + ih * is.w : -1, shift);
            }
          }
        }
      }
    }
  }

  // Stride 1: the output columns [lo, hi) whose input column ow + shift
  // lies inside the input.
  std::pair<int64_t, int64_t> UnitStrideColumns(int64_t shift) const {
    const int64_t out_w = output_shape().w;
    const int64_t lo = std::clamp<int64_t>(-shift, 0, out_w);
    return {lo, std::clamp<int64_t>(input_shape().w - shift, lo, out_w)};
  }

  // cols[(c * K + ki) * K + kj][bb * P + oh * OW + ow] =
  //   in[c][b0 + bb][oh * s - pad + ki][ow * s - pad + kj] (0 outside).
  void Im2Col(const float* in, int64_t n, int64_t b0, int64_t nb,
              float* cols) const {
    const int64_t in_w = input_shape().w;
    const int64_t out_w = output_shape().w;
    ForEachPatchRow(n, b0, nb, [&](int64_t col, int64_t image, int64_t shift) {
      float* d = cols + col;
      if (image < 0) {
        std::fill_n(d, out_w, 0.0f);
        return;
      }
      const float* src = in + image;
      if (g_.stride == 1) {
        const auto [lo, hi] = UnitStrideColumns(shift);
        std::fill_n(d, lo, 0.0f);
        std::copy(src + lo + shift, src + hi + shift, d + lo);
        std::fill(d + hi, d + out_w, 0.0f);
        return;
      }
      for (int64_t ow = 0; ow < out_w; ++ow) {
        const int64_t iw = ow * g_.stride + shift;
        d[ow] = iw >= 0 && iw < in_w ? src[iw] : 0.0f;
      }
    });
  }

  // The adjoint of Im2Col: d_in[...] += d_cols[...] (d_in zeroed before).
  void Col2Im(const float* d_cols, int64_t n, int64_t b0, int64_t nb,
              float* d_in) const {
    const int64_t in_w = input_shape().w;
    const int64_t out_w = output_shape().w;
    ForEachPatchRow(n, b0, nb, [&](int64_t col, int64_t image, int64_t shift) {
      if (image < 0) return;
      const float* s = d_cols + col;
      float* d = d_in + image;
      if (g_.stride == 1) {
        const auto [lo, hi] = UnitStrideColumns(shift);
        for (int64_t ow = lo; ow < hi; ++ow) d[ow + shift] += s[ow];
        return;
      }
      for (int64_t ow = 0; ow < out_w; ++ow) {
        const int64_t iw = ow * g_.stride + shift;
        if (iw >= 0 && iw < in_w) d[iw] += s[ow];
      }
    });
  }

  ConvGeometry g_;
  int64_t k_;  // weights per output channel: C * kernel * kernel
  uint64_t weight_offset_;
  uint64_t bias_offset_;
};

}  // namespace

Result<std::unique_ptr<Layer>> BuildConv(const LayerSpec& spec,
                                         ModelLayout& layout) {
  const pb::LayerConfig& config = spec.config;
  const std::string& where = spec.where;
  const Shape& in = spec.in;
  MERIDIAN_RETURN_IF_ERROR(
      CheckRange(config.channels(), 1, kMaxChannels, where + ".channels"));
  MERIDIAN_RETURN_IF_ERROR(
      CheckRange(config.kernel(), 1, kMaxKernel, where + ".kernel"));
  const uint64_t stride = config.has_stride() ? config.stride() : 1;
  MERIDIAN_RETURN_IF_ERROR(
      CheckRange(stride, 1, kMaxKernel, where + ".stride"));
  MERIDIAN_RETURN_IF_ERROR(
      CheckRange(config.padding(), 0, kMaxKernel, where + ".padding"));
  ConvGeometry g{config.kernel(), static_cast<int64_t>(stride),
                 config.padding()};
  if (in.h + 2 * g.padding < g.kernel || in.w + 2 * g.padding < g.kernel) {
    return InvalidArgumentError(where + ": kernel " + std::to_string(g.kernel) +
                                " is larger than its padded input " +
                                ShapeText(in));
  }
  const Shape out{config.channels(),
                  (in.h + 2 * g.padding - g.kernel) / g.stride + 1,
                  (in.w + 2 * g.padding - g.kernel) / g.stride + 1};
  const uint64_t weight_offset = layout.num_elements();
  MERIDIAN_RETURN_IF_ERROR(layout.Add(
      "conv" + spec.id + ".weight",
      {static_cast<uint64_t>(out.c), static_cast<uint64_t>(in.c),
       static_cast<uint64_t>(g.kernel), static_cast<uint64_t>(g.kernel)}));
  const uint64_t bias_offset = layout.num_elements();
  MERIDIAN_RETURN_IF_ERROR(
      layout.Add("conv" + spec.id + ".bias", {static_cast<uint64_t>(out.c)}));
  return std::unique_ptr<Layer>(
      new Conv(in, out, g, weight_offset, bias_offset));
}

}  // namespace meridian::cnn_internal
