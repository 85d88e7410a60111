// The worker's commit cycle: when the site's plan says (CommitTrigger), it
// sends the change since the model it last loaded, with an id, and — for
// a sparse model — the rows its next batches will read; until that commit
// is answered it rejoins whenever the server is gone and sends it again
// unless the site says it was applied; then it loads the answer (or, after
// a refusal, pulls the model) and follows the plan that came with it.
// When the site keeps checkpoints, the changes of answered commits it does
// not hold durably yet are kept (UndurableCommits) and, after every rejoin,
// replayed above the site's WELCOME.last_commit_id before anything else
// (a site restarted from a checkpoint lacks them).
//
// Ownership and threads: owned by Worker::Impl and driven by the worker's
// thread alone. Holds no decoded state: a reply is parsed and loaded in
// one call. Size: the plan, counters, one model of floats (the change of
// the commit in flight) and UndurableCommits' bound.
#ifndef MERIDIAN_WORKER_COMMITTER_H_
#define MERIDIAN_WORKER_COMMITTER_H_

#include <cstdint>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/clock.h"
#include "meridian/core/status.h"
#include "meridian/net/transport.h"
#include "meridian/sched/policy.h"
#include "meridian/train/model.h"
#include "meridian/wire.pb.h"
#include "worker/model_replica.h"
#include "worker/site_connection.h"
#include "worker/training_batches.h"
#include "worker/undurable_commits.h"

namespace meridian {

class Committer {
 public:
  // Not owned, all outliving this. `stats` are the worker's (commits,
  // bytes and round trips counted here; the rest sent along).
  Committer(const Model* model, ModelReplica* replica, TrainingBatches* batches,
            SiteConnection* connection, pb::WorkerStats* stats, Clock* clock);
  Committer(const Committer&) = delete;
  Committer& operator=(const Committer&) = delete;

  // Loads the model of a WELCOME or MODEL `reply` at `version` into the
  // replica (ParseModelPayload; errors name what is wrong with it) and
  // follows `plan` from now on.
  Status Adopt(const Envelope& reply, uint64_t version,
               const pb::CommitPlan& plan);

  // One local step finished: true when the plan says to commit now.
  bool OnStep(Duration now) { return trigger_.OnStep(now); }

  // Sends the accumulated change and loads the reply. Returns false when
  // the job is over (the worker has said BYE). Errors: the server keeps
  // refusing commits, answers nonsense, or stays gone.
  Result<bool> Commit();

 private:
  // A sparse model plans its next batches now, at a commit, and asks the
  // server for their rows: as many batches as the plan's local steps (or
  // the steps of the round just ended, when the plan is time-driven), at
  // most kMaxPlannedSamples samples. Dense models ask for the whole model
  // (no reads).
  google::protobuf::RepeatedPtrField<pb::RowRead> PlanReads();
  // A COMMIT of the change since the last pull, computed from
  // `base_version`, with id `commit_id`, asking for `reads`.
  std::pair<pb::Header, std::vector<zmq::message_t>> BuildCommit(
      uint64_t commit_id, uint64_t base_version,
      const google::protobuf::RepeatedPtrField<pb::RowRead>& reads);
  // The answer to a commit was a refusal: the update is dropped; says so
  // and resynchronises, unless the server keeps refusing.
  Status OnRefused(const pb::Error& error);
  // Fetches the current model (after a refused commit).
  Status Pull();
  // SiteConnection::Rejoin, then the replay of the kept commits the
  // WELCOME shows the site lacks; rejoins again when the site goes away
  // meanwhile. Returns the last WELCOME.
  Result<Envelope> RejoinAndReplay(std::string why, Duration absent_since);
  // Replays the kept commits above `welcome`'s last_commit_id, oldest
  // first, each sum as one COMMIT with replay_first_id. Returns why to
  // rejoin (empty: done). A replay the site refuses, or cannot take
  // (the job is over), is logged and dropped: the site counts it lost.
  Result<std::string> Replay(const pb::Welcome& welcome);
  std::pair<pb::Header, std::vector<zmq::message_t>> BuildReplay(
      const UndurableCommits::Kept& kept, uint64_t base_version) const;
  // Commit `commit_id` was answered by `reply`: its change is kept until
  // the site holds it durably.
  void KeepAnswered(uint64_t commit_id, const pb::Header& reply);
  // Time waiting for a commit's answer (blocked, and the smoothed round
  // trip the worker reports).
  void RecordRoundTrip(Duration sent);

  const Model* const model_;
  ModelReplica* const replica_;
  TrainingBatches* const batches_;
  SiteConnection* const connection_;
  pb::WorkerStats* const stats_;
  Clock* const clock_;
  CommitTrigger trigger_;
  // The id of the last commit (1, 2, 3 ...; a commit sent again keeps its
  // id).
  uint64_t last_commit_id_ = 0;
  int consecutive_rejections_ = 0;
  // Whether the site tells durable points (it keeps checkpoints): from the
  // last WELCOME or MODEL loaded.
  bool keep_ = false;
  std::vector<float> change_;  // of the commit in flight, when keep_
  UndurableCommits undurable_;
};

// Exponential smoothing of the reported training loss and commit overhead.
double Ema(double previous, double sample, bool first);

}  // namespace meridian

#endif  // MERIDIAN_WORKER_COMMITTER_H_
