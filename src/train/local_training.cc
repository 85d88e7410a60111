#include "meridian/train/local_training.h"

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "meridian/train/dataset.h"
#include "meridian/train/optimizer.h"

namespace meridian {

Result<LocalTrainingResult> TrainLocally(const pb::JobConfig& job,
                                         uint64_t samples, int threads,
                                         const LocalStepObserver& on_step) {
  MERIDIAN_ASSIGN_OR_RETURN(RawData raw, LoadRawData(job.data(), true, true));
  const Dataset train = MakeTrainDataset(raw, {}, job.data().normalization());
  const Dataset test = MakeTestDataset(raw, job.data().normalization());
  if (train.size() == 0) {
    return FailedPreconditionError("the job has no training samples");
  }
  MERIDIAN_ASSIGN_OR_RETURN(
      std::unique_ptr<Model> model,
      MakeJobModelOnThreads(job, raw.input_dim(), 10, threads));
  const uint64_t n = model->layout().num_elements();
  std::vector<float> params(n);
  std::vector<float> grad(n);
  model->Initialize(job.seed(), params);
  SgdOptimizer optimizer(job.optimizer(), n);

  const auto batch = static_cast<Eigen::Index>(
      std::min<uint64_t>(job.optimizer().batch_size(), train.size()));
  Eigen::MatrixXf features(train.input_dim(), batch);
  std::vector<uint8_t> labels(static_cast<size_t>(batch));
  std::vector<uint32_t> order(train.size());
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 rng(job.seed());
  size_t cursor = order.size();

  LocalTrainingResult result;
  using SteadyClock = std::chrono::steady_clock;
  const auto start = SteadyClock::now();
  const auto deadline =
      start + std::chrono::duration_cast<SteadyClock::duration>(
                  std::chrono::duration<double>(job.time_budget_s()));
  while (samples > 0 ? result.samples < samples
                     : SteadyClock::now() < deadline) {
    for (Eigen::Index j = 0; j < batch; ++j) {
      if (cursor == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      const uint32_t sample = order[cursor++];
      features.col(j) = train.features.col(sample);
      labels[static_cast<size_t>(j)] = train.labels[sample];
    }
    const float loss = model->LossAndGradient(params, features, labels, grad);
    if (!std::isfinite(loss)) {
      return FailedPreconditionError("training diverged: the loss of step " +
                                     std::to_string(result.steps + 1) +
                                     " is not finite");
    }
    if (const std::vector<ElementRange>* rows = model->SparseRows()) {
      optimizer.Step(params, grad, *rows);
    } else {
      optimizer.Step(params, grad);
    }
    model->ApplyStateUpdate(params);
    ++result.steps;
    result.samples += static_cast<uint64_t>(batch);
    if (on_step && !on_step(result.steps, *model, params)) break;
  }
  result.seconds =
      std::chrono::duration<double>(SteadyClock::now() - start).count();
  result.test = model->Evaluate(params, test);
  return result;
}

}  // namespace meridian
