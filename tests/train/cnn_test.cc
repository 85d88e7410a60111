// Convolutional models: every layer's gradient against finite differences,
// the layout derived from the layers, BatchNorm's running statistics in
// training and evaluation, every kernel set, and config errors.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "meridian/train/dataset.h"
#include "meridian/train/model.h"
#include "meridian/train/optimizer.h"
#include "train/kernels.h"
#include "train/model_test_util.h"

namespace meridian {
namespace {

pb::LayerConfig Layer(pb::LayerKind kind) {
  pb::LayerConfig layer;
  layer.set_kind(kind);
  return layer;
}

pb::LayerConfig Conv(uint32_t channels, uint32_t kernel, uint32_t stride = 1,
                     uint32_t padding = 0) {
  pb::LayerConfig layer = Layer(pb::CONV);
  layer.set_channels(channels);
  layer.set_kernel(kernel);
  if (stride != 1) layer.set_stride(stride);
  if (padding != 0) layer.set_padding(padding);
  return layer;
}

pb::LayerConfig Fc(uint32_t units) {
  pb::LayerConfig layer = Layer(pb::FULLY_CONNECTED);
  layer.set_channels(units);
  return layer;
}

pb::LayerConfig GroupNorm(uint32_t groups) {
  pb::LayerConfig layer = Layer(pb::GROUP_NORM);
  layer.set_groups(groups);
  return layer;
}

pb::ModelConfig Cnn(std::vector<pb::LayerConfig> layers,
                    uint32_t input_channels = 1) {
  pb::ModelConfig config;
  config.set_kind(pb::CNN);
  for (auto& layer : layers) *config.add_layers() = layer;
  if (input_channels != 1) config.set_input_channels(input_channels);
  return config;
}

pb::ModelConfig Preset(const std::string& name) {
  pb::ModelConfig config;
  config.set_kind(pb::CNN);
  config.set_preset(name);
  return config;
}

using testing::Batch;
using testing::Build;
using testing::CpuIsas;
using testing::RandomBatch;

// Initial parameters with every tensor perturbed (norm scales away from 1,
// biases away from 0) so that each gradient term matters.
std::vector<float> Params(const Model& model, uint64_t seed) {
  std::vector<float> params(model.layout().num_elements());
  model.Initialize(seed, params);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> jitter(-0.3f, 0.3f);
  for (const TensorInfo& tensor : model.layout().tensors()) {
    if (tensor.name.find("running") != std::string::npos) continue;
    for (uint64_t i = 0; i < tensor.size; ++i) {
      params[tensor.offset + i] += jitter(rng);
    }
  }
  return params;
}

// The loss of a fresh model at `params` (fresh, so that a dropout mask is
// the same in every evaluation).
double FreshLoss(const pb::ModelConfig& config, int dim, int classes,
                 const std::vector<float>& params, const Batch& batch,
                 kernels::Isa isa) {
  std::unique_ptr<Model> model = Build(config, dim, classes, isa);
  std::vector<float> grad(params.size());
  return model->LossAndGradient(params, batch.features, batch.labels, grad);
}

// Central differences of the loss against the analytic gradient, for up to
// `per_tensor` elements of every tensor (running statistics must have a
// zero gradient: the training loss does not depend on them). ReLU and max
// pooling have kinks: where a step crosses one (the forward and backward
// differences disagree), the analytic gradient is the derivative on one
// side, so it must match one of the two one-sided differences.
void CheckGradientOn(const pb::ModelConfig& config, int dim, int classes,
                     int batch_size, kernels::Isa isa, int per_tensor) {
  SCOPED_TRACE(config.ShortDebugString() + " on " + kernels::IsaName(isa));
  std::unique_ptr<Model> model = Build(config, dim, classes, isa);
  ASSERT_NE(model, nullptr);
  const Batch batch = RandomBatch(dim, batch_size, classes, 7);
  std::vector<float> params = Params(*model, 11);
  std::vector<float> grad(params.size());
  const float loss =
      model->LossAndGradient(params, batch.features, batch.labels, grad);
  ASSERT_TRUE(std::isfinite(loss));
  const double base = FreshLoss(config, dim, classes, params, batch, isa);
  EXPECT_NEAR(loss, base, 1e-5);
  std::mt19937_64 rng(5);
  int checked = 0;
  int kinks = 0;
  for (const TensorInfo& tensor : model->layout().tensors()) {
    const bool state = tensor.name.find("running") != std::string::npos;
    for (int t = 0; t < per_tensor && t < static_cast<int>(tensor.size); ++t) {
      const uint64_t i =
          tensor.offset + (tensor.size <= 24 ? t : rng() % tensor.size);
      if (state) {
        EXPECT_EQ(grad[i], 0.0f) << tensor.name;
        continue;
      }
      const float eps = 2e-3f;
      std::vector<float> plus = params;
      std::vector<float> minus = params;
      plus[i] += eps;
      minus[i] -= eps;
      const double up =
          (FreshLoss(config, dim, classes, plus, batch, isa) - base) / eps;
      const double down =
          (base - FreshLoss(config, dim, classes, minus, batch, isa)) / eps;
      ++checked;
      const auto tolerance = [](double numeric) {
        return 2e-3 + 2e-2 * std::abs(numeric);
      };
      if (std::abs(up - down) > 1e-3 + 5e-3 * std::abs(up + down)) {
        ++kinks;
        EXPECT_LE(std::min(std::abs(grad[i] - up) - tolerance(up),
                           std::abs(grad[i] - down) - tolerance(down)),
                  0.0)
            << tensor.name << " element " << i - tensor.offset << ": "
            << grad[i] << " is neither one-sided difference " << up << ", "
            << down;
        continue;
      }
      const double numeric = (up + down) / 2;
      EXPECT_NEAR(grad[i], numeric, tolerance(numeric))
          << tensor.name << " element " << i - tensor.offset;
    }
  }
  // Most steps must be smooth, or the check says little.
  EXPECT_LE(kinks * 4, checked)
      << kinks << " of " << checked << " elements crossed a kink";
}

// On every kernel set the CPU has.
void CheckGradient(const pb::ModelConfig& config, int dim, int classes,
                   int batch_size) {
  for (kernels::Isa isa : CpuIsas()) {
    CheckGradientOn(config, dim, classes, batch_size, isa, 24);
  }
}

TEST(CnnGradientTest, ConvolutionWithPaddingAndStride) {
  CheckGradient(Cnn({Conv(3, 3, 1, 1), Layer(pb::RELU), Conv(4, 3, 2, 0)}), 36,
                4, 3);
  // Two input channels, a kernel wider than the stride, padding 2.
  CheckGradient(Cnn({Conv(2, 5, 2, 2)}, 2), 2 * 49, 3, 2);
}

TEST(CnnGradientTest, Pooling) {
  pb::LayerConfig overlapping = Layer(pb::MAX_POOL);
  overlapping.set_kernel(3);
  overlapping.set_stride(2);
  CheckGradient(Cnn({Conv(3, 3, 1, 1), Layer(pb::MAX_POOL)}), 36, 4, 3);
  CheckGradient(Cnn({Conv(2, 3), overlapping}), 49, 4, 3);
  CheckGradient(Cnn({Conv(3, 3, 1, 1), Layer(pb::AVG_POOL)}), 36, 4, 3);
}

TEST(CnnGradientTest, BatchNormAfterConvolutionAndAfterDense) {
  CheckGradient(Cnn({Conv(3, 3, 1, 1), Layer(pb::BATCH_NORM), Layer(pb::RELU)}),
                36, 4, 4);
  CheckGradient(Cnn({Fc(6), Layer(pb::BATCH_NORM), Layer(pb::RELU)}), 20, 3, 5);
  // First layer: no gradient below it is needed.
  CheckGradient(Cnn({Layer(pb::BATCH_NORM), Conv(2, 3)}, 2), 2 * 25, 3, 4);
}

TEST(CnnGradientTest, GroupNorm) {
  CheckGradient(Cnn({Conv(4, 3, 1, 1), GroupNorm(2), Layer(pb::RELU)}), 36, 4,
                3);
  CheckGradient(Cnn({Conv(6, 3), GroupNorm(3), Layer(pb::MAX_POOL)}), 49, 4, 2);
  CheckGradient(Cnn({Fc(8), GroupNorm(2)}), 20, 3, 3);
}

TEST(CnnGradientTest, DropoutAndDenseInTheMiddle) {
  pb::LayerConfig dropout = Layer(pb::DROPOUT);
  dropout.set_rate(0.3);
  CheckGradient(Cnn({Conv(3, 3), Layer(pb::RELU), Fc(7), dropout,
                     Layer(pb::RELU), Fc(5)}),
                36, 4, 3);
}

// Large enough that a convolution is computed in several chunks of samples
// (vgg-small's second layer: one sample per chunk): the gradient of a batch
// is the mean of its samples' gradients.
TEST(CnnGradientTest, ChunkedConvolutionMatchesPerSampleSum) {
  std::unique_ptr<Model> model = Build(Preset("vgg-small"), 784, 10);
  const Batch batch = RandomBatch(784, 3, 10, 3);
  const std::vector<float> params = Params(*model, 2);
  std::vector<float> whole(params.size());
  model->LossAndGradient(params, batch.features, batch.labels, whole);
  std::vector<double> sum(params.size(), 0.0);
  std::vector<float> one(params.size());
  for (int j = 0; j < 3; ++j) {
    model->LossAndGradient(params, batch.features.middleCols(j, 1),
                           std::span(batch.labels).subspan(j, 1), one);
    for (size_t i = 0; i < one.size(); ++i) sum[i] += one[i] / 3.0;
  }
  double worst = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    worst = std::max(worst, std::abs(whole[i] - sum[i]));
  }
  EXPECT_LT(worst, 1e-4);
}

TEST(CnnTest, EveryKernelSetAgreesWithThePortablePath) {
  for (const std::string& preset : CnnPresetNames()) {
    std::unique_ptr<Model> portable =
        Build(Preset(preset), 784, 10, kernels::Isa::kPortable);
    const Batch batch = RandomBatch(784, 17, 10, 9);
    const std::vector<float> params = Params(*portable, 4);
    std::vector<float> want(params.size());
    const float want_loss =
        portable->LossAndGradient(params, batch.features, batch.labels, want);
    for (kernels::Isa isa : CpuIsas()) {
      if (isa == kernels::Isa::kPortable) continue;
      SCOPED_TRACE(preset + " on " + kernels::IsaName(isa));
      std::unique_ptr<Model> fast = Build(Preset(preset), 784, 10, isa);
      std::vector<float> got(params.size());
      EXPECT_NEAR(
          fast->LossAndGradient(params, batch.features, batch.labels, got),
          want_loss, 1e-4);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-4 + 1e-3 * std::abs(want[i])) << i;
      }
    }
  }
}

TEST(CnnTest, LayoutIsDerivedFromTheLayers) {
  std::unique_ptr<Model> lenet = Build(Preset("lenet5"), 784, 10);
  EXPECT_EQ(lenet->layout().DebugString(),
            "conv0.weight[6,1,5,5] conv0.bias[6] conv3.weight[16,6,5,5] "
            "conv3.bias[16] fc6.weight[120,400] fc6.bias[120] "
            "fc8.weight[84,120] fc8.bias[84] fc10.weight[10,84] fc10.bias[10]");
  EXPECT_EQ(lenet->layout().num_elements(), 61706u);  // as PyTorch's LeNet-5
  std::unique_ptr<Model> bn = Build(Preset("lenet5-bn"), 784, 10);
  ASSERT_NE(bn->layout().Find("bn1.running_var"), nullptr);
  EXPECT_EQ(bn->layout().Find("bn1.running_var")->shape,
            std::vector<uint64_t>{6});
  std::unique_ptr<Model> gn = Build(Preset("vgg-small-gn"), 784, 10);
  ASSERT_NE(gn->layout().Find("fc14.weight"), nullptr);
  EXPECT_EQ(gn->layout().Find("fc14.weight")->shape,
            (std::vector<uint64_t>{128, 32 * 7 * 7}));
  // Three-channel 32x32 images (CIFAR-shaped) through the same preset.
  std::unique_ptr<Model> color = [] {
    pb::ModelConfig config = Preset("lenet5");
    config.set_input_channels(3);
    return Build(config, 3 * 32 * 32, 10);
  }();
  EXPECT_EQ(color->layout().Find("conv0.weight")->shape,
            (std::vector<uint64_t>{6, 3, 5, 5}));
  EXPECT_EQ(color->layout().Find("fc6.weight")->shape,
            (std::vector<uint64_t>{120, 16 * 6 * 6}));
}

TEST(CnnTest, InitializationIsDeterministicAndNormsStartAsIdentity) {
  std::unique_ptr<Model> model = Build(Preset("lenet5-bn"), 784, 10);
  std::vector<float> a(model->layout().num_elements());
  std::vector<float> b(a.size());
  model->Initialize(42, a);
  model->Initialize(42, b);
  EXPECT_EQ(a, b);
  const TensorInfo* var = model->layout().Find("bn1.running_var");
  const TensorInfo* scale = model->layout().Find("bn1.weight");
  for (uint64_t i = 0; i < var->size; ++i) {
    EXPECT_EQ(a[var->offset + i], 1.0f);
    EXPECT_EQ(a[scale->offset + i], 1.0f);
  }
}

// Training normalises with the batch's statistics; ApplyStateUpdate moves
// the running ones towards them; evaluation uses the running ones.
TEST(CnnTest, BatchNormRunningStatisticsInTrainingAndEvaluation) {
  pb::LayerConfig bn = Layer(pb::BATCH_NORM);
  bn.set_momentum(1.0);  // running statistics = the last batch's
  const pb::ModelConfig config = Cnn({Fc(3), bn});
  std::unique_ptr<Model> model = Build(config, 4, 2);
  Batch batch = RandomBatch(4, 50, 2, 1);
  batch.features.array() += 5.0f;  // a mean far from the initial 0
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(3, params);
  std::vector<float> grad(params.size());
  const std::vector<float> before = params;
  model->ApplyStateUpdate(params);  // no training pass yet: nothing
  EXPECT_EQ(params, before);
  model->LossAndGradient(params, batch.features, batch.labels, grad);
  model->ApplyStateUpdate(params);
  const TensorInfo* mean = model->layout().Find("bn1.running_mean");
  const TensorInfo* var = model->layout().Find("bn1.running_var");
  // The batch statistics of the dense layer's outputs, by hand.
  const TensorInfo* w = model->layout().Find("fc0.weight");
  const TensorInfo* b = model->layout().Find("fc0.bias");
  for (int o = 0; o < 3; ++o) {
    std::vector<double> z(50);
    for (int j = 0; j < 50; ++j) {
      double value = params[b->offset + o];
      for (int i = 0; i < 4; ++i) {
        value += params[w->offset + o * 4 + i] * batch.features(i, j);
      }
      z[j] = value;
    }
    double m = 0;
    for (double v : z) m += v / 50;
    double v2 = 0;
    for (double v : z) v2 += (v - m) * (v - m) / 49;  // unbiased
    EXPECT_NEAR(params[mean->offset + o], m, 1e-3 * (1 + std::abs(m)));
    EXPECT_NEAR(params[var->offset + o], v2, 1e-3 * (1 + v2));
  }
  // A second ApplyStateUpdate without a pass changes nothing.
  const std::vector<float> after = params;
  model->ApplyStateUpdate(params);
  EXPECT_EQ(params, after);

  // Evaluation with running statistics equal to the batch's gives the
  // training loss (up to the unbiased/biased variance and epsilon).
  Dataset data;
  data.features = batch.features;
  data.labels = batch.labels;
  data.num_classes = 2;
  std::vector<float> grad2(params.size());
  const float train_loss =
      model->LossAndGradient(params, batch.features, batch.labels, grad2);
  const EvalResult eval = model->Evaluate(params, data);
  EXPECT_NEAR(eval.loss, train_loss, 0.02);
  // With running statistics far from the batch's, evaluation differs.
  std::vector<float> shifted = params;
  for (int o = 0; o < 3; ++o) shifted[mean->offset + o] += 10.0f;
  EXPECT_GT(std::abs(model->Evaluate(shifted, data).loss - eval.loss), 0.1);
}

TEST(CnnTest, EvaluationIsChunkedAndMatchesPerSampleCorrectness) {
  std::unique_ptr<Model> model = Build(Preset("lenet5-gn"), 784, 10);
  const Batch batch = RandomBatch(784, 1500, 10, 8);
  Dataset data;
  data.features = batch.features;
  data.labels = batch.labels;
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(1, params);
  std::vector<uint8_t> correct;
  const EvalResult all = model->EvaluateSamples(params, data, &correct);
  ASSERT_EQ(correct.size(), 1500u);
  uint64_t right = 0;
  for (uint8_t c : correct) right += c;
  EXPECT_NEAR(all.accuracy, right / 1500.0, 1e-12);
  const EvalResult first = model->Evaluate(params, data, 10);
  EXPECT_EQ(first.samples, 10u);
  // GroupNorm is per sample: the first 10 samples score the same alone.
  Dataset ten;
  ten.features = batch.features.leftCols(10);
  ten.labels.assign(batch.labels.begin(), batch.labels.begin() + 10);
  EXPECT_NEAR(model->Evaluate(params, ten).loss, first.loss, 1e-5);
}

// Learns a task a linear model cannot: the class is which quadrant of the
// image holds a bright square.
TEST(CnnTest, TrainsOnASpatialTask) {
  std::unique_ptr<Model> model = Build(Preset("lenet5-bn"), 784, 4);
  std::mt19937_64 rng(6);
  auto make = [&](int count) {
    Batch batch;
    batch.features = Eigen::MatrixXf::Zero(784, count);
    for (int j = 0; j < count; ++j) {
      const int quadrant = static_cast<int>(rng() % 4);
      const int top = (quadrant / 2) * 14 + static_cast<int>(rng() % 8);
      const int left = (quadrant % 2) * 14 + static_cast<int>(rng() % 8);
      for (int y = 0; y < 5; ++y) {
        for (int x = 0; x < 5; ++x) {
          batch.features((top + y) * 28 + left + x, j) = 1.0f;
        }
      }
      batch.labels.push_back(static_cast<uint8_t>(quadrant));
    }
    return batch;
  };
  const Batch test = make(200);
  Dataset data;
  data.features = test.features;
  data.labels = test.labels;
  data.num_classes = 4;
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(2, params);
  pb::OptimizerConfig optimizer_config;
  optimizer_config.set_learning_rate(0.05);
  optimizer_config.set_momentum(0.9);
  SgdOptimizer optimizer(optimizer_config, params.size());
  std::vector<float> grad(params.size());
  for (int step = 0; step < 60; ++step) {
    const Batch batch = make(16);
    model->LossAndGradient(params, batch.features, batch.labels, grad);
    optimizer.Step(params, grad);
    model->ApplyStateUpdate(params);
  }
  EXPECT_GT(model->Evaluate(params, data).accuracy, 0.9);
}

TEST(CnnTest, ConfigErrorsNameTheField) {
  auto error = [](const pb::ModelConfig& config, int dim = 784) {
    Result<std::unique_ptr<Model>> model = MakeModel(config, dim, 10);
    return model.ok() ? std::string("ok") : model.status().message();
  };
  EXPECT_NE(error(Cnn({GroupNorm(4)}, 1)).find("groups must divide"),
            std::string::npos);
  EXPECT_NE(error(Cnn({Conv(4, 30)})).find("model.layers[0]: kernel 30"),
            std::string::npos);
  EXPECT_NE(error(Cnn({Fc(8), Conv(2, 3)})).find("model.layers[1]"),
            std::string::npos);
  EXPECT_NE(error(Cnn({Conv(0, 3)})).find("model.layers[0].channels"),
            std::string::npos);
  EXPECT_NE(error(Cnn({Conv(4, 0)})).find("model.layers[0].kernel"),
            std::string::npos);
  pb::LayerConfig relu_with_kernel = Layer(pb::RELU);
  relu_with_kernel.set_kernel(3);
  EXPECT_NE(
      error(Cnn({relu_with_kernel})).find("kernel is not used by kind RELU"),
      std::string::npos);
  pb::LayerConfig dropout = Layer(pb::DROPOUT);
  dropout.set_rate(1.0);
  EXPECT_NE(error(Cnn({dropout})).find("rate"), std::string::npos);
  EXPECT_NE(error(Cnn({Layer(pb::LAYER_KIND_UNSPECIFIED)})).find("kind"),
            std::string::npos);
  EXPECT_NE(error(Preset("resnet")).find("lenet5"), std::string::npos);
  pb::ModelConfig both = Preset("lenet5");
  *both.add_layers() = Layer(pb::RELU);
  EXPECT_NE(error(both).find("exclusive"), std::string::npos);
  EXPECT_NE(error(Cnn({})).find("model.layers"), std::string::npos);
  EXPECT_NE(error(Preset("lenet5"), 700).find("input_channels"),
            std::string::npos);
  pb::ModelConfig mlp_with_layers;
  mlp_with_layers.set_kind(pb::MLP);
  mlp_with_layers.add_hidden(8);
  *mlp_with_layers.add_layers() = Layer(pb::RELU);
  EXPECT_NE(error(mlp_with_layers).find("kind CNN"), std::string::npos);
  // Huge layers are refused before anything is allocated.
  EXPECT_NE(error(Cnn({Fc(1 << 24), Fc(1 << 24)})).find("parameters"),
            std::string::npos);
  EXPECT_NE(error(Cnn({Conv(40000, 1)})).find("values per sample"),
            std::string::npos);
}

TEST(CnnTest, BadInputsGiveNanNotACrash) {
  std::unique_ptr<Model> model = Build(Preset("lenet5"), 784, 10);
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(1, params);
  std::vector<float> grad(params.size(), 1.0f);
  const Batch batch = RandomBatch(784, 4, 10, 1);
  std::vector<uint8_t> bad = batch.labels;
  bad[2] = 10;
  EXPECT_TRUE(
      std::isnan(model->LossAndGradient(params, batch.features, bad, grad)));
  EXPECT_EQ(*std::max_element(grad.begin(), grad.end()), 0.0f);
  const Batch wrong = RandomBatch(100, 4, 10, 1);
  EXPECT_TRUE(std::isnan(
      model->LossAndGradient(params, wrong.features, wrong.labels, grad)));
  std::vector<float> short_params(10);
  EXPECT_TRUE(std::isnan(model->LossAndGradient(short_params, batch.features,
                                                batch.labels, grad)));
}

}  // namespace
}  // namespace meridian
