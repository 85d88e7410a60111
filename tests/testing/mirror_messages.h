// Hand-made peer-site messages for tests of a site's mirror socket.
#ifndef MERIDIAN_TESTS_TESTING_MIRROR_MESSAGES_H_
#define MERIDIAN_TESTS_TESTING_MIRROR_MESSAGES_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/layout.h"
#include "meridian/core/mutex.h"
#include "meridian/core/status.h"
#include "meridian/wire.pb.h"

namespace meridian::testing {

// Makes `header` a MIRROR_UPDATE of `clock` from `origin` that adds `value`
// to the first 3 elements of the layout's "fc0.bias" (fp32 through the
// compression pipeline) and appends its payload frame to `frames`. The
// sender and sequence are the caller's.
Status MakeBiasUpdate(const ModelLayout& layout, int64_t clock,
                      const std::string& origin, float value,
                      pb::Header* header, std::vector<zmq::message_t>* frames);

// A peer site's mirror socket that reads what a site sends it and
// acknowledges every numbered message as applied and durable (as a real
// peer would), so the site's final flush completes. Once it has the site's
// final clock, its acknowledgements (and its answers to heartbeats) say
// that its own flush is complete too (MirrorAck.flushed), unless made with
// `says_flushed` false: then only after SayFlushed(). Serves `socket` (a
// bound ROUTER, not used by anyone else meanwhile) on its own thread until
// destroyed; `site` is the name it answers as.
class AckingPeer {
 public:
  AckingPeer(zmq::socket_t* socket, std::string site,
             bool says_flushed = true);
  ~AckingPeer();
  AckingPeer(const AckingPeer&) = delete;
  AckingPeer& operator=(const AckingPeer&) = delete;

  // The first message it received (nullopt: none yet). Thread-safe.
  std::optional<pb::Header> first() const;
  // Heartbeats the site sent after its final clock. Thread-safe.
  int heartbeats_after_final() const { return heartbeats_after_final_; }
  // From now on, say the flush is complete here. Thread-safe.
  void SayFlushed() { says_flushed_ = true; }

 private:
  void Serve();
  zmq::socket_t* socket_;
  const std::string site_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> says_flushed_;
  std::atomic<int> heartbeats_after_final_{0};
  mutable Mutex mu_;
  std::optional<pb::Header> first_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_TESTING_MIRROR_MESSAGES_H_
