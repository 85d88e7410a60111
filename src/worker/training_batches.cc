#include "worker/training_batches.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace meridian {

TrainingBatches::TrainingBatches(Dataset data, uint64_t batch_size,
                                 uint64_t seed)
    : data_(std::move(data)), rng_(seed) {
  order_.resize(data_.size());
  std::iota(order_.begin(), order_.end(), 0u);
  cursor_ = order_.size();  // shuffle before the first batch
  const int batch =
      static_cast<int>(std::min<uint64_t>(batch_size, data_.size()));
  features_.resize(data_.input_dim(), batch);
  labels_.resize(batch);
}

uint32_t TrainingBatches::Draw() {
  if (cursor_ >= order_.size()) {
    std::shuffle(order_.begin(), order_.end(), rng_);
    cursor_ = 0;
  }
  return order_[cursor_++];
}

void TrainingBatches::Next() {
  for (size_t j = 0; j < labels_.size(); ++j) {
    const uint32_t sample = planned_cursor_ < planned_.size()
                                ? planned_[planned_cursor_++]
                                : Draw();
    features_.col(static_cast<Eigen::Index>(j)) = data_.features.col(sample);
    labels_[j] = data_.labels[sample];
  }
}

Eigen::MatrixXf TrainingBatches::PlanAhead(uint64_t count) {
  planned_.erase(planned_.begin(),
                 planned_.begin() + static_cast<ptrdiff_t>(planned_cursor_));
  planned_cursor_ = 0;
  while (planned_.size() < count) planned_.push_back(Draw());
  Eigen::MatrixXf features(data_.input_dim(),
                           static_cast<Eigen::Index>(planned_.size()));
  for (size_t j = 0; j < planned_.size(); ++j) {
    features.col(static_cast<Eigen::Index>(j)) =
        data_.features.col(planned_[j]);
  }
  return features;
}

}  // namespace meridian
