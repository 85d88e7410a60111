#include "worker/committer.h"

#include <algorithm>
#include <string>

#include "meridian/core/log.h"
#include "meridian/net/message.h"

namespace meridian {
namespace {

// Consecutive refused commits after which the worker gives up.
constexpr int kMaxConsecutiveRejections = 5;
// Smoothing of the reported training loss and commit overhead.
constexpr double kEmaWeight = 0.1;
// Most samples a sparse model's worker plans ahead (and asks its server the
// rows of) at a commit.
constexpr uint64_t kMaxPlannedSamples = uint64_t{1} << 20;

// The durable point a WELCOME or MODEL carries (null: none, the site keeps
// no checkpoints).
const pb::DurablePoint* DurablePointOf(const pb::Header& reply) {
  if (reply.has_welcome() && reply.welcome().has_durable()) {
    return &reply.welcome().durable();
  }
  if (reply.has_model() && reply.model().has_durable()) {
    return &reply.model().durable();
  }
  return nullptr;
}

}  // namespace

double Ema(double previous, double sample, bool first) {
  return first ? sample : (1 - kEmaWeight) * previous + kEmaWeight * sample;
}

Committer::Committer(const Model* model, ModelReplica* replica,
                     TrainingBatches* batches, SiteConnection* connection,
                     pb::WorkerStats* stats, Clock* clock)
    : model_(model),
      replica_(replica),
      batches_(batches),
      connection_(connection),
      stats_(stats),
      clock_(clock),
      undurable_(model->layout().num_elements()) {}

Status Committer::Adopt(const Envelope& reply, uint64_t version,
                        const pb::CommitPlan& plan) {
  const std::vector<FrameView> frames = ViewFrames(reply.payload);
  const Parsed<ModelPayload> payload =
      ParseModelPayload(reply.header, frames, model_->layout());
  if (!payload.ok()) {
    return payload.rejection().ToStatus().WithContext(
        "model from the site server");
  }
  replica_->Load(*payload, version);
  trigger_.Reset(plan, clock_->Now());
  const pb::DurablePoint* point = DurablePointOf(reply.header);
  keep_ = point != nullptr;
  if (keep_) {
    undurable_.OnDurablePoint(*point);
  } else {
    undurable_.Clear();
  }
  return Status::Ok();
}

void Committer::KeepAnswered(uint64_t commit_id, const pb::Header& reply) {
  const pb::DurablePoint* point = DurablePointOf(reply);
  if (!keep_ || point == nullptr) return;
  undurable_.Add(commit_id, &change_, *point);
}

std::pair<pb::Header, std::vector<zmq::message_t>> Committer::BuildReplay(
    const UndurableCommits::Kept& kept, uint64_t base_version) const {
  pb::Header header;
  header.set_type(pb::COMMIT);
  header.set_clock(static_cast<int64_t>(stats_->commits()));
  std::vector<zmq::message_t> frames;
  for (const TensorInfo& tensor : model_->layout().tensors()) {
    zmq::message_t frame = MakeFloatFrame(tensor.size);
    std::copy_n(kept.sum.begin() + static_cast<ptrdiff_t>(tensor.offset),
                tensor.size, static_cast<float*>(frame.data()));
    frames.push_back(std::move(frame));
    AddTensorSlice(tensor, &header);
  }
  pb::Commit* commit = header.mutable_commit();
  commit->set_base_version(base_version);
  commit->set_commit_id(kept.last_id);
  commit->set_replay_first_id(kept.first_id);
  *commit->mutable_stats() = *stats_;
  return {std::move(header), std::move(frames)};
}

Result<std::string> Committer::Replay(const pb::Welcome& welcome) {
  if (!welcome.has_durable()) {
    undurable_.Clear();
    return std::string();
  }
  const uint64_t applied = welcome.last_commit_id();
  for (size_t i = 0; i < undurable_.kept().size(); ++i) {
    const UndurableCommits::Kept& kept = undurable_.kept()[i];
    if (kept.last_id <= applied) continue;
    const std::string range = std::to_string(kept.first_id) + " to " +
                              std::to_string(kept.last_id);
    if (kept.first_id <= applied || welcome.stop()) {
      MLOG(ERROR) << "commits " << range << " were answered but the site "
                  << "lost them in a restart, and they cannot be replayed ("
                  << (welcome.stop() ? "the job is over"
                                     : "it holds commits up to " +
                                           std::to_string(applied))
                  << ")";
      continue;
    }
    auto [header, frames] = BuildReplay(kept, welcome.model_version());
    Result<Envelope> reply =
        connection_->Call(std::move(header), std::move(frames));
    if (std::string why = SiteConnection::RejoinReason(reply); !why.empty()) {
      return why;
    }
    if (!reply.ok()) return reply.status();
    if (reply->header.type() == pb::ERROR) {
      MLOG(ERROR) << "the site refused the replay of commits " << range
                  << ", which it had answered before a restart: "
                  << pb::ErrorCode_Name(reply->header.error().code()) << ": "
                  << reply->header.error().message();
      continue;
    }
    MLOG(INFO) << "replayed commits " << range << ", answered before the "
               << "site restarted and missing from its checkpoint";
  }
  return std::string();
}

Result<Envelope> Committer::RejoinAndReplay(std::string why,
                                            Duration absent_since) {
  for (;;) {
    MERIDIAN_ASSIGN_OR_RETURN(Envelope welcome,
                              connection_->Rejoin(why, absent_since));
    MERIDIAN_ASSIGN_OR_RETURN(why, Replay(welcome.header.welcome()));
    if (why.empty()) return welcome;
    absent_since = clock_->Now();
  }
}

google::protobuf::RepeatedPtrField<pb::RowRead> Committer::PlanReads() {
  google::protobuf::RepeatedPtrField<pb::RowRead> reads;
  if (model_->SparseRows() == nullptr) return reads;
  const uint64_t steps = std::max<uint64_t>(
      {trigger_.plan().local_steps(), trigger_.steps_since_commit(), 1});
  const uint64_t wanted =
      std::min<uint64_t>(steps * batches_->batch_size(), kMaxPlannedSamples);
  std::vector<ElementRange> ranges;
  model_->SampleRows(batches_->PlanAhead(wanted), &ranges);
  const std::vector<TensorInfo>& tensors = model_->layout().tensors();
  std::vector<pb::RowRead*> by_tensor(tensors.size(), nullptr);
  ForEachRow(model_->layout(), ranges, [&](size_t t, uint32_t row) {
    if (by_tensor[t] == nullptr) {
      by_tensor[t] = reads.Add();
      by_tensor[t]->set_tensor(tensors[t].name);
    }
    by_tensor[t]->add_rows(row);  // ascending: the ranges are
  });
  // Tensors the batches do not read at all come as no rows, not whole.
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (by_tensor[t] == nullptr && RowLength(tensors[t]) > 0) {
      reads.Add()->set_tensor(tensors[t].name);
    }
  }
  return reads;
}

std::pair<pb::Header, std::vector<zmq::message_t>> Committer::BuildCommit(
    uint64_t commit_id, uint64_t base_version,
    const google::protobuf::RepeatedPtrField<pb::RowRead>& reads) {
  pb::Header header;
  header.set_type(pb::COMMIT);
  header.set_clock(static_cast<int64_t>(stats_->commits()));
  std::vector<zmq::message_t> frames =
      replica_->UpdateFrames(model_->SparseRows() != nullptr, &header);
  uint64_t bytes = 0;
  for (const zmq::message_t& frame : frames) bytes += frame.size();
  stats_->set_commit_bytes(stats_->commit_bytes() + bytes);
  pb::Commit* commit = header.mutable_commit();
  commit->set_base_version(base_version);
  commit->set_local_steps(trigger_.steps_since_commit());
  commit->set_commit_id(commit_id);
  *commit->mutable_reads() = reads;
  *commit->mutable_stats() = *stats_;
  return {std::move(header), std::move(frames)};
}

Result<bool> Committer::Commit() {
  const google::protobuf::RepeatedPtrField<pb::RowRead> reads = PlanReads();
  const uint64_t commit_id = ++last_commit_id_;
  if (keep_) replica_->ChangeInto(&change_);
  const Duration sent = clock_->Now();
  auto [header, frames] =
      BuildCommit(commit_id, replica_->base_version(), reads);
  Result<Envelope> reply =
      connection_->Call(std::move(header), std::move(frames));
  // Until the commit is answered: rejoin whenever the server is gone, and
  // send the commit again (same id, rebased) unless the site says it was
  // applied.
  for (std::string why = SiteConnection::RejoinReason(reply); !why.empty();
       why = SiteConnection::RejoinReason(reply)) {
    const Duration absent_since =
        reply.ok() ? clock_->Now() : connection_->ServerSilentSince();
    MERIDIAN_ASSIGN_OR_RETURN(Envelope welcome,
                              RejoinAndReplay(why, absent_since));
    const pb::Welcome& w = welcome.header.welcome();
    if (commit_id <= w.last_commit_id()) {
      // Applied before the answer was lost: the WELCOME is its answer.
      MLOG(INFO) << "commit " << commit_id << " was applied before the "
                 << "connection was lost";
      KeepAnswered(commit_id, welcome.header);
      RecordRoundTrip(sent);
      stats_->set_commits(stats_->commits() + 1);
      consecutive_rejections_ = 0;
      if (w.stop()) {
        connection_->Leave(*stats_, "the job is over");
        return false;
      }
      MERIDIAN_RETURN_IF_ERROR(Adopt(welcome, w.model_version(), w.plan()));
      return true;
    }
    MLOG(INFO) << "commit " << commit_id << " was not applied (the site "
               << "applied up to " << w.last_commit_id()
               << "): sending it again on model version " << w.model_version();
    auto [again, again_frames] =
        BuildCommit(commit_id, w.model_version(), reads);
    reply = connection_->Call(std::move(again), std::move(again_frames));
  }
  if (!reply.ok()) return reply.status();
  RecordRoundTrip(sent);
  if (reply->header.type() == pb::ERROR) {
    MERIDIAN_RETURN_IF_ERROR(OnRefused(reply->header.error()));
    return true;
  }
  consecutive_rejections_ = 0;
  if (reply->header.type() != pb::MODEL) {
    return DataLossError("expected MODEL, got " +
                         DescribeHeader(reply->header));
  }
  stats_->set_commits(stats_->commits() + 1);
  KeepAnswered(commit_id, reply->header);
  const pb::Model& model = reply->header.model();
  if (model.stop()) {
    connection_->Leave(*stats_, model.stop_reason());
    return false;
  }
  MERIDIAN_RETURN_IF_ERROR(Adopt(*reply, model.version(), model.plan()));
  return true;
}

Status Committer::OnRefused(const pb::Error& error) {
  // The update is dropped; say so, resynchronise and go on, unless the
  // server keeps refusing (then something is really wrong).
  MLOG(ERROR) << "commit of " << trigger_.steps_since_commit()
              << " steps dropped by the site server: "
              << pb::ErrorCode_Name(error.code()) << ": " << error.message();
  if (++consecutive_rejections_ >= kMaxConsecutiveRejections) {
    return FailedPreconditionError(
        "site server refused " + std::to_string(consecutive_rejections_) +
        " commits in a row; last: " + error.message());
  }
  return Pull();
}

void Committer::RecordRoundTrip(Duration sent) {
  const double round_trip = ToSeconds(clock_->Now() - sent);
  stats_->set_blocked_s(stats_->blocked_s() + round_trip);
  stats_->set_commit_overhead_s(
      Ema(stats_->commit_overhead_s(), round_trip, stats_->commits() == 0));
}

Status Committer::Pull() {
  pb::Header header;
  header.set_type(pb::PULL);
  header.mutable_pull();
  Result<Envelope> answer = connection_->Call(header);
  if (const std::string why = SiteConnection::RejoinReason(answer);
      !why.empty()) {
    MERIDIAN_ASSIGN_OR_RETURN(
        Envelope welcome,
        RejoinAndReplay(why, answer.ok() ? clock_->Now()
                                         : connection_->ServerSilentSince()));
    const pb::Welcome& w = welcome.header.welcome();
    // After the end the next commit is answered with stop.
    if (w.stop()) return Status::Ok();
    return Adopt(welcome, w.model_version(), w.plan());
  }
  MERIDIAN_ASSIGN_OR_RETURN(Envelope reply, std::move(answer));
  if (reply.header.type() != pb::MODEL) {
    return DataLossError("expected MODEL for PULL, got " +
                         DescribeHeader(reply.header));
  }
  if (reply.header.model().stop()) return Status::Ok();
  return Adopt(reply, reply.header.model().version(),
               reply.header.model().plan());
}

}  // namespace meridian
