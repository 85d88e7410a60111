// Real updates for compression_bench --job: a job's model trained in this
// process (TrainLocally: the job's data, optimizer, batch and seed), its
// changes recorded as the two kinds of update Meridian sends.
//
//   commit       the change of the model over `steps_per_update` steps: what
//                a worker commits to its site (and, summed over a site's
//                workers, what DENSE sync and DiLoCo send)
//   significant  what Gaia's significance filter (the job's sync.threshold
//                and threshold_mode, TakeSignificant) takes out of an
//                accumulator into which every commit is added: what a site
//                sends its peers when one commit is one clock
//
// Both are split by the model's tensors, as the site server and the sync
// engine encode them (one slice per tensor).
#ifndef MERIDIAN_BENCH_COMPRESSION_REAL_UPDATES_H_
#define MERIDIAN_BENCH_COMPRESSION_REAL_UPDATES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "meridian/compression/compression.h"
#include "meridian/job.pb.h"
#include "meridian/core/layout.h"
#include "meridian/core/status.h"

namespace meridian::bench {

struct RealUpdateOptions {
  uint64_t warmup_steps = 200;  // trained before the first recorded update
  uint64_t updates = 16;        // recorded updates of each kind
  // Steps per update; 0: the job's policy.local_steps.
  uint64_t steps_per_update = 0;
  // The significance filter's threshold; negative: the job's
  // sync.threshold.
  double theta = -1;
};

// One update: a slice per tensor of the layout (SparseUpdate::size = the
// tensor's elements). A commit's slices hold every element that changed;
// a tensor with no entry has an empty slice.
using RealUpdate = std::vector<SparseUpdate>;

struct RealUpdates {
  std::string model;  // the job's model, described
  ModelLayout layout;
  uint64_t steps_per_update = 0;
  uint64_t warmup_steps = 0;
  double theta = 0;  // the filter's threshold
  pb::ThresholdMode threshold_mode = pb::RELATIVE;
  std::vector<RealUpdate> commits;
  std::vector<RealUpdate> significant;

  // Mean entries per update of `kind`, over the model's elements.
  static double Density(const std::vector<RealUpdate>& kind, uint64_t elements);
};

// Trains `job` and records its updates. Errors of the job's data and model
// pass through; InvalidArgument names a bad option; FailedPrecondition
// when training diverges.
Result<RealUpdates> RecordRealUpdates(const pb::JobConfig& job,
                                      const RealUpdateOptions& options);

}  // namespace meridian::bench

#endif  // MERIDIAN_BENCH_COMPRESSION_REAL_UPDATES_H_
