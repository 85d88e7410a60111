// Worker-side minibatch SGD with momentum, weight decay and learning-rate
// schedules.
#ifndef MERIDIAN_TRAIN_OPTIMIZER_H_
#define MERIDIAN_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/train/model.h"

namespace meridian {

// Learning rate as a function of the local step count (0-based):
// CONSTANT lr; STEP lr * gamma^floor(step / step_size);
// INVERSE_SQRT lr / sqrt(1 + step / step_size) (real division).
// LR_SCHEDULE_KIND_UNSPECIFIED is CONSTANT; a step_size of 0 counts as 1.
double LearningRateAt(const pb::OptimizerConfig& config, uint64_t step);

// Heavy-ball SGD: g' = g + weight_decay * p; v = momentum * v + g';
// p -= lr(step) * v. Owns the velocity; thread-compatible.
class SgdOptimizer {
 public:
  SgdOptimizer(const pb::OptimizerConfig& config, uint64_t num_params);

  // One step on `params` with gradient `grad` (both num_params long; with
  // any other size nothing happens and steps() does not advance).
  void Step(std::span<float> params, std::span<const float> grad);
  // The same step on the elements of `ranges` alone (a sparse gradient,
  // Model::SparseRows): the velocity of other elements is neither decayed
  // nor applied ("lazy" momentum, as sparse embeddings train). Ranges
  // outside num_params refuse the step like a size mismatch.
  void Step(std::span<float> params, std::span<const float> grad,
            const std::vector<ElementRange>& ranges);

  uint64_t steps() const { return steps_; }
  double current_learning_rate() const;

 private:
  pb::OptimizerConfig config_;
  std::vector<float> velocity_;
  uint64_t steps_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_TRAIN_OPTIMIZER_H_
