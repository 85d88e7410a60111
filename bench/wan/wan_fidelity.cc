// Fidelity benchmark of the WAN emulator (not a timed test).
//
//   bench/wan/fidelity [--quick] [--json FILE]      (builds, then runs this)
//   build/bin/wan_fidelity [--quick] [--json FILE] [--meridian PATH]
//                          [--no-tbf] [--no-jitter]
//
// Drives real bytes over loopback through a real `meridian wanem` process
// (the one-link form, one process per cell) and measures, per configured
// bandwidth x latency:
//  - throughput: one TCP stream sends as fast as it can; the receiver times
//    the bytes after its first read, from that read to the last byte;
//  - added one-way latency: 64-byte probes on an otherwise idle link, each
//    carrying its send time (steady clock, same machine), 10 ms apart;
//    median and p99 of receive time - send time;
//  - jitter: probes 30 ms apart through 50 ms +- 10 ms (uniform, normal);
//    the moments of the measured delay against the configured distribution;
//  - the unshaped proxy (no bandwidth, no latency): its throughput ceiling
//    and overhead, against the same stream without the proxy;
//  - where network namespaces work: Linux tbf on a veth pair between two
//    namespaces at the same bandwidths (this kernel has no netem).
// Also checks that wanem's byte counters equal the bytes sent.
// Prints a markdown table with the goals and writes JSON.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "meridian/wan/control.h"
#include "meridian/core/process.h"  // src/: ChildProcess
#include "wan/socket_util.h"  // wan/: ListenTcp, ConnectTcp, WriteAll

namespace {

namespace wan = meridian::wan;
using meridian::Result;
using meridian::wan::WriteAll;  // wan/socket_util.h

using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             Clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "wan_fidelity: %s\n", message.c_str());
  std::exit(1);
}

// ---- sockets ----------------------------------------------------------------

struct Endpoint {
  std::string host;
  int port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};

// A listening socket on `host` with a free port, stored in `*port`.
int ListenOn(const std::string& host, int* port) {
  Result<int> fd = wan::ListenTcp(wan::HostPort{host, 0});
  if (!fd.ok()) Die("listen on " + host + ": " + fd.status().message());
  Result<std::string> local = wan::LocalAddress(*fd);
  if (!local.ok()) Die("getsockname: " + local.status().message());
  *port = std::stoi(local->substr(local->rfind(':') + 1));
  return *fd;
}

// A connected socket (TCP_NODELAY).
int ConnectTo(const Endpoint& to) {
  Result<int> fd = wan::ConnectTcp(
      wan::HostPort{to.host, static_cast<uint16_t>(to.port)},
      std::chrono::seconds(10));
  if (!fd.ok()) Die("connect " + to.str() + ": " + fd.status().message());
  return *fd;
}

// Accepts one connection within `timeout_s`; -1 on timeout.
int AcceptOne(int listen_fd, double timeout_s) {
  pollfd item{listen_fd, POLLIN, 0};
  if (::poll(&item, 1, static_cast<int>(timeout_s * 1000)) <= 0) return -1;
  return ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
}

// ---- measurements -----------------------------------------------------------

struct Throughput {
  double bits_per_s = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  bool ok = false;
};

// Sends `bytes` over `to` while a thread (in `sink_netns`, if any) receives
// them on `listen_fd`.
Throughput MeasureThroughput(int listen_fd, const Endpoint& to, uint64_t bytes,
                             double timeout_s,
                             const std::string& sink_netns = "",
                             const std::string& source_netns = "");

void EnterNetns(const std::string& name) {
  if (name.empty()) return;
  const std::string path = "/var/run/netns/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
    Die("cannot enter netns " + name + ": " + std::strerror(errno));
  }
  ::close(fd);
}

Throughput MeasureThroughput(int listen_fd, const Endpoint& to, uint64_t bytes,
                             double timeout_s, const std::string& sink_netns,
                             const std::string& source_netns) {
  Throughput result;
  std::atomic<bool> receiver_done{false};
  int64_t first_ns = 0, last_ns = 0;
  uint64_t first_bytes = 0, received = 0;
  std::thread receiver([&] {
    (void)sink_netns;  // the listening socket already lives there
    const int fd = AcceptOne(listen_fd, timeout_s);
    if (fd < 0) {
      receiver_done = true;
      return;
    }
    std::vector<char> buffer(1 << 20);
    const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_s * 1e9);
    while (received < bytes && NowNs() < deadline) {
      pollfd item{fd, POLLIN, 0};
      if (::poll(&item, 1, 200) <= 0) continue;
      const ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
      if (n <= 0) break;
      const int64_t now = NowNs();
      if (received == 0) {
        first_ns = now;
        first_bytes = static_cast<uint64_t>(n);
      }
      last_ns = now;
      received += static_cast<uint64_t>(n);
    }
    ::close(fd);
    receiver_done = true;
  });
  std::thread sender([&] {
    EnterNetns(source_netns);
    const int fd = ConnectTo(to);
    std::vector<char> block(1 << 20);
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i);
    uint64_t left = bytes;
    while (left > 0 && !receiver_done.load()) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(left, block.size()));
      if (!WriteAll(fd, block.data(), n)) break;
      left -= n;
    }
    // Keep the connection until the receiver has everything.
    while (!receiver_done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::close(fd);
  });
  sender.join();
  receiver.join();
  result.bytes = received;
  if (received == bytes && last_ns > first_ns) {
    result.seconds = static_cast<double>(last_ns - first_ns) / 1e9;
    result.bits_per_s =
        static_cast<double>(received - first_bytes) * 8.0 / result.seconds;
    result.ok = true;
  }
  return result;
}

struct Probe {
  uint64_t seq;
  int64_t sent_ns;
  char pad[48];
};
static_assert(sizeof(Probe) == 64);

// One-way delays (seconds) of `count` probes sent `interval_s` apart.
std::vector<double> MeasureDelays(int listen_fd, const Endpoint& to, int count,
                                  double interval_s, double timeout_s) {
  std::vector<double> delays;
  std::thread receiver([&] {
    const int fd = AcceptOne(listen_fd, timeout_s);
    if (fd < 0) return;
    Probe probe;
    size_t have = 0;
    const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_s * 1e9);
    while (static_cast<int>(delays.size()) < count && NowNs() < deadline) {
      pollfd item{fd, POLLIN, 0};
      if (::poll(&item, 1, 200) <= 0) continue;
      const ssize_t n = ::recv(fd, reinterpret_cast<char*>(&probe) + have,
                               sizeof(probe) - have, 0);
      if (n <= 0) break;
      have += static_cast<size_t>(n);
      if (have == sizeof(probe)) {
        delays.push_back(static_cast<double>(NowNs() - probe.sent_ns) / 1e9);
        have = 0;
      }
    }
    ::close(fd);
  });
  const int fd = ConnectTo(to);
  int64_t next = NowNs() + 20'000'000;  // let the connection settle
  for (int i = 0; i < count; ++i) {
    std::this_thread::sleep_until(
        Clock::time_point(std::chrono::nanoseconds(next)));
    Probe probe{};
    probe.seq = static_cast<uint64_t>(i);
    probe.sent_ns = NowNs();
    if (!WriteAll(fd, &probe, sizeof(probe))) break;
    next += static_cast<int64_t>(interval_s * 1e9);
  }
  receiver.join();
  ::close(fd);
  return delays;
}

struct Stats {
  double mean = 0, sd = 0, p1 = 0, p50 = 0, p99 = 0, min = 0, max = 0;
  size_t n = 0;
};

Stats Describe(std::vector<double> v) {
  Stats s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) {
    const double idx = p * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(idx));
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (idx - static_cast<double>(lo));
  };
  for (double x : v) s.mean += x;
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = v.size() > 1 ? std::sqrt(s.sd / static_cast<double>(v.size() - 1)) : 0;
  s.p1 = pct(0.01);
  s.p50 = pct(0.5);
  s.p99 = pct(0.99);
  s.min = v.front();
  s.max = v.back();
  return s;
}

// ---- the wanem process ------------------------------------------------------

class Wanem {
 public:
  Wanem(const std::string& binary, const std::vector<std::string>& flags,
        const std::string& log_path) {
    std::vector<std::string> argv = {binary, "wanem"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"--control", "tcp://127.0.0.1:0", "--ready-fd",
                             std::to_string(meridian::kReadyFd)});
    Result<meridian::ChildProcess> child =
        meridian::ChildProcess::Spawn("wanem", argv, log_path);
    if (!child.ok()) Die("cannot start wanem: " + child.status().message());
    child_.emplace(std::move(*child));
    Result<std::string> line =
        child_->ReadReadyLine(std::chrono::milliseconds(10000));
    if (!line.ok() || line->rfind("ready ", 0) != 0) {
      Stop();
      Die("wanem did not start (log: " + log_path + ")");
    }
    control_ = line->substr(6);
    meridian::wan::ControlClient client(control_);
    auto status = client.GetStatus();
    if (!status.ok() || status->links_size() == 0 ||
        status->links(0).routes_size() == 0) {
      Stop();
      Die("wanem status: " + status.status().ToString());
    }
    const std::string listen = status->links(0).routes(0).listen();
    listen_.host = listen.substr(0, listen.rfind(':'));
    listen_.port = std::stoi(listen.substr(listen.rfind(':') + 1));
  }
  ~Wanem() { Stop(); }

  // Bytes delivered client->server and messages, from wanem's counters.
  uint64_t UpstreamBytes() {
    meridian::wan::ControlClient client(control_);
    auto status = client.GetStatus();
    if (!status.ok() || status->links_size() == 0) return 0;
    return status->links(0).a_to_b().bytes();
  }

  const Endpoint& listen() const { return listen_; }

  // SIGTERM, then waits for the exit (SIGKILL after 10 s).
  void Stop() {
    if (!child_) return;
    child_->Signal(SIGTERM);
    for (int i = 0; i < 1000 && !child_->Poll(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    child_.reset();  // kills and reaps a child still running
  }

 private:
  std::optional<meridian::ChildProcess> child_;
  std::string control_;
  Endpoint listen_;
};

// ---- tbf in network namespaces
// -----------------------------------------------

bool Sh(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
}

class Netns {
 public:
  static constexpr const char* kA = "meridian-wanbench-a";
  static constexpr const char* kB = "meridian-wanbench-b";
  static constexpr const char* kAddrA = "10.231.77.1";
  static constexpr const char* kAddrB = "10.231.77.2";

  // Empty string: ready; otherwise why not.
  std::string Setup() {
    Cleanup();
    if (::geteuid() != 0) return "not root";
    if (!Sh("ip netns add " + std::string(kA))) {
      return "'ip netns add' failed (no permission or no netns support)";
    }
    created_ = true;
    if (!Sh("ip netns add " + std::string(kB)) ||
        !Sh("ip link add mwbench-a type veth peer name mwbench-b") ||
        !Sh("ip link set mwbench-a netns " + std::string(kA)) ||
        !Sh("ip link set mwbench-b netns " + std::string(kB)) ||
        !Sh("ip -n " + std::string(kA) + " addr add " + kAddrA +
            "/24 dev mwbench-a") ||
        !Sh("ip -n " + std::string(kB) + " addr add " + kAddrB +
            "/24 dev mwbench-b") ||
        !Sh("ip -n " + std::string(kA) + " link set mwbench-a up") ||
        !Sh("ip -n " + std::string(kB) + " link set mwbench-b up") ||
        !Sh("ip -n " + std::string(kA) + " link set lo up") ||
        !Sh("ip -n " + std::string(kB) + " link set lo up")) {
      return "could not build the veth pair between namespaces";
    }
    if (!Sh("ip netns exec " + std::string(kA) +
            " tc qdisc replace dev mwbench-a root tbf rate 10mbit burst 15000 "
            "latency 50ms")) {
      return "tc cannot attach tbf (sch_tbf missing?)";
    }
    return "";
  }

  bool SetRate(double mbit) {
    // Burst: at least 1 ms of data and 15 kB (Mininet uses burst 15k);
    // queue: 50 ms (tc turns it into a byte limit).
    const double burst = std::max(15000.0, mbit * 1e6 / 8 / 1000);
    char command[256];
    std::snprintf(command, sizeof(command),
                  "ip netns exec %s tc qdisc replace dev mwbench-a root tbf "
                  "rate %.0fmbit burst %.0f latency 50ms",
                  kA, mbit, burst);
    return Sh(command);
  }

  void Cleanup() {
    Sh("ip netns del " + std::string(kA));
    Sh("ip netns del " + std::string(kB));
    created_ = false;
  }
  ~Netns() { Cleanup(); }

 private:
  bool created_ = false;
};

// ---- the run
// ------------------------------------------------------------------

struct Cell {
  double mbit = 0;  // 0: unshaped
  double latency_ms = 0;
  Throughput throughput;
  Stats delay;  // seconds
  uint64_t counted = 0;
  uint64_t sent = 0;
};

std::string Fmt(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

std::string Rate(double bps) {
  if (bps >= 1e9) return Fmt("%.3f Gbit/s", bps / 1e9);
  if (bps >= 1e6) return Fmt("%.3f Mbit/s", bps / 1e6);
  return Fmt("%.1f kbit/s", bps / 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, tbf = true, jitter = true;
  std::string json_path, binary;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else if (arg == "--meridian" && i + 1 < argc) {
      binary = argv[++i];
    } else if (arg == "--no-tbf") {
      tbf = false;
    } else if (arg == "--no-jitter") {
      jitter = false;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--json FILE] [--meridian PATH] "
                   "[--no-tbf] [--no-jitter]\n",
                   argv[0]);
      return 2;
    }
  }
  ::signal(SIGPIPE, SIG_IGN);
  if (binary.empty()) {
    binary = (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
              "meridian")
                 .string();
  }
  if (!std::filesystem::exists(binary)) Die("no meridian binary at " + binary);
  const std::string log_path =
      (std::filesystem::temp_directory_path() / "wan_fidelity_wanem.log")
          .string();
  std::remove(log_path.c_str());

  // Transfers sized to ~1.5 s of link time (0.25 s with --quick).
  const double transfer_s = quick ? 0.25 : 1.5;
  const int probes = quick ? 20 : 100;
  std::vector<double> bandwidths = {1, 10, 100, 1000};
  std::vector<double> latencies = {0, 10, 50, 150};
  if (quick) {
    bandwidths = {10, 100};
    latencies = {0, 10};
  }

  int sink_port = 0;
  const int sink = ListenOn("127.0.0.1", &sink_port);
  const Endpoint sink_endpoint{"127.0.0.1", sink_port};

  std::string load;
  {
    std::ifstream in("/proc/loadavg");
    std::getline(in, load);
  }
  std::printf("WAN emulator fidelity (meridian wanem over loopback)%s\n",
              quick ? " --quick" : "");
  std::printf("load average before: %s\n\n", load.c_str());
  std::fflush(stdout);

  // Shaped cells.
  std::vector<Cell> cells;
  for (double mbit : bandwidths) {
    for (double latency_ms : latencies) {
      Cell cell;
      cell.mbit = mbit;
      cell.latency_ms = latency_ms;
      Wanem wanem(binary,
                  {"--listen", "127.0.0.1:0", "--forward", sink_endpoint.str(),
                   "--bandwidth", Fmt("%.0fmbit", mbit), "--latency",
                   Fmt("%.0fms", latency_ms)},
                  log_path);
      cell.sent = static_cast<uint64_t>(mbit * 1e6 / 8 * transfer_s);
      cell.throughput = MeasureThroughput(sink, wanem.listen(), cell.sent,
                                          transfer_s * 4 + 10);
      cell.delay = Describe(
          MeasureDelays(sink, wanem.listen(), probes, 0.01, probes * 0.01 + 5));
      cell.counted = wanem.UpstreamBytes();
      wanem.Stop();
      std::fprintf(stderr,
                   "  %5.0f Mbit/s %4.0f ms: %s, one-way median %.3f ms\n",
                   mbit, latency_ms, Rate(cell.throughput.bits_per_s).c_str(),
                   cell.delay.p50 * 1e3);
      cells.push_back(cell);
    }
  }

  // Unshaped proxy vs the same stream without it.
  const uint64_t big = quick ? (256ull << 20) : (2ull << 30);
  Cell direct;
  direct.sent = big;
  direct.throughput = MeasureThroughput(sink, sink_endpoint, big, 60);
  direct.delay = Describe(
      MeasureDelays(sink, sink_endpoint, probes, 0.01, probes * 0.01 + 5));
  Cell unshaped;
  {
    Wanem wanem(binary,
                {"--listen", "127.0.0.1:0", "--forward", sink_endpoint.str()},
                log_path);
    unshaped.sent = big;
    unshaped.throughput = MeasureThroughput(sink, wanem.listen(), big, 60);
    unshaped.delay = Describe(
        MeasureDelays(sink, wanem.listen(), probes, 0.01, probes * 0.01 + 5));
    unshaped.counted = wanem.UpstreamBytes();
  }
  std::fprintf(stderr, "  unshaped: %s (direct %s)\n",
               Rate(unshaped.throughput.bits_per_s).c_str(),
               Rate(direct.throughput.bits_per_s).c_str());

  // Jitter distributions.
  struct JitterCell {
    std::string distribution;
    Stats delay;
  };
  std::vector<JitterCell> jitters;
  if (jitter) {
    for (const std::string distribution : {"uniform", "normal"}) {
      Wanem wanem(binary,
                  {"--listen", "127.0.0.1:0", "--forward", sink_endpoint.str(),
                   "--bandwidth", "100mbit", "--latency", "50ms", "--jitter",
                   "10ms", "--jitter-distribution", distribution},
                  log_path);
      const int n = quick ? 30 : 100;
      jitters.push_back(
          {distribution, Describe(MeasureDelays(sink, wanem.listen(), n, 0.03,
                                                n * 0.03 + 5))});
    }
  }

  // tbf on a veth pair.
  struct TbfCell {
    double mbit;
    Throughput throughput;
    uint64_t sent;
  };
  std::vector<TbfCell> tbf_cells;
  std::string tbf_skipped;
  if (!tbf) {
    tbf_skipped = "--no-tbf";
  } else {
    Netns netns;
    tbf_skipped = netns.Setup();
    if (tbf_skipped.empty()) {
      int port = 0;
      int listen_fd = -1;
      std::thread([&] {
        EnterNetns(Netns::kB);
        listen_fd = ListenOn(Netns::kAddrB, &port);
      }).join();
      for (double mbit : bandwidths) {
        if (!netns.SetRate(mbit)) {
          tbf_skipped = "tc tbf rate change failed";
          break;
        }
        TbfCell cell{
            mbit, {}, static_cast<uint64_t>(mbit * 1e6 / 8 * transfer_s)};
        cell.throughput = MeasureThroughput(
            listen_fd, Endpoint{Netns::kAddrB, port}, cell.sent,
            transfer_s * 4 + 10, Netns::kB, Netns::kA);
        std::fprintf(stderr, "  tbf %5.0f Mbit/s: %s\n", mbit,
                     Rate(cell.throughput.bits_per_s).c_str());
        tbf_cells.push_back(cell);
      }
      ::close(listen_fd);
    }
  }
  {
    std::ifstream in("/proc/loadavg");
    std::getline(in, load);
  }

  // ---- report ----
  int met = 0, total = 0;
  std::printf(
      "| bandwidth | latency | throughput | error | one-way median | p99 | "
      "median error | bytes counted | goals met |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (const Cell& c : cells) {
    const double target = c.mbit * 1e6;
    const double error =
        c.throughput.ok ? (c.throughput.bits_per_s - target) / target : NAN;
    const double median_error_ms = c.delay.p50 * 1e3 - c.latency_ms;
    const bool tput_ok = c.throughput.ok && std::fabs(error) <= 0.02;
    const bool lat_ok = c.delay.n > 0 && std::fabs(median_error_ms) <= 1.0;
    total += 2;
    met += tput_ok + lat_ok;
    std::printf(
        "| %.0f Mbit/s | %.0f ms | %s | %+.2f%% %s | %.3f ms | %.3f ms | "
        "%+.3f ms %s | %s |  %s |\n",
        c.mbit, c.latency_ms, Rate(c.throughput.bits_per_s).c_str(),
        error * 100, tput_ok ? "✓" : "✗", c.delay.p50 * 1e3, c.delay.p99 * 1e3,
        median_error_ms, lat_ok ? "✓" : "✗",
        c.counted == c.sent + sizeof(Probe) * probes ? "exact" : "MISMATCH",
        tput_ok && lat_ok ? "yes" : "no");
  }
  const double unshaped_gbs = unshaped.throughput.bits_per_s / 8 / 1e9;
  const bool unshaped_ok = unshaped_gbs >= 1.0;
  ++total;
  met += unshaped_ok;
  std::printf(
      "\n| path | throughput | one-way median | p99 | goal | met |\n"
      "|---|---|---|---|---|---|\n"
      "| loopback, no proxy | %.2f GB/s | %.3f ms | %.3f ms | — | — |\n"
      "| unshaped wanem proxy | %.2f GB/s (%.0f%% of direct) | %.3f ms "
      "(+%.3f) | %.3f ms | ≥ 1 GB/s | %s |\n",
      direct.throughput.bits_per_s / 8 / 1e9, direct.delay.p50 * 1e3,
      direct.delay.p99 * 1e3, unshaped_gbs,
      100 * unshaped.throughput.bits_per_s /
          std::max(1.0, direct.throughput.bits_per_s),
      unshaped.delay.p50 * 1e3, (unshaped.delay.p50 - direct.delay.p50) * 1e3,
      unshaped.delay.p99 * 1e3, unshaped_ok ? "yes" : "no");
  if (!jitters.empty()) {
    std::printf(
        "\n| jitter (100 Mbit/s, 50 ms ± 10 ms) | mean | sd (expected) | p1 | "
        "median | p99 | min | max |\n|---|---|---|---|---|---|---|---|\n");
    for (const JitterCell& j : jitters) {
      const double expected_sd =
          j.distribution == "uniform" ? 10.0 / std::sqrt(3.0) : 10.0;
      std::printf(
          "| %s | %.2f ms | %.2f ms (%.2f) | %.2f ms | %.2f ms | %.2f ms | "
          "%.2f ms | %.2f ms |\n",
          j.distribution.c_str(), j.delay.mean * 1e3, j.delay.sd * 1e3,
          expected_sd, j.delay.p1 * 1e3, j.delay.p50 * 1e3, j.delay.p99 * 1e3,
          j.delay.min * 1e3, j.delay.max * 1e3);
    }
  }
  if (!tbf_cells.empty()) {
    // tbf meters whole Ethernet frames: with a 1500-byte MTU and TCP
    // timestamps, 1448 of every 1514 bytes are payload, so TCP goodput
    // through a perfect tbf is 4.4% under its rate. wanem meters payload.
    constexpr double kPayloadShare = 1448.0 / 1514.0;
    std::printf(
        "\n| Linux tbf on veth (netns) | TCP goodput | vs rate | vs rate x "
        "1448/1514 (payload share of a frame) |\n|---|---|---|---|\n");
    for (const TbfCell& t : tbf_cells) {
      const double rate = t.mbit * 1e6;
      std::printf("| %.0f Mbit/s | %s | %+.2f%% | %+.2f%% |\n", t.mbit,
                  Rate(t.throughput.bits_per_s).c_str(),
                  (t.throughput.bits_per_s - rate) / rate * 100,
                  (t.throughput.bits_per_s - rate * kPayloadShare) /
                      (rate * kPayloadShare) * 100);
    }
  } else {
    std::printf("\ntbf comparison skipped: %s\n", tbf_skipped.c_str());
  }
  std::printf(
      "\ngoals met: %d of %d (throughput within ±2%%, median one-way "
      "latency within ±1 ms, unshaped ≥ 1 GB/s)\n",
      met, total);
  std::printf("load average after: %s\n", load.c_str());

  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\n  \"quick\": " << (quick ? "true" : "false")
        << ",\n  \"load_after\": \"" << load << "\",\n  \"cells\": [\n";
    for (size_t i = 0; i < cells.size(); ++i) {
      const Cell& c = cells[i];
      out << "    {\"bandwidth_mbit\": " << c.mbit
          << ", \"latency_ms\": " << c.latency_ms
          << ", \"throughput_bps\": " << c.throughput.bits_per_s
          << ", \"transfer_bytes\": " << c.sent
          << ", \"counted_bytes\": " << c.counted
          << ", \"one_way_median_ms\": " << c.delay.p50 * 1e3
          << ", \"one_way_p99_ms\": " << c.delay.p99 * 1e3
          << ", \"probes\": " << c.delay.n << "}"
          << (i + 1 < cells.size() ? "," : "") << "\n";
    }
    out << "  ],\n  \"direct\": {\"throughput_bps\": "
        << direct.throughput.bits_per_s
        << ", \"one_way_median_ms\": " << direct.delay.p50 * 1e3
        << ", \"one_way_p99_ms\": " << direct.delay.p99 * 1e3 << "},\n"
        << "  \"unshaped\": {\"throughput_bps\": "
        << unshaped.throughput.bits_per_s
        << ", \"one_way_median_ms\": " << unshaped.delay.p50 * 1e3
        << ", \"one_way_p99_ms\": " << unshaped.delay.p99 * 1e3 << "},\n"
        << "  \"jitter\": [";
    for (size_t i = 0; i < jitters.size(); ++i) {
      const Stats& s = jitters[i].delay;
      out << (i ? ", " : "") << "{\"distribution\": \""
          << jitters[i].distribution << "\", \"mean_ms\": " << s.mean * 1e3
          << ", \"sd_ms\": " << s.sd * 1e3 << ", \"p1_ms\": " << s.p1 * 1e3
          << ", \"median_ms\": " << s.p50 * 1e3
          << ", \"p99_ms\": " << s.p99 * 1e3 << "}";
    }
    out << "],\n  \"tbf\": [";
    for (size_t i = 0; i < tbf_cells.size(); ++i) {
      out << (i ? ", " : "") << "{\"bandwidth_mbit\": " << tbf_cells[i].mbit
          << ", \"throughput_bps\": " << tbf_cells[i].throughput.bits_per_s
          << "}";
    }
    out << "],\n  \"tbf_skipped\": \"" << tbf_skipped << "\",\n"
        << "  \"goals_met\": " << met << ",\n  \"goals_total\": " << total
        << "\n}\n";
    std::printf("json: %s\n", json_path.c_str());
  }
  ::close(sink);
  return 0;
}
