// DiLoCo's outer optimisation across sites (sync.kind DILOCO; Douillard et
// al., "DiLoCo: Distributed Low-Communication Training of Language Models",
// 2023, and "Streaming DiLoCo", 2025). Every site trains its own replica
// for H clocks (the inner steps: its workers under the job's policy), then
// sends its outer gradient Δ = anchor - model (anchor: the model after the
// last outer step, identical at every site), coded like an update (int8,
// int4, ...). Once a round has every site's Δ, each site averages them and
// takes an SGD step with (Nesterov) momentum on the anchor:
//     m ← μ·m + mean(Δ);  anchor ← anchor - lr·(mean(Δ) + μ·m)   (Nesterov)
//                          anchor ← anchor - lr·m                 (plain)
// With `fragments` F > 1 the model is cut into F element ranges whose
// rounds are staggered every H/F clocks (Streaming DiLoCo's fragments).
// MODEL_AVERAGING (FedAvg) is the special case lr 1, no momentum, one
// fragment: the new anchor is the mean of the sites' models.
//
// This site's model after a round: new anchor + (model now - base), base =
// anchor - Δ̂ (Δ̂: its own Δ as the peers decode it). What the workers
// committed after Δ was taken is kept, and so is what the coding of Δ lost
// (error feedback: it goes out with the next round's Δ). Nothing the
// workers committed is dropped.
//
// Adaptive period (SkewScout's knob, sync.skewscout under MODEL_AVERAGING
// or DILOCO with one fragment): rounds are not at fixed multiples of H.
// Each site sends, with its Δ of a round, the period its controller
// proposes; when the round closes every site has the same proposals and
// takes the shortest (within [min_period, max_period]) as the clocks from
// this round to the next. So the sites agree on every round's clock with
// no coordinator and no extra message, and the site whose data loses most
// to skew sets the pace. A peer can be at most one round ahead (its next
// round needs this site's Δ of the current one), whose clock this site
// cannot check until its own round closes: such a round is accepted
// within max_period clocks of the open one and dropped, counted, once the
// agreed schedule passes its clock without a round there (only a peer
// that computed another period sends one). A restarted site replays its
// own rounds sent after its checkpoint from its outgoing log: those may
// lie several rounds ahead; they agree with the schedule because the
// peers resend the same proposals.
//
// Error feedback (sync.diloco.error_feedback, SparseLoCo): the residual e
// (1 × model) is kept here with the anchor, and saved and restored with it
// ("outer/residual"): it survives a site restart. A round recovered from
// the outgoing log (a crash after the send, before the next checkpoint)
// measures Δ from the restored model, as its base does.
//
// Ownership and threads: owned by the sync engine, used on its event loop
// only (not thread-safe). Size: anchor and momentum (2 × model), plus per
// open round a sum and a base of its fragment; rounds accepted lie within
// two periods of this site's clock, so at most 3 rounds per fragment exist
// (≤ 8 × model in all, 4 × in practice); with an adaptive period at most
// one open round and one per peer ahead of it. Crash: SaveTo/RestoreFrom put
// all of it in the site server's checkpoint (arrays "outer/..."); a round's Δ
// sent after the checkpoint is recovered from the outgoing log (AddOwn with the
// restored model as base), so the anchor every site computes stays the same.
#ifndef MERIDIAN_SYNC_OUTER_STEPS_H_
#define MERIDIAN_SYNC_OUTER_STEPS_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "meridian/checkpoint.pb.h"
#include "meridian/job.pb.h"
#include "meridian/ps/param_store.h"
#include "meridian/core/status.h"
#include "durable/checkpoint.h"

namespace meridian {

struct OuterStepOptions {
  uint32_t period = 50;  // H: clocks between two rounds of one fragment
  uint32_t fragments = 1;
  double lr = 0.7;        // outer learning rate
  double momentum = 0.9;  // μ
  bool nesterov = true;
  uint32_t peers = 0;  // other sites whose Δ every round needs
  // An adaptive period (fragments 1): `period` is the first one, and a
  // round's agreed period is clamped into [min_period, max_period].
  bool adaptive = false;
  uint32_t min_period = 1;
  uint32_t max_period = 1;
  // SparseLoCo's error feedback (sync.diloco.error_feedback): a residual
  // e per parameter, decayed by `feedback_decay` (β) every round.
  bool error_feedback = false;
  double feedback_decay = 1.0;
};

// Whether sites of this sync kind exchange outer gradients in rounds:
// DILOCO and MODEL_AVERAGING.
bool HasOuterRounds(pb::SyncKind kind);

// The options of `sync` (averaging_period and sync.diloco; for
// MODEL_AVERAGING lr 1, no momentum, one fragment; an adaptive period in
// sync.skewscout's bounds when SkewScout is enabled) for a site with
// `peers` other sites.
OuterStepOptions OuterStepOptionsFrom(const pb::SyncConfig& sync,
                                      uint32_t peers);

class OuterSteps {
 public:
  // Refuses period 0, fragments that do not divide the period or exceed
  // the model, a non-positive lr, momentum outside [0, 1), no peers; and
  // for an adaptive period, fragments > 1 or a period outside
  // 1 <= min_period <= period <= max_period.
  static Result<OuterSteps> Create(const OuterStepOptions& options,
                                   uint64_t num_elements);

  // The anchor starts as `model` (the replicas' common initial model).
  void Start(std::span<const float> model);
  bool started() const { return started_; }
  const OuterStepOptions& options() const { return options_; }

  // The fragment whose round starts at `clock`, if one does (clocks
  // H/F, 2H/F, ...; fragment (clock / (H/F) - 1) mod F; adaptive: fragment
  // 0 at NextRoundClock()).
  std::optional<uint32_t> FragmentDueAt(int64_t clock) const;
  // The fragment of an outer gradient tagged with round `clock`: as
  // FragmentDueAt, except that with an adaptive period it is 0 for any
  // clock (a round ahead of the next is not known yet: AddOwn and AddPeer
  // check the tag).
  std::optional<uint32_t> FragmentOfTag(int64_t clock) const;
  // Adaptive period: the clock of the next round to close (the last
  // closed round's clock + period()), and the period in force.
  bool adaptive() const { return options_.adaptive; }
  int64_t NextRoundClock() const;
  uint32_t period() const { return period_; }
  // Rounds whose agreed period changed it (oldest first, at most
  // kMaxPeriodChanges) and rounds dropped because the agreement named
  // another clock.
  struct PeriodChange {
    int64_t round = 0;
    uint32_t period = 0;
  };
  static constexpr size_t kMaxPeriodChanges = 1000;
  const std::deque<PeriodChange>& period_changes() const {
    return period_changes_;
  }
  uint64_t rounds_dropped() const { return rounds_dropped_; }
  KeyRange RangeOf(uint32_t fragment) const;
  // Whether `fragment` has a round this site sent its Δ for and that has
  // not closed (its next round must wait: the base would be lost).
  bool Open(uint32_t fragment) const;
  bool AnyOpen() const;
  bool HasOwn(int64_t clock) const;

  // Δ = anchor - model over the range of `fragment`; `model_range` is the
  // local model's values in that range.
  void OuterGradient(uint32_t fragment, std::span<const float> model_range,
                     std::vector<float>* out) const;

  // Error feedback (options().error_feedback; no-ops without it). The
  // message of a round: m = β·e + Δ over the range of `fragment`, made in
  // place from Δ. Then, once m went out as `decoded` (what the peers
  // add), e = m - decoded over that range: what was not sent waits for
  // the next round. The replica's base is then the model Δ was taken
  // from (anchor - Δ), not anchor - decoded: the unsent part lives in e,
  // so every replica restarts from the new anchor.
  void AddResidual(uint32_t fragment, std::vector<float>* delta) const;
  void KeepResidual(uint32_t fragment, std::span<const float> message,
                    std::span<const float> decoded);
  std::span<const float> residual() const { return residual_; }
  // This site's Δ of the round at `clock` as the peers decode it. `base`
  // (the range's values the workers' later commits are measured from):
  // default anchor - Δ̂; after a crash, the restored model. `proposal`:
  // the period it sent with the Δ (adaptive period only; must lie in
  // [min_period, max_period]).
  Status AddOwn(int64_t clock, std::span<const float> decoded,
                std::span<const float> base = {}, uint32_t proposal = 0);
  // Peer `peer`'s Δ of the round at `clock`; this site is at
  // `local_clock`. Refused (nothing changes) when `clock` starts no round,
  // lies more than two periods ahead of `local_clock` (an honest peer is
  // at most one ahead: its next round of a fragment waits for this site's
  // Δ of the previous one; the second covers a site restored to a clock
  // just before the one its logged Δ was sent at), belongs to a round
  // that closed, repeats the peer, or has the wrong size. Adaptive period:
  // `clock` must be the next round's, or (while this site's Δ of that round
  // is out) within max_period clocks after it, one such round per peer;
  // `proposal` must lie in [min_period, max_period].
  Status AddPeer(int64_t clock, uint32_t peer, std::span<const float> decoded,
                 int64_t local_clock, uint32_t proposal = 0);

  // One outer step taken: add `correction` (new anchor - base) to the
  // local model's `range`.
  struct Step {
    int64_t clock = 0;
    KeyRange range;
    std::vector<float> correction;
  };
  // Takes the outer step of the oldest round that has every Δ (nullopt:
  // none has). Adaptive period: only the round at NextRoundClock() closes;
  // its shortest proposal becomes period(), and rounds before the new
  // NextRoundClock() are dropped (rounds_dropped()).
  std::optional<Step> CloseReady();

  uint64_t steps() const { return steps_; }
  uint32_t open_rounds() const;  // rounds this site sent its Δ for
  size_t rounds() const { return rounds_.size(); }
  std::span<const float> anchor() const { return anchor_; }
  std::span<const float> momentum() const { return momentum_; }

  // Checkpoint: the rounds' bookkeeping into `out`; the arrays (anchor,
  // momentum, the residual, each round's sum and base) appended to
  // `arrays`. A checkpoint without a residual restores a zero one (error
  // feedback turned on for a resumed job); one with a residual restored
  // by a job without error feedback drops it. Take both
  // at once (between two calls of the event loop).
  void SaveTo(pb::OuterStepCheckpoint* out) const;
  void AppendArrays(std::vector<NamedArray>* arrays) const;
  // Replaces the state with a checkpoint's (errors name what is missing or
  // inconsistent; nothing is changed then).
  Status RestoreFrom(const pb::OuterStepCheckpoint& saved,
                     const Checkpoint& arrays);

 private:
  struct Round {
    uint32_t fragment = 0;
    std::vector<float> sum;  // of the Δ received (own included)
    std::vector<bool> from_peer;
    uint32_t contributions = 0;
    bool own = false;
    std::vector<float> base;  // with own
    // Adaptive period: the proposals (0: not in yet).
    uint32_t own_proposal = 0;
    std::vector<uint32_t> peer_proposals;
  };

  OuterSteps(const OuterStepOptions& options, uint64_t num_elements)
      : options_(options), num_elements_(num_elements) {}
  uint32_t FragmentOf(int64_t clock) const;
  Status CheckRound(int64_t clock, size_t size, const char* whose,
                    bool own) const;
  // Adaptive period: whether `clock` may be a round now (see AddPeer).
  Status CheckAdaptiveClock(int64_t clock, const char* whose) const;
  Status CheckProposal(uint32_t proposal, const char* whose) const;
  // The clock of this site's earliest round with its Δ in (-1: none).
  int64_t OpenOwnClock() const;
  // Adaptive period: the round at `clock`'s shortest proposal becomes the
  // period; afterwards rounds before the next one are dropped.
  void AgreePeriod(int64_t clock, const Round& round);
  void DropRoundsOffSchedule();
  Round& RoundAt(int64_t clock);
  // RestoreFrom's parts, on the copy being restored: the adaptive
  // period's agreement and one round (its arrays from `arrays`).
  Status RestorePeriod(const pb::OuterStepCheckpoint& saved);
  Status RestoreRound(const pb::OuterRoundCheckpoint& round_state,
                      const Checkpoint& arrays);

  OuterStepOptions options_;
  uint64_t num_elements_ = 0;
  bool started_ = false;
  std::vector<float> anchor_;
  std::vector<float> momentum_;
  // Error feedback: one float per parameter (empty without it).
  std::vector<float> residual_;
  std::map<int64_t, Round> rounds_;
  // Per fragment: the clock of its last closed round (0: none).
  std::vector<int64_t> closed_;
  uint64_t steps_ = 0;
  uint32_t period_ = 0;  // adaptive: agreed at the last closed round
  std::deque<PeriodChange> period_changes_;
  uint64_t rounds_dropped_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_SYNC_OUTER_STEPS_H_
