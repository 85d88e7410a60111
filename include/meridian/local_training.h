// The single-process reference of a job: its model trained on all of its
// training data by one loop in this process, with the job's optimizer,
// batch size and seed, and no servers, network or sync. Distributed runs
// are judged against it (README "Workloads").
#ifndef MERIDIAN_LOCAL_TRAINING_H_
#define MERIDIAN_LOCAL_TRAINING_H_

#include <cstdint>

#include "meridian/job.pb.h"
#include "meridian/model.h"
#include "meridian/status.h"

namespace meridian {

struct LocalTrainingResult {
  uint64_t steps = 0;
  uint64_t samples = 0;     // training samples processed (steps x batch)
  double seconds = 0;       // wall time of the training loop
  EvalResult test;          // on the job's test set, after the last step
};

// Trains for `samples` training samples (rounded up to whole batches), or
// for the job's time_budget_s seconds when `samples` is 0, computing each
// step on `threads` threads (MakeJobModelOnThreads: the batch in slices,
// the gradient their sample-weighted mean; its errors). The initial
// model is the site servers' (Initialize(job.seed())); minibatches are
// drawn epoch by epoch from a shuffle seeded by job.seed(). Errors of the
// data and the model pass through; FailedPrecondition when training
// diverges (a non-finite loss), naming the step.
Result<LocalTrainingResult> TrainLocally(const pb::JobConfig& job,
                                         uint64_t samples, int threads = 1);

}  // namespace meridian

#endif  // MERIDIAN_LOCAL_TRAINING_H_
