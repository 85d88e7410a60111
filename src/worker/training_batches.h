// The worker's share of the training data and the order it trains on it:
// minibatches drawn from an epoch permutation, reshuffled every epoch; for
// a sparse model, the samples of the next batches are drawn ahead at a
// commit (PlanAhead), so that the worker can ask its server for the rows
// they read, and trained first.
//
// Ownership and threads: owned by Worker::Impl and used by the worker's
// thread alone. Size: the data, a permutation of it, one batch, and at
// most the samples planned ahead (the caller bounds them).
#ifndef MERIDIAN_WORKER_TRAINING_BATCHES_H_
#define MERIDIAN_WORKER_TRAINING_BATCHES_H_

#include <Eigen/Core>
#include <cstdint>
#include <random>
#include <vector>

#include "meridian/train/dataset.h"

namespace meridian {

class TrainingBatches {
 public:
  // Batches of `batch_size` samples (at most the data's), in an order
  // seeded by `seed`.
  TrainingBatches(Dataset data, uint64_t batch_size, uint64_t seed);
  TrainingBatches(const TrainingBatches&) = delete;
  TrainingBatches& operator=(const TrainingBatches&) = delete;

  uint64_t samples() const { return data_.size(); }
  uint64_t batch_size() const { return labels_.size(); }

  // Fills features() and labels() with the next batch: planned samples
  // first, then the epoch's order.
  void Next();
  const Eigen::MatrixXf& features() const { return features_; }
  const std::vector<uint8_t>& labels() const { return labels_; }

  // Plans the next `count` samples (those planned before and not trained
  // yet stay first) and returns their features, one column per sample.
  Eigen::MatrixXf PlanAhead(uint64_t count);

 private:
  // The next sample of the epoch's shuffled order.
  uint32_t Draw();

  Dataset data_;
  std::mt19937_64 rng_;
  std::vector<uint32_t> order_;  // epoch permutation of local samples
  size_t cursor_ = 0;
  // The samples planned ahead, trained from planned_cursor_ on.
  std::vector<uint32_t> planned_;
  size_t planned_cursor_ = 0;
  Eigen::MatrixXf features_;  // the current batch
  std::vector<uint8_t> labels_;
};

}  // namespace meridian

#endif  // MERIDIAN_WORKER_TRAINING_BATCHES_H_
