#include "site/commit_recovery.h"

#include <algorithm>

namespace meridian {

CommitRecovery::Range& CommitRecovery::RangeOf(uint32_t slot,
                                               uint64_t incarnation) {
  for (Range& range : ranges_) {
    if (range.slot == slot && range.incarnation == incarnation) return range;
  }
  ranges_.push_back(Range{slot, incarnation, 0, 0});
  return ranges_.back();
}

void CommitRecovery::Restore(
    std::span<const CommitRecord> records,
    const google::protobuf::RepeatedPtrField<pb::WorkerSlotCheckpoint>& saved,
    std::span<const pb::AppliedCommit> applied) {
  ranges_.clear();
  // What an earlier restart left unsettled: still so, unless the
  // checkpoint now holds more of it (the process replayed, and a checkpoint
  // was taken after).
  for (int slot = 0; slot < saved.size(); ++slot) {
    for (const pb::UnreplayedCommits& kept : saved[slot].unreplayed()) {
      Range& range = RangeOf(static_cast<uint32_t>(slot), kept.incarnation());
      range.durable_id = kept.durable_id();
      range.last_applied_id = kept.last_applied_id();
    }
  }
  for (uint32_t slot = 0; slot < records.size(); ++slot) {
    const CommitRecord& record = records[slot];
    if (record.incarnation == 0) continue;  // no process to come back
    Range& range = RangeOf(slot, record.incarnation);
    range.durable_id = std::max(range.durable_id, record.last_commit_id);
    range.last_applied_id = std::max(range.last_applied_id, range.durable_id);
  }
  for (const pb::AppliedCommit& commit : applied) {
    Range& range = RangeOf(commit.slot(), commit.incarnation());
    range.last_applied_id = std::max(range.last_applied_id, commit.commit_id());
  }
  // A process none of whose commits the checkpoint lacks, and that is not
  // the slot's (whose first commit still shows what a lost reply hid), is
  // settled: nothing lost.
  std::erase_if(ranges_, [&](const Range& range) {
    const bool restored = range.slot < records.size() &&
                          records[range.slot].incarnation == range.incarnation;
    return !restored && range.last_applied_id <= range.durable_id;
  });
}

uint64_t CommitRecovery::OnFirstCommit(uint32_t slot, uint64_t incarnation,
                                       uint64_t first_id) {
  uint64_t lost = 0;
  std::erase_if(ranges_, [&](const Range& range) {
    if (range.slot != slot) return false;
    if (range.incarnation != incarnation) {
      lost += range.last_applied_id - range.durable_id;
    } else if (first_id > range.durable_id + 1) {
      // Ids 1, 2, 3 ... per process: those between were answered and lost
      // (the log may not know all of them: a power loss, an older server).
      lost += first_id - range.durable_id - 1;
    }
    return true;
  });
  return lost;
}

uint64_t CommitRecovery::Unsettled() const {
  uint64_t total = 0;
  for (const Range& range : ranges_) {
    total += range.last_applied_id - range.durable_id;
  }
  return total;
}

void CommitRecovery::SaveTo(uint32_t slot,
                            pb::WorkerSlotCheckpoint* out) const {
  for (const Range& range : ranges_) {
    if (range.slot != slot || range.last_applied_id <= range.durable_id) {
      continue;
    }
    pb::UnreplayedCommits* kept = out->add_unreplayed();
    kept->set_incarnation(range.incarnation);
    kept->set_durable_id(range.durable_id);
    kept->set_last_applied_id(range.last_applied_id);
  }
}

}  // namespace meridian
