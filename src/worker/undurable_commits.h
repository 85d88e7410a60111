// The changes of this worker process's answered commits that its site
// server does not hold durably yet, kept so that the worker can replay them
// when the site crashes and restarts from a checkpoint that lacks them
// (docs/worker-protocol.md §14).
//
// Every WELCOME and MODEL of a site that keeps checkpoints carries the
// worker's durable point (pb::DurablePoint): the highest of its commit ids
// in the newest durable checkpoint, and in each checkpoint being written.
// Commits at or below the durable id are dropped here. The rest are kept
// as sums of consecutive commits: two neighbours are summed into one
// unless a pending checkpoint's id lies between them (that checkpoint may
// become the point a restarted site resumes from, and a replay must start
// right after it: a sum cannot be split). A checkpoint taken later holds
// ids at or above the newest answered one, so the newest commit never needs
// to stay apart from its predecessors for a checkpoint not listed yet.
//
// Bound: at most kMaxKept sums (each one model of floats) plus one spare.
// The site lists at most two pending checkpoints, so the commits fit in
// three sums; if a site listed more, the two oldest sums are merged anyway
// (logged; should the site then restart from a checkpoint between them,
// it refuses that replay and counts those commits in lost_commits).
//
// Ownership and threads: owned by the Committer, driven by the worker's
// thread alone. Crash: nothing here survives the worker; what a dead
// worker kept the restarted site counts lost (recovery.lost_commits).
#ifndef MERIDIAN_WORKER_UNDURABLE_COMMITS_H_
#define MERIDIAN_WORKER_UNDURABLE_COMMITS_H_

#include <cstdint>
#include <deque>
#include <vector>

#include "meridian/wire.pb.h"

namespace meridian {

class UndurableCommits {
 public:
  static constexpr size_t kMaxKept = 4;

  // Sums of the commits first_id .. last_id (ascending, disjoint).
  struct Kept {
    uint64_t first_id = 0;
    uint64_t last_id = 0;
    std::vector<float> sum;  // the model's size
  };

  explicit UndurableCommits(uint64_t num_elements)
      : num_elements_(num_elements) {}

  // Commit `commit_id` (above every kept one) was answered with `point`
  // (its reply's durable point): the site applied `*change` (params -
  // base, the model's size). Takes the buffer without a copy and hands a
  // recycled one (any size, contents undefined) back in `*change`. The
  // point must come with it: a checkpoint taken just before this commit
  // arrived is listed there first.
  void Add(uint64_t commit_id, std::vector<float>* change,
           const pb::DurablePoint& point);
  // The durable point of a reply: drops what it holds, merges what no
  // pending checkpoint separates.
  void OnDurablePoint(const pb::DurablePoint& point);
  // Forgets everything (the site keeps no checkpoints).
  void Clear();

  const std::deque<Kept>& kept() const { return kept_; }
  // Commits kept.
  uint64_t commits() const;
  // Times the bound merged sums a pending checkpoint separated.
  uint64_t forced_merges() const { return forced_merges_; }

 private:
  // Whether a pending checkpoint may become durable between `a` and `b`.
  bool Separated(const Kept& a, const Kept& b) const;
  // Adds b into a (b follows a) and recycles b's buffer.
  void MergeInto(Kept& a, Kept& b);
  void Compact();

  const uint64_t num_elements_;
  std::deque<Kept> kept_;
  std::vector<float> spare_;  // a recycled sum buffer
  std::vector<uint64_t> pending_;  // the last point's pending ids
  uint64_t forced_merges_ = 0;
};

}  // namespace meridian

#endif  // MERIDIAN_WORKER_UNDURABLE_COMMITS_H_
