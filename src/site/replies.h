// The answers to workers: WELCOME (a join) and MODEL (a commit or a pull),
// built so that the store fills their frames in place, and delivered over
// the worker endpoint — or held while the inter-site sync does not allow
// the read (Gaia's DS bound, an averaging round, a selective barrier) and
// released when it does, with a log line that says why a stalled site
// waits.
//
// Ownership and threads: owned by SiteServer::Impl, driven by its event
// loop alone. What each worker waits for is its WorkerSlot's (pending,
// held, read_ranges, read_rows), not this class's. Size: one reply is
// built at a time; a reply carries at most the model, or what a PULL may
// ask (server.limits.max_reply_floats).
#ifndef MERIDIAN_SITE_REPLIES_H_
#define MERIDIAN_SITE_REPLIES_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/ps/param_store.h"
#include "meridian/sched/policy.h"
#include "site/site_clock.h"
#include "site/site_context.h"
#include "site/site_state.h"
#include "site/worker_endpoint.h"
#include "site/worker_table.h"
#include "sync/sync_engine.h"

namespace meridian {

class Replies {
 public:
  // Not owned, all outliving this: `policy` gives each reply its plan,
  // `sync` (null for a site that syncs with nobody) says which reads it
  // allows.
  Replies(const SiteContext& site, WorkerEndpoint* endpoint,
          WorkerTable* workers, const ParameterStore* store,
          const IntraSitePolicy* policy, SyncEngine* sync,
          const TrainingPhase* phase, const SiteClock* clock);
  Replies(const Replies&) = delete;
  Replies& operator=(const Replies&) = delete;

  // A reply carrying model values: one payload frame per slice, and the
  // store reads that fill the frames in place.
  struct ModelReply {
    pb::Header header;
    std::vector<zmq::message_t> frames;
    std::vector<ReadSegment> reads;
  };

  // A reply of `type` for the slices `ranges` (validated; empty: every
  // tensor whole) or, when `rows` (a commit's validated reads, one entry
  // per tensor) is not empty, CODEC_ROWS slices of those rows and the
  // other tensors whole.
  ModelReply NewModelReply(pb::MessageType type,
                           std::span<const pb::TensorSlice> ranges = {},
                           const RowReads& rows = {});
  // Completes and sends a MODEL reply whose frames hold the model at
  // `version`.
  void SendModelReply(uint32_t worker, uint64_t version, ModelReply reply);

  // Answers `worker`'s pending request as its kind says: a HELLO with
  // WELCOME, a COMMIT or PULL with MODEL (after the end of the job: stop).
  void SendReply(uint32_t worker);
  // Answers a released worker now, or holds the answer until the sync
  // allows what it reads.
  void Answer(uint32_t worker);
  // Answers every held worker the sync now allows; says why the others
  // wait once they have waited long.
  void ReleaseHeld();
  // The end of the job: nothing is held any more; every live worker
  // awaiting an answer gets it.
  void AnswerAllWaiting();

  // Whether a worker may get the whole model now (the sync's DS bound,
  // averaging round and selective barrier).
  bool ReadsAllowed() const;

 private:
  // The same for what `worker`'s pending request reads.
  bool ReadsAllowed(uint32_t worker) const;
  // The body of NewModelReply for row reads.
  ModelReply RowsReply(ModelReply reply, const RowReads& rows);
  // The model, the plan, and what the site applied of the worker's
  // process. After the end of the job it says stop (the worker may still
  // send an unapplied commit).
  void SendWelcome(uint32_t worker);
  void SendModel(uint32_t worker);
  void Deliver(uint32_t worker, const pb::Header& header,
               std::vector<zmq::message_t> frames);
  // Says, at growing intervals from kHeldNoticeS on, why `held` workers
  // are held, the longest for `longest_s` (the sync's DS bound, round or
  // barrier: its clocks and each peer's channel), so a stalled job
  // explains itself in the log.
  void NoteHeldWorkers(int held, double longest_s, double now);

  static constexpr double kHeldNoticeS = 5.0;

  const SiteContext& site_;
  WorkerEndpoint* const endpoint_;
  WorkerTable* const workers_;
  const ParameterStore* const store_;  // reads are thread-safe
  const IntraSitePolicy* const policy_;
  SyncEngine* const sync_;
  const TrainingPhase* const phase_;
  const SiteClock* const clock_;
  WaitNotice held_notice_{1.0, 60.0};
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_REPLIES_H_
