// Process metrics: a thread-safe registry of named counters and gauges with
// labels, rendered in the Prometheus text exposition format (version 0.0.4),
// and a small HTTP server (one event-loop thread) that serves it at
// GET /metrics.
//
// A role keeps a MetricsRegistry, takes a MetricCell* for every series it
// exports once, and updates the cells from its own threads (a relaxed atomic
// store: cheap enough for an event loop). The server renders the registry
// on its own thread at every scrape. Every metric name starts with
// "meridian_"; counters end in "_total".
#ifndef MERIDIAN_METRICS_METRICS_H_
#define MERIDIAN_METRICS_METRICS_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meridian/core/mutex.h"
#include "meridian/core/status.h"
#include "meridian/core/thread_annotations.h"

namespace meridian {

// Label name -> value, in the order given (rendered sorted by name).
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { kCounter, kGauge };

// One time series. Set/Add are safe from any thread; readers see each
// update whole.
class MetricCell {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double delta);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Thread-safe. The role's threads (e.g. a site server's event loop,
// wanem's main loop) create series and update their cells; the metrics
// server's threads render it at every scrape. mu_ guards the map of families
// and series; the cells themselves are atomic and never freed before the
// registry, so updates take no lock.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The cell of series (name, labels), created (at 0) on first use. The
  // first call for a name fixes the family's help text and type. Characters
  // a Prometheus name may not hold become '_' (metric names:
  // [a-zA-Z_:][a-zA-Z0-9_:]*, label names: [a-zA-Z_][a-zA-Z0-9_]*); label
  // values are free text (escaped when rendered). The pointer stays valid as
  // long as the registry. Thread-safe.
  MetricCell* Counter(std::string_view name, std::string_view help,
                      const MetricLabels& labels = {}) EXCLUDES(mu_);
  MetricCell* Gauge(std::string_view name, std::string_view help,
                    const MetricLabels& labels = {}) EXCLUDES(mu_);

  // Text exposition format: per family (sorted by name) "# HELP", "# TYPE"
  // and one line per series (sorted by labels). Thread-safe.
  std::string RenderText() const EXCLUDES(mu_);

 private:
  struct Family {
    std::string help;
    MetricType type = MetricType::kGauge;
    // Rendered label set ("{a=\"x\"}" or "") -> cell.
    std::map<std::string, std::unique_ptr<MetricCell>> series;
  };
  MetricCell* Get(std::string_view name, std::string_view help, MetricType type,
                  const MetricLabels& labels) EXCLUDES(mu_);

  mutable Mutex mu_;
  std::map<std::string, Family> families_ GUARDED_BY(mu_);
};

// Escapes a label value for the text format: backslash, double quote and
// newline become \\, \" and \n.
std::string EscapeLabelValue(std::string_view value);
// A metric value as the text format writes it: the shortest decimal that
// reads back exactly, "NaN", "+Inf" or "-Inf".
std::string FormatMetricValue(double value);

// One line of a scrape.
struct MetricSample {
  std::string name;
  MetricLabels labels;
  double value = 0;
  // The value of label `key`, or "" when absent.
  std::string Label(std::string_view key) const;
};

// Parses the text exposition format (comment lines skipped, timestamps
// ignored). Errors name the line and what is wrong with it.
Result<std::vector<MetricSample>> ParseMetricsText(std::string_view text);

// A metrics endpoint address "HOST:PORT" ("http://" and a trailing
// "/metrics" are accepted and dropped). HOST "*" means every interface
// (0.0.0.0); PORT 0 asks for any free port.
struct MetricsAddress {
  std::string host;
  int port = 0;
  std::string ToString() const;  // "host:port"
};
Result<MetricsAddress> ParseMetricsAddress(std::string_view text);

// What a metrics endpoint grants its clients, so that slow or hostile
// ones cannot starve scrapes (MetricsServer says what that bounds).
struct MetricsServerLimits {
  // The longest one step of a connection may take, whatever the client
  // sends: delivering a request head in full (counted from accept, or from
  // the end of the previous response on a kept-alive connection; a byte
  // does not restart it), and taking at least one more byte of a response
  // it is sent.
  std::chrono::milliseconds io_timeout{2000};
  // A connection is closed this long after it was accepted, whatever it
  // does.
  std::chrono::milliseconds connection_timeout{10000};
  // Bytes of one request head (request line and headers; a scrape needs a
  // few hundred): the size of each connection's head buffer. A longer head
  // is answered 431 and ends the connection.
  size_t max_request_bytes = 8192;
  // Requests served on one connection before the server closes it.
  size_t keep_alive_max = 10;
  // Open connections in all, and from one IP address. A new connection is
  // always admitted: at a cap the server first closes another one
  // (MetricsServer says which).
  size_t max_connections = 256;
  size_t max_connections_per_address = 64;
  // Responses rendered afresh that may wait for slow readers at once;
  // beyond that, a scrape is answered with the newest render if it is
  // under a second old (shared, not copied).
  size_t max_rendered_responses = 4;
};

// Serves GET (and HEAD) /metrics, the registry's RenderText, and 404 on
// any other path, from one event-loop thread (non-blocking sockets,
// epoll), until Stop() or destruction.
//
// Slow and hostile clients (the defaults of MetricsServerLimits in
// brackets). A connection that sends nothing, half a request, a byte at a
// time or endless headers is closed io_timeout [2 s] after it began
// waiting for a request, and its head buffer never exceeds
// max_request_bytes [8 KiB]; one that does not read its response is
// closed once it has taken nothing for io_timeout; none lives longer than
// connection_timeout [10 s]. A new connection is always admitted: at
// max_connections_per_address [64] connections from its address, the one
// of that address that has waited longest for a request of its own (else
// the one that has waited longest for its client to read) is closed
// first; at max_connections [256] in all, likewise one of the address
// holding the most. So a scrape, which sends its request at once and is
// answered in the same turn of the loop, is served in milliseconds however
// many slow or idle connections there are, and a client can only push out
// its own connections unless it holds the most. Bounds, whatever clients
// do: max_connections descriptors (plus 3), max_connections x
// max_request_bytes [2 MiB] of head buffers, and at most
// (max_rendered_responses [4] + 1 + connection_timeout in seconds [10]) x
// the rendered text's size of responses waiting for readers. Stop() ends
// every connection at once.
//
// Threads: the owner calls Start, Stop, address() and url(); the event
// loop's thread answers scrapes, touching only the registry (thread-safe)
// and its own state.
class MetricsServer {
 public:
  // Binds `address` (ParseMetricsAddress) and starts serving. Errors: a
  // malformed address (InvalidArgument) or one that cannot be bound, e.g.
  // in use (Unavailable, naming the address). `registry` must outlive the
  // server.
  static Result<std::unique_ptr<MetricsServer>> Start(
      const MetricsRegistry* registry, std::string_view address,
      const MetricsServerLimits& limits = MetricsServerLimits());
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Stops accepting and joins the serving thread. Idempotent.
  void Stop();
  // The bound "host:port" (the port resolved when 0 was asked for).
  const std::string& address() const;
  // "http://host:port/metrics", 0.0.0.0 shown as 127.0.0.1.
  std::string url() const;

 private:
  class Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Starts a server for a role when `address` is set ("" or "none": no
// endpoint, returns null). A failure is logged as a warning naming `who`
// and the address, and returns null: a role runs on without metrics rather
// than fail.
std::unique_ptr<MetricsServer> StartMetricsServerOrWarn(
    const MetricsRegistry* registry, std::string_view address,
    std::string_view who);

// GET http://<address>/metrics, waiting at most `timeout_s` to connect and
// as long for the answer. Errors: unreachable (Unavailable), an HTTP status
// other than 200 (DataLoss), a malformed address (InvalidArgument).
Result<std::string> FetchMetricsText(std::string_view address,
                                     double timeout_s);

}  // namespace meridian

#endif  // MERIDIAN_METRICS_METRICS_H_
