// Convolutional classifiers: a sequence of layers (convolution, pooling,
// ReLU, BatchNorm, GroupNorm, dropout, dense) from the job file or a preset,
// followed by a dense layer to the classes and softmax cross-entropy.
//
// Activation layouts. A batch of n samples of shape C x H x W (P = H * W
// positions) is held in one of two layouts, both with a position's
// neighbours contiguous:
//   channel-major  (c * n + b) * P + p   spatial layers (conv, pools): one
//                                        channel of the whole batch is one
//                                        row, so a convolution of the batch
//                                        is one product per chunk
//   sample-major   b * C * P + c * P + p dense layers and the features as
//                                        they arrive (one column a sample)
// Elementwise and normalisation layers work on either (through strides).
// Convolutions run as im2col + the outer-product kernel over chunks of
// samples small enough to stay in cache (the columns are recomputed in the
// backward pass instead of being kept); the weight gradient is a dot
// product over the chunk's positions.

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "meridian/train/dataset.h"
#include "meridian/train/model.h"
#include "train/kernels.h"
#include "train/model_internal.h"

namespace meridian {
namespace {

using model_internal::EvaluateClassifier;
using model_internal::kMaxParams;
using model_internal::LogitsView;
using model_internal::SoftmaxCrossEntropy;
using model_internal::UniformSymmetric;

// Bounds on what a job file may ask for (a model is built by every process
// of a job; these keep a typo from exhausting memory).
constexpr uint64_t kMaxChannels = 65536;
constexpr uint64_t kMaxDenseWidth = uint64_t{1} << 24;
constexpr uint64_t kMaxKernel = 64;
constexpr uint64_t kMaxActivation = uint64_t{1} << 24;  // floats per sample
// im2col columns per convolution chunk (floats): 512 KiB, about an L2.
constexpr int64_t kChunkFloats = int64_t{1} << 17;
// The largest bordered buffer of one implicit-GEMM group (floats): 128 KiB,
// so that the group's buffers stay in L2 (larger groups measured slower).
constexpr int64_t kGroupFloats = int64_t{1} << 15;
// Floats of activations one evaluation chunk may hold (64 MiB).
constexpr int64_t kEvalFloats = int64_t{1} << 24;
constexpr int64_t kMaxEvalChunk = 1000;

struct Shape {
  int64_t c = 0;
  int64_t h = 0;
  int64_t w = 0;
  int64_t plane() const { return h * w; }
  int64_t size() const { return c * h * w; }
};

// Where element (channel c, sample b, position p) of an activation lives:
// c * channel_stride + b * sample_stride + p.
struct Strides {
  int64_t channel = 0;
  int64_t sample = 0;
};

Strides StridesOf(const Shape& shape, int64_t n, bool channel_major) {
  if (channel_major) return {n * shape.plane(), shape.plane()};
  return {shape.plane(), shape.size()};
}

// One layer's scratch for one mode (training or evaluation); grows only.
struct LayerWork {
  std::vector<float> a;            // conv: columns / padded input; norms: xhat;
                                   // dense: flat x; dropout: mask
  std::vector<float> b;            // conv: column gradients / wide output;
                                   // norms: 1 / std; dense: flat dx
  std::vector<float> c;            // conv (stride 1): wide output gradient
  std::vector<float> d;            // conv (stride 1): padded output gradient
  std::vector<float> e;            // conv (stride 1): wide input gradient,
                                   // flipped weights
  std::vector<const float*> rows;  // conv (stride 1): input rows
  std::vector<const float*> grad_rows;  // conv (stride 1): gradient rows
  std::vector<int32_t> index;           // max pool: the winner of each window
};

// What one pass needs besides the layer's own data.
struct Pass {
  int64_t n = 0;  // samples
  bool train = false;
  kernels::Isa isa = kernels::Isa::kPortable;
  float* pack = nullptr;  // kernels::OuterProduct scratch
  std::mt19937_64* rng = nullptr;
};

// A contiguous run of floats (e.g. one (channel, sample)'s P positions) as
// an Eigen array, so reductions and elementwise updates vectorise.
using ConstSegment = Eigen::Map<const Eigen::ArrayXf>;
using Segment = Eigen::Map<Eigen::ArrayXf>;

void Grow(std::vector<float>& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) {
    buffer.resize(static_cast<size_t>(size));
  }
}

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

class Layer {
 public:
  Layer(Shape in, Shape out) : in_(in), out_(out) {}
  virtual ~Layer() = default;

  const Shape& input_shape() const { return in_; }
  const Shape& output_shape() const { return out_; }
  // The layout of the output, given whether the input is channel-major.
  virtual bool OutputChannelMajor(bool input_channel_major) const {
    return input_channel_major;
  }
  // Writes the initial values of this layer's tensors.
  virtual void Initialize(std::mt19937_64& /*rng*/, float* /*params*/,
                          bool /*last*/) const {}
  // OuterProduct scratch for a pass over n samples.
  virtual int64_t PackSize(int64_t /*n*/) const { return 0; }

  // out = layer(in) for pass.n samples; `channel_major` is the input's
  // layout.
  virtual void Forward(const float* params, const float* in, float* out,
                       bool channel_major, LayerWork& work,
                       const Pass& pass) = 0;
  // Gradients of this layer's tensors into `grad` (the model's, zeroed
  // before the pass) and, when d_in is not null, dLoss/din (overwritten).
  virtual void Backward(const float* params, const float* in, const float* out,
                        const float* d_out, float* d_in, float* grad,
                        bool channel_major, LayerWork& work,
                        const Pass& pass) = 0;
  // Writes state computed by the last training Forward (running
  // statistics) into params.
  virtual void ApplyState(float* /*params*/) {}

 private:
  Shape in_;
  Shape out_;
};

// --- convolution -------------------------------------------------------------

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

  // cols[(c * K + ki) * K + kj][bb * P + oh * OW + ow] =
  //   in[c][b0 + bb][oh * s - pad + ki][ow * s - pad + kj] (0 outside).
  void Im2Col(const float* in, int64_t n, int64_t b0, int64_t nb,
              float* cols) const {
    const Shape& is = input_shape();
    const Shape& os = output_shape();
    const int64_t positions = os.plane();
    const int64_t ld = nb * positions;
    for (int64_t c = 0; c < is.c; ++c) {
      for (int64_t ki = 0; ki < g_.kernel; ++ki) {
        for (int64_t kj = 0; kj < g_.kernel; ++kj) {
          float* dst_row = cols + ((c * g_.kernel + ki) * g_.kernel + kj) * ld;
          for (int64_t bb = 0; bb < nb; ++bb) {
            const float* plane = in + (c * n + b0 + bb) * is.plane();
            float* dst = dst_row + bb * positions;
            for (int64_t oh = 0; oh < os.h; ++oh) {
              float* d = dst + oh * os.w;
              const int64_t ih = oh * g_.stride - g_.padding + ki;
              if (ih < 0 || ih >= is.h) {
                std::fill_n(d, os.w, 0.0f);
                continue;
              }
              const float* src = plane + ih * is.w;
              const int64_t shift = kj - g_.padding;
              if (g_.stride == 1) {
                const int64_t lo = std::clamp<int64_t>(-shift, 0, os.w);
                const int64_t hi = std::clamp<int64_t>(is.w - shift, lo, os.w);
                std::fill_n(d, lo, 0.0f);
                std::copy(src + lo + shift, src + hi + shift, d + lo);
                std::fill(d + hi, d + os.w, 0.0f);
              } else {
                for (int64_t ow = 0; ow < os.w; ++ow) {
                  const int64_t iw = ow * g_.stride + shift;
                  d[ow] = iw >= 0 && iw < is.w ? src[iw] : 0.0f;
                }
              }
            }
          }
        }
      }
    }
  }

  // The adjoint of Im2Col: d_in[...] += d_cols[...] (d_in zeroed before).
  void Col2Im(const float* d_cols, int64_t n, int64_t b0, int64_t nb,
              float* d_in) const {
    const Shape& is = input_shape();
    const Shape& os = output_shape();
    const int64_t positions = os.plane();
    const int64_t ld = nb * positions;
    for (int64_t c = 0; c < is.c; ++c) {
      for (int64_t ki = 0; ki < g_.kernel; ++ki) {
        for (int64_t kj = 0; kj < g_.kernel; ++kj) {
          const float* src_row =
              d_cols + ((c * g_.kernel + ki) * g_.kernel + kj) * ld;
          for (int64_t bb = 0; bb < nb; ++bb) {
            float* plane = d_in + (c * n + b0 + bb) * is.plane();
            const float* src = src_row + bb * positions;
            for (int64_t oh = 0; oh < os.h; ++oh) {
              const int64_t ih = oh * g_.stride - g_.padding + ki;
              if (ih < 0 || ih >= is.h) continue;
              const float* s = src + oh * os.w;
              float* d = plane + ih * is.w;
              const int64_t shift = kj - g_.padding;
              if (g_.stride == 1) {
                const int64_t lo = std::clamp<int64_t>(-shift, 0, os.w);
                const int64_t hi = std::clamp<int64_t>(is.w - shift, lo, os.w);
                for (int64_t ow = lo; ow < hi; ++ow) d[ow + shift] += s[ow];
              } else {
                for (int64_t ow = 0; ow < os.w; ++ow) {
                  const int64_t iw = ow * g_.stride + shift;
                  if (iw >= 0 && iw < is.w) d[iw] += s[ow];
                }
              }
            }
          }
        }
      }
    }
  }

  ConvGeometry g_;
  int64_t k_;  // weights per output channel: C * kernel * kernel
  uint64_t weight_offset_;
  uint64_t bias_offset_;
};

// --- pooling -----------------------------------------------------------------

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

// --- elementwise
// ---------------------------------------------------------------

class Relu final : public Layer {
 public:
  explicit Relu(Shape shape) : Layer(shape, shape) {}

  void Forward(const float*, const float* in, float* out, bool, LayerWork&,
               const Pass& pass) override {
    const int64_t count = pass.n * input_shape().size();
    Segment(out, count) = ConstSegment(in, count).max(0.0f);
  }

  void Backward(const float*, const float*, const float* out,
                const float* d_out, float* d_in, float*, bool, LayerWork&,
                const Pass& pass) override {
    if (d_in == nullptr) return;
    const int64_t count = pass.n * input_shape().size();
    // The gradient passes where the output is positive. Branch-free (a
    // mask multiplied in): the signs are random, and the compiled branch
    // of `out > 0 ? d : 0` cost a seventh of a vgg-small step.
    Segment(d_in, count) = ConstSegment(d_out, count) *
                           (ConstSegment(out, count) > 0.0f).cast<float>();
  }
};

class Dropout final : public Layer {
 public:
  Dropout(Shape shape, double rate) : Layer(shape, shape), rate_(rate) {}

  void Forward(const float*, const float* in, float* out, bool, LayerWork& work,
               const Pass& pass) override {
    const int64_t count = pass.n * input_shape().size();
    if (!pass.train || rate_ <= 0) {
      std::copy_n(in, count, out);
      return;
    }
    Grow(work.a, count);
    // Keep with probability 1 - rate, scaled so the expectation is the input.
    const float keep = static_cast<float>(1.0 / (1.0 - rate_));
    const uint64_t threshold =
        static_cast<uint64_t>(rate_ * static_cast<double>(uint64_t{1} << 53));
    for (int64_t i = 0; i < count; ++i) {
      const float mask = ((*pass.rng)() >> 11) < threshold ? 0.0f : keep;
      work.a[static_cast<size_t>(i)] = mask;
      out[i] = in[i] * mask;
    }
  }

  void Backward(const float*, const float*, const float*, const float* d_out,
                float* d_in, float*, bool, LayerWork& work,
                const Pass& pass) override {
    if (d_in == nullptr) return;
    const int64_t count = pass.n * input_shape().size();
    if (rate_ <= 0) {
      std::copy_n(d_out, count, d_in);
      return;
    }
    for (int64_t i = 0; i < count; ++i) {
      d_in[i] = d_out[i] * work.a[static_cast<size_t>(i)];
    }
  }

 private:
  double rate_;
};

// --- normalisation
// ---------------------------------------------------------------

class BatchNorm final : public Layer {
 public:
  // Tensors: weight, bias, running_mean, running_var, each [C], from
  // `offset` on.
  BatchNorm(Shape shape, uint64_t offset, double momentum, double epsilon)
      : Layer(shape, shape),
        offset_(offset),
        momentum_(static_cast<float>(momentum)),
        epsilon_(static_cast<float>(epsilon)),
        pending_(static_cast<size_t>(2 * shape.c)) {}

  void Initialize(std::mt19937_64&, float* params, bool) const override {
    const int64_t c = input_shape().c;
    std::fill_n(params + offset_, c, 1.0f);          // weight
    std::fill_n(params + offset_ + c, c, 0.0f);      // bias
    std::fill_n(params + offset_ + 2 * c, c, 0.0f);  // running_mean
    std::fill_n(params + offset_ + 3 * c, c, 1.0f);  // running_var
  }

  void Forward(const float* params, const float* in, float* out,
               bool channel_major, LayerWork& work, const Pass& pass) override {
    const Shape& s = input_shape();
    const int64_t p = s.plane();
    const Strides st = StridesOf(s, pass.n, channel_major);
    const float* gamma = params + offset_;
    const float* beta = gamma + s.c;
    const float* running_mean = gamma + 2 * s.c;
    const float* running_var = gamma + 3 * s.c;
    if (!pass.train) {
      for (int64_t c = 0; c < s.c; ++c) {
        const float scale = gamma[c] / std::sqrt(running_var[c] + epsilon_);
        const float shift = beta[c] - running_mean[c] * scale;
        for (int64_t b = 0; b < pass.n; ++b) {
          const int64_t at = c * st.channel + b * st.sample;
          Segment(out + at, p) = ConstSegment(in + at, p) * scale + shift;
        }
      }
      return;
    }
    Grow(work.a, pass.n * s.size());
    Grow(work.b, s.c);
    const double m = static_cast<double>(pass.n * p);
    for (int64_t c = 0; c < s.c; ++c) {
      // Float sums per segment, double across them.
      double sum = 0;
      for (int64_t b = 0; b < pass.n; ++b) {
        sum += ConstSegment(in + c * st.channel + b * st.sample, p).sum();
      }
      const float mean = static_cast<float>(sum / m);
      double squares = 0;
      for (int64_t b = 0; b < pass.n; ++b) {
        squares += (ConstSegment(in + c * st.channel + b * st.sample, p) - mean)
                       .square()
                       .sum();
      }
      const double var = squares / m;
      const float inv_std = static_cast<float>(1.0 / std::sqrt(var + epsilon_));
      work.b[static_cast<size_t>(c)] = inv_std;
      for (int64_t b = 0; b < pass.n; ++b) {
        const int64_t at = c * st.channel + b * st.sample;
        Segment xhat(work.a.data() + at, p);
        xhat = (ConstSegment(in + at, p) - mean) * inv_std;
        Segment(out + at, p) = xhat * gamma[c] + beta[c];
      }
      // Running statistics as PyTorch keeps them (unbiased variance).
      const double unbiased = m > 1 ? var * m / (m - 1) : var;
      pending_[static_cast<size_t>(c)] =
          (1 - momentum_) * running_mean[c] + momentum_ * mean;
      pending_[static_cast<size_t>(s.c + c)] =
          (1 - momentum_) * running_var[c] +
          momentum_ * static_cast<float>(unbiased);
    }
    has_pending_ = true;
  }

  void Backward(const float* params, const float*, const float*,
                const float* d_out, float* d_in, float* grad,
                bool channel_major, LayerWork& work,
                const Pass& pass) override {
    const Shape& s = input_shape();
    const int64_t p = s.plane();
    const Strides st = StridesOf(s, pass.n, channel_major);
    const float* gamma = params + offset_;
    const float m = static_cast<float>(pass.n * p);
    for (int64_t c = 0; c < s.c; ++c) {
      double sum_dy = 0;
      double sum_dy_xhat = 0;
      for (int64_t b = 0; b < pass.n; ++b) {
        const int64_t at = c * st.channel + b * st.sample;
        const ConstSegment dy(d_out + at, p);
        sum_dy += dy.sum();
        sum_dy_xhat += (dy * ConstSegment(work.a.data() + at, p)).sum();
      }
      grad[offset_ + c] = static_cast<float>(sum_dy_xhat);
      grad[offset_ + s.c + c] = static_cast<float>(sum_dy);
      if (d_in == nullptr) continue;
      // dx = gamma inv_std / M (M dy - sum dy - xhat sum dy xhat).
      const float scale = gamma[c] * work.b[static_cast<size_t>(c)] / m;
      const float total_dy = static_cast<float>(sum_dy);
      const float total_dy_xhat = static_cast<float>(sum_dy_xhat);
      for (int64_t b = 0; b < pass.n; ++b) {
        const int64_t at = c * st.channel + b * st.sample;
        Segment(d_in + at, p) =
            scale * (m * ConstSegment(d_out + at, p) - total_dy -
                     ConstSegment(work.a.data() + at, p) * total_dy_xhat);
      }
    }
  }

  void ApplyState(float* params) override {
    if (!has_pending_) return;
    std::copy(pending_.begin(), pending_.end(),
              params + offset_ + 2 * input_shape().c);
    has_pending_ = false;
  }

 private:
  uint64_t offset_;
  float momentum_;
  float epsilon_;
  std::vector<float> pending_;  // running mean then var after the last pass
  bool has_pending_ = false;
};

class GroupNorm final : public Layer {
 public:
  // Tensors: weight, bias, each [C], from `offset` on.
  GroupNorm(Shape shape, uint64_t offset, int64_t groups, double epsilon)
      : Layer(shape, shape),
        offset_(offset),
        groups_(groups),
        epsilon_(static_cast<float>(epsilon)) {}

  void Initialize(std::mt19937_64&, float* params, bool) const override {
    std::fill_n(params + offset_, input_shape().c, 1.0f);
    std::fill_n(params + offset_ + input_shape().c, input_shape().c, 0.0f);
  }

  void Forward(const float* params, const float* in, float* out,
               bool channel_major, LayerWork& work, const Pass& pass) override {
    const Shape& s = input_shape();
    const int64_t p = s.plane();
    const int64_t per_group = s.c / groups_;
    const Strides st = StridesOf(s, pass.n, channel_major);
    const float* gamma = params + offset_;
    const float* beta = gamma + s.c;
    Grow(work.a, pass.n * s.size());
    Grow(work.b, pass.n * groups_);
    const double m = static_cast<double>(per_group * p);
    for (int64_t b = 0; b < pass.n; ++b) {
      for (int64_t g = 0; g < groups_; ++g) {
        const int64_t first = g * per_group;
        double sum = 0;
        for (int64_t c = first; c < first + per_group; ++c) {
          sum += ConstSegment(in + c * st.channel + b * st.sample, p).sum();
        }
        const float mean = static_cast<float>(sum / m);
        double squares = 0;
        for (int64_t c = first; c < first + per_group; ++c) {
          squares +=
              (ConstSegment(in + c * st.channel + b * st.sample, p) - mean)
                  .square()
                  .sum();
        }
        const float inv_std =
            static_cast<float>(1.0 / std::sqrt(squares / m + epsilon_));
        work.b[static_cast<size_t>(b * groups_ + g)] = inv_std;
        for (int64_t c = first; c < first + per_group; ++c) {
          const int64_t at = c * st.channel + b * st.sample;
          Segment xhat(work.a.data() + at, p);
          xhat = (ConstSegment(in + at, p) - mean) * inv_std;
          Segment(out + at, p) = xhat * gamma[c] + beta[c];
        }
      }
    }
  }

  void Backward(const float* params, const float*, const float*,
                const float* d_out, float* d_in, float* grad,
                bool channel_major, LayerWork& work,
                const Pass& pass) override {
    const Shape& s = input_shape();
    const int64_t p = s.plane();
    const int64_t per_group = s.c / groups_;
    const Strides st = StridesOf(s, pass.n, channel_major);
    const float* gamma = params + offset_;
    float* grad_gamma = grad + offset_;
    float* grad_beta = grad + offset_ + s.c;
    const float m = static_cast<float>(per_group * p);
    for (int64_t b = 0; b < pass.n; ++b) {
      for (int64_t g = 0; g < groups_; ++g) {
        const int64_t first = g * per_group;
        // With dxhat = dy gamma:
        // dx = inv_std / M (M dxhat - sum dxhat - xhat sum dxhat xhat).
        double sum_dxhat = 0;
        double sum_dxhat_xhat = 0;
        for (int64_t c = first; c < first + per_group; ++c) {
          const int64_t at = c * st.channel + b * st.sample;
          const ConstSegment dy(d_out + at, p);
          const float dy_sum = dy.sum();
          const float dy_xhat =
              (dy * ConstSegment(work.a.data() + at, p)).sum();
          grad_gamma[c] += dy_xhat;
          grad_beta[c] += dy_sum;
          sum_dxhat += static_cast<double>(gamma[c]) * dy_sum;
          sum_dxhat_xhat += static_cast<double>(gamma[c]) * dy_xhat;
        }
        if (d_in == nullptr) continue;
        const float scale = work.b[static_cast<size_t>(b * groups_ + g)] / m;
        const float total = static_cast<float>(sum_dxhat);
        const float total_xhat = static_cast<float>(sum_dxhat_xhat);
        for (int64_t c = first; c < first + per_group; ++c) {
          const int64_t at = c * st.channel + b * st.sample;
          Segment(d_in + at, p) =
              scale * ((m * gamma[c]) * ConstSegment(d_out + at, p) - total -
                       ConstSegment(work.a.data() + at, p) * total_xhat);
        }
      }
    }
  }

 private:
  uint64_t offset_;
  int64_t groups_;
  float epsilon_;
};

// --- dense -------------------------------------------------------------------

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

// --- the model ---------------------------------------------------------------

// Activations, their gradients and every layer's work for one mode.
struct Scratch {
  std::vector<std::vector<float>> acts;    // acts[0]: input, acts[l + 1]:
                                           // layer l's output
  std::vector<std::vector<float>> deltas;  // dLoss / acts[l]
  std::vector<LayerWork> works;
  std::vector<float> pack;
  int64_t capacity = 0;
};

class Cnn final : public Model {
 public:
  Cnn(ModelLayout layout, std::vector<std::unique_ptr<Layer>> layers,
      Shape input, bool input_channel_major, int num_classes, kernels::Isa isa)
      : layout_(std::move(layout)),
        layers_(std::move(layers)),
        input_(input),
        input_channel_major_(input_channel_major),
        num_classes_(num_classes),
        isa_(isa),
        rng_(0x6d65726964696eULL) {
    channel_major_.push_back(input_channel_major_);
    int64_t per_sample = input_.size();
    for (const auto& layer : layers_) {
      channel_major_.push_back(
          layer->OutputChannelMajor(channel_major_.back()));
      per_sample += layer->output_shape().size();
    }
    eval_chunk_ = std::clamp<int64_t>(
        kEvalFloats / std::max<int64_t>(per_sample, 1), 1, kMaxEvalChunk);
  }

  const ModelLayout& layout() const override { return layout_; }
  int input_dim() const override { return static_cast<int>(input_.size()); }
  int num_classes() const override { return num_classes_; }

  void Initialize(uint64_t seed, std::span<float> params) const override {
    if (!model_internal::SizedForInitialize(params, layout_.num_elements())) {
      return;
    }
    std::mt19937_64 rng(seed);
    for (size_t l = 0; l < layers_.size(); ++l) {
      layers_[l]->Initialize(rng, params.data(), l + 1 == layers_.size());
    }
  }

  float LossAndGradient(std::span<const float> params,
                        const Eigen::Ref<const Eigen::MatrixXf>& features,
                        std::span<const uint8_t> labels,
                        std::span<float> grad) override {
    std::fill(grad.begin(), grad.end(), 0.0f);
    if (!InputsValid(params, features, labels) ||
        grad.size() != params.size()) {
      return std::numeric_limits<float>::quiet_NaN();
    }
    const int64_t n = features.cols();
    if (n == 0) return 0.0f;
    Reserve(train_, n, /*train=*/true);
    const Pass pass{n, true, isa_, train_.pack.data(), &rng_};
    Forward(params, features, pass, train_);
    const double loss = SoftmaxCrossEntropy(
        {train_.acts.back().data(), 1, num_classes_}, num_classes_,
        labels.first(static_cast<size_t>(n)), train_.deltas.back().data());
    for (size_t l = layers_.size(); l-- > 0;) {
      layers_[l]->Backward(
          params.data(), train_.acts[l].data(), train_.acts[l + 1].data(),
          train_.deltas[l + 1].data(),
          l == 0 ? nullptr : train_.deltas[l].data(), grad.data(),
          channel_major_[l], train_.works[l], pass);
    }
    return static_cast<float>(loss / static_cast<double>(n));
  }

  void SeedRandom(uint64_t seed) override { rng_.seed(seed); }

  void ApplyStateUpdate(std::span<float> params) override {
    if (params.size() != layout_.num_elements()) return;
    for (auto& layer : layers_) layer->ApplyState(params.data());
  }

 private:
  EvalResult EvaluateInto(std::span<const float> params, const Dataset& data,
                          uint64_t max_samples,
                          std::vector<uint8_t>* correct) override {
    const bool fits = params.size() == layout_.num_elements() &&
                      data.features.rows() == input_.size();
    return EvaluateClassifier(
        fits, data, num_classes_, max_samples, eval_chunk_, correct,
        [&](int64_t start, int64_t n) {
          Reserve(eval_, n, /*train=*/false);
          const Pass pass{n, false, isa_, eval_.pack.data(), &rng_};
          Forward(params, data.features.middleCols(start, n), pass, eval_);
          return LogitsView{eval_.acts.back().data(), 1, num_classes_};
        });
  }

  bool InputsValid(std::span<const float> params,
                   const Eigen::Ref<const Eigen::MatrixXf>& features,
                   std::span<const uint8_t> labels) const {
    if (params.size() != layout_.num_elements()) return false;
    if (features.rows() != input_.size()) return false;
    if (static_cast<uint64_t>(features.cols()) != labels.size()) return false;
    for (uint8_t label : labels) {
      if (label >= num_classes_) return false;
    }
    return true;
  }

  void Reserve(Scratch& scratch, int64_t n, bool train) const {
    if (n <= scratch.capacity) return;
    const size_t count = layers_.size() + 1;
    scratch.acts.resize(count);
    scratch.works.resize(layers_.size());
    Grow(scratch.acts[0], n * input_.size());
    int64_t pack = 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      Grow(scratch.acts[l + 1], n * layers_[l]->output_shape().size());
      pack = std::max(pack, layers_[l]->PackSize(n));
    }
    if (train) {
      scratch.deltas.resize(count);
      for (size_t l = 1; l < count; ++l) {
        Grow(scratch.deltas[l], static_cast<int64_t>(scratch.acts[l].size()));
      }
    }
    Grow(scratch.pack, pack);
    scratch.capacity = n;
  }

  void Forward(std::span<const float> params,
               const Eigen::Ref<const Eigen::MatrixXf>& features,
               const Pass& pass, Scratch& scratch) {
    // Features arrive sample-major, one column a sample.
    float* input = scratch.acts[0].data();
    const int64_t dim = input_.size();
    if (input_channel_major_ && input_.c > 1) {
      for (int64_t b = 0; b < pass.n; ++b) {
        const float* column = features.data() + b * features.outerStride();
        for (int64_t c = 0; c < input_.c; ++c) {
          std::copy_n(column + c * input_.plane(), input_.plane(),
                      input + (c * pass.n + b) * input_.plane());
        }
      }
    } else {
      for (int64_t b = 0; b < pass.n; ++b) {
        std::copy_n(features.data() + b * features.outerStride(), dim,
                    input + b * dim);
      }
    }
    for (size_t l = 0; l < layers_.size(); ++l) {
      layers_[l]->Forward(params.data(), scratch.acts[l].data(),
                          scratch.acts[l + 1].data(), channel_major_[l],
                          scratch.works[l], pass);
    }
  }

  ModelLayout layout_;
  std::vector<std::unique_ptr<Layer>> layers_;
  Shape input_;
  bool input_channel_major_;
  std::vector<bool> channel_major_;  // [l]: layout of acts[l]
  int num_classes_;
  kernels::Isa isa_;
  int64_t eval_chunk_ = 1;
  std::mt19937_64 rng_;  // dropout masks; fixed seed, advances per step
  Scratch train_;
  Scratch eval_;
};

// --- building from the config
// ------------------------------------------------------

pb::LayerConfig ConvConfig(uint32_t channels, uint32_t kernel,
                           uint32_t padding) {
  pb::LayerConfig layer;
  layer.set_kind(pb::CONV);
  layer.set_channels(channels);
  layer.set_kernel(kernel);
  if (padding > 0) layer.set_padding(padding);
  return layer;
}

pb::LayerConfig SimpleConfig(pb::LayerKind kind) {
  pb::LayerConfig layer;
  layer.set_kind(kind);
  return layer;
}

pb::LayerConfig DenseConfig(uint32_t units) {
  pb::LayerConfig layer;
  layer.set_kind(pb::FULLY_CONNECTED);
  layer.set_channels(units);
  return layer;
}

pb::LayerConfig NormConfig(char norm, uint32_t channels) {
  if (norm == 'b') return SimpleConfig(pb::BATCH_NORM);
  pb::LayerConfig layer;
  layer.set_kind(pb::GROUP_NORM);
  // LeNet's 6 channels in 2 groups, else groups of 4 channels.
  layer.set_groups(channels == 6 ? 2 : channels / 4);
  return layer;
}

// A conv block: conv, the norm when asked (' ' none, 'b' BatchNorm, 'g'
// GroupNorm), ReLU.
void AddConvBlock(std::vector<pb::LayerConfig>& layers, uint32_t channels,
                  uint32_t kernel, uint32_t padding, char norm) {
  layers.push_back(ConvConfig(channels, kernel, padding));
  if (norm != ' ') layers.push_back(NormConfig(norm, channels));
  layers.push_back(SimpleConfig(pb::RELU));
}

}  // namespace

std::vector<std::string> CnnPresetNames() {
  return {"lenet5",    "lenet5-bn",    "lenet5-gn",
          "vgg-small", "vgg-small-bn", "vgg-small-gn"};
}

Result<std::vector<pb::LayerConfig>> CnnPresetLayers(const std::string& name) {
  char norm = ' ';
  if (name.ends_with("-bn")) norm = 'b';
  if (name.ends_with("-gn")) norm = 'g';
  const std::string family =
      norm == ' ' ? name : name.substr(0, name.size() - 3);
  std::vector<pb::LayerConfig> layers;
  if (family == "lenet5") {
    AddConvBlock(layers, 6, 5, 2, norm);
    layers.push_back(SimpleConfig(pb::MAX_POOL));
    AddConvBlock(layers, 16, 5, 0, norm);
    layers.push_back(SimpleConfig(pb::MAX_POOL));
    layers.push_back(DenseConfig(120));
    layers.push_back(SimpleConfig(pb::RELU));
    layers.push_back(DenseConfig(84));
    layers.push_back(SimpleConfig(pb::RELU));
    return layers;
  }
  if (family == "vgg-small") {
    AddConvBlock(layers, 16, 3, 1, norm);
    AddConvBlock(layers, 16, 3, 1, norm);
    layers.push_back(SimpleConfig(pb::MAX_POOL));
    AddConvBlock(layers, 32, 3, 1, norm);
    AddConvBlock(layers, 32, 3, 1, norm);
    layers.push_back(SimpleConfig(pb::MAX_POOL));
    layers.push_back(DenseConfig(128));
    layers.push_back(SimpleConfig(pb::RELU));
    return layers;
  }
  std::string known;
  for (const std::string& preset : CnnPresetNames()) {
    known += (known.empty() ? "" : ", ") + preset;
  }
  return InvalidArgumentError("model.preset \"" + name +
                              "\" is not a CNN preset (known: " + known + ")");
}

namespace {

// Checks that `layer` leaves the fields its kind does not use unset.
Status CheckUnusedFields(const pb::LayerConfig& layer,
                         const std::string& where) {
  struct Field {
    bool set;
    const char* name;
    std::vector<pb::LayerKind> users;
  };
  const Field fields[] = {
      {layer.has_channels(), "channels", {pb::CONV, pb::FULLY_CONNECTED}},
      {layer.has_kernel(), "kernel", {pb::CONV, pb::MAX_POOL, pb::AVG_POOL}},
      {layer.has_stride(), "stride", {pb::CONV, pb::MAX_POOL, pb::AVG_POOL}},
      {layer.has_padding(), "padding", {pb::CONV}},
      {layer.has_groups(), "groups", {pb::GROUP_NORM}},
      {layer.has_rate(), "rate", {pb::DROPOUT}},
      {layer.has_momentum(), "momentum", {pb::BATCH_NORM}},
      {layer.has_epsilon(), "epsilon", {pb::BATCH_NORM, pb::GROUP_NORM}},
  };
  for (const Field& field : fields) {
    if (field.set && std::find(field.users.begin(), field.users.end(),
                               layer.kind()) == field.users.end()) {
      return InvalidArgumentError(where + "." + field.name +
                                  " is not used by kind " +
                                  pb::LayerKind_Name(layer.kind()));
    }
  }
  return Status::Ok();
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

// Builds one layer from its config, adding its tensors to `layout`.
Result<std::unique_ptr<Layer>> BuildLayer(const pb::LayerConfig& config,
                                          size_t index, const Shape& in,
                                          bool flattened, ModelLayout& layout) {
  const std::string where = "model.layers[" + std::to_string(index) + "]";
  MERIDIAN_RETURN_IF_ERROR(CheckUnusedFields(config, where));
  const std::string id = std::to_string(index);
  const auto spatial_only = [&]() -> Status {
    if (flattened) {
      return InvalidArgumentError(where + " (" +
                                  pb::LayerKind_Name(config.kind()) +
                                  ") comes after a FULLY_CONNECTED layer, "
                                  "whose output has no spatial layout");
    }
    return Status::Ok();
  };
  switch (config.kind()) {
    case pb::CONV: {
      MERIDIAN_RETURN_IF_ERROR(spatial_only());
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
        return InvalidArgumentError(
            where + ": kernel " + std::to_string(g.kernel) +
            " is larger than its padded input " + ShapeText(in));
      }
      const Shape out{config.channels(),
                      (in.h + 2 * g.padding - g.kernel) / g.stride + 1,
                      (in.w + 2 * g.padding - g.kernel) / g.stride + 1};
      const uint64_t weight_offset = layout.num_elements();
      MERIDIAN_RETURN_IF_ERROR(layout.Add(
          "conv" + id + ".weight",
          {static_cast<uint64_t>(out.c), static_cast<uint64_t>(in.c),
           static_cast<uint64_t>(g.kernel), static_cast<uint64_t>(g.kernel)}));
      const uint64_t bias_offset = layout.num_elements();
      MERIDIAN_RETURN_IF_ERROR(
          layout.Add("conv" + id + ".bias", {static_cast<uint64_t>(out.c)}));
      return std::unique_ptr<Layer>(
          new Conv(in, out, g, weight_offset, bias_offset));
    }
    case pb::MAX_POOL:
    case pb::AVG_POOL: {
      MERIDIAN_RETURN_IF_ERROR(spatial_only());
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
                                    " is larger than its input " +
                                    ShapeText(in));
      }
      const Shape out{in.c, (in.h - k) / s + 1, (in.w - k) / s + 1};
      return std::unique_ptr<Layer>(
          new Pool(in, out, k, s, config.kind() == pb::MAX_POOL));
    }
    case pb::RELU:
      return std::unique_ptr<Layer>(new Relu(in));
    case pb::DROPOUT: {
      const double rate = config.has_rate() ? config.rate() : 0.5;
      if (!(rate >= 0 && rate < 1)) {
        return InvalidArgumentError(where + ".rate must be in [0, 1), got " +
                                    std::to_string(rate));
      }
      return std::unique_ptr<Layer>(new Dropout(in, rate));
    }
    case pb::BATCH_NORM:
    case pb::GROUP_NORM: {
      const double epsilon = config.has_epsilon() ? config.epsilon() : 1e-5;
      if (!(epsilon > 0 && epsilon <= 1)) {
        return InvalidArgumentError(where + ".epsilon must be in (0, 1], got " +
                                    std::to_string(epsilon));
      }
      const uint64_t offset = layout.num_elements();
      const auto channels = static_cast<uint64_t>(in.c);
      if (config.kind() == pb::BATCH_NORM) {
        const double momentum = config.has_momentum() ? config.momentum() : 0.1;
        if (!(momentum >= 0 && momentum <= 1)) {
          return InvalidArgumentError(where +
                                      ".momentum must be in [0, 1], got " +
                                      std::to_string(momentum));
        }
        for (const char* tensor :
             {".weight", ".bias", ".running_mean", ".running_var"}) {
          MERIDIAN_RETURN_IF_ERROR(layout.Add("bn" + id + tensor, {channels}));
        }
        return std::unique_ptr<Layer>(
            new BatchNorm(in, offset, momentum, epsilon));
      }
      const uint64_t groups = config.groups();
      if (groups == 0 || channels % groups != 0) {
        return InvalidArgumentError(
            where + ".groups must divide the " + std::to_string(channels) +
            " channels of its input, got " + std::to_string(groups));
      }
      for (const char* tensor : {".weight", ".bias"}) {
        MERIDIAN_RETURN_IF_ERROR(layout.Add("gn" + id + tensor, {channels}));
      }
      return std::unique_ptr<Layer>(
          new GroupNorm(in, offset, static_cast<int64_t>(groups), epsilon));
    }
    case pb::FULLY_CONNECTED: {
      MERIDIAN_RETURN_IF_ERROR(CheckRange(config.channels(), 1, kMaxDenseWidth,
                                          where + ".channels"));
      const auto units = static_cast<uint64_t>(config.channels());
      const uint64_t weight_offset = layout.num_elements();
      MERIDIAN_RETURN_IF_ERROR(layout.Add(
          "fc" + id + ".weight", {units, static_cast<uint64_t>(in.size())}));
      const uint64_t bias_offset = layout.num_elements();
      MERIDIAN_RETURN_IF_ERROR(layout.Add("fc" + id + ".bias", {units}));
      return std::unique_ptr<Layer>(new Dense(in, static_cast<int64_t>(units),
                                              weight_offset, bias_offset));
    }
    default:
      return InvalidArgumentError(where +
                                  ".kind must be set (CONV, MAX_POOL, "
                                  "AVG_POOL, RELU, BATCH_NORM, GROUP_NORM, "
                                  "DROPOUT or FULLY_CONNECTED), got " +
                                  pb::LayerKind_Name(config.kind()));
  }
}

}  // namespace

namespace model_internal {

Result<std::unique_ptr<Model>> MakeCnn(const pb::ModelConfig& config,
                                       int input_dim, int num_classes) {
  if (config.hidden_size() > 0) {
    return InvalidArgumentError(
        "model.hidden is for kind MLP; a CNN's layers are model.layers or "
        "model.preset");
  }
  std::vector<pb::LayerConfig> configs;
  if (config.has_preset()) {
    if (config.layers_size() > 0) {
      return InvalidArgumentError(
          "model.preset and model.layers are exclusive: give one");
    }
    MERIDIAN_ASSIGN_OR_RETURN(configs, CnnPresetLayers(config.preset()));
  } else {
    if (config.layers_size() == 0) {
      return InvalidArgumentError(
          "model.kind CNN needs model.layers or a model.preset (e.g. preset: "
          "\"lenet5\")");
    }
    configs.assign(config.layers().begin(), config.layers().end());
  }
  // The first spatial layer wants channel-major input; a CNN that starts
  // with a dense layer takes the features as they are, in any number.
  const bool input_channel_major =
      configs.front().kind() != pb::FULLY_CONNECTED;
  const int64_t channels = config.input_channels();
  const auto side = static_cast<int64_t>(std::llround(
      std::sqrt(static_cast<double>(input_dim) /
                static_cast<double>(std::max<int64_t>(channels, 1)))));
  if (input_channel_major &&
      (channels == 0 || side * side * channels != input_dim)) {
    return InvalidArgumentError(
        "model.input_channels: the input's " + std::to_string(input_dim) +
        " values are not " + std::to_string(channels) +
        " square image(s); a CNN needs C x H x W inputs with H = W");
  }
  const Shape input = input_channel_major ? Shape{channels, side, side}
                                          : Shape{input_dim, 1, 1};

  // The output layer to the classes, built and checked like the others.
  pb::LayerConfig& head = configs.emplace_back();
  head.set_kind(pb::FULLY_CONNECTED);
  head.set_channels(static_cast<uint32_t>(num_classes));

  ModelLayout layout;
  std::vector<std::unique_ptr<Layer>> layers;
  Shape shape = input;
  bool flattened = false;
  for (size_t i = 0; i < configs.size(); ++i) {
    MERIDIAN_ASSIGN_OR_RETURN(
        std::unique_ptr<Layer> layer,
        BuildLayer(configs[i], i, shape, flattened, layout));
    shape = layer->output_shape();
    if (configs[i].kind() == pb::FULLY_CONNECTED) flattened = true;
    if (static_cast<uint64_t>(shape.size()) > kMaxActivation) {
      return InvalidArgumentError("model.layers[" + std::to_string(i) +
                                  "] outputs " + ShapeText(shape) +
                                  " values per sample, more than " +
                                  std::to_string(kMaxActivation));
    }
    if (layout.num_elements() > kMaxParams) {
      return InvalidArgumentError("model has more than " +
                                  std::to_string(kMaxParams) + " parameters");
    }
    layers.push_back(std::move(layer));
  }
  return std::unique_ptr<Model>(new Cnn(std::move(layout), std::move(layers),
                                        input, input_channel_major, num_classes,
                                        kernels::WantedIsa()));
}

}  // namespace model_internal
}  // namespace meridian
