#include "site/site_state.h"

namespace meridian {

void TrainingPhase::Start() {
  start_s_ = clock_->NowSeconds();
  training_ = true;
}

bool TrainingPhase::Finish(const std::string& reason) {
  if (finished_) return false;
  finished_ = true;
  stop_reason_ = reason;
  training_s_ = training_ ? Elapsed() : 0;
  return true;
}

double TrainingPhase::Elapsed() const {
  return clock_->NowSeconds() - start_s_ + trained_before_s_;
}

double TrainingPhase::EvalTime() const {
  const double frozen = training_s_.load();
  return frozen > 0 ? frozen : Elapsed();
}

double TrainingPhase::ReportedSeconds() const {
  if (!training_) return 0;
  return finished_ ? training_s_.load() : Elapsed();
}

double TrainingPhase::CheckpointSeconds() const {
  return training_ ? ReportedSeconds() : trained_before_s_;
}

void TrainingPhase::ResumeFinished(const std::string& reason,
                                   double training_s) {
  finished_ = true;
  stop_reason_ = reason;
  training_s_ = training_s;
}

}  // namespace meridian
