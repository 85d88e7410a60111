#include "site/site_checkpoint.h"

#include <algorithm>

#include "meridian/core/log.h"

namespace meridian {
namespace {

// A checkpoint asked for early (a peer's retention filling) waits at least
// this long after the previous one (seconds), and at least
// kEarlyCostMultiple times what the last write took, so early checkpoints
// keep the writer busy at most 1/kEarlyCostMultiple of the time.
constexpr double kMinEarlySpacingS = 0.1;
constexpr double kEarlyCostMultiple = 5.0;

}  // namespace

double EarlyCheckpointSpacing(double last_write_s, double period_s) {
  const double spacing =
      std::max(kMinEarlySpacingS, kEarlyCostMultiple * last_write_s);
  return period_s > 0 ? std::min(spacing, period_s) : spacing;
}

Result<std::unique_ptr<SiteCheckpointer>> SiteCheckpointer::Open(
    SiteCheckpointOptions options, bool resume) {
  std::unique_ptr<SiteCheckpointer> self(
      new SiteCheckpointer(std::move(options)));
  const std::string& dir = self->options_.dir;
  const std::string& fingerprint = self->options_.fingerprint;
  uint64_t durable = 0;
  if (!resume) {
    MERIDIAN_ASSIGN_OR_RETURN(std::vector<uint64_t> existing,
                              ListCheckpoints(dir));
    if (!existing.empty()) {
      return FailedPreconditionError(
          "checkpoint directory '" + dir + "' holds checkpoints of an " +
          "earlier run (newest: " + CheckpointFileName(existing.back()) +
          "): continue that run with --resume, or delete them to start "
          "afresh");
    }
  } else {
    MERIDIAN_ASSIGN_OR_RETURN(LoadedCheckpoint loaded,
                              LoadLatest(dir, fingerprint));
    if (loaded.checkpoint) {
      Recovered recovered;
      recovered.path = loaded.path;
      recovered.notes = loaded.refused;
      if (!recovered.meta.ParseFromString(loaded.checkpoint->meta)) {
        return DataLossError("checkpoint '" + loaded.path +
                             "': its state record does not parse");
      }
      recovered.checkpoint = std::move(*loaded.checkpoint);
      durable = recovered.checkpoint.sequence;
      MERIDIAN_ASSIGN_OR_RETURN(
          LogContents log,
          ReadLog(dir, fingerprint, recovered.meta.log_segment()));
      if (log.ignored_bytes > 0) recovered.notes.push_back(log.ignored_note);
      for (const LogRecord& record : log.records) {
        pb::LoggedMessage message;
        if (!message.ParseFromArray(record.payload.data(),
                                    static_cast<int>(record.payload.size()))) {
          return DataLossError("outgoing log in '" + dir + "', segment " +
                               std::to_string(record.segment) +
                               ": a record does not parse");
        }
        if (message.has_applied_commit()) {
          recovered.applied.push_back(message.applied_commit());
          continue;
        }
        if (message.site_restarted()) {
          ++recovered.restarts_logged;
          continue;
        }
        recovered.logged.push_back(std::move(message));
      }
      self->next_number_ = std::max(self->next_number_, durable + 1);
      if (log.last_segment != kNoSegment) {
        self->next_number_ = std::max(self->next_number_, log.last_segment + 1);
      }
      self->durable_segments_.push_back(recovered.meta.log_segment());
      self->recovered_ = std::move(recovered);
    }
  }
  MERIDIAN_ASSIGN_OR_RETURN(std::vector<uint64_t> segments,
                            ListLogSegments(dir));
  if (!segments.empty()) {
    self->next_number_ = std::max(self->next_number_, segments.back() + 1);
  }
  LogWriterOptions log_options;
  log_options.fsync_each_append = self->options_.fsync_log;
  MERIDIAN_ASSIGN_OR_RETURN(
      self->log_,
      LogWriter::Open(dir, fingerprint, self->next_number_++, log_options));
  if (!self->log_->repair_note().empty()) {
    MLOG(WARNING) << "outgoing log: " << self->log_->repair_note();
  }
  CheckpointWriterOptions writer;
  writer.dir = dir;
  writer.durable_sequence = durable;
  self->writer_ = std::make_unique<CheckpointWriter>(std::move(writer));
  return self;
}

SiteCheckpointer::~SiteCheckpointer() = default;

Status SiteCheckpointer::Log(const pb::LoggedMessage& message) {
  const std::string bytes = message.SerializeAsString();
  return log_->Append(std::span<const std::byte>(
      reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
}

Status SiteCheckpointer::LogApplied(const pb::AppliedCommit& commit) {
  pb::LoggedMessage record;
  *record.mutable_applied_commit() = commit;
  return LogUnsynced(record);
}

Status SiteCheckpointer::LogRestart() {
  pb::LoggedMessage record;
  record.set_site_restarted(true);
  return LogUnsynced(record);
}

Status SiteCheckpointer::LogUnsynced(const pb::LoggedMessage& record) {
  const std::string bytes = record.SerializeAsString();
  return log_->AppendUnsynced(std::span<const std::byte>(
      reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
}

std::vector<uint64_t> SiteCheckpointer::Pending() const {
  const uint64_t settled = writer_->settled_sequence();
  std::vector<uint64_t> pending;
  for (const InFlight& submitted : in_flight_) {
    if (!submitted.replaced && submitted.sequence > settled) {
      pending.push_back(submitted.sequence);
    }
  }
  return pending;
}

bool SiteCheckpointer::Due(double now, bool wanted) const {
  if (last_checkpoint_s_ < 0) return true;
  const double since = now - last_checkpoint_s_;
  if (since >= options_.period_s) return true;
  // An early one only once the previous one is on disk: a snapshot taken
  // while it is written would replace nothing and double the work.
  return wanted && in_flight_.empty() &&
         since >= EarlyCheckpointSpacing(last_write_s(), options_.period_s);
}

uint64_t SiteCheckpointer::Submit(pb::SiteCheckpoint meta,
                                  std::vector<NamedArray> arrays, double now) {
  last_checkpoint_s_ = now;
  const uint64_t number = next_number_++;
  // Records appended from now on follow this snapshot.
  if (Status rotated = log_->Rotate(number); !rotated.ok()) {
    // The log keeps going in its old segment, which recovery from this
    // checkpoint would not read: better no checkpoint than a wrong one.
    MLOG(ERROR) << "checkpoint " << number
                << " skipped: cannot start a new log segment: " << rotated;
    return 0;
  }
  meta.set_log_segment(number);
  InFlight in_flight;
  in_flight.sequence = number;
  in_flight.log_segment = number;
  in_flight.sync = meta.sync();
  Checkpoint checkpoint;
  checkpoint.sequence = number;
  checkpoint.fingerprint = options_.fingerprint;
  checkpoint.meta = meta.SerializeAsString();
  checkpoint.arrays = std::move(arrays);
  if (writer_->Submit(std::move(checkpoint)) && !in_flight_.empty()) {
    // The writer held one checkpoint waiting, the newest submitted before
    // this one: it is never written now.
    in_flight_.back().replaced = true;
  }
  in_flight_.push_back(std::move(in_flight));
  return number;
}

std::optional<pb::SyncCheckpoint> SiteCheckpointer::TakeDurable() {
  const uint64_t durable = writer_->durable_sequence();
  std::optional<pb::SyncCheckpoint> newest;
  while (!in_flight_.empty() && in_flight_.front().sequence <= durable) {
    InFlight& done = in_flight_.front();
    if (done.sequence == durable) {
      newest = std::move(done.sync);
      durable_segments_.push_back(done.log_segment);
    }
    // A checkpoint replaced by a newer submission is never written; its
    // segment's records are covered by the newer one's.
    in_flight_.pop_front();
  }
  if (newest) {
    while (durable_segments_.size() > 2) durable_segments_.pop_front();
    // The fallback checkpoint (the older of the two kept) needs its log.
    if (Status pruned = PruneLog(options_.dir, durable_segments_.front());
        !pruned.ok()) {
      MLOG(WARNING) << "cannot delete old log segments: " << pruned;
    }
  }
  if (Status error = writer_->last_error(); !error.ok()) {
    if (write_errors_seen_++ % 100 == 0) {
      MLOG(ERROR) << "checkpoint write failed: " << error
                  << " (the site goes on; its durable point stays older)";
    }
  }
  return newest;
}

std::vector<NamedArray> StoreArrays(const ParameterStore& store,
                                    const SyncEngine* sync) {
  std::vector<NamedArray> arrays;
  NamedArray model{"model", std::vector<float>(store.num_elements())};
  store.Snapshot(model.values);
  arrays.push_back(std::move(model));
  std::vector<float> velocity = store.CopyVelocity();
  if (!velocity.empty()) arrays.push_back({"velocity", std::move(velocity)});
  if (sync != nullptr) {
    for (const auto& [peer, id] : sync->Accumulators()) {
      arrays.push_back({"acc/" + peer, store.CopyAccumulator(id)});
    }
    sync->AppendArrays(&arrays);
  }
  return arrays;
}

Status RestoreStoreArrays(const Checkpoint& checkpoint, uint64_t version,
                          ParameterStore* store, const SyncEngine* sync) {
  auto find = [&](const std::string& name) -> Result<const NamedArray*> {
    const NamedArray* array = checkpoint.Find(name);
    if (array == nullptr) {
      return DataLossError("the checkpoint has no array '" + name +
                           "': is it a checkpoint of this job's topology?");
    }
    if (array->values.size() != store->num_elements()) {
      return DataLossError("the checkpoint's array '" + name + "' has " +
                           std::to_string(array->values.size()) +
                           " elements, the model " +
                           std::to_string(store->num_elements()));
    }
    return array;
  };
  MERIDIAN_ASSIGN_OR_RETURN(const NamedArray* model, find("model"));
  const NamedArray* velocity = checkpoint.Find("velocity");
  if (velocity != nullptr) MERIDIAN_RETURN_IF_ERROR(find("velocity").status());
  MERIDIAN_RETURN_IF_ERROR(store->Restore(
      model->values,
      velocity != nullptr ? std::span<const float>(velocity->values)
                          : std::span<const float>(),
      version));
  if (sync != nullptr) {
    for (const auto& [peer, id] : sync->Accumulators()) {
      MERIDIAN_ASSIGN_OR_RETURN(const NamedArray* acc, find("acc/" + peer));
      MERIDIAN_RETURN_IF_ERROR(store->RestoreAccumulator(id, acc->values));
    }
  }
  return Status::Ok();
}

}  // namespace meridian
