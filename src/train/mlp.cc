// Fully connected classifiers (softmax regression and ReLU MLPs) over a flat
// parameter vector, with forward/backward passes in Eigen (the three dense
// products on AVX-512 or AVX2/FMA kernels where the CPU has them).
//
// Layer l computes Z_l = W_l * A_{l-1} + b_l (A_{-1} = the features, one
// column per sample) and A_l = ReLU(Z_l) for hidden layers; the last layer's
// Z is the logits. W_l is stored row-major [out, in] followed by b_l [out],
// layer after layer ("fc0.weight", "fc0.bias", "fc1.weight", ...).

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
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

using RowMajorMatrixXf =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstWeightMap = Eigen::Map<const RowMajorMatrixXf>;
using WeightMap = Eigen::Map<RowMajorMatrixXf>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;
using ConstMatrixRef = Eigen::Ref<const Eigen::MatrixXf>;

// Samples per forward pass in Evaluate (bounds scratch memory).
constexpr Eigen::Index kEvalChunk = 1000;
// Largest layer width MakeModel accepts.
constexpr uint64_t kMaxWidth = uint64_t{1} << 24;

struct Layer {
  Eigen::Index in = 0;
  Eigen::Index out = 0;
  uint64_t weight_offset = 0;
  uint64_t bias_offset = 0;
  bool relu = false;
};

// Per-layer activations and deltas for up to `capacity` samples. Only grows,
// so repeated calls with batches no larger than before never allocate.
struct Scratch {
  std::vector<Eigen::MatrixXf> acts;    // acts[l]: A_l (logits for the last)
  std::vector<Eigen::MatrixXf> deltas;  // deltas[l]: dLoss / dZ_l
  std::vector<float> pack;              // operand packing (SIMD backward)
  Eigen::Index capacity = 0;
};

class Mlp final : public Model {
 public:
  Mlp(ModelLayout layout, std::vector<Layer> layers, int input_dim,
      int num_classes, kernels::Isa isa)
      : layout_(std::move(layout)),
        layers_(std::move(layers)),
        input_dim_(input_dim),
        num_classes_(num_classes),
        isa_(isa) {}

  const ModelLayout& layout() const override { return layout_; }
  int input_dim() const override { return input_dim_; }
  int num_classes() const override { return num_classes_; }

  void Initialize(uint64_t seed, std::span<float> params) const override {
    if (!model_internal::SizedForInitialize(params, layout_.num_elements())) {
      return;
    }
    std::mt19937_64 rng(seed);
    for (const Layer& layer : layers_) {
      const double fan_in = static_cast<double>(layer.in);
      const double fan_out = static_cast<double>(layer.out);
      // He-uniform keeps ReLU activations' variance; Glorot-uniform for the
      // linear output layer.
      const float limit =
          static_cast<float>(layer.relu ? std::sqrt(6.0 / fan_in)
                                        : std::sqrt(6.0 / (fan_in + fan_out)));
      float* weight = params.data() + layer.weight_offset;
      const Eigen::Index count = layer.in * layer.out;
      for (Eigen::Index i = 0; i < count; ++i) {
        weight[i] = model_internal::UniformSymmetric(rng, limit);
      }
      std::fill_n(params.data() + layer.bias_offset, layer.out, 0.0f);
    }
  }

  float LossAndGradient(std::span<const float> params,
                        const ConstMatrixRef& features,
                        std::span<const uint8_t> labels,
                        std::span<float> grad) override {
    const Eigen::Index n = features.cols();
    if (!InputsValid(params, features, labels) ||
        grad.size() != params.size()) {
      std::fill(grad.begin(), grad.end(), 0.0f);
      return std::numeric_limits<float>::quiet_NaN();
    }
    if (n == 0) {
      std::fill(grad.begin(), grad.end(), 0.0f);
      return 0.0f;
    }
    Reserve(train_, n);
    Forward(params, features, n, train_);

    // Logits and their deltas are classes x n, one column per sample.
    const double loss = model_internal::SoftmaxCrossEntropy(
        {train_.acts.back().data(), 1, train_.acts.back().outerStride()},
        num_classes_, labels.first(static_cast<size_t>(n)),
        train_.deltas.back().data());

    // Backward, last layer first.
    for (size_t l = layers_.size(); l-- > 0;) {
      const Layer& layer = layers_[l];
      const auto d = train_.deltas[l].leftCols(n);
      const ConstMatrixRef input =
          l == 0 ? features : ConstMatrixRef(train_.acts[l - 1].leftCols(n));
      float* grad_w_data = grad.data() + layer.weight_offset;
      const float* weight_data = params.data() + layer.weight_offset;
      VectorMap grad_b(grad.data() + layer.bias_offset, layer.out);
      grad_b.noalias() = d.rowwise().sum();
      auto d_prev = train_.deltas[l == 0 ? 0 : l - 1].leftCols(n);
      if (isa_ != kernels::Isa::kPortable) {
        // grad_w[o, i] = sum_b d(o, b) * input(i, b).
        kernels::OuterProduct(isa_, layer.out, layer.in, n, d.data(), 1,
                              d.outerStride(), input.data(),
                              input.outerStride(), grad_w_data, layer.in,
                              train_.pack.data());
        if (l > 0) {
          // d_prev(i, b) = sum_o d(o, b) * weight[o, i].
          kernels::OuterProduct(isa_, n, layer.in, layer.out, d.data(),
                                d.outerStride(), 1, weight_data, layer.in,
                                d_prev.data(), d_prev.outerStride(),
                                train_.pack.data());
        }
      } else  // NOLINT(readability/braces)
      {
        WeightMap grad_w(grad_w_data, layer.out, layer.in);
        grad_w.noalias() = d * input.transpose();
        if (l > 0) {
          const ConstWeightMap weight(weight_data, layer.out, layer.in);
          d_prev.noalias() = weight.transpose() * d;
        }
      }
      if (l > 0) {
        // ReLU: the gradient passes where the activation was positive.
        d_prev.array() *= (input.array() > 0.0f).cast<float>();
      }
    }
    return static_cast<float>(loss / static_cast<double>(n));
  }

 private:
  EvalResult EvaluateInto(std::span<const float> params, const Dataset& data,
                          uint64_t max_samples,
                          std::vector<uint8_t>* correct) override {
    const uint64_t total = std::min<uint64_t>(
        data.labels.size(), static_cast<uint64_t>(data.features.cols()));
    Reserve(eval_, std::min<Eigen::Index>(kEvalChunk,
                                          static_cast<Eigen::Index>(
                                              std::max<uint64_t>(total, 1))));
    const bool fits = params.size() == layout_.num_elements() &&
                      data.features.rows() == input_dim_;
    return model_internal::EvaluateClassifier(
        fits, data, num_classes_, max_samples, kEvalChunk, correct,
        [&](int64_t start, int64_t n) {
          Forward(params, data.features.middleCols(start, n), n, eval_);
          const Eigen::MatrixXf& logits = eval_.acts.back();
          return model_internal::LogitsView{logits.data(), 1,
                                            logits.outerStride()};
        });
  }

  bool InputsValid(std::span<const float> params,
                   const ConstMatrixRef& features,
                   std::span<const uint8_t> labels) const {
    if (params.size() != layout_.num_elements()) return false;
    if (features.rows() != input_dim_) return false;
    if (static_cast<uint64_t>(features.cols()) != labels.size()) return false;
    for (uint8_t label : labels) {
      if (label >= num_classes_) return false;
    }
    return true;
  }

  void Reserve(Scratch& scratch, Eigen::Index n) const {
    if (n <= scratch.capacity && !scratch.acts.empty()) return;
    const Eigen::Index capacity = std::max(n, scratch.capacity);
    scratch.acts.resize(layers_.size());
    scratch.deltas.resize(layers_.size());
    int64_t pack = 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      scratch.acts[l].resize(layers_[l].out, capacity);
      scratch.deltas[l].resize(layers_[l].out, capacity);
      // Weight gradient (rows = out, steps = samples) and delta propagation
      // (rows = samples, steps = out).
      pack = std::max({pack, kernels::OuterPackSize(layers_[l].out, capacity),
                       kernels::OuterPackSize(capacity, layers_[l].out)});
    }
    if (isa_ != kernels::Isa::kPortable)
      scratch.pack.resize(static_cast<size_t>(pack));
    scratch.capacity = capacity;
  }

  // Fills scratch.acts[l].leftCols(n) for every layer.
  void Forward(std::span<const float> params, const ConstMatrixRef& features,
               Eigen::Index n, Scratch& scratch) const {
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      const float* weight_data = params.data() + layer.weight_offset;
      const float* bias_data = params.data() + layer.bias_offset;
      const ConstMatrixRef input =
          l == 0 ? features : ConstMatrixRef(scratch.acts[l - 1].leftCols(n));
      auto out = scratch.acts[l].leftCols(n);
      if (isa_ != kernels::Isa::kPortable) {
        kernels::DotProduct(isa_, layer.out, n, layer.in, weight_data, layer.in,
                            input.data(), input.outerStride(), bias_data,
                            layer.relu, out.data(), out.outerStride());
        continue;
      }
      const ConstWeightMap weight(weight_data, layer.out, layer.in);
      const ConstVectorMap bias(bias_data, layer.out);
      out.noalias() = weight * input;
      out.colwise() += bias;
      if (layer.relu) out = out.cwiseMax(0.0f);
    }
  }

  ModelLayout layout_;
  std::vector<Layer> layers_;
  int input_dim_;
  int num_classes_;
  kernels::Isa isa_;  // the kernels this model runs on
  Scratch train_;     // LossAndGradient
  Scratch eval_;  // Evaluate (kept apart so the two never resize each other)
};

}  // namespace

namespace model_internal {

Result<std::unique_ptr<Model>> MakeMlp(const pb::ModelConfig& config,
                                       int input_dim, int num_classes) {
  std::vector<uint64_t> widths = {static_cast<uint64_t>(input_dim)};
  switch (config.kind()) {
    case pb::SOFTMAX:
      if (config.hidden_size() > 0) {
        return InvalidArgumentError(
            "model.kind SOFTMAX has no hidden layers, but model.hidden lists " +
            std::to_string(config.hidden_size()) + " (use kind: MLP)");
      }
      break;
    case pb::MLP:
      if (config.hidden_size() == 0) {
        return InvalidArgumentError(
            "model.kind MLP needs at least one model.hidden layer size "
            "(use kind: SOFTMAX for no hidden layer)");
      }
      for (int i = 0; i < config.hidden_size(); ++i) {
        const uint64_t width = config.hidden(i);
        if (width == 0 || width > kMaxWidth) {
          return InvalidArgumentError(
              "model.hidden[" + std::to_string(i) + "] must be in [1, " +
              std::to_string(kMaxWidth) + "], got " + std::to_string(width));
        }
        widths.push_back(width);
      }
      break;
    default:
      return InvalidArgumentError("model.kind must be SOFTMAX or MLP, got " +
                                  pb::ModelKind_Name(config.kind()));
  }
  widths.push_back(static_cast<uint64_t>(num_classes));

  ModelLayout layout;
  std::vector<Layer> layers;
  uint64_t total = 0;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    const uint64_t in = widths[l];
    const uint64_t out = widths[l + 1];
    total += out * in + out;  // widths <= 2^24: no overflow
    if (total > model_internal::kMaxParams) {
      return InvalidArgumentError("model has more than " +
                                  std::to_string(model_internal::kMaxParams) +
                                  " parameters");
    }
    const std::string prefix = "fc" + std::to_string(l);
    Layer layer;
    layer.in = static_cast<Eigen::Index>(in);
    layer.out = static_cast<Eigen::Index>(out);
    layer.weight_offset = layout.num_elements();
    MERIDIAN_RETURN_IF_ERROR(layout.Add(prefix + ".weight", {out, in}));
    layer.bias_offset = layout.num_elements();
    MERIDIAN_RETURN_IF_ERROR(layout.Add(prefix + ".bias", {out}));
    layer.relu = l + 2 < widths.size();
    layers.push_back(layer);
  }
  return std::unique_ptr<Model>(new Mlp(std::move(layout), std::move(layers),
                                        input_dim, num_classes,
                                        kernels::WantedIsa()));
}

}  // namespace model_internal

}  // namespace meridian
