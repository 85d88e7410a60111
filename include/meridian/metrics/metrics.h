// Process metrics: a thread-safe registry of named counters and gauges with
// labels, rendered in the Prometheus text exposition format (version 0.0.4),
// and a small HTTP server (cpp-httplib) that serves it at GET /metrics.
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
  // The longest the server waits on a connection at a time: for a request
  // (a new connection, or the next one on a kept-alive connection), for
  // each further part of a request, for room to write the next part of a
  // response.
  std::chrono::milliseconds io_timeout{2000};
  // A connection is closed this long after the server began serving it,
  // whatever it does (a client trickling bytes cannot hold it longer).
  std::chrono::milliseconds connection_timeout{10000};
  // Bytes of one request (request line, headers, body): a scrape needs a
  // few hundred. A longer request ends the connection.
  size_t max_request_bytes = 16384;
  // Requests served on one connection before the server closes it.
  size_t keep_alive_max = 10;
  // Threads serving connections, one per connection; started on demand.
  size_t max_threads = 64;
  // Accepted connections waiting for a thread when all are busy. While
  // this is full the server accepts nothing more: further connections wait
  // in the kernel's listen backlog (128), costing this process nothing.
  size_t max_queued = 64;
  // A thread without a connection for this long ends (and is joined
  // within about a second).
  std::chrono::milliseconds idle_thread_timeout{5000};
};

// Serves GET /metrics (the registry's RenderText) and 404 on any other
// path, on a background thread, until Stop() or destruction.
//
// Slow and hostile clients (the defaults of MetricsServerLimits in
// brackets). Every connection has a serving thread of its own, so a
// connection that sends nothing, sends half a request and stalls, reads
// its response slowly, trickles bytes or streams endless headers holds
// only its own thread, and for at most min(io_timeout [2 s] after the last
// byte it moved, connection_timeout [10 s]). A scrape is served at once
// while fewer than max_threads [64] other connections are being served.
// With more, it waits its turn: at most about 2 x connection_timeout [20 s]
// behind max_threads + max_queued [128] hostile connections, and longer
// only if they keep the kernel's backlog filled as well. N such
// connections cost min(N, 64) threads (stacks are mostly untouched virtual
// memory: a few dozen KiB resident each), min(N, 128) descriptors and at
// most max_request_bytes [16 KiB] of request plus one rendered response
// each. Threads left idle end after idle_thread_timeout [5 s], so the
// server returns to no serving thread at all. Stop() ends every
// connection within about 100 ms (each wait on a client looks at it).
//
// Threads: the owner calls Start, Stop, address() and url(); cpp-httplib's
// listening thread and the serving threads answer scrapes, touching only
// the registry (thread-safe) and httplib's own state; the serving threads'
// queue (metrics.cc) locks its own state.
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
