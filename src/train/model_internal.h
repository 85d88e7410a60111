// What the model implementations (mlp.cc, cnn.cc) share: initialisation
// draws, the softmax cross-entropy head, chunked evaluation, and their
// factories (MakeModel in model.cc dispatches to them).
#ifndef MERIDIAN_TRAIN_MODEL_INTERNAL_H_
#define MERIDIAN_TRAIN_MODEL_INTERNAL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "meridian/train/dataset.h"
#include "meridian/train/model.h"

namespace meridian::model_internal {

// Largest model (parameters and state) MakeModel accepts.
constexpr uint64_t kMaxParams = uint64_t{1} << 30;

// Uniform float in [-limit, limit) from 24 random bits: the same values on
// every platform for a given seed (std::uniform_real_distribution is not).
inline float UniformSymmetric(std::mt19937_64& rng, float limit) {
  const float unit = static_cast<float>(rng() >> 40) * 0x1.0p-24f;  // [0,1)
  return (2.0f * unit - 1.0f) * limit;
}

// Initialize's precondition: `params` holds the model's `size` parameters.
// When it does not, fills it with NaN (the misuse is loud rather than
// silent) and returns false.
inline bool SizedForInitialize(std::span<float> params, uint64_t size) {
  if (params.size() == size) return true;
  std::fill(params.begin(), params.end(),
            std::numeric_limits<float>::quiet_NaN());
  return false;
}

// A batch of logits in memory: logit c of sample j is
// data[c * class_stride + j * sample_stride].
struct LogitsView {
  const float* data = nullptr;
  int64_t class_stride = 1;
  int64_t sample_stride = 1;
};

// Softmax cross-entropy of `labels.size()` samples (labels < classes, not
// checked here). Returns the summed loss (nats); writes dLoss/dlogits of the
// *mean* loss, (softmax - onehot) / n, into `delta` laid out like `logits`.
double SoftmaxCrossEntropy(const LogitsView& logits, int classes,
                           std::span<const uint8_t> labels, float* delta);

// Loss and accuracy over the first `max_samples` samples of `data` (all when
// 0), `chunk` samples per call of `forward(start, n)`, which returns the
// logits of samples [start, start + n). Per-sample correctness goes to
// `correct` when not null. loss is NaN (and nothing is evaluated) when the
// model does not `fit` the parameters and data, or a label is >= classes.
template <typename Forward>
EvalResult EvaluateClassifier(bool fits, const Dataset& data, int classes,
                              uint64_t max_samples, int64_t chunk,
                              std::vector<uint8_t>* correct,
                              Forward&& forward) {
  if (correct != nullptr) correct->clear();
  EvalResult result;
  if (!fits) {
    result.loss = std::numeric_limits<double>::quiet_NaN();
    return result;
  }
  uint64_t total = std::min<uint64_t>(
      data.labels.size(), static_cast<uint64_t>(data.features.cols()));
  if (max_samples > 0) total = std::min(total, max_samples);
  if (total == 0) return result;
  if (correct != nullptr) correct->reserve(total);
  double loss = 0;
  uint64_t right = 0;
  for (uint64_t start = 0; start < total;
       start += static_cast<uint64_t>(chunk)) {
    const int64_t n = static_cast<int64_t>(
        std::min<uint64_t>(static_cast<uint64_t>(chunk), total - start));
    const LogitsView logits = forward(static_cast<int64_t>(start), n);
    for (int64_t j = 0; j < n; ++j) {
      const float* z = logits.data + j * logits.sample_stride;
      const int label = data.labels[start + static_cast<uint64_t>(j)];
      if (label >= classes) {
        if (correct != nullptr) correct->clear();
        result.loss = std::numeric_limits<double>::quiet_NaN();
        return result;
      }
      int predicted = 0;
      float max_logit = z[0];
      for (int c = 1; c < classes; ++c) {
        if (z[c * logits.class_stride] > max_logit) {
          max_logit = z[c * logits.class_stride];
          predicted = c;
        }
      }
      double sum = 0;
      for (int c = 0; c < classes; ++c) {
        sum += std::exp(
            static_cast<double>(z[c * logits.class_stride] - max_logit));
      }
      loss += std::log(sum) + max_logit - z[label * logits.class_stride];
      if (predicted == label) ++right;
      if (correct != nullptr) correct->push_back(predicted == label);
    }
  }
  result.samples = total;
  result.loss = loss / static_cast<double>(total);
  result.accuracy = static_cast<double>(right) / static_cast<double>(total);
  result.metric = result.accuracy;
  return result;
}

// The factories behind MakeModel; input_dim and num_classes are already
// checked (input_dim > 0, num_classes in [1, 256]).
Result<std::unique_ptr<Model>> MakeMlp(const pb::ModelConfig& config,
                                       int input_dim, int num_classes);
Result<std::unique_ptr<Model>> MakeCnn(const pb::ModelConfig& config,
                                       int input_dim, int num_classes);

}  // namespace meridian::model_internal

#endif  // MERIDIAN_TRAIN_MODEL_INTERNAL_H_
