// The single-process reference of a job: its model trained on all of its
// training data by one loop in this process, with the job's optimizer,
// batch size and seed, and no servers, network or sync. Distributed runs
// are judged against it (docs/guide.md, "Workloads").
#ifndef MERIDIAN_TRAIN_LOCAL_TRAINING_H_
#define MERIDIAN_TRAIN_LOCAL_TRAINING_H_

#include <cstdint>
#include <functional>
#include <span>

#include "meridian/job.pb.h"
#include "meridian/train/model.h"
#include "meridian/core/status.h"

namespace meridian {

struct LocalTrainingResult {
  uint64_t steps = 0;
  uint64_t samples = 0;  // training samples processed (steps x batch)
  double seconds = 0;    // wall time of the training loop
  EvalResult test;       // on the job's test set, after the last step
};

// Called after every optimizer step with the step's number (from 1), the
// model and the parameters after the step; training stops after a step
// whose call returns false. Runs on TrainLocally's thread; `params` is valid
// only during the call.
using LocalStepObserver = std::function<bool(uint64_t step, const Model& model,
                                             std::span<const float> params)>;

// Trains for `samples` training samples (rounded up to whole batches), or
// for the job's time_budget_s seconds when `samples` is 0, computing each
// step on `threads` threads (MakeJobModelOnThreads: the batch in slices,
// the gradient their sample-weighted mean; its errors). The initial
// model is the site servers' (Initialize(job.seed())); minibatches are
// drawn epoch by epoch from a shuffle seeded by job.seed(). Errors of the
// data and the model pass through; FailedPrecondition when training
// diverges (a non-finite loss), naming the step. `on_step`, when set, sees
// every step (e.g. compression_bench --job records the model's changes).
Result<LocalTrainingResult> TrainLocally(const pb::JobConfig& job,
                                         uint64_t samples, int threads = 1,
                                         const LocalStepObserver& on_step = {});

}  // namespace meridian

#endif  // MERIDIAN_TRAIN_LOCAL_TRAINING_H_
