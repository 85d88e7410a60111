#include "meridian/train/optimizer.h"

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <span>

namespace meridian {

double LearningRateAt(const pb::OptimizerConfig& config, uint64_t step) {
  const double lr = config.learning_rate();
  // Validation rejects step_size 0; treat it as 1 rather than divide by 0.
  const uint64_t step_size = config.step_size() == 0 ? 1 : config.step_size();
  switch (config.schedule()) {
    case pb::STEP:
      return lr *
             std::pow(config.gamma(), static_cast<double>(step / step_size));
    case pb::INVERSE_SQRT:
      return lr / std::sqrt(1.0 + static_cast<double>(step) /
                                      static_cast<double>(step_size));
    case pb::CONSTANT:
    default:  // LR_SCHEDULE_KIND_UNSPECIFIED: the documented default
      return lr;
  }
}

SgdOptimizer::SgdOptimizer(const pb::OptimizerConfig& config,
                           uint64_t num_params)
    : config_(config), velocity_(num_params, 0.0f) {}

double SgdOptimizer::current_learning_rate() const {
  return LearningRateAt(config_, steps_);
}

void SgdOptimizer::Step(std::span<float> params, std::span<const float> grad) {
  // Precondition: both spans are num_params long. A mismatch would write out
  // of bounds, so it is refused (no step is taken).
  if (params.size() != velocity_.size() || grad.size() != velocity_.size()) {
    return;
  }
  const Eigen::Index n = static_cast<Eigen::Index>(velocity_.size());
  Eigen::Map<Eigen::VectorXf> p(params.data(), n);
  Eigen::Map<const Eigen::VectorXf> g(grad.data(), n);
  Eigen::Map<Eigen::VectorXf> v(velocity_.data(), n);
  const float lr = static_cast<float>(LearningRateAt(config_, steps_));
  const float momentum = static_cast<float>(config_.momentum());
  const float weight_decay = static_cast<float>(config_.weight_decay());
  if (weight_decay != 0.0f) {
    v = momentum * v + g + weight_decay * p;
  } else {
    v = momentum * v + g;
  }
  p -= lr * v;
  ++steps_;
}

void SgdOptimizer::Step(std::span<float> params, std::span<const float> grad,
                        const std::vector<ElementRange>& ranges) {
  const uint64_t n = velocity_.size();
  if (params.size() != n || grad.size() != n) return;
  for (const ElementRange& range : ranges) {
    if (range.begin > range.end || range.end > n) return;
  }
  const float lr = static_cast<float>(LearningRateAt(config_, steps_));
  const float momentum = static_cast<float>(config_.momentum());
  const float weight_decay = static_cast<float>(config_.weight_decay());
  for (const ElementRange& range : ranges) {
    for (uint64_t i = range.begin; i < range.end; ++i) {
      const float v =
          momentum * velocity_[i] + grad[i] + weight_decay * params[i];
      velocity_[i] = v;
      params[i] -= lr * v;
    }
  }
  ++steps_;
}

}  // namespace meridian
