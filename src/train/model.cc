// MakeModel and what the model implementations share.

#include "meridian/train/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "train/kernels.h"
#include "train/model_internal.h"

namespace meridian {

namespace model_internal {

double SoftmaxCrossEntropy(const LogitsView& logits, int classes,
                           std::span<const uint8_t> labels, float* delta) {
  const int64_t n = static_cast<int64_t>(labels.size());
  const float inv_n = 1.0f / static_cast<float>(std::max<int64_t>(n, 1));
  double loss = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float* z = logits.data + j * logits.sample_stride;
    float* d = delta + j * logits.sample_stride;
    const int64_t cs = logits.class_stride;
    // Stable: subtract the sample's largest logit before exponentiating.
    float max_logit = z[0];
    for (int c = 1; c < classes; ++c)
      max_logit = std::max(max_logit, z[c * cs]);
    float sum = 0;
    for (int c = 0; c < classes; ++c) {
      d[c * cs] = std::exp(z[c * cs] - max_logit);
      sum += d[c * cs];
    }
    const int label = labels[static_cast<size_t>(j)];
    loss += std::log(static_cast<double>(sum)) + max_logit - z[label * cs];
    const float scale = inv_n / sum;
    for (int c = 0; c < classes; ++c) d[c * cs] *= scale;
    d[label * cs] -= inv_n;
  }
  return loss;
}

}  // namespace model_internal

const char* ModelKernels() { return kernels::IsaName(kernels::WantedIsa()); }

Result<std::unique_ptr<Model>> MakeModel(const pb::ModelConfig& config,
                                         int input_dim, int num_classes) {
  if (input_dim <= 0) {
    return InvalidArgumentError("model input dimension must be positive, got " +
                                std::to_string(input_dim));
  }
  if (num_classes <= 0 || num_classes > 256) {
    // Labels are bytes.
    return InvalidArgumentError("model needs between 1 and 256 classes, got " +
                                std::to_string(num_classes));
  }
  if (config.kind() != pb::CNN &&
      (config.layers_size() > 0 || config.has_preset() ||
       config.has_input_channels())) {
    return InvalidArgumentError(
        "model.layers, model.preset and model.input_channels are for kind "
        "CNN, not " +
        pb::ModelKind_Name(config.kind()));
  }
  switch (config.kind()) {
    case pb::SOFTMAX:
    case pb::MLP:
      return model_internal::MakeMlp(config, input_dim, num_classes);
    case pb::CNN:
      return model_internal::MakeCnn(config, input_dim, num_classes);
    case pb::MATRIX_FACTORIZATION:
      return InvalidArgumentError(
          "model.kind MATRIX_FACTORIZATION is built over the job's rating "
          "matrix (data.ratings), not over " +
          std::to_string(input_dim) + " input features");
    default:
      return InvalidArgumentError(
          "model.kind must be SOFTMAX, MLP, CNN or MATRIX_FACTORIZATION, "
          "got " +
          pb::ModelKind_Name(config.kind()));
  }
}

MetricSpec ModelMetric(const pb::ModelConfig& config) {
  if (config.kind() == pb::MATRIX_FACTORIZATION) return {"rmse", false};
  if (config.kind() == pb::EXTERNAL && config.metrics_size() > 0) {
    return {config.metrics(0).name(), config.metrics(0).higher_is_better()};
  }
  return MetricSpec{};
}

Result<std::unique_ptr<Model>> MakeJobModel(const pb::JobConfig& job,
                                            int input_dim, int num_classes) {
  if (job.model().kind() == pb::MATRIX_FACTORIZATION) {
    if (!job.data().has_ratings()) {
      return InvalidArgumentError(
          "model.kind MATRIX_FACTORIZATION needs a rating matrix "
          "(data.ratings)");
    }
    return MakeMatrixFactorization(job.model(), job.data().ratings().users(),
                                   job.data().ratings().items());
  }
  return MakeModel(job.model(), input_dim, num_classes);
}

}  // namespace meridian
