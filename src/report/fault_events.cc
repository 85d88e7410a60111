#include "report/fault_events.h"

#include "meridian/core/log.h"

namespace meridian {

int FaultEventLog::Record(pb::FaultKind kind, const std::string& subject,
                          const std::string& detail, double duration_s) {
  if (events_.size() >= kMaxFaultEvents) {
    if (!capped_) {
      capped_ = true;
      MLOG(WARNING) << "more than " << kMaxFaultEvents
                    << " fault events: later ones are logged only";
    }
    return -1;
  }
  pb::FaultEvent* event = events_.Add();
  event->set_kind(kind);
  event->set_site(site_);
  event->set_subject(subject);
  event->set_unix_s(wall_clock_->UnixSeconds());
  event->set_duration_s(duration_s);
  event->set_detail(detail);
  return events_.size() - 1;
}

void FaultEventLog::Resolve(int index, double duration_s) {
  if (index >= 0 && index < events_.size()) {
    events_.Mutable(index)->set_duration_s(duration_s);
  }
}

void FaultEventLog::Restore(
    const google::protobuf::RepeatedPtrField<pb::FaultEvent>& events) {
  events_.Clear();
  for (const pb::FaultEvent& event : events) {
    if (events_.size() >= kMaxFaultEvents) break;
    *events_.Add() = event;
  }
}

void FaultEventLog::CopyTo(
    google::protobuf::RepeatedPtrField<pb::FaultEvent>* out) const {
  for (const pb::FaultEvent& event : events_) {
    if (out->size() >= kMaxFaultEvents) break;
    *out->Add() = event;
  }
}

}  // namespace meridian
