#include "meridian/metrics/metrics.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <system_error>
#include <thread>

#include "meridian/core/log.h"

namespace meridian {
namespace {

bool IsNameStart(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (allow_colon && c == ':');
}
bool IsNameChar(char c, bool allow_colon) {
  return IsNameStart(c, allow_colon) || (c >= '0' && c <= '9');
}

// `name` with every character a Prometheus name may not hold replaced by
// '_' (metric names may hold ':', label names may not).
std::string SanitizeName(std::string_view name, bool allow_colon) {
  std::string out(name);
  if (out.empty()) return "_";
  for (size_t i = 0; i < out.size(); ++i) {
    const bool ok = i == 0 ? IsNameStart(out[i], allow_colon)
                           : IsNameChar(out[i], allow_colon);
    if (!ok) out[i] = '_';
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// "{a=\"x\",b=\"y\"}" with names sorted, or "" without labels.
std::string RenderLabels(const MetricLabels& labels) {
  if (labels.empty()) return "";
  std::vector<std::pair<std::string, std::string>> sorted;
  sorted.reserve(labels.size());
  for (const auto& [key, value] : labels) {
    sorted.emplace_back(SanitizeName(key, false), value);
  }
  std::sort(sorted.begin(), sorted.end());
  std::string out = "{";
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i > 0) out += ',';
    out += sorted[i].first + "=\"" + EscapeLabelValue(sorted[i].second) + "\"";
  }
  return out + "}";
}

const char* TypeName(MetricType type) {
  return type == MetricType::kCounter ? "counter" : "gauge";
}

// Sets SO_REUSEADDR only: cpp-httplib's default also sets SO_REUSEPORT,
// with which a second server would silently share the port instead of
// failing to bind.
void MetricsSocketOptions(int sock) {
  int yes = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

constexpr auto kStartTimeout = std::chrono::seconds(5);
// cpp-httplib listens with a backlog of 5: a burst of connections (slow
// clients connecting at once) would overflow it and the kernel would drop
// the SYN of a scrape, which retries only after 1, 2, 4 s. The kernel caps
// this at net.core.somaxconn.
constexpr int kListenBacklog = 128;
// How often a wait on a connection looks at whether the server stops.
constexpr auto kStopPoll = std::chrono::milliseconds(100);

// cpp-httplib's task queue for the metrics server (httplib::ThreadPool
// has a fixed number of threads): one thread per connection being served,
// started on demand up to `max_threads`, each ending after `idle_timeout`
// without work, so that threads taken by a burst of slow connections are
// given back. When all are busy, connections wait in a FIFO of at most
// `max_queued`; while that is full, enqueue() (called by the accept loop)
// waits, so further connections stay in the kernel's listen backlog
// without costing a descriptor or memory here.
//
// Thread-safe: enqueue() runs on httplib's listening thread, the workers
// on their own, Release() on the owner's; shutdown() on the listening
// thread after its loop, then the destructor.
class ElasticTaskQueue final : public httplib::TaskQueue {
 public:
  // `on_destroy` runs first thing in the destructor.
  ElasticTaskQueue(const MetricsServerLimits& limits,
                   std::function<void()> on_destroy)
      : max_threads_(std::max<size_t>(1, limits.max_threads)),
        max_queued_(std::max<size_t>(1, limits.max_queued)),
        idle_timeout_(limits.idle_thread_timeout),
        on_destroy_(std::move(on_destroy)) {}
  ~ElasticTaskQueue() override {
    on_destroy_();
    shutdown();
  }

  void enqueue(std::function<void()> fn) override EXCLUDES(mu_) {
    std::vector<std::thread> finished;
    std::function<void()> inline_job;
    {
      MutexLock lock(&mu_);
      while (jobs_.size() >= max_queued_ && !released_) space_.wait(mu_);
      jobs_.push_back(std::move(fn));
      if (jobs_.size() > waiting_ && threads_.size() < max_threads_) {
        try {
          std::thread thread([this] { Work(); });
          const std::thread::id id = thread.get_id();
          threads_.emplace(id, std::move(thread));
        } catch (const std::system_error&) {
          // No thread to be had (a process limit). The job waits for a
          // running thread; with none, the accept loop serves it itself
          // (accepting nothing meanwhile) rather than let it wait for ever.
          if (threads_.empty()) inline_job = TakeJob();
        }
      } else {
        work_.notify_one();
      }
      finished = TakeFinished();
    }
    if (inline_job) inline_job();
    for (std::thread& thread : finished) thread.join();
  }

  // Waits for the connections being served and those queued (each ends
  // within the server's timeouts once it stops running), then for every
  // thread. Idempotent.
  void shutdown() override EXCLUDES(mu_) {
    std::vector<std::thread> threads;
    {
      MutexLock lock(&mu_);
      shutdown_ = true;
      released_ = true;
      for (auto& [id, thread] : threads_) threads.push_back(std::move(thread));
      threads_.clear();
      for (std::thread& thread : TakeFinished()) {
        threads.push_back(std::move(thread));
      }
    }
    work_.notify_all();
    space_.notify_all();
    for (std::thread& thread : threads) {
      if (thread.joinable()) thread.join();
    }
  }

  // Lets a waiting enqueue() go on (the server is stopping: its accept
  // loop must see that).
  void Release() EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      released_ = true;
    }
    space_.notify_all();
  }

  // Called by the accept loop when no connection came for a while: joins
  // the threads that ended idle, so that their stacks are given back.
  void on_idle() override EXCLUDES(mu_) {
    std::vector<std::thread> finished;
    {
      MutexLock lock(&mu_);
      finished = TakeFinished();
    }
    for (std::thread& thread : finished) thread.join();
  }

 private:
  void Work() EXCLUDES(mu_) {
    mu_.lock();
    while (true) {
      ++waiting_;
      const auto deadline = std::chrono::steady_clock::now() + idle_timeout_;
      while (jobs_.empty() && !shutdown_ &&
             work_.wait_until(mu_, deadline) != std::cv_status::timeout) {
      }
      --waiting_;
      if (jobs_.empty()) {
        if (shutdown_ || std::chrono::steady_clock::now() >= deadline) break;
        continue;
      }
      std::function<void()> fn = TakeJob();
      mu_.unlock();
      fn();  // serves one connection and closes it
      fn = nullptr;
      mu_.lock();
    }
    // Idle too long, or shutting down: hand this thread over to be joined
    // (by the next enqueue, or shutdown, which may have taken it already).
    if (auto self = threads_.find(std::this_thread::get_id());
        self != threads_.end()) {
      finished_.push_back(std::move(self->second));
      threads_.erase(self);
    }
    mu_.unlock();
  }

  std::function<void()> TakeJob() REQUIRES(mu_) {
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    space_.notify_one();
    return fn;
  }

  std::vector<std::thread> TakeFinished() REQUIRES(mu_) {
    std::vector<std::thread> finished;
    finished.swap(finished_);
    return finished;
  }

  const size_t max_threads_;
  const size_t max_queued_;
  const std::chrono::steady_clock::duration idle_timeout_;
  const std::function<void()> on_destroy_;
  Mutex mu_;
  std::condition_variable_any work_;   // a job was queued, or shutdown
  std::condition_variable_any space_;  // the queue has room, or released
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mu_);
  // Running threads (serving or waiting for work), by id.
  std::map<std::thread::id, std::thread> threads_ GUARDED_BY(mu_);
  std::vector<std::thread> finished_ GUARDED_BY(mu_);  // to be joined
  size_t waiting_ GUARDED_BY(mu_) = 0;  // threads waiting for a job
  bool shutdown_ GUARDED_BY(mu_) = false;
  bool released_ GUARDED_BY(mu_) = false;
};

using SteadyTime = std::chrono::steady_clock::time_point;

// One connection of the metrics server as cpp-httplib's Stream, enforcing
// what httplib 0.11 does not: a deadline for the whole connection and a
// byte budget per request (httplib reads request lines and headers without
// a size limit, and its timeouts are per read, so a client trickling bytes
// or streaming headers could hold a thread or grow memory without end).
// Every wait is also bounded by the io timeout and ends early when the
// server stops. Used by one serving thread.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int sock, const MetricsServerLimits& limits,
                   std::function<bool()> stopping)
      : sock_(sock),
        limits_(limits),
        stopping_(std::move(stopping)),
        deadline_(std::chrono::steady_clock::now() +
                  limits.connection_timeout) {}

  // Waits up to the io timeout for the next request's first byte; then
  // gives that request a fresh byte budget. False: nothing came, the
  // deadline passed or the server stops.
  bool NextRequest() {
    budget_ = limits_.max_request_bytes;
    return !failed_ && (begin_ < end_ || Wait(POLLIN));
  }
  // A read or write failed (timeout, deadline, too long, closed, error).
  // httplib then answers 400 if it can and would wait for another request
  // on the connection; the connection should rather end.
  bool failed() const { return failed_; }

  bool is_readable() const override { return begin_ < end_ || Wait(POLLIN); }
  bool is_writable() const override { return Wait(POLLOUT); }

  ssize_t read(char* ptr, size_t size) override {
    if (begin_ == end_) {
      if (budget_ == 0) return Fail();  // the request is too long
      while (true) {
        if (!Wait(POLLIN)) return Fail();
        const ssize_t n = ::recv(
            sock_, buffer_, std::min(sizeof(buffer_), budget_), MSG_DONTWAIT);
        if (n > 0) {
          begin_ = 0;
          end_ = static_cast<size_t>(n);
          budget_ -= end_;
          break;
        }
        if (n == 0) {  // the client closed
          failed_ = true;
          return 0;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          return Fail();
        }
      }
    }
    const size_t count = std::min(size, end_ - begin_);
    std::memcpy(ptr, buffer_ + begin_, count);
    begin_ += count;
    return static_cast<ssize_t>(count);
  }

  ssize_t write(const char* ptr, size_t size) override {
    while (true) {
      if (!Wait(POLLOUT)) return Fail();
      const ssize_t n = ::send(sock_, ptr, size, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n >= 0) return n;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return Fail();
      }
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Describe(::getpeername, &ip, &port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Describe(::getsockname, &ip, &port);
  }
  int socket() const override { return sock_; }

 private:
  // Waits for `events` for at most the io timeout and never past the
  // connection's deadline, looking every kStopPoll at whether the server
  // stops. True when the socket is ready (or closed: the read or write
  // then says so).
  bool Wait(short events) const {
    const SteadyTime until = std::min(
        deadline_, std::chrono::steady_clock::now() + limits_.io_timeout);
    while (true) {
      if (stopping_()) return false;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd item{sock_, events, 0};
      const int ready = ::poll(
          &item, 1, static_cast<int>(std::min(left, kStopPoll).count()) + 1);
      if (ready > 0) return true;
      if (ready < 0 && errno != EINTR) return false;
    }
  }

  ssize_t Fail() {
    failed_ = true;
    return -1;
  }

  // The address of one end of the connection, as `get_name` (getpeername
  // or getsockname) tells it; *ip and *port stay as they are when it fails.
  void Describe(int (*get_name)(int, sockaddr*, socklen_t*), std::string* ip,
                int* port) const {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (get_name(sock_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return;
    }
    char text[INET6_ADDRSTRLEN] = {};
    if (address.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
      ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
      *port = ntohs(v4->sin_port);
    } else if (address.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
      ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
      *port = ntohs(v6->sin6_port);
    }
    *ip = text;
  }

  const int sock_;
  const MetricsServerLimits& limits_;
  const std::function<bool()> stopping_;
  const SteadyTime deadline_;
  size_t budget_ = 0;  // bytes the current request may still take
  bool failed_ = false;
  char buffer_[4096];
  size_t begin_ = 0;
  size_t end_ = 0;
};

// cpp-httplib's server with its connection loop replaced (the virtual
// process_and_close_socket, as httplib's SSLServer does): the same
// keep-alive loop around httplib's own request parsing and routing
// (process_request), over a ConnectionStream instead of httplib's socket
// stream, so that MetricsServerLimits hold.
class MetricsHttpServer final : public httplib::Server {
 public:
  explicit MetricsHttpServer(const MetricsServerLimits& limits)
      : limits_(limits) {}

  // The bound listening socket (between bind and stop).
  int listen_socket() const { return svr_sock_; }

 private:
  bool process_and_close_socket(int sock) override {
    ConnectionStream stream(sock, limits_,
                            [this] { return svr_sock_ == INVALID_SOCKET; });
    bool ok = false;
    const size_t requests = std::max<size_t>(1, limits_.keep_alive_max);
    for (size_t i = 0; i < requests && stream.NextRequest(); ++i) {
      bool connection_closed = false;
      ok = process_request(stream, /*close_connection=*/i + 1 == requests,
                           connection_closed, nullptr);
      if (!ok || connection_closed || stream.failed()) break;
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ok;
  }

  const MetricsServerLimits limits_;
};

}  // namespace

void MetricCell::Add(double delta) {
  value_.fetch_add(delta, std::memory_order_relaxed);
}

MetricCell* MetricsRegistry::Counter(std::string_view name,
                                     std::string_view help,
                                     const MetricLabels& labels) {
  return Get(name, help, MetricType::kCounter, labels);
}

MetricCell* MetricsRegistry::Gauge(std::string_view name, std::string_view help,
                                   const MetricLabels& labels) {
  return Get(name, help, MetricType::kGauge, labels);
}

MetricCell* MetricsRegistry::Get(std::string_view name, std::string_view help,
                                 MetricType type, const MetricLabels& labels) {
  const std::string family_name = SanitizeName(name, true);
  const std::string key = RenderLabels(labels);
  MutexLock lock(&mu_);
  auto [it, inserted] = families_.try_emplace(family_name);
  Family& family = it->second;
  if (inserted) {
    family.help = std::string(help);
    family.type = type;
  }
  std::unique_ptr<MetricCell>& cell = family.series[key];
  if (!cell) cell = std::make_unique<MetricCell>();
  return cell.get();
}

std::string MetricsRegistry::RenderText() const {
  std::string out;
  MutexLock lock(&mu_);
  for (const auto& [name, family] : families_) {
    out += "# HELP " + name + " " + EscapeHelp(family.help) + "\n";
    out += "# TYPE " + name + " " + TypeName(family.type) + "\n";
    for (const auto& [labels, cell] : family.series) {
      out += name + labels + " " + FormatMetricValue(cell->value()) + "\n";
    }
  }
  return out;
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto [end, error] = std::to_chars(buf, buf + sizeof(buf), value);
  if (error != std::errc()) return "NaN";
  return std::string(buf, end);
}

std::string MetricSample::Label(std::string_view key) const {
  for (const auto& [name, value] : labels) {
    if (name == key) return value;
  }
  return "";
}

namespace {

// Parses one sample line; `error` says what is wrong.
bool ParseSampleLine(std::string_view line, MetricSample* sample,
                     std::string* error) {
  size_t i = 0;
  auto skip_spaces = [&] {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  };
  if (i >= line.size() || !IsNameStart(line[i], true)) {
    *error = "expected a metric name";
    return false;
  }
  const size_t name_start = i;
  while (i < line.size() && IsNameChar(line[i], true)) ++i;
  sample->name = std::string(line.substr(name_start, i - name_start));
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      skip_spaces();
      if (i < line.size() && line[i] == '}') {
        ++i;
        break;
      }
      if (i >= line.size() || !IsNameStart(line[i], false)) {
        *error = "expected a label name or '}'";
        return false;
      }
      const size_t key_start = i;
      while (i < line.size() && IsNameChar(line[i], false)) ++i;
      std::string key(line.substr(key_start, i - key_start));
      if (i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') {
        *error = "expected =\"value\" after label '" + key + "'";
        return false;
      }
      i += 2;
      std::string value;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i++];
        if (c == '"') {
          closed = true;
          break;
        }
        if (c == '\\') {
          if (i >= line.size()) break;
          const char escaped = line[i++];
          value += escaped == 'n' ? '\n' : escaped;
        } else {
          value += c;
        }
      }
      if (!closed) {
        *error = "unterminated value of label '" + key + "'";
        return false;
      }
      sample->labels.emplace_back(std::move(key), std::move(value));
      skip_spaces();
      if (i < line.size() && line[i] == ',') ++i;
    }
  }
  skip_spaces();
  const size_t value_start = i;
  while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
  const std::string_view text = line.substr(value_start, i - value_start);
  if (text == "NaN") {
    sample->value = std::nan("");
  } else if (text == "+Inf" || text == "Inf") {
    sample->value = HUGE_VAL;
  } else if (text == "-Inf") {
    sample->value = -HUGE_VAL;
  } else {
    const auto [end, ec] =
        std::from_chars(text.data(), text.data() + text.size(), sample->value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
      *error = "expected a number after the name, got '" +
               std::string(text.substr(0, 40)) + "'";
      return false;
    }
  }
  return true;  // an optional timestamp may follow; it is ignored
}

}  // namespace

Result<std::vector<MetricSample>> ParseMetricsText(std::string_view text) {
  std::vector<MetricSample> samples;
  int line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view()
                                             : text.substr(newline + 1);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
      line.remove_suffix(1);
    }
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) {
      line.remove_prefix(1);
    }
    if (line.empty() || line.front() == '#') continue;
    MetricSample sample;
    std::string error;
    if (!ParseSampleLine(line, &sample, &error)) {
      return DataLossError("metrics line " + std::to_string(line_number) +
                           " ('" + std::string(line.substr(0, 80)) +
                           "'): " + error);
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::string MetricsAddress::ToString() const {
  return host + ":" + std::to_string(port);
}

Result<MetricsAddress> ParseMetricsAddress(std::string_view text) {
  const std::string original(text.substr(0, 200));
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("metrics address '" + original + "': " + why +
                                " (expected HOST:PORT, e.g. 127.0.0.1:9100; "
                                "port 0 picks a free one)");
  };
  if (text.rfind("http://", 0) == 0) text.remove_prefix(7);
  if (text.size() >= 8 && text.substr(text.size() - 8) == "/metrics") {
    text.remove_suffix(8);
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("no port");
  MetricsAddress out;
  out.host = std::string(text.substr(0, colon));
  if (out.host.empty()) return bad("empty host");
  if (out.host == "*") out.host = "0.0.0.0";
  for (char c : out.host) {
    if (static_cast<unsigned char>(c) <= ' ' || c == '/' || c == ':' ||
        c == '[' || c == ']' || c == '"') {
      return bad("bad character in host");
    }
  }
  const std::string_view port = text.substr(colon + 1);
  int value = -1;
  const auto [end, ec] =
      std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() ||
      value < 0 || value > 65535) {
    return bad("port must be a number in 0..65535");
  }
  out.port = value;
  return out;
}

class MetricsServer::Impl {
 public:
  Impl(const MetricsRegistry* registry, const MetricsServerLimits& limits)
      : registry_(registry), limits_(limits) {}
  ~Impl() { Stop(); }

  Status Start(const MetricsAddress& address) {
    // The listening thread creates the queue when its loop starts and
    // deletes it when the loop ends; queue_ lets Stop() release an accept
    // loop waiting on a full queue.
    server_.new_task_queue = [this] {
      auto* queue = new ElasticTaskQueue(limits_, [this] {
        MutexLock lock(&queue_mu_);
        queue_ = nullptr;
      });
      MutexLock lock(&queue_mu_);
      queue_ = queue;
      return queue;
    };
    server_.set_socket_options(MetricsSocketOptions);
    // Timeouts, keep-alive and request sizes are MetricsHttpServer's; a
    // scrape carries no body.
    server_.set_payload_max_length(limits_.max_request_bytes);
    // The accept loop wakes this often when no connection comes, to join
    // the threads that ended idle (ElasticTaskQueue::on_idle).
    server_.set_idle_interval(1, 0);
    server_.Get("/metrics", [this](const httplib::Request&,
                                   httplib::Response& response) {
      response.set_content(registry_->RenderText(),
                           "text/plain; version=0.0.4; charset=utf-8");
    });
    server_.set_error_handler(
        [](const httplib::Request& request, httplib::Response& response) {
          if (response.status == 404) {
            response.set_content(
                "not found: " + request.path + " (metrics are at /metrics)\n",
                "text/plain");
          }
        });
    int port = address.port;
    if (port == 0) {
      port = server_.bind_to_any_port(address.host);
      if (port <= 0) port = -1;
    } else if (!server_.bind_to_port(address.host, port)) {
      port = -1;
    }
    if (port < 0) {
      return UnavailableError("cannot listen for metrics on " +
                              address.ToString() +
                              " (address in use or not on this host)");
    }
    // Listening already: this only raises the backlog.
    ::listen(server_.listen_socket(), kListenBacklog);
    address_ = MetricsAddress{address.host, port}.ToString();
    url_host_ = address.host == "0.0.0.0" ? "127.0.0.1" : address.host;
    url_host_ += ":" + std::to_string(port);
    thread_ = std::thread([this] {
      server_.listen_after_bind();
      done_.store(true);
    });
    // stop() is a no-op until the server runs: wait for it, so that an
    // early Stop() cannot miss it.
    const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
    while (!server_.is_running() && !done_.load() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!server_.is_running()) {
      Stop();
      return UnavailableError("metrics server on " + address_ +
                              " did not start");
    }
    return Status::Ok();
  }

  void Stop() {
    if (!thread_.joinable()) return;
    // Start() saw the server running (or its loop over), so this one
    // stop() closes the listening socket and ends the accept loop; a
    // second would trip cpp-httplib's assertion on the closed socket.
    if (!done_.load()) server_.stop();
    {
      MutexLock lock(&queue_mu_);
      if (queue_ != nullptr) queue_->Release();
    }
    thread_.join();
  }

  const std::string& address() const { return address_; }
  std::string url() const { return "http://" + url_host_ + "/metrics"; }

 private:
  // Threads: registry_ and server_ are read by the serving threads (both
  // thread-safe); thread_, address_ and url_host_ belong to the owner's
  // thread (set in Start before the thread runs, joined in Stop); done_ is
  // set by the listening thread when its loop ends; queue_ is set and
  // cleared by the listening thread (the queue's life) and read by Stop().
  const MetricsRegistry* registry_;
  const MetricsServerLimits limits_;
  Mutex queue_mu_;
  ElasticTaskQueue* queue_ GUARDED_BY(queue_mu_) = nullptr;
  MetricsHttpServer server_{limits_};
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::string address_;
  std::string url_host_;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsRegistry* registry, std::string_view address,
    const MetricsServerLimits& limits) {
  MERIDIAN_ASSIGN_OR_RETURN(MetricsAddress parsed,
                            ParseMetricsAddress(address));
  auto impl = std::make_unique<Impl>(registry, limits);
  try {
    MERIDIAN_RETURN_IF_ERROR(impl->Start(parsed));
  } catch (const std::exception& error) {
    return UnavailableError("metrics server on " + parsed.ToString() + ": " +
                            error.what());
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() = default;
void MetricsServer::Stop() { impl_->Stop(); }
const std::string& MetricsServer::address() const { return impl_->address(); }
std::string MetricsServer::url() const { return impl_->url(); }

std::unique_ptr<MetricsServer> StartMetricsServerOrWarn(
    const MetricsRegistry* registry, std::string_view address,
    std::string_view who) {
  if (address.empty() || address == "none") return nullptr;
  Result<std::unique_ptr<MetricsServer>> server =
      MetricsServer::Start(registry, address);
  if (!server.ok()) {
    MLOG(WARNING) << who << " runs without a metrics endpoint: "
                  << server.status().message();
    return nullptr;
  }
  MLOG(INFO) << "metrics at " << (*server)->url();
  return std::move(*server);
}

Result<std::string> FetchMetricsText(std::string_view address,
                                     double timeout_s) {
  MERIDIAN_ASSIGN_OR_RETURN(MetricsAddress parsed,
                            ParseMetricsAddress(address));
  if (parsed.port == 0) {
    return InvalidArgumentError("metrics address '" + std::string(address) +
                                "': port 0 cannot be scraped");
  }
  const std::string host = parsed.host == "0.0.0.0" ? "127.0.0.1" : parsed.host;
  try {
    httplib::Client client(host, parsed.port);
    const auto timeout = std::chrono::duration<double>(timeout_s);
    client.set_connection_timeout(
        std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    client.set_read_timeout(
        std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    client.set_write_timeout(
        std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    httplib::Result result = client.Get("/metrics");
    if (!result) {
      std::string why;
      switch (result.error()) {
        case httplib::Error::Connection:
          why = "connection refused or host unreachable";
          break;
        case httplib::Error::ConnectionTimeout:
          why = "no answer within the timeout";
          break;
        default:
          why = httplib::to_string(result.error());
      }
      return UnavailableError("cannot reach http://" + host + ":" +
                              std::to_string(parsed.port) + "/metrics: " + why);
    }
    if (result->status != 200) {
      return DataLossError("http://" + host + ":" +
                           std::to_string(parsed.port) + "/metrics answered " +
                           std::to_string(result->status));
    }
    return std::move(result->body);
  } catch (const std::exception& error) {
    return UnavailableError("scraping " + parsed.ToString() + ": " +
                            error.what());
  }
}

}  // namespace meridian
