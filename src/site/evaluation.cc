#include "site/evaluation.h"

#include "meridian/core/log.h"

namespace meridian {

void AddMetric(pb::EvalPoint* point, std::string_view name, double value) {
  pb::MetricValue* metric = point->add_metrics();
  metric->set_name(std::string(name));
  metric->set_value(value);
}

EvalTimeline::EvalTimeline(MetricSpec metric, double target, Sources sources)
    : metric_(std::move(metric)), target_(target), sources_(std::move(sources)) {}

pb::EvalPoint EvalTimeline::NewPoint(uint64_t version, uint64_t commits) const {
  pb::EvalPoint point;
  point.set_t_s(sources_.training_s ? sources_.training_s() : 0);
  point.set_model_version(static_cast<uint32_t>(version));
  point.set_commits(static_cast<uint32_t>(commits));
  if (sources_.theta) point.set_theta(sources_.theta());
  if (sources_.skew_knob) {
    if (std::optional<double> knob = sources_.skew_knob()) {
      point.set_skew_knob(*knob);
    }
  }
  return point;
}

void EvalTimeline::Record(const pb::EvalPoint& point) {
  bool reached_now = false;
  {
    MutexLock lock(&mu_);
    points_.push_back(point);
    if (target_ > 0 && metric_.Reached(point.metric(), target_) &&
        time_to_target_s_ < 0) {
      time_to_target_s_ = point.t_s();
      reached_now = true;
    }
  }
  if (reached_now) {
    target_reached_.store(true);
    MLOG(INFO) << "target " << metric_.name << " " << target_ << " reached at "
               << point.t_s() << " s (" << metric_.name << " "
               << point.metric() << ")";
  }
}

std::vector<pb::EvalPoint> EvalTimeline::Points() const {
  MutexLock lock(&mu_);
  return points_;
}

std::optional<pb::EvalPoint> EvalTimeline::Last() const {
  MutexLock lock(&mu_);
  if (points_.empty()) return std::nullopt;
  return points_.back();
}

double EvalTimeline::time_to_target_s() const {
  MutexLock lock(&mu_);
  return time_to_target_s_;
}

void EvalTimeline::Restore(std::vector<pb::EvalPoint> points,
                           double time_to_target_s) {
  MutexLock lock(&mu_);
  points_ = std::move(points);
  time_to_target_s_ = time_to_target_s;
  target_reached_.store(time_to_target_s >= 0);
}

}  // namespace meridian
