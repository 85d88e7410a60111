// One direction of an emulated link: a pacer (serialization at the link's
// bandwidth) followed by a delay line (propagation latency + jitter), on an
// injected clock. Pure bookkeeping, no threads and no sockets: the caller
// enqueues chunk sizes and polls for the chunks that are due, in order.
//
// Pacing: the link is a virtual clock, `busy_until`. A chunk departs at
// max(arrival, busy_until) and then occupies the link for bytes*8/bandwidth,
// so an idle link earns no credit beyond letting the next chunk leave at
// once (one chunk of burst, as on a real wire where a packet starts
// serializing as soon as the line is free). Departure times are computed
// from the virtual clock, not from when Poll() ran, so a late timer is
// carried forward instead of lost: a chunk polled late does not delay the
// ones behind it.
//
// Delay line: a chunk that departs at t is released at t + latency +
// jitter draw, but never before the chunk ahead of it (FIFO: jitter never
// reorders bytes, like netem with a pfifo child; back-to-back chunks share
// the larger delay).
//
// Partition pauses the direction: nothing departs or is released while it
// lasts; Heal() resumes it where it stopped (bytes in flight take the rest
// of their latency, queued bytes are paced from the heal on), in order.
//
// Queue limit: bytes accepted and not yet delivered (the caller reports
// deliveries with Delivered()). Room() is what may still be accepted;
// Enqueue() does not enforce it, the reader does (TCP backpressure).
//
// Thread-compatible: the emulator guards each Shaper with a mutex.
#ifndef MERIDIAN_WAN_SHAPER_H_
#define MERIDIAN_WAN_SHAPER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/wan/link_model.h"

namespace meridian::wan {

class Shaper {
 public:
  struct Released {
    uint64_t seq;        // order of Enqueue(), from 0
    size_t bytes;        // as enqueued
    Duration departure;  // when it left the pacer
    Duration release;    // when it left the delay line (its due time)
  };

  // `clock` is not owned and must outlive the shaper.
  Shaper(const DirectionModel& model, const Clock* clock);

  // Changes the model from now on: the bandwidth applies to chunks that
  // have not departed yet, latency and jitter to chunks that depart from
  // now on (still never before the chunks ahead). Resets the jitter seed
  // only when it changed.
  void SetModel(const DirectionModel& model);
  const DirectionModel& model() const { return model_; }

  // Accepts a chunk of `bytes` (0 is allowed, e.g. an end-of-stream
  // marker: it takes no link time but keeps its place) arriving now.
  // Returns its sequence number.
  uint64_t Enqueue(size_t bytes);

  // Appends every chunk due at clock->Now() to `out`, in order; returns how
  // many were appended.
  size_t Poll(std::vector<Released>* out);

  // When the next chunk becomes due; nullopt when nothing is pending or the
  // direction is partitioned.
  std::optional<Duration> NextEventTime() const;

  void Partition();
  void Heal();
  bool partitioned() const { return partitioned_; }

  // Reports that `bytes` of released chunks reached their destination.
  void Delivered(uint64_t bytes);
  // Accepted, not yet delivered (pacer + delay line + caller's buffers).
  uint64_t in_flight_bytes() const { return in_flight_; }
  uint64_t queue_limit() const { return EffectiveQueueLimit(model_); }
  uint64_t Room() const {
    const uint64_t limit = queue_limit();
    return in_flight_ >= limit ? 0 : limit - in_flight_;
  }
  // Chunks enqueued and not yet released.
  size_t pending_chunks() const { return pacer_.size() + delay_.size(); }

 private:
  struct Waiting {
    uint64_t seq;
    size_t bytes;
    Duration arrival;
  };
  Duration DrawDelay();
  // Moves chunks whose departure time is <= now from the pacer into the
  // delay line.
  void Depart(Duration now);

  DirectionModel model_;
  const Clock* clock_;
  std::mt19937_64 rng_;
  std::deque<Waiting> pacer_;
  std::deque<Released> delay_;
  Duration busy_until_{0};
  double busy_carry_ns_ = 0;  // sub-nanosecond remainder of link time
  Duration last_release_{0};
  bool partitioned_ = false;
  Duration partition_start_{0};
  uint64_t next_seq_ = 0;
  uint64_t in_flight_ = 0;
};

// Draws of the jitter distributions, exposed for tests: a uniform double in
// [0, 1) and a standard normal (Box-Muller), both from `rng`, identical on
// every platform (unlike std::normal_distribution).
double UniformUnit(std::mt19937_64& rng);
double StandardNormal(std::mt19937_64& rng);

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_SHAPER_H_
