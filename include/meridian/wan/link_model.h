// The model of the emulated WAN: links and routes. Per direction, a link
// has a bandwidth (the serialization rate), a one-way propagation latency,
// jitter and a queue limit. A link joins two sites {a, b}, is named "a-b"
// (a = the site listed first in the job) and has two independent
// directions, so asymmetric links are just two different DirectionModels.
// A route is a TCP listener attached to a link for connections from one
// side to an address on the other (wan/emulator.h runs them).
#ifndef MERIDIAN_WAN_LINK_MODEL_H_
#define MERIDIAN_WAN_LINK_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "meridian/core/clock.h"
#include "meridian/core/status.h"
#include "meridian/job.pb.h"

namespace meridian::wan {

struct DirectionModel {
  // Serialization rate in bit/s; 0 = unlimited (no pacing at all).
  double bandwidth_bps = 1e9;
  // One-way propagation delay added to every byte after serialization.
  Duration latency{0};
  // Spread of the per-chunk delay around `latency`: UNIFORM = latency +-
  // jitter (flat), NORMAL = latency + N(0, jitter^2) clipped at 0. 0 = none.
  Duration jitter{0};
  pb::JitterDistribution jitter_distribution = pb::JITTER_UNIFORM;
  // Bytes the direction may hold (accepted, not yet delivered) before the
  // emulator stops reading its sockets. 0 = DefaultQueueLimit(*this).
  uint64_t queue_limit_bytes = 0;
  // Seed of the jitter draws (reproducible runs).
  uint64_t seed = 1;

  // No pacing, no delay: bytes may be forwarded as they are read.
  bool passthrough() const {
    return bandwidth_bps == 0 && latency == Duration::zero() &&
           jitter == Duration::zero();
  }
  friend bool operator==(const DirectionModel&,
                         const DirectionModel&) = default;
};

// The defaults of a link no config mentions: 1 Gbit/s, 0 ms, no jitter.
DirectionModel DefaultDirectionModel();

// Queue limit used when the model leaves it at 0: 2 x bandwidth x (latency
// + jitter), at least 1 MiB (a TCP proxy never drops, so the limit only
// decides when to stop reading; it must exceed the bandwidth-delay
// product, or the emulator would throttle below the configured rate).
// Unlimited bandwidth: 16 MiB.
uint64_t DefaultQueueLimit(const DirectionModel& model);
inline uint64_t EffectiveQueueLimit(const DirectionModel& model) {
  return model.queue_limit_bytes != 0 ? model.queue_limit_bytes
                                      : DefaultQueueLimit(model);
}

// Size of the pieces the emulator paces: about 1 ms of link time (so
// timer granularity never shows as bursts), between 64 bytes and
// `max_bytes`. Unlimited bandwidth: `max_bytes`.
size_t ChunkBytes(const DirectionModel& model, size_t max_bytes);

// Applies the set fields of `change` to `model`, parsing their units. The
// error names the offending field as `field_prefix` + "." + field name
// (e.g. "wan.link[0].a_to_b.latency"). `model` is unchanged on error.
Status ApplyDirectionConfig(const pb::LinkDirectionConfig& change,
                            std::string_view field_prefix,
                            DirectionModel* model);

// The model as text, e.g. "100mbit 20ms jitter 5ms(normal) queue 4MiB".
std::string DescribeDirection(const DirectionModel& model);

struct LinkModel {
  std::string a;  // the site listed first in the job
  std::string b;
  DirectionModel a_to_b;
  DirectionModel b_to_a;

  std::string name() const { return a + "-" + b; }
};

struct RouteSpec {
  std::string link;       // "a-b"
  std::string from_site;  // a or b: the side whose processes connect
  std::string listen;     // host:port to listen on; port 0 picks a free one
  std::string forward;    // host:port on the other side
  // false: a forward host that does not resolve is an error. true (the
  // routes of a standalone wanem, whose peers may not exist yet, e.g. a
  // Kubernetes Service created later): a warning, and the host is looked up
  // again for every connection.
  bool allow_unresolved = false;
};

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_LINK_MODEL_H_
