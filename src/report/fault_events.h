// The fault events one process keeps for its report (report.json's
// `events`): what happened (kind), at which site, to whom, when, for how
// long. Every event is also logged where it is detected; this keeps the
// first kMaxFaultEvents of them, so that a worker dying and coming back
// every few seconds for days, or a link flapping, cannot grow a summary or
// a checkpoint without bound (the first refusal is logged once).
//
// Ownership and threads: owned by one component (a site server, a sync
// engine) and used by its event-loop thread alone; not thread-safe.
// Time: `unix_s` from the injected wall clock; durations in seconds.
#ifndef MERIDIAN_REPORT_FAULT_EVENTS_H_
#define MERIDIAN_REPORT_FAULT_EVENTS_H_

#include <string>
#include <string_view>

#include "google/protobuf/repeated_ptr_field.h"
#include "meridian/core/clock.h"
#include "meridian/report.pb.h"

namespace meridian {

inline constexpr int kMaxFaultEvents = 1000;

// Appends `event` to `events` unless they hold kMaxFaultEvents already;
// the first refusal is logged (naming `whose` events) and sets *capped.
// Returns its index, or -1 when it was not kept.
int AppendFaultEvent(pb::FaultEvent event,
                     google::protobuf::RepeatedPtrField<pb::FaultEvent>* events,
                     bool* capped, std::string_view whose);

class FaultEventLog {
 public:
  // `site`: stamped on every event ("" for the launcher). `wall_clock` (not
  // owned) must outlive the log.
  FaultEventLog(std::string site, const WallClock* wall_clock)
      : site_(std::move(site)), wall_clock_(wall_clock) {}

  // Appends an event detected now; `duration_s` 0 when it is not resolved
  // yet. Returns its index (for Resolve), or -1 when the log is full.
  int Record(pb::FaultKind kind, const std::string& subject,
             const std::string& detail, double duration_s = 0);
  // The event `index` (Record's; -1 or an index no longer held is ignored)
  // is resolved: it lasted `duration_s`.
  void Resolve(int index, double duration_s);

  // Replaces the events with `events` (a checkpoint's), up to the bound.
  void Restore(
      const google::protobuf::RepeatedPtrField<pb::FaultEvent>& events);
  // Appends every event to `out` (up to kMaxFaultEvents in `out`).
  void CopyTo(google::protobuf::RepeatedPtrField<pb::FaultEvent>* out) const;

  const google::protobuf::RepeatedPtrField<pb::FaultEvent>& events() const {
    return events_;
  }

 private:
  const std::string site_;
  const WallClock* const wall_clock_;
  google::protobuf::RepeatedPtrField<pb::FaultEvent> events_;
  bool capped_ = false;  // the refusal was logged
};

}  // namespace meridian

#endif  // MERIDIAN_REPORT_FAULT_EVENTS_H_
