#include "report/fault_events.h"

#include <utility>

#include "meridian/core/log.h"

namespace meridian {

int AppendFaultEvent(pb::FaultEvent event,
                     google::protobuf::RepeatedPtrField<pb::FaultEvent>* events,
                     bool* capped, std::string_view whose) {
  if (events->size() >= kMaxFaultEvents) {
    if (!*capped) {
      *capped = true;
      MLOG(WARNING) << "more than " << kMaxFaultEvents << " " << whose
                    << ": later ones are logged only";
    }
    return -1;
  }
  *events->Add() = std::move(event);
  return events->size() - 1;
}

int FaultEventLog::Record(pb::FaultKind kind, const std::string& subject,
                          const std::string& detail, double duration_s) {
  pb::FaultEvent event;
  event.set_kind(kind);
  event.set_site(site_);
  event.set_subject(subject);
  event.set_unix_s(wall_clock_->UnixSeconds());
  event.set_duration_s(duration_s);
  event.set_detail(detail);
  return AppendFaultEvent(std::move(event), &events_, &capped_, "fault events");
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
