#include "meridian/metrics.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <thread>

#include "meridian/log.h"

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

// Threads serving scrapes: they are rare and answered in microseconds.
constexpr size_t kServerThreads = 2;
constexpr time_t kKeepAliveS = 1;  // bounds how long Stop() can wait
constexpr auto kStartTimeout = std::chrono::seconds(5);

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
  explicit Impl(const MetricsRegistry* registry) : registry_(registry) {}
  ~Impl() { Stop(); }

  Status Start(const MetricsAddress& address) {
    server_.new_task_queue = [] {
      return new httplib::ThreadPool(kServerThreads);
    };
    server_.set_socket_options(MetricsSocketOptions);
    server_.set_keep_alive_timeout(kKeepAliveS);
    server_.set_read_timeout(kKeepAliveS, 0);
    server_.set_write_timeout(kKeepAliveS, 0);
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
    thread_.join();
  }

  const std::string& address() const { return address_; }
  std::string url() const { return "http://" + url_host_ + "/metrics"; }

 private:
  // Threads: registry_ and server_ are read by the serving threads (both
  // thread-safe); thread_, address_ and url_host_ belong to the owner's
  // thread (set in Start before the thread runs, joined in Stop); done_ is
  // set by the listening thread when its loop ends.
  const MetricsRegistry* registry_;
  httplib::Server server_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::string address_;
  std::string url_host_;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsRegistry* registry, std::string_view address) {
  MERIDIAN_ASSIGN_OR_RETURN(MetricsAddress parsed,
                            ParseMetricsAddress(address));
  auto impl = std::make_unique<Impl>(registry);
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
