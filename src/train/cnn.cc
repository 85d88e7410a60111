// Convolutional classifiers: a sequence of layers (convolution, pooling,
// ReLU, BatchNorm, GroupNorm, dropout, dense) from the job file or a preset,
// followed by a dense layer to the classes and softmax cross-entropy. This
// file holds the model (the passes over its layers), the presets and the
// parsing of model.layers; the layers, and the activation layouts they
// share, are in cnn_layer.h.

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
#include "train/cnn_layer.h"
#include "train/kernels.h"
#include "train/model_internal.h"

namespace meridian {
namespace {

using cnn_internal::BuildConv;
using cnn_internal::BuildDense;
using cnn_internal::BuildDropout;
using cnn_internal::BuildNorm;
using cnn_internal::BuildPool;
using cnn_internal::BuildRelu;
using cnn_internal::Grow;
using cnn_internal::Layer;
using cnn_internal::LayerSpec;
using cnn_internal::LayerWork;
using cnn_internal::Pass;
using cnn_internal::Shape;
using cnn_internal::ShapeText;

using model_internal::EvaluateClassifier;
using model_internal::kMaxParams;
using model_internal::LogitsView;
using model_internal::SoftmaxCrossEntropy;

// Activations a job file may ask for (floats per sample; a model is built
// by every process of a job: this keeps a typo from exhausting memory).
constexpr uint64_t kMaxActivation = uint64_t{1} << 24;
// Floats of activations one evaluation chunk may hold (64 MiB).
constexpr int64_t kEvalFloats = int64_t{1} << 24;
constexpr int64_t kMaxEvalChunk = 1000;

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

// Builds one layer from its config, adding its tensors to `layout`.
Result<std::unique_ptr<Layer>> BuildLayer(const pb::LayerConfig& config,
                                          size_t index, const Shape& in,
                                          bool flattened, ModelLayout& layout) {
  const LayerSpec spec{.config = config,
                       .where = "model.layers[" + std::to_string(index) + "]",
                       .id = std::to_string(index),
                       .in = in};
  MERIDIAN_RETURN_IF_ERROR(CheckUnusedFields(config, spec.where));
  const auto spatial_only = [&]() -> Status {
    if (flattened) {
      return InvalidArgumentError(spec.where + " (" +
                                  pb::LayerKind_Name(config.kind()) +
                                  ") comes after a FULLY_CONNECTED layer, "
                                  "whose output has no spatial layout");
    }
    return Status::Ok();
  };
  switch (config.kind()) {
    case pb::CONV:
      MERIDIAN_RETURN_IF_ERROR(spatial_only());
      return BuildConv(spec, layout);
    case pb::MAX_POOL:
    case pb::AVG_POOL:
      MERIDIAN_RETURN_IF_ERROR(spatial_only());
      return BuildPool(spec);
    case pb::RELU:
      return BuildRelu(spec);
    case pb::DROPOUT:
      return BuildDropout(spec);
    case pb::BATCH_NORM:
    case pb::GROUP_NORM:
      return BuildNorm(spec, layout);
    case pb::FULLY_CONNECTED:
      return BuildDense(spec, layout);
    default:
      return InvalidArgumentError(spec.where +
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
