#include "real_updates.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "meridian/train/local_training.h"
#include "meridian/train/model.h"
#include "meridian/sync/sync.h"

namespace meridian::bench {
namespace {

// `flat` (entries ascending over the whole model) cut into one slice per
// tensor, indices relative to the tensor.
RealUpdate SplitByTensor(const ModelLayout& layout,
                         std::span<const uint64_t> indices,
                         std::span<const float> values) {
  RealUpdate update;
  update.reserve(layout.tensors().size());
  size_t j = 0;
  for (const TensorInfo& tensor : layout.tensors()) {
    SparseUpdate& slice = update.emplace_back();
    slice.size = tensor.size;
    const uint64_t end = tensor.offset + tensor.size;
    for (; j < indices.size() && indices[j] < end; ++j) {
      slice.indices.push_back(
          static_cast<uint32_t>(indices[j] - tensor.offset));
      slice.values.push_back(values[j]);
    }
  }
  return update;
}

std::string DescribeModel(const pb::ModelConfig& model, uint64_t elements) {
  std::string text = pb::ModelKind_Name(model.kind());
  if (!model.preset().empty()) text += " " + model.preset();
  for (const uint32_t hidden : model.hidden()) {
    text += " " + std::to_string(hidden);
  }
  return text + " (" + std::to_string(elements) + " parameters)";
}

}  // namespace

double RealUpdates::Density(const std::vector<RealUpdate>& kind,
                            uint64_t elements) {
  if (kind.empty() || elements == 0) return 0;
  double entries = 0;
  for (const RealUpdate& update : kind) {
    for (const SparseUpdate& slice : update) entries += slice.values.size();
  }
  return entries / static_cast<double>(kind.size()) /
         static_cast<double>(elements);
}

Result<RealUpdates> RecordRealUpdates(const pb::JobConfig& job,
                                      const RealUpdateOptions& options) {
  if (options.updates == 0) {
    return InvalidArgumentError("updates must be at least 1");
  }
  RealUpdates out;
  out.steps_per_update =
      options.steps_per_update > 0
          ? options.steps_per_update
          : std::max<uint64_t>(1, job.policy().local_steps());
  // Step numbers start at 1: the first recorded update starts after a step.
  out.warmup_steps = std::max<uint64_t>(1, options.warmup_steps);
  out.theta = options.theta >= 0 ? options.theta : job.sync().threshold();
  out.threshold_mode = job.sync().threshold_mode();
  if (!std::isfinite(out.theta)) {
    return InvalidArgumentError("theta must be finite");
  }
  const uint64_t last_step =
      out.warmup_steps + options.updates * out.steps_per_update;

  std::vector<float> before;  // the parameters at the last update's start
  std::vector<float> delta;
  std::vector<float> accumulator;
  std::vector<uint64_t> indices;
  std::vector<float> values;
  auto record = [&](uint64_t step, const Model& model,
                    std::span<const float> params) {
    if (step < out.warmup_steps) return true;
    if (before.empty()) {  // the first recorded step: set up
      out.layout = model.layout();
      out.model = DescribeModel(job.model(), params.size());
      accumulator.assign(params.size(), 0.0f);
      delta.resize(params.size());
      before.assign(params.begin(), params.end());
      return step < last_step;
    }
    if ((step - out.warmup_steps) % out.steps_per_update != 0) return true;
    indices.clear();
    values.clear();
    for (size_t i = 0; i < params.size(); ++i) {
      delta[i] = params[i] - before[i];
      accumulator[i] += delta[i];
      if (delta[i] != 0.0f) {
        indices.push_back(i);
        values.push_back(delta[i]);
      }
    }
    out.commits.push_back(SplitByTensor(out.layout, indices, values));
    before.assign(params.begin(), params.end());
    indices.clear();
    values.clear();
    TakeSignificant(accumulator, params, out.theta, out.threshold_mode, 0,
                    &indices, &values);
    out.significant.push_back(SplitByTensor(out.layout, indices, values));
    return step < last_step;
  };
  const uint64_t batch = std::max<uint64_t>(1, job.optimizer().batch_size());
  Result<LocalTrainingResult> trained =
      TrainLocally(job, last_step * batch, 1, record);
  if (!trained.ok()) return trained.status();
  if (out.commits.size() < options.updates) {
    return InternalError("training stopped after " +
                         std::to_string(out.commits.size()) + " of " +
                         std::to_string(options.updates) + " updates");
  }
  return out;
}

}  // namespace meridian::bench
