#include "site/site_durability.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include "durable/checkpoint.h"
#include "meridian/core/format.h"
#include "meridian/core/log.h"

namespace meridian {

SiteDurability::SiteDurability(const SiteContext& site,
                               const SiteServerOptions& options, Parts parts)
    : site_(site), options_(options), parts_(parts) {}

std::string SiteDurability::Fingerprint() const {
  const std::string layout = site_.layout.DebugString();
  const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(layout.data()),
                          static_cast<uInt>(layout.size()));
  char digest[16];
  std::snprintf(digest, sizeof(digest), "%08lx", crc);
  return CheckpointFingerprint(site_.job.name(), site_.name(), site_.job.seed(),
                               digest);
}

std::string SiteDurability::CheckpointDir() const {
  if (!options_.checkpoint_dir.empty()) return options_.checkpoint_dir;
  const std::string& site = site_.name();
  if (site_.job.fault().has_checkpoint_dir()) {
    return site_.job.fault().checkpoint_dir() + "/" + site;
  }
  if (!options_.out_dir.empty()) {
    return options_.out_dir + "/checkpoints/" + site;
  }
  return "";
}

Status SiteDurability::Open() {
  const pb::FaultConfig& fault = site_.job.fault();
  const std::string dir = CheckpointDir();
  if (fault.checkpoint_period_s() <= 0 || dir.empty()) {
    if (options_.resume) {
      MLOG(WARNING) << "--resume, but this site keeps no checkpoints ("
                    << (dir.empty() ? "no --out or checkpoint_dir"
                                    : "fault.checkpoint_period_s is 0")
                    << "): starting from the initial model";
    }
    return Status::Ok();
  }
  SiteCheckpointOptions options;
  options.dir = dir;
  options.fingerprint = Fingerprint();
  options.period_s = fault.checkpoint_period_s();
  options.fsync_log = fault.fsync_log();
  Result<std::unique_ptr<SiteCheckpointer>> opened =
      SiteCheckpointer::Open(std::move(options), options_.resume);
  if (!opened.ok()) {
    return opened.status().WithContext("site '" + site_.name() + "'");
  }
  checkpointer_ = std::move(*opened);
  parts_.workers->EnableDurablePoints();
  if (checkpointer_->recovered()) {
    MERIDIAN_RETURN_IF_ERROR(
        Recover(*checkpointer_->recovered())
            .WithContext("resuming site '" + site_.name() + "'"));
    checkpointer_->ForgetRecovered();
  } else if (options_.resume) {
    MLOG(INFO) << "--resume: no checkpoint in " << dir
               << " yet: starting from the initial model";
  }
  if (parts_.sync != nullptr) {
    parts_.sync->EnableCheckpoints();
    parts_.sync->SetOutgoingLog([this](const pb::LoggedMessage& message) {
      return checkpointer_->Log(message);
    });
  }
  MLOG(INFO) << "checkpoints every "
             << FormatSeconds(fault.checkpoint_period_s(), 1) << " s in " << dir
             << (fault.fsync_log() ? " (log fsynced per update)" : "");
  return Status::Ok();
}

Status SiteDurability::Recover(const SiteCheckpointer::Recovered& recovered) {
  const pb::SiteCheckpoint& meta = recovered.meta;
  ParameterStore* store = parts_.store;
  MERIDIAN_RETURN_IF_ERROR(RestoreStoreArrays(
      recovered.checkpoint, meta.model_version(), store, parts_.sync));
  if (meta.server_momentum() > 0) store->SetMomentum(meta.server_momentum());
  if (meta.aggregate_commits() > 0) {
    const NamedArray* aggregate = recovered.checkpoint.Find("aggregate");
    if (aggregate == nullptr) {
      return DataLossError("the checkpoint has " +
                           std::to_string(meta.aggregate_commits()) +
                           " commits in an open barrier but no aggregate");
    }
    MERIDIAN_RETURN_IF_ERROR(parts_.policy->mutable_aggregate()->Restore(
        aggregate->values, meta.aggregate_commits()));
  }
  int64_t clock = meta.clock();
  uint64_t retracted = 0;
  if (parts_.sync != nullptr) {
    MERIDIAN_ASSIGN_OR_RETURN(
        retracted, parts_.sync->RestoreState(meta.sync(), recovered.logged,
                                             &recovered.checkpoint));
    clock = std::max<int64_t>(clock, parts_.sync->Summary().clock());
  }
  parts_.clock->Restore(clock);  // the policy starts again at 0
  if (const NamedArray* held = recovered.checkpoint.Find(kHeldOwnChanges)) {
    if (OwnChangeHold* hold = parts_.clock->hold()) {
      // Queued at the restored clock: applied once the peers announce it.
      MERIDIAN_RETURN_IF_ERROR(hold->Restore(held->values, clock));
    } else {
      // Held by a run that held its own changes: this one applies them.
      MERIDIAN_RETURN_IF_ERROR(
          OwnChangeHold::ApplyHeld(store, held->values));
    }
  }
  RestoreWorkers(meta, recovered.checkpoint.sequence, recovered.applied);
  parts_.counters->commits = meta.commits();
  parts_.counters->rejected = meta.rejected();
  parts_.counters->pulls = meta.pulls();
  parts_.phase->Resume(meta.training_s());
  parts_.evaluator->timeline().Restore({meta.timeline().begin(), meta.timeline().end()},
                            meta.time_to_target_s());
  parts_.events->Restore(meta.events());
  recovery_ = meta.recovery();
  recovery_.set_restarts(recovery_.restarts() + recovered.restarts_logged +
                         1);
  if (Status logged = checkpointer_->LogRestart(); !logged.ok()) {
    MLOG(ERROR) << "cannot log the restart (a crash before the next "
                << "checkpoint would count one restart fewer): " << logged;
  }
  recovery_.set_checkpoint_t_s(meta.training_s());
  recovery_.set_lost_clock_from(meta.clock());
  recovery_.set_lost_clock_to(clock);
  recovery_.set_retracted_updates(recovery_.retracted_updates() +
                                  static_cast<uint32_t>(retracted));
  if (meta.finished()) {
    resumed_finished_ = true;
    parts_.phase->ResumeFinished(meta.stop_reason(), meta.training_s());
  }
  std::string detail =
      "from " + recovered.path + " (" + FormatSeconds(meta.training_s(), 1) +
      " s of training, clock " + std::to_string(meta.clock()) + "); " +
      std::to_string(recovered.logged.size()) +
      " messages sent after it go out again; " + std::to_string(retracted) +
      " updates of the lost window taken back from the peers; " +
      std::to_string(lost_.Unsettled()) +
      " commits applied after it wait for their workers' replay; clock now " +
      std::to_string(clock);
  for (const std::string& note : recovered.notes) detail += "; " + note;
  MLOG(WARNING) << "resumed " << detail;
  parts_.events->Record(pb::SITE_RECOVERED, "site '" + site_.name() + "'",
                        detail);
  return Status::Ok();
}

void SiteDurability::RestoreWorkers(
    const pb::SiteCheckpoint& meta, uint64_t sequence,
    std::span<const pb::AppliedCommit> applied) {
  std::vector<CommitRecord> records;
  Positions restored{sequence, {}};
  for (const pb::WorkerSlotCheckpoint& slot : meta.workers()) {
    records.push_back({slot.incarnation(), slot.last_commit_id(),
                       slot.commits_applied(), slot.incarnations(),
                       slot.stats(), slot.retired_stats()});
    restored.slots.push_back({slot.incarnation(), slot.last_commit_id()});
  }
  parts_.workers->RestoreCommitRecords(records);
  lost_.Restore(records, meta.workers(), applied);
  // The checkpoint restored from is the durable point every returning
  // worker hears of in its WELCOME.
  positions_.assign(1, std::move(restored));
  PublishDurablePoints();
}

pb::SiteRecovery SiteDurability::recovery() const {
  pb::SiteRecovery recovery = recovery_;
  recovery.set_lost_commits(recovery.lost_commits() +
                            static_cast<uint32_t>(lost_.Unsettled()));
  return recovery;
}

void SiteDurability::NoteApplied(uint32_t worker, uint64_t commit_id) {
  if (!checkpointer_ || commit_id == 0) return;
  pb::AppliedCommit applied;
  applied.set_slot(worker);
  applied.set_incarnation((*parts_.workers)[worker].incarnation);
  applied.set_commit_id(commit_id);
  if (Status logged = checkpointer_->LogApplied(applied); !logged.ok()) {
    if (log_errors_++ % 100 == 0) {
      MLOG(ERROR) << "cannot log an applied commit (a crash would count "
                  << "fewer lost commits): " << logged;
    }
  }
}

void SiteDurability::NoteFirstCommit(uint32_t worker, uint64_t first_id) {
  const WorkerSlot& slot = (*parts_.workers)[worker];
  const uint64_t lost = lost_.OnFirstCommit(worker, slot.incarnation, first_id);
  if (lost == 0) return;
  recovery_.set_lost_commits(recovery_.lost_commits() +
                             static_cast<uint32_t>(lost));
  MLOG(WARNING) << "worker " << slot.Name() << ": " << lost
                << " commits answered after the checkpoint were lost with "
                << "the crash (neither replayed nor sent again)";
}

void SiteDurability::NoteReplayed(uint32_t worker, uint64_t first_id,
                                  uint64_t last_id) {
  const uint64_t replayed = last_id - first_id + 1;
  recovery_.set_replayed_commits(recovery_.replayed_commits() +
                                 static_cast<uint32_t>(replayed));
  MLOG(INFO) << "worker " << (*parts_.workers)[worker].Name()
             << " replayed its commits " << first_id << " to " << last_id
             << ", answered before the crash and missing from the checkpoint";
}

void SiteDurability::PublishDurablePoints() {
  if (!checkpointer_) return;
  // In this order: a write that ends in between is then durable rather
  // than neither (the writer publishes durable before settled).
  std::vector<uint64_t> pending = checkpointer_->Pending();
  const uint64_t durable = checkpointer_->durable_sequence();
  if (durable == published_durable_ && pending == published_pending_) return;
  // Positions below the durable checkpoint's are of no use any more, nor
  // are those of checkpoints that will never be durable (replaced, failed).
  while (positions_.size() > 1 && positions_[1].sequence <= durable) {
    positions_.pop_front();
  }
  std::erase_if(positions_, [&](const Positions& at) {
    return at.sequence > durable &&
           std::find(pending.begin(), pending.end(), at.sequence) ==
               pending.end();
  });
  WorkerTable& workers = *parts_.workers;
  for (uint32_t i = 0; i < workers.size(); ++i) {
    WorkerSlot& slot = workers[i];
    slot.durable_commit_id = 0;
    slot.pending_durable.clear();
    for (const Positions& at : positions_) {
      if (i >= at.slots.size() || at.slots[i].incarnation != slot.incarnation) {
        continue;
      }
      const uint64_t id = at.slots[i].commit_id;
      if (at.sequence <= durable) {
        slot.durable_commit_id = id;
      } else if (std::find(pending.begin(), pending.end(), at.sequence) !=
                     pending.end() &&
                 id > slot.durable_commit_id &&
                 (slot.pending_durable.empty() ||
                  id > slot.pending_durable.back())) {
        slot.pending_durable.push_back(id);
      }
    }
  }
  published_durable_ = durable;
  published_pending_ = std::move(pending);
}

void SiteDurability::CheckpointBeforeTraining() {
  if (!checkpointer_ || recovery_.restarts() > 0) return;
  TakeCheckpoint(/*finished=*/false);
  if (Status written = checkpointer_->Flush(); !written.ok()) {
    MLOG(ERROR) << "cannot write the first checkpoint: " << written;
  }
}

void SiteDurability::MaybeCheckpoint() {
  if (!checkpointer_) return;
  SyncEngine* sync = parts_.sync;
  if (std::optional<pb::SyncCheckpoint> durable = checkpointer_->TakeDurable();
      durable && sync != nullptr) {
    sync->NoteDurable(*durable);
  }
  PublishDurablePoints();
  if (!parts_.phase->running()) return;
  if (!checkpointer_->Due(site_.Now(),
                          sync != nullptr && sync->CheckpointWanted())) {
    return;
  }
  TakeCheckpoint(/*finished=*/false);
}

void SiteDurability::FinalCheckpoint() {
  if (!checkpointer_ || resumed_finished_) return;
  TakeCheckpoint(/*finished=*/true);
  if (Status flushed = checkpointer_->Flush(); !flushed.ok()) {
    MLOG(ERROR) << "cannot write the final checkpoint: " << flushed;
  }
}

void SiteDurability::TakeCheckpoint(bool finished) {
  const ParameterStore& store = *parts_.store;
  const WorkerTable& workers = *parts_.workers;
  pb::SiteCheckpoint meta;
  meta.set_site(site_.name());
  meta.set_model_version(store.version());
  meta.set_clock(parts_.clock->value());
  meta.set_training_s(parts_.phase->CheckpointSeconds());
  meta.set_commits(parts_.counters->commits.load());
  meta.set_rejected(parts_.counters->rejected);
  meta.set_pulls(parts_.counters->pulls);
  meta.set_duplicate_commits(workers.duplicate_commits());
  meta.set_server_momentum(store.rule().momentum);
  meta.set_time_to_target_s(parts_.evaluator->timeline().time_to_target_s());
  for (const pb::EvalPoint& point : parts_.evaluator->timeline().Points()) {
    *meta.add_timeline() = point;
  }
  parts_.events->CopyTo(meta.mutable_events());
  *meta.mutable_recovery() = recovery_;
  Positions positions;
  for (const CommitRecord& record : workers.CommitRecords()) {
    pb::WorkerSlotCheckpoint* slot = meta.add_workers();
    slot->set_incarnation(record.incarnation);
    slot->set_last_commit_id(record.last_commit_id);
    slot->set_commits_applied(record.commits_applied);
    slot->set_incarnations(record.incarnations);
    *slot->mutable_stats() = record.stats;
    *slot->mutable_retired_stats() = record.retired_stats;
    lost_.SaveTo(static_cast<uint32_t>(meta.workers_size() - 1), slot);
    positions.slots.push_back({record.incarnation, record.last_commit_id});
  }
  if (parts_.sync != nullptr) parts_.sync->SaveState(meta.mutable_sync());
  std::vector<NamedArray> arrays = StoreArrays(store, parts_.sync);
  if (const OwnChangeHold* hold = parts_.clock->hold()) {
    NamedArray held{kHeldOwnChanges,
                    std::vector<float>(store.num_elements(), 0.0f)};
    hold->AddTo(held.values);
    arrays.push_back(std::move(held));
  }
  const UpdateAccumulator& aggregate = parts_.policy->aggregate();
  if (aggregate.count() > 0) {
    meta.set_aggregate_commits(aggregate.count());
    arrays.push_back(
        {"aggregate", {aggregate.sum().begin(), aggregate.sum().end()}});
  }
  meta.set_finished(finished);
  if (finished) meta.set_stop_reason(parts_.phase->stop_reason());
  positions.sequence =
      checkpointer_->Submit(std::move(meta), std::move(arrays), site_.Now());
  if (positions.sequence == 0) return;  // skipped
  positions_.push_back(std::move(positions));
  PublishDurablePoints();
}

}  // namespace meridian
