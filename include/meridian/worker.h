// A worker: trains on its share of its site's data and commits its
// accumulated change to the site server as the server's plan says.
#ifndef MERIDIAN_WORKER_H_
#define MERIDIAN_WORKER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "meridian/job.pb.h"
#include "meridian/wire.pb.h"
#include "meridian/status.h"

namespace meridian {

struct WorkerOptions {
  pb::JobConfig job;   // validated
  std::string site;    // name of the worker's site
  uint32_t index = 0;  // worker index inside the site
  // Site server endpoint; empty: the site's address from the job.
  std::string connect;
  // "HOST:PORT" of the worker's own metrics endpoint; empty or "none": no
  // endpoint (the default: the site server exports every worker's counts).
  std::string metrics_address;
  // When it becomes true the worker leaves (BYE) after its current step.
  // May be null. Not owned.
  const std::atomic<bool>* stop_requested = nullptr;
};

class Worker {
 public:
  // Loads the worker's share of the training data and builds its model.
  static Result<std::unique_ptr<Worker>> Create(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Joins the site, trains and commits until the server says stop (then
  // says BYE) or stop_requested is set. Errors: the server cannot be
  // reached, refuses the worker, or stops answering.
  Status Run();

  const pb::WorkerStats& stats() const;

 private:
  class Impl;
  explicit Worker(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace meridian

#endif  // MERIDIAN_WORKER_H_
