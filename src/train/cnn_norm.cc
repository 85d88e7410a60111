// Normalisation layers: BatchNorm (running statistics for evaluation) and
// GroupNorm (per sample), on either activation layout.

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

}  // namespace

Result<std::unique_ptr<Layer>> BuildNorm(const LayerSpec& spec,
                                         ModelLayout& layout) {
  const pb::LayerConfig& config = spec.config;
  const std::string& where = spec.where;
  const double epsilon = config.has_epsilon() ? config.epsilon() : 1e-5;
  if (!(epsilon > 0 && epsilon <= 1)) {
    return InvalidArgumentError(where + ".epsilon must be in (0, 1], got " +
                                std::to_string(epsilon));
  }
  const uint64_t offset = layout.num_elements();
  const auto channels = static_cast<uint64_t>(spec.in.c);
  if (config.kind() == pb::BATCH_NORM) {
    const double momentum = config.has_momentum() ? config.momentum() : 0.1;
    if (!(momentum >= 0 && momentum <= 1)) {
      return InvalidArgumentError(where + ".momentum must be in [0, 1], got " +
                                  std::to_string(momentum));
    }
    for (const char* tensor :
         {".weight", ".bias", ".running_mean", ".running_var"}) {
      MERIDIAN_RETURN_IF_ERROR(layout.Add("bn" + spec.id + tensor, {channels}));
    }
    return std::unique_ptr<Layer>(
        new BatchNorm(spec.in, offset, momentum, epsilon));
  }
  const uint64_t groups = config.groups();
  if (groups == 0 || channels % groups != 0) {
    return InvalidArgumentError(
        where + ".groups must divide the " + std::to_string(channels) +
        " channels of its input, got " + std::to_string(groups));
  }
  for (const char* tensor : {".weight", ".bias"}) {
    MERIDIAN_RETURN_IF_ERROR(layout.Add("gn" + spec.id + tensor, {channels}));
  }
  return std::unique_ptr<Layer>(
      new GroupNorm(spec.in, offset, static_cast<int64_t>(groups), epsilon));
}

}  // namespace meridian::cnn_internal
