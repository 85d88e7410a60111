// The site server's table of its workers: who holds each slot (which
// process incarnation, over which connection), whether it is live, what it
// asked for that is not answered yet, and which of its commits were
// applied. It decides membership (HELLO), admits requests (sender,
// connection, sequence), detects silent workers and keeps the commit-id
// bookkeeping that makes a commit sent again after a reconnect apply once.
//
// Ownership and threads: owned by the site server's Impl and used by its
// event loop alone; not thread-safe. Time is seconds on the server's
// (injected) clock, passed in by the caller.
// Size: one slot per worker the job gives the server (fixed at
// construction); per slot at most kMaxRetiredIncarnations remembered
// incarnations and one pending request.
// Crash: the table lives in memory only. A restarted site server starts
// with every slot absent; its workers rejoin with their incarnations and
// send again a commit they got no answer to (WELCOME.last_commit_id 0).
// CommitRecords()/RestoreCommitRecords() carry what a checkpoint needs to
// keep "applied once" across a restart as well.
#ifndef MERIDIAN_SITE_WORKER_TABLE_H_
#define MERIDIAN_SITE_WORKER_TABLE_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meridian/net/message.h"
#include "meridian/wire.pb.h"

namespace meridian {

// A slot's membership. kAbsent -> kLive (HELLO) -> kDead (silent past the
// timeout) -> kLive (HELLO: the same incarnation back, or a restart) ...;
// kLive -> kLeft (BYE); kLeft -> kLive only with a new incarnation.
enum class SlotState { kAbsent, kLive, kDead, kLeft };

// The request of a slot that is not answered yet. kHello is answered with
// WELCOME (a join, or a worker that came back while its request was held:
// the answer then goes to its new connection as a WELCOME), the others
// with MODEL.
enum class Pending { kNone, kHello, kCommit, kPull };

struct WorkerSlot {
  // Identity (fixed).
  std::string site;    // the worker's own site (may differ from the server's)
  uint32_t index = 0;  // inside that site
  double step_time_s = 0;
  std::string Name() const { return site + "/" + std::to_string(index); }

  // Membership.
  SlotState state = SlotState::kAbsent;
  // The process holding the slot (HELLO.incarnation; 0: a client that does
  // not send one) and the connection it spoke over last.
  uint64_t incarnation = 0;
  std::string routing_id;
  uint32_t incarnations = 0;  // processes that joined as this worker
  bool ever_joined = false;
  // Incarnations this slot replaced (newest last); their HELLOs are
  // refused, so two processes started with one index cannot take the slot
  // from each other in turn.
  std::deque<uint64_t> retired;

  // Liveness (seconds on the server's clock).
  double last_heard_s = 0;  // any message over the slot's connection
  double last_sent_s = 0;   // anything sent to it (replies, heartbeats)
  double dead_since_s = 0;

  // Requests.
  uint64_t last_sequence = 0;  // of the last accepted request
  Pending pending = Pending::kNone;
  // Its answer is ready but held by the sync (DS bound etc.) since then.
  bool held = false;
  double held_since_s = 0;
  // What its pending PULL reads; empty: everything.
  std::vector<pb::TensorSlice> read_ranges;
  // The rows its pending COMMIT's answer carries, per tensor (Commit.reads;
  // nullopt for a tensor sent whole); empty: the whole model. Bounded by
  // the model's rows.
  std::vector<std::optional<std::vector<uint32_t>>> read_rows;

  // Commits.
  uint64_t last_commit_id = 0;     // highest applied id of the incarnation
  uint64_t commits_applied = 0;    // every incarnation's, applied here
  uint64_t duplicate_commits = 0;  // ids seen again, answered, not applied
  // As the current incarnation last reported, and the sum of what earlier
  // incarnations reported.
  pb::WorkerStats stats;
  pb::WorkerStats retired_stats;
  // What of the current incarnation's commits the site holds durably
  // (set by SiteDurability, sent with every WELCOME and MODEL when the
  // site keeps checkpoints): the highest id in the newest durable
  // checkpoint, and in each checkpoint being written (ascending, at most
  // two).
  uint64_t durable_commit_id = 0;
  std::vector<uint64_t> pending_durable;

  bool awaiting_reply() const { return pending != Pending::kNone; }
};

// What a HELLO did to its slot.
struct Admission {
  enum class Kind {
    kJoined,       // first process of a slot that was absent
    kReconnected,  // the live incarnation over a new connection
    kRejoined,     // the same incarnation back after it was declared dead
    kRestarted,    // a new incarnation took the slot (the old one is gone)
    kRefused,      // see `refusal`
  };
  Kind kind = Kind::kRefused;
  SlotState previous = SlotState::kAbsent;
  // kReconnected: the slot had a request pending, whose answer now goes to
  // the new connection as a WELCOME. Otherwise the caller answers.
  bool request_pending = false;
  // kRestarted from kLive: the old incarnation's unanswered request, now
  // dropped (never answered).
  Pending dropped = Pending::kNone;
  // kRejoined, or kRestarted from kDead: seconds it was dead.
  double dead_s = 0;
  Rejection refusal;
};

// A slot's commit-id bookkeeping, for checkpoints.
struct CommitRecord {
  uint64_t incarnation = 0;
  uint64_t last_commit_id = 0;
  // For the report after a restart: what the slot had applied and its
  // processes had reported.
  uint64_t commits_applied = 0;
  uint32_t incarnations = 0;
  pb::WorkerStats stats;
  pb::WorkerStats retired_stats;
};

// How far above the last accepted sequence number a request's may be
// (HELLO excepted: it starts the count afresh). Requests come one at a
// time, so a well-behaved worker steps by 1 (a few after a timeout).
inline constexpr uint64_t kMaxSequenceStep = uint64_t{1} << 20;

class WorkerTable {
 public:
  static constexpr size_t kMaxRetiredIncarnations = 8;

  // `slots`: identity fields set, in the policy's order. `server`: the
  // site server's name, for refusals. A worker silent for
  // `worker_timeout_s` is declared dead.
  WorkerTable(std::vector<WorkerSlot> slots, std::string server,
              double worker_timeout_s);

  uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }
  WorkerSlot& operator[](uint32_t slot) { return slots_[slot]; }
  const WorkerSlot& operator[](uint32_t slot) const { return slots_[slot]; }
  const std::vector<WorkerSlot>& slots() const { return slots_; }

  // The slot of worker (site, index), if this server serves it.
  std::optional<uint32_t> Find(const std::string& site, uint32_t index) const;
  // Whether a live or dead slot spoke over `routing_id` last: the
  // connection of a worker that joined (RequestIntake serves it first).
  bool IsWorkerConnection(const std::string& routing_id) const;
  // "a/0, a/1, ..." of every slot, or of the slots not live.
  std::string Describe() const;
  std::string DescribeNotLive() const;

  uint32_t Count(SlotState state) const;
  uint32_t LiveCount() const { return Count(SlotState::kLive); }
  // Slots that have ever been held (a status's workers_joined).
  uint32_t JoinedCount() const;
  // Every slot said BYE (dead and absent slots may still come back).
  bool AllLeft() const { return Count(SlotState::kLeft) == size(); }
  // Nobody is live: every slot left, is dead or never came.
  bool NoneLive() const { return LiveCount() == 0; }

  // A HELLO of `incarnation` for `slot` over `routing_id` at `now_s`
  // (sender and layout already checked). On success the slot is live with
  // a pending HELLO (or, kReconnected, its earlier pending request), its
  // sequence restarted from the HELLO's.
  Admission Admit(uint32_t slot, uint64_t incarnation,
                  const std::string& routing_id, uint64_t sequence,
                  double now_s);

  // The slot of a request (COMMIT, PULL, BYE) from a live worker over its
  // current connection, with a sequence number above its last and no
  // request pending (unless `allow_pending`: a BYE may come while one is)
  // — or why it is refused. Any message over the slot's current
  // connection refreshes its liveness, refused or not.
  struct Checked {
    std::optional<uint32_t> slot;
    Rejection refusal;
  };
  Checked CheckRequest(const pb::Header& header, const std::string& routing_id,
                       double now_s, bool allow_pending = false);

  // A HEARTBEAT: refreshes the sender's liveness when it comes over its
  // slot's current connection and returns true; false for a worker this
  // table does not know over that connection (the server restarted, or
  // declared it dead): the server tells it to rejoin.
  bool OnHeartbeat(const pb::Header& header, const std::string& routing_id,
                   double now_s);

  // A worker declared dead, and the request of its that will never be
  // answered now.
  struct Death {
    uint32_t slot = 0;
    Pending dropped = Pending::kNone;
    double silent_s = 0;
  };
  // Marks the end of one look at the clock by the event loop and returns
  // the workers it declares dead now: live workers silent for more than
  // the timeout (their pending request is dropped). When the loop itself
  // was stalled (stopped, starved) for more than a quarter of the timeout
  // since the previous call, nobody is declared dead: every live worker
  // gets a fresh window and `*stalled_s` says how long the stall was.
  std::vector<Death> CheckLiveness(double now_s, double* stalled_s);

  // Declares the live worker in `slot` dead now, for another reason than
  // silence (it does not read its replies): as CheckLiveness does, its
  // pending request is dropped. It must join again (HELLO).
  Death DeclareDead(uint32_t slot, double now_s);

  // Live workers whose reply the server holds and that were sent nothing
  // for `interval_s`: they are due a HEARTBEAT.
  std::vector<uint32_t> DueForHeartbeat(double now_s, double interval_s) const;

  // Something was sent to `slot` (a reply clears its pending request).
  void NoteSent(uint32_t slot, double now_s) {
    slots_[slot].last_sent_s = now_s;
  }
  void NoteAnswered(uint32_t slot, double now_s);

  // BYE: the slot is left; its request (the BYE) answered by the caller.
  void Leave(uint32_t slot);

  // Commit ids (0: a client without ids; never a duplicate).
  bool IsDuplicate(uint32_t slot, uint64_t commit_id) const;
  void RecordApplied(uint32_t slot, uint64_t commit_id);
  // A replay of the slot's commits `first_id` .. `last_id` was applied
  // (one update, that many commits).
  void RecordReplayed(uint32_t slot, uint64_t first_id, uint64_t last_id);
  void RecordDuplicate(uint32_t slot) { ++slots_[slot].duplicate_commits; }
  uint64_t duplicate_commits() const;

  // What a checkpoint keeps per slot, and putting it back into a fresh
  // table (slots stay absent; the same incarnation rejoining is told what
  // was applied).
  std::vector<CommitRecord> CommitRecords() const;
  void RestoreCommitRecords(std::span<const CommitRecord> records);

  // The worker's statistics over all its incarnations (the report's).
  static pb::WorkerStats TotalStats(const WorkerSlot& slot);

  // Whether replies tell each worker its durable point (the site keeps
  // checkpoints: SiteDurability turns it on), and the point of `slot`.
  void EnableDurablePoints() { durable_points_ = true; }
  bool durable_points() const { return durable_points_; }
  pb::DurablePoint DurablePointOf(uint32_t slot) const;

 private:
  std::vector<WorkerSlot> slots_;
  std::string server_;
  double worker_timeout_s_;
  double last_check_s_ = -1;  // the previous CheckLiveness, -1: none yet
  bool durable_points_ = false;
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_WORKER_TABLE_H_
