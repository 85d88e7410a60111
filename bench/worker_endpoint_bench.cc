// The worker endpoint under abuse (issue 13; a benchmark, not a timed test).
//
//   bench/scenarios/worker_endpoint [--out DIR] ...   (runs this)
//   build/bin/worker_endpoint_bench [--seconds-per-phase S] [--model-hidden H]
//       [--flood-connections N] [--out DIR] [--meridian PATH]
//
// Starts a real `meridian site` (one site, policy ASYNC, an MLP 784-H-10 on
// generated data) and joins its two worker slots: worker 0 is well behaved
// and PULLs the whole model in a loop (an RpcClient, as `meridian worker`
// uses), worker 1 belongs to the benchmark. Measures worker 0's PULL round
// trip (p50, p99) in three phases of --seconds-per-phase each:
//   idle      nothing else talks to the server (worker 1 heartbeats);
//   flood     N anonymous connections (default 20) each send requests as
//             fast as the server answers them, 4 in flight per connection:
//             STATUS_REQUESTs, garbage headers, PULLs from strangers, HELLOs
//             with a wrong model; they read every reply;
//   slow      worker 1's connection stops reading its replies and keeps
//             sending PULLs (one per millisecond; dropped when its socket
//             will not take them);
//   endless   N strangers each stream one multipart message that never
//             ends (raw ZMTP; half in 1 KiB frames, half in empty frames)
//             as fast as the kernel takes it;
//   drip      500 connections each send a byte every 100 ms (a handshake,
//             then a message that never ends); one the server closes is
//             opened again at once;
//   held      up to 10,000 connections opened (as fast as the server
//             accepts them) and held, saying nothing.
// For the last three the RSS bound is idle RSS + the worker endpoint front's
// bound (SiteStatus.front.memory_bound, wan/front.h).
// and the server's RSS (VmRSS) before, at most during, and after each phase
// (after: 1 s after the phase's load stopped). Prints a markdown table and
// the goal:
//   p99 during abuse <= 2 x idle p99 + the flood's own service time (the
//   server's CPU time per flood message: its CPU time in the flood phase,
//   less the worker's PULLs at the idle phase's CPU per PULL, over the
//   flood replies it sent), and
//   RSS <= idle RSS + connections x (send_queue + receive_queue) x
//   (model bytes + 1 MiB) (job.proto server.limits defaults 4 and 8).
// Whether the goal is met never changes the exit status (0 unless the
// benchmark could not run). --out DIR also writes DIR/results.md and
// DIR/results.json.

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "meridian/config/config.h"
#include "meridian/core/layout.h"
#include "meridian/net/message.h"
#include "meridian/train/model.h"
#include "meridian/net/transport.h"
#include "meridian/wire.pb.h"
#include "meridian/core/process.h"
#include "testing/raw_zmtp.h"
#include "testing/site_control.h"
#include "testing/test_data.h"

namespace meridian {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kSite[] = "site-a";
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kSendQueue = 4;  // job.proto EndpointLimits defaults
constexpr uint64_t kReceiveQueue = 8;
constexpr int kFloodDepth = 4;  // requests in flight per flood connection
constexpr int kHeldConnections = 10000;
constexpr int kDripConnections = 500;

struct Options {
  double seconds_per_phase = 10;
  int hidden = 256;
  int flood_connections = 20;
  std::string out_dir;
  std::string meridian;
};

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "worker_endpoint_bench: %s\n", message.c_str());
  std::exit(1);
}

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

// User + system CPU seconds `pid` has used (/proc/PID/stat).
double ReadCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  // Fields after the command (which may hold spaces): state is field 3,
  // utime 14, stime 15.
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::strtod(field.c_str(), nullptr);
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

uint64_t ReadRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    }
  }
  return 0;
}

pb::Endpoint Worker(uint32_t index) {
  pb::Endpoint self;
  self.set_site(kSite);
  self.set_role(pb::ROLE_WORKER);
  self.set_id(index);
  return self;
}

pb::Endpoint Client() {
  pb::Endpoint self;
  self.set_role(pb::ROLE_CLIENT);
  return self;
}

void SendHeader(zmq::socket_t& socket, const pb::Header& header,
                zmq::send_flags flags = zmq::send_flags::none) {
  const std::string bytes = header.SerializeAsString();
  (void)socket.send(zmq::buffer(bytes), flags);
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = std::min(
      values.size() - 1, static_cast<size_t>(p * (values.size() - 1) + 0.5));
  return values[index];
}

struct PhaseResult {
  std::string name;
  std::vector<double> rtt_ms;
  uint64_t failures = 0;  // PULLs without an answer within the timeout
  uint64_t rss_before = 0;
  uint64_t rss_max = 0;
  uint64_t rss_after = 0;
  uint64_t load_messages = 0;  // sent by the phase's abusers
  uint64_t load_replies = 0;   // received by them
  double server_cpu_s = 0;     // the server's CPU time during the phase
  double p50() const { return Percentile(rtt_ms, 0.5); }
  double p99() const { return Percentile(rtt_ms, 0.99); }
};

class Bench {
 public:
  explicit Bench(Options options) : options_(std::move(options)) {}
  int Run();

 private:
  void Setup();
  void Join();
  // Runs worker 0's PULL loop and `load` (on this thread) for one phase.
  PhaseResult Phase(
      const std::string& name,
      const std::function<void(const std::atomic<bool>&, PhaseResult*)>& load);
  void Flood(const std::atomic<bool>& stop, PhaseResult* result);
  void SlowReader(const std::atomic<bool>& stop, PhaseResult* result);
  // `endless` and `drips` strangers (testing::Intruders) for the phase;
  // load_messages: the bytes they got into the kernel.
  void Strangers(const std::atomic<bool>& stop, PhaseResult* result,
                 int endless, int drips);
  // kHeldConnections connections opened and held, saying nothing.
  void Held(const std::atomic<bool>& stop, PhaseResult* result);
  void HeartbeatWorker1();
  // The goals of a run, from its idle and flood phases (phases[0], [1]).
  struct Goals {
    double idle_p99_ms = 0;
    // The server's CPU time per flood message (ms).
    double flood_service_ms = 0;
    double p99_ms = 0;
    // Bound of the phases whose connections the server's queues hold.
    uint64_t queued_rss_bytes = 0;
  };
  Goals GoalsOf(const std::vector<PhaseResult>& phases) const;
  // The RSS bound of `phase`: the front's logged bound for the strangers'
  // partial messages, dripping and held connections, else the queues'.
  uint64_t RssBoundOf(const PhaseResult& phase, const Goals& goals) const;
  void Report(const std::vector<PhaseResult>& phases);
  void WriteJson(const std::vector<PhaseResult>& phases,
                 const Goals& goals) const;

  Options options_;
  std::string dir_;
  std::string job_path_;
  pb::JobConfig job_;
  ModelLayout layout_;
  uint64_t params_ = 0;
  std::optional<ChildProcess> server_;
  std::string endpoint_;
  // The worker endpoint front's bound and counters at the end (0: none).
  uint64_t front_bound_ = 0;
  pb::FrontStatus front_stats_;
  zmq::context_t context_;
  std::unique_ptr<RpcClient> good_;
  std::unique_ptr<zmq::socket_t> worker1_;
  uint64_t worker1_seq_ = 0;
  SteadyClock::time_point worker1_last_{};
  uint64_t idle_rss_ = 0;
};

void Bench::Setup() {
  dir_ = testing::MakeTempDir("worker-endpoint-bench");
  testing::SyntheticDataOptions data;
  data.train_samples = 300;
  data.test_samples = 200;
  if (Status s = testing::WriteSyntheticIdx(dir_ + "/data", data); !s.ok()) {
    Die(s.ToString());
  }
  job_ = testing::SmallJob(dir_ + "/data", 2, options_.hidden);
  job_.set_name("worker-endpoint-bench");
  job_.set_stop_at_target(false);
  job_.set_time_budget_s(3600);
  job_.mutable_server()->set_eval_period_s(5);
  job_.mutable_fault()->set_checkpoint_period_s(0);
  job_.mutable_policy()->set_kind(pb::ASYNC);
  if (!ValidateJobConfig(job_).empty()) Die("the generated job is invalid");
  job_path_ = dir_ + "/job.pbtxt";
  if (Status s = testing::WriteJobFile(job_, job_path_); !s.ok()) {
    Die(s.ToString());
  }
  Result<std::unique_ptr<Model>> model = MakeModel(job_.model(), 784, 10);
  if (!model.ok()) Die(model.status().ToString());
  layout_ = (*model)->layout();
  params_ = layout_.num_elements();
  Result<ChildProcess> child = ChildProcess::Spawn(
      "site",
      {options_.meridian, "site", "--config", job_path_, "--site", kSite,
       "--bind", "tcp://127.0.0.1:*", "--out", dir_, "--ready-fd",
       std::to_string(kReadyFd), "--metrics", "none"},
      dir_ + "/site.log");
  if (!child.ok()) Die(child.status().ToString());
  server_.emplace(std::move(*child));
  Result<std::string> line = server_->ReadReadyLine(milliseconds(60000));
  if (!line.ok()) Die("the site did not start: " + line.status().ToString());
  std::istringstream words(*line);
  std::string ready;
  words >> ready >> endpoint_;
}

void Bench::Join() {
  good_ = std::make_unique<RpcClient>(context_, endpoint_, Worker(0));
  worker1_ =
      std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
  worker1_->set(zmq::sockopt::linger, 0);
  // When it stops reading, this side buffers next to nothing.
  worker1_->set(zmq::sockopt::rcvhwm, 1);
  worker1_->connect(endpoint_);
  pb::Header hello = MakeHeader(pb::HELLO, Worker(1), ++worker1_seq_);
  hello.mutable_hello()->set_worker_index(1);
  hello.mutable_hello()->set_incarnation(0x5eed0001);
  LayoutToSpecs(layout_, hello.mutable_hello()->mutable_layout());
  SendHeader(*worker1_, hello);
  worker1_last_ = SteadyClock::now();
  // Worker 0's HELLO completes the site: both WELCOMEs come now.
  pb::Header hello0;
  hello0.set_type(pb::HELLO);
  hello0.mutable_hello()->set_worker_index(0);
  hello0.mutable_hello()->set_incarnation(0x5eed0000);
  LayoutToSpecs(layout_, hello0.mutable_hello()->mutable_layout());
  Result<Envelope> welcome = good_->Call(hello0, {}, milliseconds(30000));
  if (!welcome.ok() || welcome->header.type() != pb::WELCOME) {
    Die("worker 0 was not welcomed: " + (welcome.ok()
                                             ? DescribeHeader(welcome->header)
                                             : welcome.status().ToString()));
  }
  Result<Received> welcome1 =
      ReceiveMessage(*worker1_, false, milliseconds(30000));
  if (!welcome1.ok() || !welcome1->message ||
      welcome1->message->header.type() != pb::WELCOME) {
    Die("worker 1 was not welcomed");
  }
}

// Worker 1 stays alive (fault.worker_timeout_s) while it is not abusing.
void Bench::HeartbeatWorker1() {
  while (true) {
    Result<Received> drained =
        ReceiveMessage(*worker1_, false, milliseconds(0));
    if (!drained.ok() || drained->timed_out()) break;
  }
  if (SecondsSince(worker1_last_) < 1.0) return;
  pb::Header heartbeat = MakeHeader(pb::HEARTBEAT, Worker(1), ++worker1_seq_);
  heartbeat.mutable_heartbeat();
  SendHeader(*worker1_, heartbeat, zmq::send_flags::dontwait);
  worker1_last_ = SteadyClock::now();
}

PhaseResult Bench::Phase(
    const std::string& name,
    const std::function<void(const std::atomic<bool>&, PhaseResult*)>& load) {
  PhaseResult result;
  result.name = name;
  const pid_t pid = server_->pid();
  result.rss_before = ReadRss(pid);
  const double cpu_before = ReadCpuSeconds(pid);
  result.rss_max = result.rss_before;
  std::atomic<bool> stop{false};
  std::vector<double> rtt;
  uint64_t failures = 0;
  std::thread good([&] {
    pb::Header pull;
    pull.set_type(pb::PULL);
    pull.mutable_pull();
    while (!stop.load()) {
      const auto start = SteadyClock::now();
      Result<Envelope> reply = good_->Call(pull, {}, milliseconds(30000));
      const double ms = SecondsSince(start) * 1e3;
      if (!reply.ok() || reply->header.type() != pb::MODEL) {
        ++failures;
        continue;
      }
      rtt.push_back(ms);
    }
  });
  std::thread sampler([&] {
    while (!stop.load()) {
      result.rss_max = std::max(result.rss_max, ReadRss(pid));
      std::this_thread::sleep_for(milliseconds(50));
    }
  });
  std::thread timer([&] {
    std::this_thread::sleep_for(
        std::chrono::duration<double>(options_.seconds_per_phase));
    stop = true;
  });
  load(stop, &result);
  timer.join();
  good.join();
  sampler.join();
  result.server_cpu_s = ReadCpuSeconds(pid) - cpu_before;
  result.rtt_ms = std::move(rtt);
  result.failures = failures;
  // Let the server settle (its queues drain, the abusers are gone).
  for (int i = 0; i < 20; ++i) {
    HeartbeatWorker1();
    std::this_thread::sleep_for(milliseconds(50));
  }
  result.rss_after = ReadRss(pid);
  if (!server_->Poll()) return result;
  Die("the server exited during phase " + name + ": " +
      server_->DescribeExit() + "\n" + server_->LogTail(20));
}

// N anonymous connections, kFloodDepth requests in flight each: a new one
// goes out for every reply.
void Bench::Flood(const std::atomic<bool>& stop, PhaseResult* result) {
  std::vector<zmq::socket_t> sockets;
  for (int i = 0; i < options_.flood_connections; ++i) {
    sockets.emplace_back(context_, zmq::socket_type::dealer);
    sockets.back().set(zmq::sockopt::linger, 0);
    sockets.back().connect(endpoint_);
  }
  std::mt19937_64 rng(7);
  uint64_t sequence = 0;
  auto message = [&]() -> std::string {
    switch (rng() % 5) {
      case 0: {  // garbage header
        std::string bytes(8 + rng() % 120, '\0');
        for (char& ch : bytes) ch = static_cast<char>(rng());
        return bytes;
      }
      case 1: {  // a PULL from a stranger
        pb::Header pull = MakeHeader(pb::PULL, Client(), ++sequence);
        pull.mutable_pull();
        return pull.SerializeAsString();
      }
      case 2: {  // a HELLO with another model
        pb::Header hello = MakeHeader(pb::HELLO, Worker(1), ++sequence);
        hello.mutable_hello()->set_worker_index(1);
        pb::TensorSpec* spec = hello.mutable_hello()->add_layout();
        spec->set_name("fc1.weight");
        spec->add_shape(1);
        return hello.SerializeAsString();
      }
      default:
        return MakeHeader(pb::STATUS_REQUEST, Client(), ++sequence)
            .SerializeAsString();
    }
  };
  std::vector<int> inflight(sockets.size(), 0);
  std::vector<SteadyClock::time_point> last_reply(sockets.size(),
                                                  SteadyClock::now());
  std::vector<zmq::pollitem_t> items;
  for (zmq::socket_t& socket : sockets) {
    items.push_back({socket.handle(), 0, ZMQ_POLLIN, 0});
  }
  while (!stop.load()) {
    for (size_t i = 0; i < sockets.size(); ++i) {
      // A reply that never came (dropped by the server) frees its place.
      if (inflight[i] > 0 && SecondsSince(last_reply[i]) > 1.0) {
        inflight[i] = 0;
        last_reply[i] = SteadyClock::now();
      }
      while (inflight[i] < kFloodDepth) {
        const std::string bytes = message();
        if (!sockets[i].send(zmq::buffer(bytes), zmq::send_flags::dontwait)) {
          break;
        }
        ++inflight[i];
        ++result->load_messages;
      }
    }
    HeartbeatWorker1();
    zmq::poll(items.data(), items.size(), milliseconds(20));
    for (size_t i = 0; i < items.size(); ++i) {
      if (!(items[i].revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      while (zmq::recv_multipart(sockets[i], std::back_inserter(frames),
                                 zmq::recv_flags::dontwait)) {
        ++result->load_replies;
        inflight[i] = std::max(0, inflight[i] - 1);
        last_reply[i] = SteadyClock::now();
        frames.clear();
      }
    }
  }
}

// Worker 1 stops reading and keeps sending PULLs of the whole model.
void Bench::SlowReader(const std::atomic<bool>& stop, PhaseResult* result) {
  while (!stop.load()) {
    pb::Header pull = MakeHeader(pb::PULL, Worker(1), ++worker1_seq_);
    pull.mutable_pull();
    const std::string bytes = pull.SerializeAsString();
    if (worker1_->send(zmq::buffer(bytes), zmq::send_flags::dontwait)) {
      ++result->load_messages;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  // It reads again: whatever the server managed to queue for it.
  const auto start = SteadyClock::now();
  while (SecondsSince(start) < 30) {
    Result<Received> received =
        ReceiveMessage(*worker1_, false, milliseconds(500));
    if (!received.ok() || received->timed_out()) break;
    ++result->load_replies;
  }
}

void Bench::Strangers(const std::atomic<bool>& stop, PhaseResult* result,
                      int endless, int drips) {
  testing::Intruders intruders(endpoint_, endless, drips);
  while (!stop.load()) std::this_thread::sleep_for(milliseconds(20));
  result->load_messages = intruders.bytes_sent();
}

void Bench::Held(const std::atomic<bool>& stop, PhaseResult* result) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &limit);
  std::vector<int> fds;
  for (int i = 0; i < kHeldConnections && !stop.load(); ++i) {
    const int fd = testing::ConnectRawTcp(endpoint_);
    if (fd < 0) break;
    fds.push_back(fd);
  }
  result->load_messages = fds.size();
  while (!stop.load()) std::this_thread::sleep_for(milliseconds(20));
  for (int fd : fds) ::close(fd);
}

Bench::Goals Bench::GoalsOf(const std::vector<PhaseResult>& phases) const {
  const PhaseResult& idle = phases[0];
  const PhaseResult& flood = phases[1];
  Goals goals;
  goals.idle_p99_ms = idle.p99();
  // The server's CPU time per flood message: the flood phase's CPU time
  // less what the worker's PULLs cost (at the idle phase's CPU per PULL),
  // over the flood's replies.
  const double pull_cpu_s =
      idle.rtt_ms.empty() ? 0 : idle.server_cpu_s / idle.rtt_ms.size();
  const double flood_cpu_s = std::max(
      0.0, flood.server_cpu_s - pull_cpu_s * flood.rtt_ms.size());
  goals.flood_service_ms =
      flood.load_replies > 0 ? flood_cpu_s * 1e3 / flood.load_replies : 0;
  goals.p99_ms = 2 * goals.idle_p99_ms + goals.flood_service_ms;
  const uint64_t model_bytes = params_ * sizeof(float);
  const uint64_t connections = 2 + options_.flood_connections;
  goals.queued_rss_bytes = idle_rss_ + connections *
                                           (kSendQueue + kReceiveQueue) *
                                           (model_bytes + kMiB);
  return goals;
}

uint64_t Bench::RssBoundOf(const PhaseResult& phase,
                           const Goals& goals) const {
  const bool fronted = phase.name.find("endless") != std::string::npos ||
                       phase.name.find("drip") != std::string::npos ||
                       phase.name.find("held") != std::string::npos;
  return fronted ? idle_rss_ + front_bound_ : goals.queued_rss_bytes;
}

void Bench::Report(const std::vector<PhaseResult>& phases) {
  const PhaseResult& idle = phases[0];
  const PhaseResult& flood = phases[1];
  const Goals goals = GoalsOf(phases);
  const double idle_p99 = goals.idle_p99_ms;
  const double flood_service_ms = goals.flood_service_ms;
  const double flood_cpu_s =
      flood.load_replies > 0 ? flood_service_ms * flood.load_replies / 1e3
                             : 0;
  const uint64_t model_bytes = params_ * sizeof(float);
  const uint64_t connections = 2 + options_.flood_connections;
  const uint64_t rss_bound = goals.queued_rss_bytes;
  const double p99_goal = goals.p99_ms;
  std::ostringstream md;
  char line[1024];
  std::snprintf(line, sizeof(line),
                "Worker endpoint under abuse: MLP 784-%d-10 (%" PRIu64
                " parameters, %.2f MB), %.0f s per phase, %d flood "
                "connections, %u cores\n\n",
                options_.hidden, params_, model_bytes / 1e6,
                options_.seconds_per_phase, options_.flood_connections,
                std::thread::hardware_concurrency());
  md << line;
  md << "| phase | PULLs | p50 ms | p99 ms | p99 / idle p99 | RSS before MB | "
        "RSS max MB | RSS after MB | abuser msgs sent / replies read | goal "
        "|\n|---|---|---|---|---|---|---|---|---|---|\n";
  for (const PhaseResult& phase : phases) {
    const bool is_idle = &phase == &idle;
    const bool p99_ok = is_idle || phase.p99() <= p99_goal;
    const bool rss_ok = phase.rss_max <= RssBoundOf(phase, goals);
    std::snprintf(
        line, sizeof(line),
        "| %s | %zu%s | %.2f | %.2f | %.2f | %.1f | %.1f | %.1f | %" PRIu64
        " / %" PRIu64 " | %s |\n",
        phase.name.c_str(), phase.rtt_ms.size(),
        phase.failures > 0
            ? (" (+" + std::to_string(phase.failures) + " failed)").c_str()
            : "",
        phase.p50(), phase.p99(), idle_p99 > 0 ? phase.p99() / idle_p99 : 0,
        phase.rss_before / 1e6, phase.rss_max / 1e6, phase.rss_after / 1e6,
        phase.load_messages, phase.load_replies,
        is_idle              ? "-"
        : (p99_ok && rss_ok) ? "met"
        : !p99_ok && !rss_ok ? "NOT met (p99, RSS)"
        : !p99_ok            ? "NOT met (p99)"
                             : "NOT met (RSS)");
    md << line;
  }
  std::snprintf(
      line, sizeof(line),
      "\ngoal: p99 during abuse at most 2x idle p99 plus the flood's own "
      "service time: <= 2 x %.2f + %.3f = %.2f ms (service time: the "
      "server's %.2f s of CPU in the flood phase, less %.2f s for the "
      "worker's PULLs at the idle phase's CPU per PULL, over the flood's "
      "%" PRIu64 " replies); RSS bounded by idle RSS + connections x (send_queue + "
      "receive_queue) x (model bytes + 1 MiB) = %.1f + %" PRIu64 " x (%" PRIu64
      " + %" PRIu64 ") x (%.2f + 1.05) MB = %.1f MB\n",
      idle_p99, flood_service_ms, p99_goal, flood.server_cpu_s,
      flood.server_cpu_s - flood_cpu_s, flood.load_replies, idle_rss_ / 1e6, connections, kSendQueue,
      kReceiveQueue, model_bytes / 1e6, rss_bound / 1e6);
  md << line;
  std::snprintf(
      line, sizeof(line),
      "endless messages (half in 1 KiB frames, half in empty ones; abuser "
      "msgs: bytes sent) and held connections (abuser msgs: connections "
      "opened): RSS bounded by idle RSS + the front's logged bound = %.1f + "
      "%.1f MB = %.1f MB; the front at the end: %" PRIu64
      " connections (%" PRIu64 " trusted), %" PRIu64 " evicted, %" PRIu64
      " stalled, %" PRIu64 " refused, %" PRIu64
      " waits for the untrusted message budget\n",
      idle_rss_ / 1e6, front_bound_ / 1e6, (idle_rss_ + front_bound_) / 1e6,
      front_stats_.connections(), front_stats_.trusted(),
      front_stats_.evicted(), front_stats_.stalled(), front_stats_.refused(),
      front_stats_.budget_waits());
  md << line;
  std::printf("%s", md.str().c_str());
  std::fflush(stdout);
  if (options_.out_dir.empty()) return;
  std::filesystem::create_directories(options_.out_dir);
  std::ofstream(options_.out_dir + "/results.md") << md.str();
  WriteJson(phases, goals);
}

void Bench::WriteJson(const std::vector<PhaseResult>& phases,
                      const Goals& goals) const {
  std::ofstream json(options_.out_dir + "/results.json");
  json << "{\n  \"model_parameters\": " << params_
       << ",\n  \"seconds_per_phase\": " << options_.seconds_per_phase
       << ",\n  \"flood_connections\": " << options_.flood_connections
       << ",\n  \"flood_service_ms\": " << goals.flood_service_ms
       << ",\n  \"p99_goal_ms\": " << goals.p99_ms
       << ",\n  \"idle_p99_ms\": " << goals.idle_p99_ms
       << ",\n  \"idle_rss_bytes\": " << idle_rss_
       << ",\n  \"front_bound_bytes\": " << front_bound_
       << ",\n  \"rss_bound_bytes\": " << goals.queued_rss_bytes << ",\n  \"phases\": [";
  for (size_t i = 0; i < phases.size(); ++i) {
    const PhaseResult& phase = phases[i];
    json << (i ? "," : "") << "\n    {\"phase\": \"" << phase.name
         << "\", \"pulls\": " << phase.rtt_ms.size()
         << ", \"failed\": " << phase.failures
         << ", \"p50_ms\": " << phase.p50() << ", \"p99_ms\": " << phase.p99()
         << ", \"rss_before_bytes\": " << phase.rss_before
         << ", \"rss_max_bytes\": " << phase.rss_max
         << ", \"rss_after_bytes\": " << phase.rss_after
         << ", \"abuser_messages\": " << phase.load_messages
         << ", \"abuser_replies\": " << phase.load_replies
         << ", \"rss_bound_bytes\": " << RssBoundOf(phase, goals) << "}";
  }
  json << "\n  ]\n}\n";
}

int Bench::Run() {
  Setup();
  Join();
  // Warm up: the first replies allocate.
  pb::Header pull;
  pull.set_type(pb::PULL);
  pull.mutable_pull();
  for (int i = 0; i < 50; ++i) {
    if (!good_->Call(pull, {}, milliseconds(10000)).ok()) Die("warm-up PULL");
  }
  std::this_thread::sleep_for(milliseconds(200));
  idle_rss_ = ReadRss(server_->pid());
  std::vector<PhaseResult> phases;
  phases.push_back(
      Phase("idle", [&](const std::atomic<bool>& stop, PhaseResult*) {
        while (!stop.load()) {
          HeartbeatWorker1();
          std::this_thread::sleep_for(milliseconds(20));
        }
      }));
  phases.push_back(
      Phase("flood", [&](const std::atomic<bool>& stop, PhaseResult* result) {
        Flood(stop, result);
      }));
  phases.push_back(Phase(
      "slow reader", [&](const std::atomic<bool>& stop, PhaseResult* result) {
        SlowReader(stop, result);
      }));
  phases.push_back(Phase(
      "endless messages",
      [&](const std::atomic<bool>& stop, PhaseResult* result) {
        Strangers(stop, result, options_.flood_connections, 0);
      }));
  phases.push_back(Phase(
      "dripping connections (500)",
      [&](const std::atomic<bool>& stop, PhaseResult* result) {
        Strangers(stop, result, 0, kDripConnections);
      }));
  phases.push_back(Phase(
      "held connections (up to 10,000)",
      [&](const std::atomic<bool>& stop, PhaseResult* result) {
        Held(stop, result);
      }));
  Result<pb::SiteStatus> status =
      testing::QueryStatus(context_, endpoint_, milliseconds(10000));
  if (status.ok()) {
    front_bound_ = status->front().memory_bound();
    front_stats_ = status->front();
  }
  Report(phases);
  good_.reset();
  worker1_.reset();
  server_->Signal(SIGTERM);
  const auto start = SteadyClock::now();
  while (!server_->Poll() && SecondsSince(start) < 30) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  if (!server_->Poll()) {
    std::printf("note: the server did not exit within 30 s of SIGTERM\n");
  }
  return 0;
}

}  // namespace
}  // namespace meridian

int main(int argc, char** argv) {
  meridian::Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) meridian::Die("missing value after " + arg);
      return argv[++i];
    };
    if (arg == "--seconds-per-phase") {
      options.seconds_per_phase = std::atof(value().c_str());
    } else if (arg == "--model-hidden") {
      options.hidden = std::atoi(value().c_str());
    } else if (arg == "--flood-connections") {
      options.flood_connections = std::atoi(value().c_str());
    } else if (arg == "--out") {
      options.out_dir = value();
    } else if (arg == "--meridian") {
      options.meridian = value();
    } else {
      std::fprintf(stderr,
                   "usage: %s [--seconds-per-phase S] [--model-hidden H] "
                   "[--flood-connections N] [--out DIR] [--meridian PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  if (options.seconds_per_phase <= 0 || options.hidden < 1 ||
      options.flood_connections < 1) {
    meridian::Die(
        "need --seconds-per-phase > 0, --model-hidden >= 1 and "
        "--flood-connections >= 1");
  }
  if (options.meridian.empty()) {
    options.meridian =
        (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
         "meridian")
            .string();
  }
  if (!std::filesystem::exists(options.meridian)) {
    meridian::Die("no meridian binary at " + options.meridian);
  }
  ::signal(SIGPIPE, SIG_IGN);
  meridian::Bench bench(options);
  return bench.Run();
}
