// Run-time control of a WAN emulator: one serialized pb::WanControlRequest
// per ZeroMQ message to a REP socket, one pb::WanControlReply back. Every
// reply carries ok, error (when !ok), uptime_s and the state of the links
// the request touched (every link for status).
#ifndef MERIDIAN_WAN_CONTROL_H_
#define MERIDIAN_WAN_CONTROL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/core/clock.h"
#include "meridian/job.pb.h"
#include "meridian/report.pb.h"
#include "meridian/wan_control.pb.h"
#include "meridian/core/status.h"

namespace meridian::wan {

class Emulator;

// The version this code speaks; requests must carry it.
inline constexpr uint32_t kWanControlProtocolVersion = 1;

// ---- codec (pure; fuzzed) --------------------------------------------------

// Parses the bytes of one request and checks it with
// ValidateControlRequest. Never throws.
Result<pb::WanControlRequest> DecodeControlRequest(
    std::span<const uint8_t> bytes);

// Checks what can be checked without an emulator: the protocol version,
// that exactly one command is set, that names and addresses are present and
// well-formed and that unit strings parse. Errors name the field
// ("set.change.latency: ...").
Status ValidateControlRequest(const pb::WanControlRequest& request);

// ---- request builders (for the ctl client and the launcher) ----------------

pb::WanControlRequest MakeStatusRequest();
pb::WanControlRequest MakePartitionRequest(std::string_view link);
pb::WanControlRequest MakeHealRequest(std::string_view link);
pb::WanControlRequest MakeResetRequest(std::string_view link);
pb::WanControlRequest MakeAddRouteRequest(std::string_view link,
                                          std::string_view from_site,
                                          std::string_view listen,
                                          std::string_view forward);
// `direction`: "a-to-b", "b-to-a" or "both" (empty = both). Empty unit
// strings are left unset; `jitter_distribution`: "", "uniform", "normal".
Result<pb::WanControlRequest> MakeSetRequest(
    std::string_view link, std::string_view direction,
    std::string_view bandwidth, std::string_view latency,
    std::string_view jitter, std::string_view jitter_distribution = {},
    std::string_view queue_limit = {});

// ---- serving ---------------------------------------------------------------

// Applies one request to `emulator` and builds the reply (ok = false and
// the reason when the request is refused). Logs every change with the
// emulator's uptime.
pb::WanControlReply HandleControlRequest(Emulator& emulator,
                                         const pb::WanControlRequest& request);

// Serves control requests on a ZeroMQ REP socket in its own thread. A
// request that does not decode gets an ok = false reply; the server keeps
// serving.
class ControlServer {
 public:
  // `endpoint`: a ZeroMQ endpoint; "tcp://host:0" or "tcp://host:*" binds
  // a free port. `emulator` must outlive the server.
  static Result<std::unique_ptr<ControlServer>> Start(Emulator* emulator,
                                                      std::string endpoint);
  ~ControlServer();  // Stop()
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // The bound endpoint, e.g. "tcp://127.0.0.1:41234".
  const std::string& endpoint() const;
  uint64_t requests_served() const;
  void Stop();

  class Impl;

 private:
  explicit ControlServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- client ----------------------------------------------------------------

// A REQ client of a ControlServer. Thread-compatible. After a timeout the
// socket is rebuilt, so the client stays usable.
class ControlClient {
 public:
  explicit ControlClient(std::string endpoint,
                         Duration timeout = std::chrono::seconds(5));
  ~ControlClient();
  ControlClient(const ControlClient&) = delete;
  ControlClient& operator=(const ControlClient&) = delete;

  // Sends `request` (protocol_version is filled in when 0) and waits for
  // the reply. Unavailable/DeadlineExceeded when wanem cannot be reached.
  // A refused request is still a reply (ok = false): see the helpers below.
  Result<pb::WanControlReply> Call(pb::WanControlRequest request);

  // Helpers that turn a refusal into a FailedPrecondition/InvalidArgument
  // status carrying the reply's error.
  Result<pb::WanControlReply> GetStatus();
  // Returns the bound listen address ("127.0.0.1:43121").
  Result<std::string> AddRoute(std::string_view link,
                               std::string_view from_site,
                               std::string_view listen,
                               std::string_view forward);
  Status Partition(std::string_view link);
  Status Heal(std::string_view link);
  // Closes the link's open connections, dropping what they carried.
  Status Reset(std::string_view link);
  Status Set(std::string_view link, pb::LinkDirection direction,
             const pb::LinkDirectionConfig& change);

  const std::string& endpoint() const { return endpoint_; }

 private:
  class Socket;
  std::string endpoint_;
  Duration timeout_;
  std::unique_ptr<Socket> socket_;
};

// Turns a refused reply into an error status (OK when reply.ok()).
Status ReplyStatus(const pb::WanControlReply& reply);

// ---- presentation ----------------------------------------------------------

// A human-readable table of the links of a status reply.
std::string FormatLinkStates(const pb::WanControlReply& reply);

// Per link direction traffic for report.json, from a status reply.
std::vector<pb::LinkTraffic> LinkTrafficFromReply(
    const pb::WanControlReply& reply);

// traffic.csv: the header line and one row per link direction of a status
// reply taken `t_s` seconds into the run.
inline constexpr std::string_view kTrafficCsvHeader =
    "t_s,link,from_site,to_site,bytes,messages,queued_bytes,bandwidth_bps,"
    "latency_s,partitioned";
std::string TrafficCsvRows(double t_s, const pb::WanControlReply& reply);

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_CONTROL_H_
