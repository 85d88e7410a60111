#include "meridian/train/model.h"

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "meridian/train/dataset.h"
#include "meridian/train/optimizer.h"
#include "train/kernels.h"
#include "train/model_test_util.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

pb::ModelConfig MlpConfig(std::vector<uint32_t> hidden) {
  pb::ModelConfig config;
  config.set_kind(pb::MLP);
  for (uint32_t width : hidden) config.add_hidden(width);
  return config;
}

pb::ModelConfig SoftmaxConfig() {
  pb::ModelConfig config;
  config.set_kind(pb::SOFTMAX);
  return config;
}

using testing::Batch;
using testing::Build;
using testing::CpuIsas;
using testing::RandomBatch;

// Independent double-precision implementation of the documented model:
// widths = {input, hidden..., classes}; per layer "weight" [out, in]
// row-major then "bias" [out]; ReLU on hidden layers; mean cross-entropy.
struct Reference {
  std::vector<int> widths;

  // Logits of one sample.
  std::vector<double> Logits(const std::vector<double>& params,
                             const Eigen::MatrixXf& features, int j) const {
    std::vector<double> act(widths[0]);
    for (int i = 0; i < widths[0]; ++i) act[i] = features(i, j);
    size_t offset = 0;
    for (size_t l = 0; l + 1 < widths.size(); ++l) {
      const int in = widths[l];
      const int out = widths[l + 1];
      const double* weight = params.data() + offset;
      const double* bias = weight + static_cast<size_t>(in) * out;
      offset += static_cast<size_t>(in) * out + out;
      std::vector<double> next(out);
      for (int o = 0; o < out; ++o) {
        double z = bias[o];
        for (int i = 0; i < in; ++i) z += weight[o * in + i] * act[i];
        const bool hidden = l + 2 < widths.size();
        next[o] = hidden ? std::max(z, 0.0) : z;
      }
      act = std::move(next);
    }
    return act;
  }

  double Loss(const std::vector<double>& params,
              const Eigen::MatrixXf& features,
              const std::vector<uint8_t>& labels, int* correct = nullptr,
              int count = -1) const {
    if (count < 0) count = static_cast<int>(labels.size());
    double total = 0;
    if (correct != nullptr) *correct = 0;
    for (int j = 0; j < count; ++j) {
      const std::vector<double> z = Logits(params, features, j);
      const double max = *std::max_element(z.begin(), z.end());
      double sum = 0;
      for (double v : z) sum += std::exp(v - max);
      total += std::log(sum) + max - z[labels[j]];
      const int predicted =
          static_cast<int>(std::max_element(z.begin(), z.end()) - z.begin());
      if (correct != nullptr && predicted == labels[j]) ++*correct;
    }
    return total / count;
  }
};

std::vector<double> ToDouble(const std::vector<float>& values) {
  return std::vector<double>(values.begin(), values.end());
}

// Non-zero biases, so that their gradients matter and no pre-activation
// sits exactly on a ReLU kink (with zero biases, a sample whose previous
// layer is all zero gives Z = 0 exactly, where the derivative is one-sided).
void RandomizeBiases(const Model& model, std::vector<float>& params) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> small(-0.2f, 0.2f);
  for (const TensorInfo& tensor : model.layout().tensors()) {
    if (tensor.name.ends_with(".bias")) {
      for (uint64_t i = 0; i < tensor.size; ++i) {
        params[tensor.offset + i] = small(rng);
      }
    }
  }
}

// Checks the model's analytic gradient against central differences of the
// double-precision reference loss, for every parameter, and the model's loss
// against the reference loss.
void CheckGradient(const pb::ModelConfig& config,
                   const std::vector<int>& widths, int batch_size,
                   kernels::Isa isa) {
  const int input_dim = widths.front();
  const int num_classes = widths.back();
  std::unique_ptr<Model> model = Build(config, input_dim, num_classes, isa);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(7, params);
  RandomizeBiases(*model, params);
  const Batch batch = RandomBatch(input_dim, batch_size, num_classes, 11);
  std::vector<float> grad(params.size(), 123.0f);
  const float loss =
      model->LossAndGradient(params, batch.features, batch.labels, grad);

  const Reference reference{widths};
  std::vector<double> p = ToDouble(params);
  const double reference_loss = reference.Loss(p, batch.features, batch.labels);
  EXPECT_NEAR(loss, reference_loss, 1e-5 * std::max(1.0, reference_loss));

  const double h = 1e-5;
  int checked = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const double saved = p[k];
    p[k] = saved + h;
    const double plus = reference.Loss(p, batch.features, batch.labels);
    p[k] = saved - h;
    const double minus = reference.Loss(p, batch.features, batch.labels);
    p[k] = saved;
    const double numeric = (plus - minus) / (2 * h);
    EXPECT_NEAR(grad[k], numeric, 2e-5 + 1e-3 * std::abs(numeric))
        << "parameter " << k;
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(params.size()));
}

// On each kernel set (skipped where the CPU lacks it).
class GradientTest : public ::testing::TestWithParam<kernels::Isa> {
 protected:
  void SetUp() override {
    if (GetParam() > kernels::CpuIsa()) {
      GTEST_SKIP() << "the CPU has no " << kernels::IsaName(GetParam());
    }
  }
};

TEST_P(GradientTest, SoftmaxMatchesCentralDifferences) {
  CheckGradient(SoftmaxConfig(), {13, 4}, 10, GetParam());
}

TEST_P(GradientTest, TwoHiddenLayerMlpMatchesCentralDifferences) {
  // Odd sizes exercise every remainder path of the kernels.
  CheckGradient(MlpConfig({7, 5}), {12, 7, 5, 3}, 11, GetParam());
}

TEST_P(GradientTest, WiderMlpMatchesCentralDifferences) {
  CheckGradient(MlpConfig({19}), {37, 19, 6}, 23, GetParam());
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, GradientTest,
    ::testing::Values(kernels::Isa::kPortable, kernels::Isa::kAvx2,
                      kernels::Isa::kAvx512),
    [](const ::testing::TestParamInfo<kernels::Isa>& info) {
      return std::string(kernels::IsaName(info.param));
    });

// Central differences on the model itself (float), no reference involved.
// A parameter whose perturbation moves some pre-activation across a ReLU
// kink has different one-sided slopes; such parameters are skipped (at most
// `max_skipped_fraction` of them), every other one must agree.
void CheckModelFiniteDifferences(const pb::ModelConfig& config, int input_dim,
                                 int num_classes, double max_skipped_fraction) {
  std::unique_ptr<Model> model = Build(config, input_dim, num_classes);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(5, params);
  RandomizeBiases(*model, params);
  const Batch batch = RandomBatch(input_dim, 16, num_classes, 22);
  std::vector<float> grad(params.size());
  std::vector<float> scratch(params.size());
  const double base =
      model->LossAndGradient(params, batch.features, batch.labels, grad);
  const float eps = 1e-3f;
  int skipped = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const float saved = params[k];
    params[k] = saved + eps;
    const double plus =
        model->LossAndGradient(params, batch.features, batch.labels, scratch);
    params[k] = saved - eps;
    const double minus =
        model->LossAndGradient(params, batch.features, batch.labels, scratch);
    params[k] = saved;
    const double forward = (plus - base) / eps;
    const double backward = (base - minus) / eps;
    if (std::abs(forward - backward) >
        1e-3 + 0.05 * std::max(std::abs(forward), std::abs(backward))) {
      ++skipped;  // a kink within eps
      continue;
    }
    const double numeric = (plus - minus) / (2.0 * eps);
    EXPECT_NEAR(grad[k], numeric, 3e-4 + 2e-2 * std::abs(numeric))
        << "parameter " << k << " fwd " << forward << " bwd " << backward;
  }
  EXPECT_LE(skipped, max_skipped_fraction * params.size())
      << skipped << " of " << params.size() << " parameters skipped";
}

TEST(ModelTest, SoftmaxFloatFiniteDifferences) {
  CheckModelFiniteDifferences(SoftmaxConfig(), 10, 4, 0.0);
}

TEST(ModelTest, MlpFloatFiniteDifferences) {
  CheckModelFiniteDifferences(MlpConfig({9, 6}), 10, 4, 0.1);
}

TEST(ModelTest, EveryKernelSetAgreesWithThePortablePath) {
  const pb::ModelConfig config = MlpConfig({40, 33});
  std::unique_ptr<Model> portable =
      Build(config, 100, 10, kernels::Isa::kPortable);
  ASSERT_NE(portable, nullptr);
  std::vector<float> params(portable->layout().num_elements());
  portable->Initialize(1, params);
  for (kernels::Isa isa : CpuIsas()) {
    if (isa == kernels::Isa::kPortable) continue;
    SCOPED_TRACE(kernels::IsaName(isa));
    std::unique_ptr<Model> fast = Build(config, 100, 10, isa);
    ASSERT_NE(fast, nullptr);
    for (int batch_size : {1, 2, 8, 29, 64}) {
      const Batch batch = RandomBatch(100, batch_size, 10, batch_size);
      std::vector<float> g1(params.size()), g2(params.size());
      const float l1 =
          fast->LossAndGradient(params, batch.features, batch.labels, g1);
      const float l2 =
          portable->LossAndGradient(params, batch.features, batch.labels, g2);
      EXPECT_NEAR(l1, l2, 1e-5);
      for (size_t k = 0; k < params.size(); ++k) {
        ASSERT_NEAR(g1[k], g2[k], 1e-6 + 1e-4 * std::abs(g2[k]))
            << "batch " << batch_size << " parameter " << k;
      }
    }
  }
}

TEST(ModelTest, AcceptsFeaturesWithAnOuterStride) {
  std::unique_ptr<Model> model = Build(MlpConfig({6}), 5, 3);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(2, params);
  const Batch tall = RandomBatch(9, 7, 3, 4);  // features in the top 5 rows
  const Eigen::MatrixXf copy = tall.features.topRows(5);
  std::vector<float> g1(params.size()), g2(params.size());
  const float l1 =
      model->LossAndGradient(params, tall.features.topRows(5), tall.labels, g1);
  const float l2 = model->LossAndGradient(params, copy, tall.labels, g2);
  EXPECT_FLOAT_EQ(l1, l2);
  for (size_t k = 0; k < params.size(); ++k) EXPECT_FLOAT_EQ(g1[k], g2[k]);
}

TEST(ModelTest, LayoutNamesAndShapes) {
  std::unique_ptr<Model> model = Build(MlpConfig({256, 128}), 784, 10);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->input_dim(), 784);
  EXPECT_EQ(model->num_classes(), 10);
  const std::vector<TensorInfo>& tensors = model->layout().tensors();
  ASSERT_EQ(tensors.size(), 6u);
  const std::vector<std::string> names = {"fc0.weight", "fc0.bias",
                                          "fc1.weight", "fc1.bias",
                                          "fc2.weight", "fc2.bias"};
  const std::vector<std::vector<uint64_t>> shapes = {
      {256, 784}, {256}, {128, 256}, {128}, {10, 128}, {10}};
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(tensors[i].name, names[i]);
    EXPECT_EQ(tensors[i].shape, shapes[i]);
    EXPECT_EQ(tensors[i].offset, offset);
    offset += tensors[i].size;
  }
  EXPECT_EQ(model->layout().num_elements(),
            256u * 784 + 256 + 128 * 256 + 128 + 10 * 128 + 10);

  std::unique_ptr<Model> softmax = Build(SoftmaxConfig(), 784, 10);
  ASSERT_NE(softmax, nullptr);
  EXPECT_EQ(softmax->layout().DebugString(), "fc0.weight[10,784] fc0.bias[10]");
}

TEST(ModelTest, InitializeIsDeterministicAndScaled) {
  std::unique_ptr<Model> model = Build(MlpConfig({64}), 100, 10);
  ASSERT_NE(model, nullptr);
  const uint64_t n = model->layout().num_elements();
  std::vector<float> a(n), b(n), c(n);
  model->Initialize(42, a);
  model->Initialize(42, b);
  model->Initialize(43, c);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);

  const ModelLayout& layout = model->layout();
  const TensorInfo* w0 = layout.Find("fc0.weight");
  const TensorInfo* w1 = layout.Find("fc1.weight");
  ASSERT_NE(w0, nullptr);
  ASSERT_NE(w1, nullptr);
  const float he = std::sqrt(6.0f / 100);            // ReLU layer
  const float glorot = std::sqrt(6.0f / (64 + 10));  // output layer
  auto check_uniform = [&](const TensorInfo& t, float limit) {
    double sum = 0, squares = 0;
    float max_abs = 0;
    for (uint64_t i = 0; i < t.size; ++i) {
      const float v = a[t.offset + i];
      sum += v;
      squares += double{v} * v;
      max_abs = std::max(max_abs, std::abs(v));
    }
    EXPECT_LE(max_abs, limit) << t.name;
    EXPECT_GT(max_abs, 0.9f * limit) << t.name;
    EXPECT_NEAR(sum / t.size, 0.0, 0.1 * limit) << t.name;
    // Uniform on [-L, L]: variance L^2 / 3.
    EXPECT_NEAR(squares / t.size, limit * limit / 3, 0.15 * limit * limit)
        << t.name;
  };
  check_uniform(*w0, he);
  check_uniform(*w1, glorot);
  for (const char* bias : {"fc0.bias", "fc1.bias"}) {
    const TensorInfo* t = layout.Find(bias);
    ASSERT_NE(t, nullptr);
    for (uint64_t i = 0; i < t->size; ++i) EXPECT_EQ(a[t->offset + i], 0.0f);
  }
}

// Three well separated Gaussian blobs in 4-D.
Dataset ToyProblem(int size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  Dataset data;
  data.num_classes = 3;
  data.features.resize(4, size);
  for (int j = 0; j < size; ++j) {
    const int label = j % 3;
    for (int i = 0; i < 4; ++i) {
      data.features(i, j) = (i == label ? 3.0f : 0.0f) + noise(rng);
    }
    data.labels.push_back(static_cast<uint8_t>(label));
  }
  return data;
}

void FitToyProblem(const pb::ModelConfig& config) {
  std::unique_ptr<Model> model = Build(config, 4, 3);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements());
  std::vector<float> grad(params.size());
  model->Initialize(9, params);
  const Dataset data = ToyProblem(150, 1);
  pb::OptimizerConfig optimizer_config;
  optimizer_config.set_learning_rate(0.05);
  optimizer_config.set_momentum(0.9);
  SgdOptimizer optimizer(optimizer_config, params.size());

  const EvalResult before = model->Evaluate(params, data);
  std::mt19937_64 rng(2);
  Eigen::MatrixXf features(4, 16);
  std::vector<uint8_t> labels(16);
  float first_loss = 0, last_loss = 0;
  for (int step = 0; step < 300; ++step) {
    for (int j = 0; j < 16; ++j) {
      const uint64_t k = rng() % data.size();
      features.col(j) = data.features.col(static_cast<Eigen::Index>(k));
      labels[j] = data.labels[k];
    }
    const float loss = model->LossAndGradient(params, features, labels, grad);
    if (step == 0) first_loss = loss;
    last_loss = loss;
    optimizer.Step(params, grad);
  }
  const EvalResult after = model->Evaluate(params, data);
  EXPECT_LT(last_loss, 0.1 * first_loss);
  EXPECT_LT(after.loss, 0.05);
  EXPECT_LT(after.loss, before.loss);
  EXPECT_EQ(after.accuracy, 1.0);
  EXPECT_EQ(after.samples, 150u);
  EXPECT_EQ(optimizer.steps(), 300u);
}

TEST(ModelTest, SoftmaxFitsSeparableToyProblem) {
  FitToyProblem(SoftmaxConfig());
}

TEST(ModelTest, MlpFitsSeparableToyProblem) { FitToyProblem(MlpConfig({8})); }

TEST(ModelTest, EvaluateMatchesDirectComputation) {
  const std::vector<int> widths = {6, 5, 4};
  std::unique_ptr<Model> model = Build(MlpConfig({5}), 6, 4);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(3, params);
  // More than one evaluation chunk, with a partial last chunk.
  const Batch batch = RandomBatch(6, 2500, 4, 8);
  Dataset data;
  data.features = batch.features;
  data.labels = batch.labels;
  data.num_classes = 4;
  const Reference reference{widths};
  const std::vector<double> p = ToDouble(params);

  int correct = 0;
  const double loss =
      reference.Loss(p, data.features, data.labels, &correct, 2500);
  const EvalResult all = model->Evaluate(params, data);
  EXPECT_EQ(all.samples, 2500u);
  EXPECT_NEAR(all.loss, loss, 1e-5);
  EXPECT_DOUBLE_EQ(all.accuracy, correct / 2500.0);

  const double head_loss =
      reference.Loss(p, data.features, data.labels, &correct, 1500);
  const EvalResult head = model->Evaluate(params, data, 1500);
  EXPECT_EQ(head.samples, 1500u);
  EXPECT_NEAR(head.loss, head_loss, 1e-5);
  EXPECT_DOUBLE_EQ(head.accuracy, correct / 1500.0);

  // Asking for more than there is evaluates everything.
  EXPECT_EQ(model->Evaluate(params, data, 100000).samples, 2500u);
  // Per sample: as many marked correct as the accuracy says, and the
  // marks are the reference's argmax on each sample.
  std::vector<uint8_t> marks;
  const EvalResult each = model->EvaluateSamples(params, data, &marks);
  ASSERT_EQ(marks.size(), 2500u);
  EXPECT_DOUBLE_EQ(each.accuracy, all.accuracy);
  EXPECT_NEAR(each.loss, all.loss, 1e-9);
  int marked = 0;
  for (uint8_t mark : marks) marked += mark;
  EXPECT_EQ(marked, static_cast<int>(all.accuracy * 2500 + 0.5));
  int first_right = 0;
  Dataset one;
  one.features = data.features.leftCols(1);
  one.labels = {data.labels[0]};
  one.num_classes = 4;
  first_right = static_cast<int>(model->Evaluate(params, one).accuracy);
  EXPECT_EQ(marks[0], first_right);
  // Data that does not fit leaves no marks.
  Dataset bad = one;
  bad.labels = {9};
  EXPECT_TRUE(std::isnan(model->EvaluateSamples(params, bad, &marks).loss));
  EXPECT_TRUE(marks.empty());
  // Training calls in between do not disturb evaluation.
  std::vector<float> grad(params.size());
  model->LossAndGradient(params, batch.features.leftCols(3),
                         std::span(batch.labels).first(3), grad);
  EXPECT_NEAR(model->Evaluate(params, data).loss, loss, 1e-5);
}

TEST(ModelTest, RepeatedCallsWithVaryingBatchSizesAgree) {
  std::unique_ptr<Model> model = Build(MlpConfig({16}), 8, 3);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(4, params);
  const Batch big = RandomBatch(8, 40, 3, 5);
  std::vector<float> g1(params.size()), g2(params.size()), g3(params.size());
  const float l1 = model->LossAndGradient(params, big.features.leftCols(10),
                                          std::span(big.labels).first(10), g1);
  model->LossAndGradient(params, big.features, big.labels, g2);
  const float l3 = model->LossAndGradient(params, big.features.leftCols(10),
                                          std::span(big.labels).first(10), g3);
  EXPECT_EQ(l1, l3);
  EXPECT_EQ(g1, g3);
}

TEST(ModelTest, PreconditionViolationsGiveNanNotACrash) {
  std::unique_ptr<Model> model = Build(SoftmaxConfig(), 4, 3);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(1, params);
  std::vector<float> grad(params.size(), 5.0f);
  Eigen::MatrixXf features = Eigen::MatrixXf::Ones(4, 2);
  const std::vector<uint8_t> bad_label = {0, 3};
  EXPECT_TRUE(
      std::isnan(model->LossAndGradient(params, features, bad_label, grad)));
  EXPECT_EQ(grad, std::vector<float>(params.size(), 0.0f));
  const std::vector<uint8_t> one_label = {0};
  EXPECT_TRUE(
      std::isnan(model->LossAndGradient(params, features, one_label, grad)));
  Eigen::MatrixXf wrong_rows = Eigen::MatrixXf::Ones(5, 2);
  const std::vector<uint8_t> labels = {0, 1};
  EXPECT_TRUE(
      std::isnan(model->LossAndGradient(params, wrong_rows, labels, grad)));
  Dataset data;
  data.features = wrong_rows;
  data.labels = labels;
  EXPECT_TRUE(std::isnan(model->Evaluate(params, data).loss));
}

TEST(ModelTest, MakeModelRejectsBadConfigs) {
  EXPECT_EQ(MakeModel(MlpConfig({16, 0}), 10, 3).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeModel(MlpConfig({}), 10, 3).status().code(),
            StatusCode::kInvalidArgument);
  pb::ModelConfig softmax_with_hidden = SoftmaxConfig();
  softmax_with_hidden.add_hidden(8);
  EXPECT_EQ(MakeModel(softmax_with_hidden, 10, 3).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeModel(MlpConfig({8}), 0, 3).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeModel(MlpConfig({8}), -5, 3).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeModel(MlpConfig({8}), 10, 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeModel(SoftmaxConfig(), 10, -1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeModel(SoftmaxConfig(), 10, 257).status().code(),
            StatusCode::kInvalidArgument);
  pb::ModelConfig unspecified;
  unspecified.set_kind(pb::MODEL_KIND_UNSPECIFIED);
  EXPECT_EQ(MakeModel(unspecified, 10, 3).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeModel(MlpConfig({1u << 30}), 1 << 20, 10).status().code(),
            StatusCode::kInvalidArgument);
  // The proto default kind is MLP.
  pb::ModelConfig defaults;
  defaults.add_hidden(4);
  EXPECT_OK(MakeModel(defaults, 10, 3));
}

}  // namespace
}  // namespace meridian
