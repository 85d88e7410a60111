// A site's model replica: one flat float vector (see layout.h) split into
// shards by key range. Each shard has its own lock, so applying an update,
// answering a pull and the evaluator's snapshot interleave shard by shard
// instead of serialising on the whole model.
#ifndef MERIDIAN_PS_PARAM_STORE_H_
#define MERIDIAN_PS_PARAM_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/core/layout.h"
#include "meridian/core/mutex.h"
#include "meridian/core/status.h"
#include "meridian/core/thread_annotations.h"

namespace meridian {

// A contiguous run of values addressed in the flat key space.
struct UpdateSegment {
  uint64_t offset = 0;
  std::span<const float> values;
};

// A destination for values read from the store: elements
// [offset, offset + values.size()) of the key space.
struct ReadSegment {
  uint64_t offset = 0;
  std::span<float> values;
};

// Half-open key range [begin, end).
struct KeyRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};

// How committed updates change the model:
//   u' = learning_rate * u / (rule == MEAN ? workers : 1)
//   momentum == 0: w += u'
//   momentum  > 0: v = momentum * v + u'; w += v
struct ApplyRule {
  pb::ApplyRule rule = pb::MEAN;
  double learning_rate = 1.0;
  double momentum = 0.0;
  uint32_t workers = 1;

  static ApplyRule FromConfig(const pb::ServerConfig& config, uint32_t workers);
  // The factor applied to a raw update before momentum.
  float Scale() const;
};

// Thread-safe: every method may be called from any thread, except where a
// method says otherwise (SetMomentum, AddAccumulator: before training or
// from the applying thread). In a site server the event loop applies
// updates, answers pulls and (through the sync engine) visits the
// accumulators while the evaluator thread takes snapshots; each shard's
// lock guards that shard's elements of every array, and version_ is
// atomic.
class ParameterStore {
 public:
  // `num_shards` is clamped to [1, layout.num_elements()]. The model starts
  // at zero; Assign() sets initial values.
  ParameterStore(ModelLayout layout, uint32_t num_shards, ApplyRule rule);
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  const ModelLayout& layout() const { return layout_; }
  uint64_t num_elements() const { return layout_.num_elements(); }
  uint32_t num_shards() const { return static_cast<uint32_t>(shards_.size()); }
  KeyRange shard_range(uint32_t shard) const { return shards_[shard]->range; }
  const ApplyRule& rule() const { return rule_; }

  // Number of updates applied so far; a pull returns the model with the
  // version it was read at.
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

  // Changes the server momentum of later Apply calls (the velocity is kept;
  // it starts at zero the first time momentum becomes positive). Not
  // thread-safe with Apply: call from the thread that applies updates.
  void SetMomentum(double momentum);

  // Replaces every value (size must be num_elements()); resets momentum.
  Status Assign(std::span<const float> values);

  // Copies the whole model into `out` (size num_elements()). Each shard is
  // copied atomically; returns the version read before copying.
  uint64_t Snapshot(std::span<float> out) const;

  // Copies elements [offset, offset + out.size()) into `out`, shard by
  // shard. Precondition: the range lies inside the key space.
  void Read(uint64_t offset, std::span<float> out) const;
  // Fills every read segment, each shard copied under one lock.
  void Read(std::span<const ReadSegment> reads) const;

  // Applies one update through the apply rule and returns the new version.
  // When `read_back` is given, it is filled with the updated values in the
  // same pass (the model a worker gets back after its commit). Precondition:
  // segments lie inside the key space (validated by the caller against the
  // layout).
  uint64_t Apply(std::span<const UpdateSegment> segments,
                 std::span<const ReadSegment> read_back = {});

  // ---- Unsent-change accumulators (inter-site sync) ----------------------
  // Adds a zero-initialised accumulator and returns its id: from now on
  // every Apply also adds the change it made to each element (after the
  // apply rule and momentum) into it. Not thread-safe with Apply: call
  // before training starts.
  size_t AddAccumulator();
  size_t num_accumulators() const { return accumulators_.size(); }

  // Adds `segments` to the model as they are (a peer site's change, already
  // scaled; no apply rule, no momentum), and into every accumulator listed
  // in `accumulate` (a hub forwarding its group's changes). Returns the new
  // version.
  uint64_t ApplyExternal(std::span<const UpdateSegment> segments,
                         std::span<const size_t> accumulate = {});

  // The same for a sparse change: w[indices[i]] += values[i] (and into
  // every accumulator in `accumulate`). Indices are flat, ascending, and
  // < num_elements(). Returns the new version.
  uint64_t ApplyExternalSparse(std::span<const uint64_t> indices,
                               std::span<const float> values,
                               std::span<const size_t> accumulate = {});

  // Calls fn(range, w, acc) for every shard with that shard locked: w and
  // acc are the shard's slices of the model and of accumulator `id`. fn may
  // change acc (the significance filter takes what it sends out of it).
  void VisitAccumulator(
      size_t id,
      const std::function<void(const KeyRange&, std::span<const float>,
                               std::span<float>)>& fn);

  // acc[indices[i]] += values[i] for accumulator `id` (the residual of a
  // lossy encoding goes back: nothing is lost, only delayed).
  // Precondition: indices ascending and < num_elements().
  void AddToAccumulator(size_t id, std::span<const uint64_t> indices,
                        std::span<const float> values);

  // ---- Held own changes (sync.own_changes: OWN_CHANGES_WITH_PEERS) --------
  // From now on Apply adds the change it makes (after the apply rule and
  // momentum) into a held buffer instead of the model; the accumulators
  // still get it at once. The site's own changes wait there until TakeHeld
  // moves them out, and reach the model through ApplyExternal when the
  // peers' changes of the same clock have (site/own_change_hold.h). Size:
  // one more float per element. Not thread-safe with Apply: call before
  // training starts.
  void HoldOwnChanges();
  bool holds_own_changes() const { return !held_.empty(); }
  // Moves the held changes into `out` (size num_elements(), overwritten)
  // and zeroes the buffer. With `unsent_in` (sync.own_changes AS_SENT:
  // accumulators that hold only this site's own changes), only the part
  // already sent to every one of them moves: per element, held - r, where
  // r is the value of those accumulators largest in magnitude (what the
  // peer sent the least still waits for), and the buffer keeps r. From the
  // thread that applies updates.
  void TakeHeld(std::span<float> out, std::span<const size_t> unsent_in = {});
  // out += the held changes, which stay held (a checkpoint's copy). From
  // the thread that applies updates.
  void AddHeldTo(std::span<float> out) const;

  // ---- Checkpoints ---------------------------------------------------------
  // The state beyond the model, copied out for a checkpoint: the velocity
  // of server momentum (empty when it never ran) and accumulator `id`. For
  // a consistent snapshot, call from the thread that applies updates.
  std::vector<float> CopyVelocity() const;
  std::vector<float> CopyAccumulator(size_t id) const;
  // Continues from a checkpoint: every value, the velocity (empty: none)
  // and the version. Sizes must match the layout. Not thread-safe with
  // Apply: call before training starts.
  Status Restore(std::span<const float> values, std::span<const float> velocity,
                 uint64_t version);
  Status RestoreAccumulator(size_t id, std::span<const float> values);

 private:
  // Allocates the velocity and points the shards at it (once).
  void EnsureVelocity();
  // One key range of the model and the lock of every element in it. The
  // spans are the shard's slices of values_, velocity_ and accumulators_:
  // after construction the store reaches its elements only through them,
  // so GUARDED_BY(mu) makes the analysis check that every element is read
  // and written under its shard's lock.
  struct Shard {
    KeyRange range;
    Mutex mu;
    std::span<float> values GUARDED_BY(mu);
    std::span<float> velocity GUARDED_BY(mu);  // empty without momentum
    std::vector<std::span<float>> accumulators GUARDED_BY(mu);  // by id
    std::span<float> held GUARDED_BY(mu);  // empty unless HoldOwnChanges
  };

  // Calls fn(shard) for every shard, in key order, with that shard locked.
  // fn is a lambda annotated REQUIRES(shard.mu).
  template <typename Fn>
  void ForEachShardLocked(Fn&& fn) const;
  // The per-shard loop of every dense update (Apply, ApplyExternal): shard
  // by shard, each shard locked once for all the segments that touch it, so
  // that a concurrent Snapshot or Read never sees a shard with only part of
  // an update (a commit carries one segment per tensor, and a shard may
  // straddle tensors). Each value u becomes the change c = scale * u, or,
  // with `momentum`, v = momentum * v + scale * u and c = v; w += c, and c
  // goes into every accumulator in `accumulate`; with `hold`, c goes into
  // the held buffer instead of w. Then copies the shard's part of
  // `read_back` while it is locked and still in cache. Returns the new
  // version.
  uint64_t AddSegments(std::span<const UpdateSegment> segments, float scale,
                       std::optional<float> momentum,
                       std::span<const size_t> accumulate,
                       std::span<const ReadSegment> read_back, bool hold);
  // Copies the parts of `reads` inside `shard`.
  static void CopyOut(const Shard& shard, std::span<const ReadSegment> reads)
      REQUIRES(shard.mu);

  ModelLayout layout_;
  ApplyRule rule_;  // momentum: written by SetMomentum, see its contract
  std::vector<std::unique_ptr<Shard>> shards_;  // fixed at construction
  // Storage of the model, the server momentum's velocity (empty unless
  // momentum > 0) and the accumulators, touched only through the shards'
  // spans. Resized only before training (constructor, SetMomentum,
  // AddAccumulator; moving an accumulator keeps its buffer, so spans stay
  // valid).
  std::vector<float> values_;
  std::vector<float> velocity_;
  std::vector<float> held_;  // empty unless HoldOwnChanges
  std::vector<std::vector<float>> accumulators_;
  std::vector<size_t> accumulator_ids_;  // 0, 1, ...: Apply feeds them all
  std::atomic<uint64_t> version_{0};
};

// Sums updates over a barrier (BSP): commits are added as they arrive and
// applied once when the policy says so. Not thread-safe.
class UpdateAccumulator {
 public:
  explicit UpdateAccumulator(uint64_t num_elements);

  void Add(std::span<const UpdateSegment> segments);
  uint32_t count() const { return count_; }
  // The sum so far (for a checkpoint) and putting one back: `sum` has the
  // model's size, `count` commits are in it.
  std::span<const float> sum() const { return sum_; }
  Status Restore(std::span<const float> sum, uint32_t count);
  // The summed update as one segment (valid until the next Add/Clear).
  std::vector<UpdateSegment> Segments() const;
  void Clear();

 private:
  std::vector<float> sum_;
  uint32_t count_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_PS_PARAM_STORE_H_
