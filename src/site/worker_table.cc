#include "site/worker_table.h"

#include <algorithm>
#include <utility>

#include "meridian/core/format.h"

namespace meridian {
namespace {

// The smallest gap between two looks that counts as a stall of the event
// loop itself (it polls every few tens of milliseconds).
constexpr double kMinStallS = 0.1;

void AddStats(const pb::WorkerStats& from, pb::WorkerStats* to) {
  to->set_steps(to->steps() + from.steps());
  to->set_commits(to->commits() + from.commits());
  to->set_compute_s(to->compute_s() + from.compute_s());
  to->set_device_wait_s(to->device_wait_s() + from.device_wait_s());
  to->set_blocked_s(to->blocked_s() + from.blocked_s());
  to->set_commit_bytes(to->commit_bytes() + from.commit_bytes());
}

}  // namespace

WorkerTable::WorkerTable(std::vector<WorkerSlot> slots, std::string server,
                         double worker_timeout_s)
    : slots_(std::move(slots)),
      server_(std::move(server)),
      worker_timeout_s_(worker_timeout_s) {}

std::optional<uint32_t> WorkerTable::Find(const std::string& site,
                                          uint32_t index) const {
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].site == site && slots_[i].index == index) return i;
  }
  return std::nullopt;
}

bool WorkerTable::IsWorkerConnection(const std::string& routing_id) const {
  for (const WorkerSlot& slot : slots_) {
    if ((slot.state == SlotState::kLive || slot.state == SlotState::kDead) &&
        slot.routing_id == routing_id) {
      return true;
    }
  }
  return false;
}

std::string WorkerTable::Describe() const {
  std::string out;
  for (const WorkerSlot& slot : slots_) {
    out += (out.empty() ? "" : ", ") + slot.Name();
  }
  return out;
}

std::string WorkerTable::DescribeNotLive() const {
  std::string out;
  for (const WorkerSlot& slot : slots_) {
    if (slot.state == SlotState::kLive) continue;
    out += (out.empty() ? "" : ", ") + slot.Name();
  }
  return out;
}

uint32_t WorkerTable::Count(SlotState state) const {
  return static_cast<uint32_t>(
      std::count_if(slots_.begin(), slots_.end(),
                    [state](const WorkerSlot& s) { return s.state == state; }));
}

uint32_t WorkerTable::JoinedCount() const {
  return static_cast<uint32_t>(
      std::count_if(slots_.begin(), slots_.end(),
                    [](const WorkerSlot& s) { return s.ever_joined; }));
}

Admission WorkerTable::Admit(uint32_t index, uint64_t incarnation,
                             const std::string& routing_id, uint64_t sequence,
                             double now_s) {
  WorkerSlot& slot = slots_[index];
  Admission admission;
  admission.previous = slot.state;
  if (incarnation != 0 && std::find(slot.retired.begin(), slot.retired.end(),
                                    incarnation) != slot.retired.end()) {
    admission.refusal = {pb::ERROR_UNEXPECTED,
                         "worker " + slot.Name() + " (incarnation " +
                             std::to_string(incarnation) +
                             ") was replaced by a newer process with the same "
                             "index"};
    return admission;
  }
  // Incarnation 0 (a client that sends none) is never "the same" process:
  // such a client cannot come back, and cannot take a live slot.
  const bool same = incarnation != 0 && incarnation == slot.incarnation;
  bool new_incarnation = true;
  switch (slot.state) {
    case SlotState::kAbsent:
      // `same` only after RestoreCommitRecords: a process the previous run
      // of this server knew, coming back.
      admission.kind =
          same ? Admission::Kind::kRejoined : Admission::Kind::kJoined;
      new_incarnation = !same;
      break;
    case SlotState::kLive:
      if (same) {
        admission.kind = Admission::Kind::kReconnected;
        admission.request_pending = slot.awaiting_reply();
        new_incarnation = false;
      } else if (incarnation == 0) {
        // Without an incarnation nothing tells a restarted process from a
        // second client: the live worker keeps its slot.
        admission.refusal = {pb::ERROR_UNEXPECTED,
                             "worker " + slot.Name() +
                                 " already joined (a HELLO without an "
                                 "incarnation cannot replace it)"};
        return admission;
      } else {
        admission.kind = Admission::Kind::kRestarted;
        admission.dropped = slot.pending;
      }
      break;
    case SlotState::kDead:
      admission.kind =
          same ? Admission::Kind::kRejoined : Admission::Kind::kRestarted;
      admission.dead_s = now_s - slot.dead_since_s;
      new_incarnation = !same;
      break;
    case SlotState::kLeft:
      if (same || incarnation == 0) {
        admission.refusal = {pb::ERROR_UNEXPECTED,
                             "worker " + slot.Name() + " already left"};
        return admission;
      }
      admission.kind = Admission::Kind::kRestarted;
      break;
  }
  if (new_incarnation) {
    if (slot.ever_joined && slot.incarnation != 0) {
      slot.retired.push_back(slot.incarnation);
      while (slot.retired.size() > kMaxRetiredIncarnations) {
        slot.retired.pop_front();
      }
    }
    AddStats(slot.stats, &slot.retired_stats);
    slot.stats.Clear();
    slot.incarnation = incarnation;
    slot.last_commit_id = 0;
    slot.durable_commit_id = 0;  // nothing of the new process yet
    slot.pending_durable.clear();
    ++slot.incarnations;
  }
  slot.ever_joined = true;
  slot.state = SlotState::kLive;
  slot.routing_id = routing_id;
  slot.last_sequence = sequence;
  slot.last_heard_s = now_s;
  slot.last_sent_s = now_s;
  // A request held for a reconnecting worker stays where it is (with the
  // policy or the sync); its answer goes to the new connection, as a
  // WELCOME. Anything else of the slot's is answered by this HELLO.
  if (!admission.request_pending) slot.held = false;
  slot.pending = Pending::kHello;
  slot.read_ranges.clear();  // a WELCOME carries the whole model
  slot.read_rows.clear();
  return admission;
}

WorkerTable::Checked WorkerTable::CheckRequest(const pb::Header& header,
                                               const std::string& routing_id,
                                               double now_s,
                                               bool allow_pending) {
  Checked checked;
  const pb::Endpoint& sender = header.sender();
  const std::optional<uint32_t> found = sender.role() == pb::ROLE_WORKER
                                            ? Find(sender.site(), sender.id())
                                            : std::nullopt;
  if (!found) {
    checked.refusal = {pb::ERROR_UNKNOWN_SENDER,
                       "sender is not a worker of site server '" + server_ +
                           "' (it serves " + Describe() + ")"};
    return checked;
  }
  WorkerSlot& slot = slots_[*found];
  if (slot.state == SlotState::kAbsent || slot.routing_id != routing_id) {
    checked.refusal = {
        pb::ERROR_UNKNOWN_SENDER,
        "worker " + slot.Name() + " has not joined from this connection"};
    return checked;
  }
  if (slot.state == SlotState::kDead) {
    checked.refusal = {pb::ERROR_UNKNOWN_SENDER,
                       "worker " + slot.Name() +
                           " was declared dead (silent for more than " +
                           FormatReal(worker_timeout_s_) +
                           " s, or not reading its replies): join again "
                           "with HELLO"};
    return checked;
  }
  if (slot.state == SlotState::kLeft) {
    checked.refusal = {pb::ERROR_UNEXPECTED,
                       "worker " + slot.Name() + " already left"};
    return checked;
  }
  slot.last_heard_s = now_s;
  if (header.sequence() <= slot.last_sequence) {
    checked.refusal = {pb::ERROR_STALE, "sequence number " +
                                            std::to_string(header.sequence()) +
                                            " is not above the last accepted " +
                                            std::to_string(slot.last_sequence) +
                                            " (replayed or reordered request)"};
    return checked;
  }
  if (header.sequence() - slot.last_sequence > kMaxSequenceStep) {
    // Refused without moving the window: one wild number (a bit flip, a
    // hostile or buggy client) cannot use up the worker's number space.
    checked.refusal = {pb::ERROR_STALE,
                       "sequence number " + std::to_string(header.sequence()) +
                           " is more than " + std::to_string(kMaxSequenceStep) +
                           " above the last accepted " +
                           std::to_string(slot.last_sequence)};
    return checked;
  }
  if (slot.awaiting_reply() && !allow_pending) {
    checked.refusal = {pb::ERROR_UNEXPECTED,
                       "worker " + slot.Name() +
                           " sent a request before its previous one was "
                           "answered"};
    return checked;
  }
  slot.last_sequence = header.sequence();
  checked.slot = found;
  return checked;
}

bool WorkerTable::OnHeartbeat(const pb::Header& header,
                              const std::string& routing_id, double now_s) {
  const pb::Endpoint& sender = header.sender();
  if (sender.role() != pb::ROLE_WORKER) return true;  // not a worker: ignored
  const std::optional<uint32_t> found = Find(sender.site(), sender.id());
  if (!found) return true;  // not one of ours: ignored, never answered
  WorkerSlot& slot = slots_[*found];
  if (slot.state == SlotState::kLive && slot.routing_id == routing_id) {
    slot.last_heard_s = now_s;
    return true;
  }
  return false;
}

std::vector<WorkerTable::Death> WorkerTable::CheckLiveness(double now_s,
                                                           double* stalled_s) {
  *stalled_s = 0;
  std::vector<Death> dead;
  const double previous = last_check_s_;
  last_check_s_ = now_s;
  if (previous >= 0 &&
      now_s - previous > std::max(kMinStallS, worker_timeout_s_ / 4)) {
    // Our own stall: the workers' messages wait in the socket, unread.
    *stalled_s = now_s - previous;
    for (WorkerSlot& slot : slots_) {
      if (slot.state == SlotState::kLive) slot.last_heard_s = now_s;
    }
    return dead;
  }
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    WorkerSlot& slot = slots_[i];
    if (slot.state != SlotState::kLive ||
        now_s - slot.last_heard_s <= worker_timeout_s_) {
      continue;
    }
    dead.push_back(DeclareDead(i, now_s));
  }
  return dead;
}

WorkerTable::Death WorkerTable::DeclareDead(uint32_t index, double now_s) {
  WorkerSlot& slot = slots_[index];
  const Death death{index, slot.pending, now_s - slot.last_heard_s};
  slot.state = SlotState::kDead;
  slot.dead_since_s = now_s;
  // Its unanswered request is dropped: an update it carried was applied
  // (or aggregated) on arrival; only the reply is never sent.
  slot.pending = Pending::kNone;
  slot.held = false;
  return death;
}

std::vector<uint32_t> WorkerTable::DueForHeartbeat(double now_s,
                                                   double interval_s) const {
  std::vector<uint32_t> due;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    const WorkerSlot& slot = slots_[i];
    if (slot.state == SlotState::kLive && slot.awaiting_reply() &&
        now_s - slot.last_sent_s >= interval_s) {
      due.push_back(i);
    }
  }
  return due;
}

void WorkerTable::NoteAnswered(uint32_t index, double now_s) {
  WorkerSlot& slot = slots_[index];
  slot.pending = Pending::kNone;
  slot.held = false;
  slot.last_sent_s = now_s;
}

void WorkerTable::Leave(uint32_t index) {
  WorkerSlot& slot = slots_[index];
  slot.state = SlotState::kLeft;
  slot.pending = Pending::kNone;
  slot.held = false;
}

bool WorkerTable::IsDuplicate(uint32_t index, uint64_t commit_id) const {
  return commit_id != 0 && commit_id <= slots_[index].last_commit_id;
}

void WorkerTable::RecordApplied(uint32_t index, uint64_t commit_id) {
  WorkerSlot& slot = slots_[index];
  slot.last_commit_id = std::max(slot.last_commit_id, commit_id);
  ++slot.commits_applied;
}

void WorkerTable::RecordReplayed(uint32_t index, uint64_t first_id,
                                 uint64_t last_id) {
  WorkerSlot& slot = slots_[index];
  slot.last_commit_id = std::max(slot.last_commit_id, last_id);
  slot.commits_applied += last_id - first_id + 1;
}

pb::DurablePoint WorkerTable::DurablePointOf(uint32_t index) const {
  const WorkerSlot& slot = slots_[index];
  pb::DurablePoint point;
  point.set_commit_id(slot.durable_commit_id);
  for (uint64_t id : slot.pending_durable) point.add_pending(id);
  return point;
}

uint64_t WorkerTable::duplicate_commits() const {
  uint64_t total = 0;
  for (const WorkerSlot& slot : slots_) total += slot.duplicate_commits;
  return total;
}

std::vector<CommitRecord> WorkerTable::CommitRecords() const {
  std::vector<CommitRecord> records;
  records.reserve(slots_.size());
  for (const WorkerSlot& slot : slots_) {
    records.push_back({slot.incarnation, slot.last_commit_id,
                       slot.commits_applied, slot.incarnations, slot.stats,
                       slot.retired_stats});
  }
  return records;
}

void WorkerTable::RestoreCommitRecords(std::span<const CommitRecord> records) {
  for (size_t i = 0; i < records.size() && i < slots_.size(); ++i) {
    slots_[i].incarnation = records[i].incarnation;
    slots_[i].last_commit_id = records[i].last_commit_id;
    slots_[i].commits_applied = records[i].commits_applied;
    slots_[i].incarnations = records[i].incarnations;
    slots_[i].stats = records[i].stats;
    slots_[i].retired_stats = records[i].retired_stats;
  }
}

pb::WorkerStats WorkerTable::TotalStats(const WorkerSlot& slot) {
  pb::WorkerStats total = slot.retired_stats;
  AddStats(slot.stats, &total);
  total.set_last_loss(slot.stats.last_loss());
  total.set_commit_overhead_s(slot.stats.commit_overhead_s());
  return total;
}

}  // namespace meridian
