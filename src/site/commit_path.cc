#include "site/commit_path.h"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "meridian/core/log.h"

namespace meridian {
namespace {

// A parsed update as segments of the key space: a dense tensor is one, a
// CODEC_ROWS tensor one per row. Borrows `update`.
std::vector<UpdateSegment> Segments(const ModelPayload& update) {
  std::vector<UpdateSegment> segments;
  segments.reserve(update.tensors.size());
  for (const TensorPayload& tensor : update.tensors) {
    if (!tensor.rows) {
      segments.push_back(UpdateSegment{tensor.tensor->offset, tensor.values});
      continue;
    }
    const DecodedRows& rows = *tensor.rows;
    for (size_t k = 0; k < rows.rows.size(); ++k) {
      segments.push_back(
          UpdateSegment{tensor.tensor->offset + rows.rows[k] * rows.row_length,
                        std::span<const float>(rows.values)
                            .subspan(k * rows.row_length, rows.row_length)});
    }
  }
  return segments;
}

}  // namespace

CommitPath::CommitPath(const SiteContext& site, ParameterStore* store,
                       WorkerTable* workers, Membership* membership,
                       WorkerEndpoint* endpoint, Replies* replies,
                       PolicyDriver* policy, SiteDurability* durability,
                       const TrainingPhase* phase, SiteCounters* counters)
    : site_(site),
      store_(store),
      workers_(workers),
      membership_(membership),
      endpoint_(endpoint),
      replies_(replies),
      policy_(policy),
      durability_(durability),
      phase_(phase),
      counters_(counters) {}

void CommitPath::HandleCommit(const Envelope& message) {
  const std::optional<uint32_t> worker = membership_->Sender(message);
  if (!worker) return;
  if (!phase_->training()) {
    return endpoint_->Refuse(
        message, {pb::ERROR_UNEXPECTED, "training has not started"});
  }
  const std::vector<FrameView> frames = ViewFrames(message.payload);
  Parsed<WorkerCommit> parsed =
      ParseCommit(message.header, frames, site_.layout);
  if (!parsed.ok()) return endpoint_->Refuse(message, parsed.rejection());
  WorkerCommit& commit = *parsed;
  const pb::Commit& fields = *commit.fields;
  if (fields.replay_first_id() != 0) {
    return HandleReplay(message, *worker, commit);
  }
  if (workers_->IsDuplicate(*worker, fields.commit_id())) {
    return AnswerDuplicate(*worker, fields, std::move(commit.reads));
  }
  if (fields.base_version() > store_->version()) {
    return endpoint_->Refuse(
        message, {pb::ERROR_STALE, "commit based on model version " +
                                       std::to_string(fields.base_version()) +
                                       ", newer than the site's " +
                                       std::to_string(store_->version())});
  }
  durability_->NoteFirstCommit(*worker, fields.commit_id());
  counters_->staleness.Add(store_->version() - fields.base_version());
  TakeRequest(*worker, fields, std::move(commit.reads));
  if (phase_->finished()) {
    // The job is over, but the worker's last update is real work: apply
    // it so that nothing accepted is lost, then tell it to stop.
    Apply(commit.update);
    RecordApplied(*worker, fields.commit_id());
    replies_->SendReply(*worker);
    return;
  }
  Decide(message, *worker, commit);
}

Parsed<CommitPath::ReplayRange> CommitPath::ParseReplay(
    const pb::Commit& fields) {
  if (fields.replay_first_id() > fields.commit_id()) {
    return Rejection{pb::ERROR_MALFORMED,
                     "replay_first_id " +
                         std::to_string(fields.replay_first_id()) +
                         " is above the commit_id " +
                         std::to_string(fields.commit_id())};
  }
  return ReplayRange{fields.replay_first_id(), fields.commit_id()};
}

void CommitPath::HandleReplay(const Envelope& message, uint32_t worker,
                              WorkerCommit& commit) {
  const pb::Commit& fields = *commit.fields;
  Parsed<ReplayRange> parsed = ParseReplay(fields);
  if (!parsed.ok()) return endpoint_->Refuse(message, parsed.rejection());
  const ReplayRange range = *parsed;
  const uint64_t applied = (*workers_)[worker].last_commit_id;
  if (range.last <= applied) {
    // Applied before (the replay's answer was lost): answered, not again.
    return AnswerDuplicate(worker, fields, std::move(commit.reads));
  }
  if (range.first <= applied) {
    // Part of it is in the model already, and a sum cannot be split.
    return endpoint_->Refuse(
        message,
        {pb::ERROR_STALE,
         "replay of commits " + std::to_string(range.first) + " to " +
             std::to_string(range.last) + ", but commits up to " +
             std::to_string(applied) +
             " are applied already: not applied (some would be twice)"});
  }
  // The sum of commits the site answered before it crashed: the worker's
  // own, already past every policy check once. Applied at once, outside
  // the policy's rounds and clock (the site's clock was restored to what
  // its peers had seen of these commits).
  //
  // The arithmetic with the sync (src/sync/saved_state.h): the restart
  // took the updates that had left for the peers after the checkpoint
  // back out of their accumulators (acc = acc_checkpoint - sent); applying
  // the replayed change R adds it to the model and to every accumulator
  // as any commit does, so acc = acc_checkpoint + R - sent, what the
  // accumulators held before the crash when every lost commit comes back:
  // each change reaches every replica once.
  durability_->NoteFirstCommit(worker, range.first);
  durability_->NoteReplayed(worker, range.first, range.last);
  TakeRequest(worker, fields, std::move(commit.reads));
  store_->Apply(Segments(commit.update));
  counters_->commits += range.last - range.first + 1;
  workers_->RecordReplayed(worker, range.first, range.last);
  durability_->NoteApplied(worker, range.last);
  replies_->Answer(worker);
}

void CommitPath::RecordApplied(uint32_t worker, uint64_t commit_id) {
  workers_->RecordApplied(worker, commit_id);
  durability_->NoteApplied(worker, commit_id);
}

void CommitPath::AnswerDuplicate(uint32_t worker, const pb::Commit& fields,
                                 RowReads reads) {
  workers_->RecordDuplicate(worker);
  MLOG(INFO) << "commit " << fields.commit_id() << " of worker "
             << (*workers_)[worker].Name()
             << " was applied already: answered, not applied again";
  TakeRequest(worker, fields, std::move(reads));
  replies_->Answer(worker);
}

void CommitPath::TakeRequest(uint32_t worker, const pb::Commit& fields,
                             RowReads reads) {
  WorkerSlot& slot = (*workers_)[worker];
  slot.stats = fields.stats();
  slot.pending = Pending::kCommit;
  slot.read_ranges.clear();
  // The whole model, or the rows the worker's next batches read.
  slot.read_rows = std::move(reads);
}

void CommitPath::Decide(const Envelope& message, uint32_t worker,
                        const WorkerCommit& commit) {
  const pb::Commit& fields = *commit.fields;
  CommitEvent event;
  event.worker = worker;
  event.base_version = fields.base_version();
  event.current_version = store_->version();
  event.local_steps = fields.local_steps();
  event.now = site_.clock->Now();
  event.commit_overhead_s = fields.stats().commit_overhead_s();
  PolicyDecision decision = policy_->OnCommit(event);
  switch (decision.update) {
    case PolicyDecision::Update::kApply: {
      RecordApplied(worker, fields.commit_id());
      auto released =
          std::find(decision.release.begin(), decision.release.end(), worker);
      if (released != decision.release.end() && !decision.flush_aggregate &&
          replies_->ReadsAllowed()) {
        // The common asynchronous case.
        ApplyAndAnswer(worker, commit.update);
        decision.release.erase(released);
      } else {
        Apply(commit.update);
      }
      break;
    }
    case PolicyDecision::Update::kAggregate:
      // Applied with its round (FinishJob flushes an open one).
      RecordApplied(worker, fields.commit_id());
      policy_->Aggregate(Segments(commit.update));
      ++counters_->commits;
      break;
    case PolicyDecision::Update::kReject:
      (*workers_)[worker].pending = Pending::kNone;
      endpoint_->Refuse(message, {pb::ERROR_STALE, decision.reject_reason});
      break;
  }
  policy_->Execute(decision);
}

void CommitPath::Apply(const ModelPayload& update) {
  store_->Apply(Segments(update));
  ++counters_->commits;
}

void CommitPath::ApplyAndAnswer(uint32_t worker, const ModelPayload& update) {
  Replies::ModelReply reply =
      replies_->NewModelReply(pb::MODEL, {}, (*workers_)[worker].read_rows);
  const uint64_t version = store_->Apply(Segments(update), reply.reads);
  ++counters_->commits;
  replies_->SendModelReply(worker, version, std::move(reply));
}

void CommitPath::HandlePull(const Envelope& message) {
  const std::optional<uint32_t> worker = membership_->Sender(message);
  if (!worker) return;
  const pb::Pull& pull = message.header.pull();
  if (Check check = CheckPull(pull); !check.ok()) {
    return endpoint_->Refuse(message, check.rejection());
  }
  WorkerSlot& slot = (*workers_)[*worker];
  slot.read_ranges.assign(pull.ranges().begin(), pull.ranges().end());
  slot.read_rows.clear();
  slot.pending = Pending::kPull;
  ++counters_->pulls;
  if (!phase_->running()) return replies_->SendReply(*worker);
  policy_->OnPull(*worker, site_.clock->Now());
}

Check CommitPath::CheckPull(const pb::Pull& pull) const {
  if (pull.ranges_size() == 0) return Check();
  pb::Header wanted;
  *wanted.mutable_slices() = pull.ranges();
  MERIDIAN_RETURN_IF_REJECTED(
      CheckSlicesAgainstLayout(wanted, site_.layout, /*whole_model=*/false));
  // Ranges may overlap: without a cap, one small request could ask for
  // thousands of copies of the model.
  uint64_t floats = 0;
  for (const pb::TensorSlice& range : pull.ranges()) {
    floats += range.length();  // each <= the model: cannot overflow
  }
  if (floats > ReplyFloatLimit()) {
    return Rejection{pb::ERROR_LIMIT, "PULL asks for " +
                                          std::to_string(floats) +
                                          " floats; a reply carries at most " +
                                          std::to_string(ReplyFloatLimit()) +
                                          " (server.limits.max_reply_floats)"};
  }
  return Check();
}

uint64_t CommitPath::ReplyFloatLimit() const {
  return std::max<uint64_t>(site_.bounds.max_reply_floats,
                            site_.layout.num_elements());
}

}  // namespace meridian
