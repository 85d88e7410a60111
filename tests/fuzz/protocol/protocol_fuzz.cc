// A stateful protocol fuzzer of a live site server's worker endpoint
// (issue 13). Not a libFuzzer target: a plain program with a seeded RNG that
// starts a real `meridian site` (one site, policy ASYNC, a small MLP, data
// it generates) and talks to it over real ZeroMQ DEALER sockets, the way
// workers, tools and hostile peers do.
//
//   protocol_fuzz --seconds N [--seed S] [--connections C] [--meridian PATH]
//                 [--workers W] [--hidden H] [--probe-every K]
//                 [--reply-timeout-ms T] [--probe-timeout-ms T]
//                 [--memory-limit-mb M] [--max-steps N] [--keep-going]
//                 [--trace]
//
// Connections: one per worker slot (they HELLO as the site's workers; the
// fuzzer owns every slot, so it is the only writer of the model), C - W - 1
// anonymous ones, and one raw connection for bytes that are no message at
// all. Every step runs one action: a valid request (COMMIT, PULL, partial
// PULL, HEARTBEAT, BYE and a rejoin, STATUS_REQUEST, a takeover of a slot
// by another connection, a reconnect), a mutation of a valid message (bit
// flips, truncation and garbage in frame 0, missing and extra frames,
// wrong slice sizes, offsets, lengths, tensors, codecs, NaN and Inf
// payloads, commits from the future, out-of-range and huge PULL ranges,
// many ranges, sequence numbers 0 / replayed / 2^64-1 / far ahead, wrong
// sender, role and site, another slot's identity over this connection,
// control messages without the token, message types a server never
// serves, wrong protocol versions, bad HELLOs, requests out of order and
// while one is in flight, many and oversized frames), a burst of requests,
// a connection that stops reading its replies for a while and keeps
// sending, or a raw TCP connection that streams one multipart message that
// never ends (ZMTP by hand, in 1 KiB or in empty frames; up to 4 at a time,
// each pushed more on every step until it gives up or the server closes
// it). Every reply is classified (per action: MODEL, ERROR_<code>, ...,
// none) and every message the fuzzer sends is first decoded with the
// server's own decoder, so it knows what the server must refuse.
//
// Checks, after every step:
//  (a) the server process is up;
//  (b) every K steps a STATUS_REQUEST from a fresh connection is answered
//      within --probe-timeout-ms (5 s);
//  (c) the model changes only through COMMITs: the fuzzer keeps the model
//      it expects (the model in the reply to each COMMIT answered with
//      MODEL; its version is one above the last), PULLs the whole model
//      after every step that sent a mutated or foreign message, and
//      compares every reply that carries model values (WELCOME, MODEL, a
//      partial MODEL) and every STATUS_REPLY's model_version with it, bit
//      for bit; a message the server must refuse that is answered with
//      anything but ERROR is a finding as well;
//  (d) the server's RSS (VmRSS) stays below idle RSS + connections x
//      (send_queue + receive_queue) x (model bytes + 1 MiB) + 64 MiB
//      (job.proto server.limits defaults: 4 and 8 messages; connections
//      count the endless streams), printed at the start;
//  (e) no reply carries more floats than server.limits.max_reply_floats
//      (default: the model's parameter count).
// At the end the server gets SIGTERM and must exit cleanly.
//
// Prints executions (messages sent), refusals by code, replies by action,
// probes, max RSS, and "no finding" or each finding with the seed and step
// to reproduce it (the same seed replays the same actions; --max-steps
// stops there). Exits 1 on a finding. --keep-going records a finding,
// stops generating what caused it, restarts the server and goes on (for
// long runs that should report every kind of finding, not only the first).
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "meridian/config/config.h"
#include "meridian/core/layout.h"
#include "meridian/net/message.h"
#include "meridian/train/model.h"
#include "meridian/net/transport.h"
#include "meridian/wire.pb.h"
#include "meridian/core/process.h"
#include "meridian/wan/front.h"
#include "testing/raw_zmtp.h"
#include "testing/test_data.h"

namespace meridian::protocol_fuzz {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kSite[] = "site-a";
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMiB = uint64_t{1} << 20;
// A sequence number this far above the last accepted one is refused by the
// hardened server (issue 13); the fuzzer rejoins a slot after sending one.
constexpr uint64_t kSequenceWindow = uint64_t{1} << 20;
// job.proto EndpointLimits defaults.
constexpr uint64_t kDefaultSendQueue = 4;
constexpr uint64_t kDefaultReceiveQueue = 8;
constexpr uint64_t kRssSlackBytes = 64 * kMiB;
// What the server keeps of retired incarnations (worker_table.h).
constexpr size_t kRetiredIncarnations = 8;
constexpr size_t kTraceLines = 40;
constexpr size_t kHistoryVersions = 64;
constexpr uint64_t kFrameChargeBytes = wan::ConnectionFront::kFrameChargeBytes;
// Endless messages: streams open at once, and the most pushed into one
// stream in one step (it stops earlier when the kernel takes no more).
constexpr size_t kMaxEndlessStreams = 4;
// How long a replaced connection's socket may go on sending what it had
// queued (OpenConnection says why it is not 0).
constexpr int kCloseLingerMs = 100;
constexpr uint64_t kEndlessPushBytes = 512 * 1024;

struct Options {
  double seconds = 30;
  uint64_t seed = 0;  // 0: from the clock (printed)
  int connections = 6;
  int workers = 3;
  int hidden = 64;
  std::string meridian;
  int probe_every = 25;
  int reply_timeout_ms = 2000;
  int probe_timeout_ms = 5000;
  uint64_t memory_limit_mb = 4096;  // RLIMIT_AS of the server; 0: none
  uint64_t max_steps = 0;           // 0: until --seconds
  bool keep_going = false;
  bool trace = false;
};

double SecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double>(SteadyClock::now() - start).count();
}

std::string Decimal(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "%" PRIu64, value);
  return text;
}

std::string Mb(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f MB", bytes / 1e6);
  return text;
}

// Printable, one line, at most `max` characters.
std::string Printable(const std::string& text, size_t max = 160) {
  std::string out;
  for (char ch : text) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  }
  return out;
}

// ---- the server process
// ------------------------------------------------------

uint64_t ReadRssBytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    }
  }
  return 0;
}

class Server {
 public:
  Status Start(const Options& options, const std::string& job_path,
               const std::string& dir, int run) {
    const std::string out = dir + "/out-" + std::to_string(run);
    std::filesystem::create_directories(out);
    log_path_ = dir + "/site-" + std::to_string(run) + ".log";
    std::vector<std::string> argv;
    if (options.memory_limit_mb > 0 &&
        std::filesystem::exists("/usr/bin/prlimit")) {
      // prlimit execs the server in place: the pid stays the server's.
      argv = {"/usr/bin/prlimit",
              "--as=" + Decimal(options.memory_limit_mb * kMiB), "--"};
    }
    for (const std::string& arg :
         {options.meridian, std::string("site"), std::string("--config"),
          job_path, std::string("--site"), std::string(kSite),
          std::string("--bind"), std::string("tcp://127.0.0.1:*"),
          std::string("--out"), out, std::string("--ready-fd"),
          std::to_string(kReadyFd), std::string("--metrics"),
          std::string("none")}) {
      argv.push_back(arg);
    }
    MERIDIAN_ASSIGN_OR_RETURN(ChildProcess child,
                              ChildProcess::Spawn("site", argv, log_path_));
    process_.emplace(std::move(child));
    MERIDIAN_ASSIGN_OR_RETURN(std::string line,
                              process_->ReadReadyLine(milliseconds(60000)));
    std::istringstream words(line);
    std::string ready;
    words >> ready >> endpoint_;
    if (ready != "ready" || endpoint_.empty()) {
      return InternalError("unexpected ready line '" + line + "'");
    }
    return Status::Ok();
  }

  bool Alive() { return process_ && !process_->Poll(); }
  pid_t pid() const { return process_ ? process_->pid() : -1; }
  uint64_t Rss() const { return process_ ? ReadRssBytes(process_->pid()) : 0; }
  const std::string& endpoint() const { return endpoint_; }
  const std::string& log_path() const { return log_path_; }
  std::string DescribeExit() const {
    return process_ ? process_->DescribeExit() : "not started";
  }
  std::string LogTail(int lines) const {
    return process_ ? process_->LogTail(lines) : "";
  }

  // SIGTERM (the server finishes cleanly on a signal), then up to
  // `wait_s` for it to exit; SIGKILL after that. Returns "" for a clean
  // exit (status 0 or 130), else what happened.
  std::string Stop(double wait_s) {
    if (!process_) return "";
    std::string problem;
    if (!process_->Poll()) {
      process_->Signal(SIGTERM);
      const auto start = SteadyClock::now();
      while (!process_->Poll() && SecondsSince(start) < wait_s) {
        std::this_thread::sleep_for(milliseconds(20));
      }
      if (!process_->Poll()) {
        process_->Signal(SIGKILL);
        while (!process_->Poll()) {
          std::this_thread::sleep_for(milliseconds(10));
        }
        problem = "did not exit within " + std::to_string(int(wait_s)) +
                  " s of SIGTERM (killed)";
      }
    }
    if (problem.empty()) {
      const int status = process_->exit_status();
      const bool clean = WIFEXITED(status) && (WEXITSTATUS(status) == 0 ||
                                               WEXITSTATUS(status) == 130);
      if (!clean) problem = process_->DescribeExit() + " after SIGTERM";
    }
    process_.reset();
    return problem;
  }

 private:
  std::optional<ChildProcess> process_;
  std::string endpoint_;
  std::string log_path_;
};

// ---- messages
// ------------------------------------------------------------------

// A message as it goes out: frame 0 (the header, or raw bytes) and payload
// frames.
struct Wire {
  pb::Header header;
  std::optional<std::string> raw_frame0;  // set: frame 0 is these bytes
  std::vector<std::string> payload;

  std::string Frame0() const {
    return raw_frame0 ? *raw_frame0 : header.SerializeAsString();
  }
};

enum class ConnKind { kWorker, kAnonymous, kRaw };

const char* KindName(ConnKind kind) {
  switch (kind) {
    case ConnKind::kWorker:
      return "worker";
    case ConnKind::kAnonymous:
      return "anon";
    case ConnKind::kRaw:
      return "raw";
  }
  return "?";
}

// A message sent and not yet answered.
struct Sent {
  uint64_t step = 0;
  std::string action;
  bool parsed = false;   // frame 0 parses as a Header
  bool decodes = false;  // DecodeMessage accepts the whole message
  pb::Header header;     // when parsed
  bool valid = false;    // a valid request by the fuzzer's own bookkeeping
  bool must_refuse = false;
  std::string why_refuse;
  bool may_apply = false;  // a decodable COMMIT: may change the model
  bool expects_reply = true;
  // An answer is not certain (an oversized frame: a server with
  // ZMQ_MAXMSGSIZE drops the connection instead): waited for briefly.
  bool short_wait = false;
  // Larger than a connection that has not joined may send (the front's
  // untrusted credit): held by the front and never delivered, so no
  // answer; the connection is replaced after it.
  bool held_by_front = false;
  bool awaited = true;  // still waited for (not timed out, connection read)
  // Given up on: its answer was dropped, or comes late. It is matched only
  // by its sequence number, so that it cannot take a later message's
  // answer.
  bool timed_out = false;
  int slot = -1;  // the worker slot named as sender, if one of ours
  bool from_owner = false;
};

// A raw TCP connection that streams one multipart message that never ends:
// MORE frames of `frame_bytes` (1 KiB, or 0: empty frames). Owns `fd`.
struct EndlessStream {
  int fd = -1;
  size_t frame_bytes = 0;
  std::string block;  // whole frames, cycled through
  size_t offset = 0;  // into block: where the next send starts
  uint64_t sent = 0;
  int steps_left = 0;  // then the fuzzer closes it
};

struct Conn {
  ConnKind kind = ConnKind::kAnonymous;
  std::unique_ptr<zmq::socket_t> socket;
  bool reading = true;  // false: stopped reading its replies
  std::deque<Sent> outstanding;
  std::set<int> hello_slots;  // slots this connection sent a HELLO for
};

struct Slot {
  int owner = -1;  // connection that got the last WELCOME
  bool joined = false;
  bool left = false;    // said BYE (answered)
  bool resync = false;  // sequence state unknown: HELLO before the next use
  bool new_incarnation = false;  // the next HELLO takes a new incarnation
  uint64_t incarnation = 0;
  std::vector<uint64_t> past_incarnations;
  uint64_t seq_known = 0;  // highest sequence number known accepted
  uint64_t seq_floor = 0;  // highest the server may have accepted
  uint64_t commit_id = 0;
  SteadyClock::time_point last_sent{};
};

// The model the fuzzer expects the server to hold.
struct Expected {
  bool ok = false;  // values are exact
  uint64_t version = 0;
  std::vector<float> values;
  std::map<uint64_t, std::vector<float>> history;
  int inflight = 0;  // decodable COMMITs sent, not answered
  int consumed = 0;  // version steps already credited to them
  int lost = 0;      // COMMITs whose answer will never be seen
  SteadyClock::time_point lost_until{};
};

struct Finding {
  std::string kind;
  uint64_t step = 0;
  std::string detail;
  std::string cause;  // what the fuzzer stops generating (--keep-going)
  std::vector<std::string> trace;
  std::string log_tail;
};

class Fuzzer {
 public:
  explicit Fuzzer(Options options)
      : options_(std::move(options)), rng_(options_.seed) {}

  int Run();

 private:
  // ---- setup
  Status Prepare();
  Status StartServer();
  void ResetState();
  void OpenConnection(int c, ConnKind kind);
  Status InitialJoin();
  void MeasureIdle();

  // ---- sending and receiving
  uint64_t Rand(uint64_t n) {
    return n == 0 ? 0 : std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  uint64_t NewIncarnation() {
    uint64_t value = 0;
    while (value == 0) value = rng_();
    return value;
  }
  pb::Endpoint WorkerEndpoint(int slot) const {
    pb::Endpoint self;
    self.set_site(kSite);
    self.set_role(pb::ROLE_WORKER);
    self.set_id(static_cast<uint32_t>(slot));
    return self;
  }
  static pb::Endpoint ClientEndpoint() {
    pb::Endpoint self;
    self.set_role(pb::ROLE_CLIENT);
    return self;
  }
  // What the server must do with `wire` over connection `c`:
  // ClassifyDelivered, unless the front holds it (Sent::held_by_front).
  Sent ClassifyDelivered(int c, const Wire& wire, const std::string& action,
                         bool valid) const;
  // Whether connection `c` joined as a slot it still owns (the front gives
  // it the trusted credit).
  bool Trusted(int c) const;
  Sent Classify(int c, const Wire& wire, const std::string& action,
                bool valid) const;
  bool Suppressed(const Sent& sent) const;
  // Sends `wire` on connection `c`; false when it was not sent (suppressed,
  // or the socket would not take it).
  bool Transmit(int c, const Wire& wire, const std::string& action, bool valid);
  bool HasAwaited(const Conn& conn) const;
  void Await(int c, milliseconds timeout);
  bool ReadOne(int c, milliseconds wait);
  void Drain(int c, milliseconds idle, milliseconds total);
  void HandleReply(int c, Received received);
  std::optional<Sent> Match(Conn& conn, const pb::Header& reply);
  void Bookkeep(int c, const Sent& sent, const pb::Header& reply);
  void Forget(int c);  // the connection's outstanding messages are lost
  void ReplaceConnection(int c);

  // ---- checks
  void CheckModelReply(const Envelope& reply, bool commit_reply,
                       const std::string& what);
  void ResolveCommit(bool applied);
  int Allowance() const;
  // `fresh`: the reply answers a request just sent (its model_version is
  // the model's now).
  void CheckStatus(const pb::SiteStatus& status, const std::string& what,
                   bool fresh);
  void CheckModel();
  void Probe();
  void CheckServer();
  void AddFinding(const std::string& kind, const std::string& detail,
                  std::string cause = "");
  // Observations on the server's logs (not findings): lines that are not
  // in the log's format (untrusted bytes written verbatim) and how many
  // lines the refusals cost (rate limiting).
  void ReportLogs() const;
  void Trace(std::string line);

  // ---- valid messages
  Wire Hello(int slot, uint64_t seq, uint64_t incarnation) const;
  Wire Commit(int slot, uint64_t seq, uint64_t base, uint64_t commit_id);
  Wire Pull(int slot, uint64_t seq) const;
  Wire PullRanges(int slot, uint64_t seq, int count, bool whole_tensors);
  Wire Simple(pb::MessageType type, const pb::Endpoint& sender,
              uint64_t seq) const;
  int HomeConn(int slot) const { return slot % worker_conns_; }
  int RandomAnon() {
    return worker_conns_ + static_cast<int>(Rand(anon_conns_));
  }
  int RawConn() const { return static_cast<int>(conns_.size()) - 1; }
  int OwnerOrHome(int slot) const;
  bool EnsureReady(int slot);
  // A random slot ready for a request from its owner; -1 when none is.
  int ReadySlot();
  uint64_t NextSeq(int slot) { return ++slots_[slot].seq_floor; }
  // Sends a valid request of `slot` and waits for its answer.
  void Request(int slot, Wire wire, const std::string& action);

  // ---- actions
  void Step();
  void ActValidCommit();
  void ActValidPull(bool ranges);
  void ActHeartbeat();
  void ActStatus();
  void ActByeAndLeave();
  void ActTakeover();
  void ActReconnect();
  void ActInFlight();
  void ActAnonBurst();
  void ActSlowStart();
  void ActEndlessStart();
  // Pushes more of every endless message; closes the streams whose time is
  // up or that the server closed.
  void PushEndless();
  void CloseEndless(size_t i, bool by_server);
  void SlowBurst();
  void SlowEnd();
  void ActMutation();
  void HeartbeatIdleSlots();

  Options options_;
  std::mt19937_64 rng_;
  std::string dir_;
  std::string job_path_;
  std::string token_;
  pb::JobConfig job_;
  ModelLayout layout_;
  uint64_t params_ = 0;
  uint64_t max_reply_floats_ = 0;
  uint64_t max_frame_bytes_ = 0;
  // The front's credit of a connection that has not joined (from the
  // first STATUS_REPLY; 0: not known yet, nothing is taken as held).
  uint64_t untrusted_credit_ = 0;
  bool sent_oversized_ = false;  // the last Transmit had a frame too large
  Server server_;
  int run_ = 0;
  zmq::context_t context_;
  std::vector<Conn> conns_;
  int worker_conns_ = 0;
  int anon_conns_ = 0;
  std::vector<Slot> slots_;
  Expected expected_;

  std::vector<EndlessStream> endless_;
  uint64_t endless_opened_ = 0;
  uint64_t endless_bytes_ = 0;
  uint64_t endless_closed_by_server_ = 0;
  uint64_t endless_max_stream_bytes_ = 0;

  // Stopped-reading connection (-1: none).
  int slow_conn_ = -1;
  int slow_slot_ = -1;
  int slow_steps_left_ = 0;

  uint64_t step_ = 0;
  bool step_mutated_ = false;  // this step sent something foreign
  bool step_refused_ = false;  // ... or got an ERROR
  bool step_sent_shutdown_ = false;
  bool slow_ended_ = false;
  bool await_timed_out_ = false;  // the last Await gave up on a reply
  std::string step_action_;
  bool stop_ = false;
  bool restart_ = false;
  std::set<std::string> suppressed_;

  uint64_t idle_rss_ = 0;
  uint64_t rss_bound_ = 0;
  uint64_t rss_max_ = 0;
  uint64_t executions_ = 0;
  uint64_t mutated_sent_ = 0;
  uint64_t valid_sent_ = 0;
  uint64_t send_blocked_ = 0;
  uint64_t probes_ = 0;
  double probe_max_s_ = 0;
  uint64_t model_checks_ = 0;
  uint64_t compared_floats_ = 0;
  uint64_t server_heartbeats_ = 0;
  uint64_t unmatched_replies_ = 0;
  uint64_t restarts_ = 0;
  std::map<std::string, uint64_t> refusals_;
  std::map<std::string, std::map<std::string, uint64_t>> outcomes_;
  std::map<std::string, std::pair<uint64_t, std::string>> surprises_;
  std::vector<Finding> findings_;
  std::deque<std::string> trace_;
  SteadyClock::time_point start_;
};

// ---- setup
// -------------------------------------------------------------------

Status Fuzzer::Prepare() {
  dir_ = testing::MakeTempDir("protocol-fuzz");
  testing::SyntheticDataOptions data;
  data.train_samples = 300;
  data.test_samples = 100;
  MERIDIAN_RETURN_IF_ERROR(testing::WriteSyntheticIdx(dir_ + "/data", data));
  job_ = testing::SmallJob(dir_ + "/data", options_.workers, options_.hidden);
  job_.set_name("protocol-fuzz");
  job_.set_stop_at_target(false);
  job_.set_time_budget_s(options_.seconds + 3600);
  job_.mutable_server()->set_eval_period_s(2);
  job_.mutable_server()->set_join_timeout_s(60);
  job_.mutable_fault()->set_checkpoint_period_s(0);
  job_.mutable_policy()->set_kind(pb::ASYNC);
  if (std::vector<ConfigIssue> issues = ValidateJobConfig(job_);
      !issues.empty()) {
    return InvalidArgumentError("the generated job is invalid: " +
                                issues.front().message);
  }
  job_path_ = dir_ + "/job.pbtxt";
  MERIDIAN_RETURN_IF_ERROR(testing::WriteJobFile(job_, job_path_));
  MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                            MakeModel(job_.model(), 28 * 28, 10));
  layout_ = model->layout();
  params_ = layout_.num_elements();
  max_reply_floats_ = params_;
  // server.limits.max_frame_bytes' default.
  for (const TensorInfo& tensor : layout_.tensors()) {
    max_frame_bytes_ = std::max(max_frame_bytes_, tensor.size * sizeof(float));
  }
  max_frame_bytes_ = std::max(max_frame_bytes_, kMiB);
  // The job's control token (the launcher's per-run token): the fuzzer
  // knows it and never sends it on SHUTDOWN; a server that takes
  // control_token refuses every SHUTDOWN here.
  // 32 random bytes as 40 Z85 characters, the token format.
  uint8_t bytes[32];
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(Rand(256));
  char z85[41];
  zmq_z85_encode(z85, bytes, sizeof(bytes));
  token_ = z85;
  ::setenv("MERIDIAN_CONTROL_TOKEN", token_.c_str(), 1);
  return Status::Ok();
}

void Fuzzer::OpenConnection(int c, ConnKind kind) {
  Conn& conn = conns_[c];
  conn.kind = kind;
  conn.socket =
      std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
  // Not 0: libzmq 4.3 aborts this process ("Resource temporarily
  // unavailable", session_base.cpp clean_pipes) when a socket closed with
  // linger 0 is half way through sending a multipart message and the
  // server drops the connection at that moment (zeromq/libzmq#3442, closed
  // as stale; clean_pipes is unchanged upstream): the closing session may
  // no longer read the rest of the message it must discard. With a linger the session's pipe stays
  // readable while the socket closes. Seen in a loaded full run
  // (tools/test --stress): the server drops misbehaving connections often.
  conn.socket->set(zmq::sockopt::linger, kCloseLingerMs);
  // A connection that stops reading pushes back at once: ZeroMQ on this
  // side buffers hardly anything of what the server sends it.
  conn.socket->set(zmq::sockopt::rcvhwm, 2);
  conn.socket->set(zmq::sockopt::sndtimeo, 2000);
  conn.socket->connect(server_.endpoint());
  conn.reading = true;
  conn.outstanding.clear();
  conn.hello_slots.clear();
}

void Fuzzer::ResetState() {
  while (!endless_.empty()) CloseEndless(endless_.size() - 1, false);
  conns_.clear();
  conns_.resize(worker_conns_ + anon_conns_ + 1);
  slots_.assign(options_.workers, Slot());
  expected_ = Expected();
  slow_conn_ = slow_slot_ = -1;
  slow_steps_left_ = 0;
}

Status Fuzzer::StartServer() {
  ResetState();
  ++run_;
  MERIDIAN_RETURN_IF_ERROR(server_.Start(options_, job_path_, dir_, run_));
  for (int c = 0; c < static_cast<int>(conns_.size()); ++c) {
    OpenConnection(c, c < worker_conns_                 ? ConnKind::kWorker
                      : c < worker_conns_ + anon_conns_ ? ConnKind::kAnonymous
                                                        : ConnKind::kRaw);
  }
  return InitialJoin();
}

// Every slot HELLOs from its home connection; the server answers them all
// with WELCOME once the last one joined.
Status Fuzzer::InitialJoin() {
  for (int s = 0; s < options_.workers; ++s) {
    Slot& slot = slots_[s];
    slot.new_incarnation = true;
    const uint64_t incarnation = NewIncarnation();
    Transmit(HomeConn(s), Hello(s, 1, incarnation), "join", true);
  }
  for (int s = 0; s < options_.workers; ++s) {
    Await(HomeConn(s), milliseconds(30000));
    if (!slots_[s].joined) {
      return UnavailableError("worker slot " + std::to_string(s) +
                              " got no WELCOME; server log:\n" +
                              server_.LogTail(20));
    }
  }
  return Status::Ok();
}

void Fuzzer::MeasureIdle() {
  for (int i = 0; i < 5; ++i) CheckModel();
  Probe();
  std::this_thread::sleep_for(milliseconds(300));
  idle_rss_ = server_.Rss();
  // + the probe and the endless streams
  const uint64_t connections = conns_.size() + 1 + kMaxEndlessStreams;
  const uint64_t model_bytes = params_ * sizeof(float);
  rss_bound_ = idle_rss_ +
               connections * (kDefaultSendQueue + kDefaultReceiveQueue) *
                   (model_bytes + kMiB) +
               kRssSlackBytes;
  if (run_ == 1) {
    std::printf("protocol_fuzz: RSS bound %s = idle %s + %" PRIu64
                " connections x (send_queue %" PRIu64
                " + receive_queue %" PRIu64
                ") x (model %s + 1 MiB) + slack %s\n",
                Mb(rss_bound_).c_str(), Mb(idle_rss_).c_str(), connections,
                kDefaultSendQueue, kDefaultReceiveQueue,
                Mb(model_bytes).c_str(), Mb(kRssSlackBytes).c_str());
    std::fflush(stdout);
  }
}

// ---- valid messages
// ------------------------------------------------------------

Wire Fuzzer::Hello(int slot, uint64_t seq, uint64_t incarnation) const {
  Wire wire;
  wire.header = MakeHeader(pb::HELLO, WorkerEndpoint(slot), seq);
  pb::Hello* hello = wire.header.mutable_hello();
  hello->set_worker_index(static_cast<uint32_t>(slot));
  hello->set_incarnation(incarnation);
  LayoutToSpecs(layout_, hello->mutable_layout());
  return wire;
}

Wire Fuzzer::Commit(int slot, uint64_t seq, uint64_t base, uint64_t commit_id) {
  Wire wire;
  wire.header = MakeHeader(pb::COMMIT, WorkerEndpoint(slot), seq);
  AddLayoutSlices(layout_, &wire.header);
  pb::Commit* commit = wire.header.mutable_commit();
  commit->set_base_version(base);
  commit->set_local_steps(1 + static_cast<uint32_t>(Rand(4)));
  commit->set_commit_id(commit_id);
  commit->mutable_stats()->set_steps(commit_id);
  std::normal_distribution<float> delta(0.0f, 1e-3f);
  for (const TensorInfo& tensor : layout_.tensors()) {
    std::vector<float> values(tensor.size);
    // Sparse, like a worker's accumulated change after a few steps.
    for (float& value : values) value = Chance(0.25) ? delta(rng_) : 0.0f;
    wire.payload.emplace_back(reinterpret_cast<const char*>(values.data()),
                              values.size() * sizeof(float));
  }
  return wire;
}

Wire Fuzzer::Pull(int slot, uint64_t seq) const {
  Wire wire;
  wire.header = MakeHeader(pb::PULL, WorkerEndpoint(slot), seq);
  wire.header.mutable_pull();
  return wire;
}

Wire Fuzzer::PullRanges(int slot, uint64_t seq, int count, bool whole_tensors) {
  Wire wire = Pull(slot, seq);
  for (int i = 0; i < count; ++i) {
    const TensorInfo& tensor =
        layout_.tensors()[Rand(layout_.tensors().size())];
    pb::TensorSlice* range = wire.header.mutable_pull()->add_ranges();
    range->set_tensor(tensor.name);
    if (whole_tensors) {
      range->set_offset(0);
      range->set_length(tensor.size);
    } else {
      const uint64_t offset = Rand(tensor.size);
      range->set_offset(offset);
      range->set_length(1 +
                        Rand(std::min<uint64_t>(tensor.size - offset, 512)));
    }
  }
  return wire;
}

Wire Fuzzer::Simple(pb::MessageType type, const pb::Endpoint& sender,
                    uint64_t seq) const {
  Wire wire;
  wire.header = MakeHeader(type, sender, seq);
  if (type == pb::HEARTBEAT) wire.header.mutable_heartbeat();
  if (type == pb::BYE) wire.header.mutable_bye();
  return wire;
}

// ---- classification
// --------------------------------------------------------------

// Decodes `wire` as the server will and works out what the server must do
// with it.
Sent Fuzzer::Classify(int c, const Wire& wire, const std::string& action,
                      bool valid) const {
  Sent sent = ClassifyDelivered(c, wire, action, valid);
  if (untrusted_credit_ == 0 || Trusted(c)) return sent;
  uint64_t charged = wire.Frame0().size() + kFrameChargeBytes;
  for (const std::string& frame : wire.payload) {
    charged += frame.size() + kFrameChargeBytes;
  }
  if (charged <= untrusted_credit_) return sent;
  sent.held_by_front = true;
  sent.expects_reply = false;
  sent.may_apply = false;
  sent.short_wait = true;
  return sent;
}

bool Fuzzer::Trusted(int c) const {
  return std::any_of(slots_.begin(), slots_.end(), [c](const Slot& slot) {
    return slot.owner == c && slot.joined && !slot.left;
  });
}

Sent Fuzzer::ClassifyDelivered(int c, const Wire& wire,
                               const std::string& action, bool valid) const {
  Sent sent;
  sent.step = step_;
  sent.action = action;
  sent.valid = valid;
  const std::string frame0 = wire.Frame0();
  std::vector<FrameView> views;
  for (const std::string& frame : wire.payload) {
    views.push_back(FrameView{std::as_bytes(std::span(frame))});
  }
  const Parsed<pb::Header> decoded =
      DecodeMessage(std::as_bytes(std::span(frame0)), views);
  sent.decodes = decoded.ok();
  sent.parsed = !frame0.empty() && frame0.size() <= kMaxHeaderBytes &&
                sent.header.ParseFromString(frame0);
  bool oversized = frame0.size() > max_frame_bytes_;
  for (const std::string& frame : wire.payload) {
    oversized |= frame.size() > max_frame_bytes_;
  }
  if (!sent.decodes) {
    sent.must_refuse = true;
    sent.why_refuse = decoded.rejection().reason;
    // A HEARTBEAT is refused without an answer; an oversized frame may
    // make the server drop the connection before anything is read.
    sent.expects_reply = !(sent.parsed && sent.header.type() == pb::HEARTBEAT);
    sent.short_wait = oversized;
    return sent;
  }
  sent.short_wait = oversized;
  const pb::Header& header = sent.header;
  const pb::Endpoint& sender = header.sender();
  const bool ours = sender.role() == pb::ROLE_WORKER &&
                    sender.site() == kSite &&
                    sender.id() < static_cast<uint32_t>(options_.workers);
  if (ours) {
    sent.slot = static_cast<int>(sender.id());
    sent.from_owner = slots_[sent.slot].owner == c;
  }
  auto refuse = [&](const std::string& why) {
    sent.must_refuse = true;
    if (sent.why_refuse.empty()) sent.why_refuse = why;
  };
  switch (header.type()) {
    case pb::HEARTBEAT:
      sent.expects_reply = false;
      break;
    case pb::STATUS_REQUEST:
      break;
    case pb::SHUTDOWN:
      if (header.control_token() != token_) {
        refuse("SHUTDOWN without the job's control token");
      }
      break;
    case pb::SET_PEERS:
      refuse(header.control_token() != token_
                 ? "SET_PEERS without the job's control token"
                 : "SET_PEERS to a site that syncs with nobody");
      break;
    case pb::HELLO: {
      const pb::Hello& hello = header.hello();
      if (!ours || hello.worker_index() != sender.id()) {
        refuse("HELLO from a worker this site does not serve");
        break;
      }
      Result<ModelLayout> layout = LayoutFromSpecs(hello.layout());
      if (!layout.ok() || !(*layout == layout_)) refuse("HELLO layout");
      const Slot& slot = slots_[sent.slot];
      if (slot.left && slot.incarnation != 0 &&
          hello.incarnation() == slot.incarnation) {
        refuse("HELLO of a process that left");
      }
      // The server remembers kRetiredIncarnations; the fuzzer may have
      // missed a replacement, so only the last few it saw count.
      const size_t retired = slot.past_incarnations.size();
      for (size_t i = retired > kRetiredIncarnations / 2
                          ? retired - kRetiredIncarnations / 2
                          : 0;
           i < retired; ++i) {
        if (hello.incarnation() != 0 &&
            slot.past_incarnations[i] == hello.incarnation()) {
          refuse("HELLO of a replaced incarnation");
        }
      }
      break;
    }
    case pb::COMMIT:
    case pb::PULL:
    case pb::BYE: {
      sent.may_apply = header.type() == pb::COMMIT;
      if (!ours) {
        refuse("request from a sender that is no worker of this site");
        break;
      }
      const Slot& slot = slots_[sent.slot];
      if (!conns_[c].hello_slots.count(sent.slot)) {
        refuse("request over a connection that never joined as that worker");
      } else if (sent.from_owner && slot.left) {
        refuse("request of a worker that left");
      } else if (sent.from_owner && slot.joined && !slot.resync &&
                 header.sequence() <= slot.seq_known) {
        refuse("sequence number not above the last accepted");
      }
      if (header.type() == pb::COMMIT) {
        if (Check v = CheckSlicesAgainstLayout(header, layout_, true);
            !v.ok()) {
          refuse(v.rejection().reason);
        } else if (Check c = CheckCodec(header, pb::CODEC_RAW); !c.ok()) {
          refuse(c.rejection().reason);
        } else {
          for (int i = 0; i < header.slices_size(); ++i) {
            if (Check f =
                    CheckFinite(header.slices(i),
                                std::as_bytes(std::span(wire.payload[i])));
                !f.ok()) {
              refuse(f.rejection().reason);
              break;
            }
          }
        }
        // (A commit id the slot may have applied is answered as a
        // duplicate before its base version is looked at.)
        if (expected_.ok && expected_.inflight == 0 && sent.from_owner &&
            header.commit().commit_id() > slot.commit_id &&
            header.commit().base_version() > expected_.version) {
          refuse("COMMIT based on a future model version");
        }
      }
      if (header.type() == pb::PULL && header.pull().ranges_size() > 0) {
        pb::Header wanted;
        *wanted.mutable_slices() = header.pull().ranges();
        if (Check v = CheckSlicesAgainstLayout(wanted, layout_, false);
            !v.ok()) {
          refuse(v.rejection().reason);
        }
      }
      break;
    }
    default:
      refuse(pb::MessageType_Name(header.type()) +
             " is not a request a site server serves");
      break;
  }
  return sent;
}

// The class of messages an accepted-invalid finding is about: the reason
// they must be refused, numbers left out.
std::string RefusalCause(const Sent& sent) {
  if (sent.parsed && sent.header.type() == pb::SHUTDOWN) return "shutdown";
  std::string why;
  for (char ch : sent.why_refuse) {
    if (!std::isdigit(static_cast<unsigned char>(ch))) why += ch;
  }
  return "why:" + why;
}

// What --keep-going stopped generating after a finding.
bool Fuzzer::Suppressed(const Sent& sent) const {
  if (suppressed_.empty()) return false;
  if (suppressed_.count("action:" + sent.action)) return true;
  if (sent.must_refuse && suppressed_.count(RefusalCause(sent))) return true;
  if (!sent.parsed) return false;
  const pb::Header& header = sent.header;
  if (suppressed_.count("shutdown") && header.type() == pb::SHUTDOWN) {
    return true;
  }
  if (suppressed_.count("big-pull") && header.type() == pb::PULL) {
    uint64_t floats = 0;
    for (const pb::TensorSlice& range : header.pull().ranges()) {
      floats += std::min<uint64_t>(range.length(), params_ + 1);
    }
    if (floats > max_reply_floats_) return true;
  }
  if (suppressed_.count("seq-jump") && sent.slot >= 0 &&
      header.sequence() > slots_[sent.slot].seq_known + kSequenceWindow) {
    return true;
  }
  return false;
}

bool Fuzzer::Transmit(int c, const Wire& wire, const std::string& action,
                      bool valid) {
  Conn& conn = conns_[c];
  Sent sent = Classify(c, wire, action, valid);
  if (Suppressed(sent)) return false;
  sent_oversized_ = sent.short_wait;
  // The job must not end because every worker left: a decodable BYE of
  // the last slot that has not left is not sent.
  if (sent.decodes && sent.header.type() == pb::BYE && sent.slot >= 0 &&
      !sent.must_refuse) {
    int staying = 0;
    for (int s = 0; s < options_.workers; ++s) {
      staying += s != sent.slot && !slots_[s].left;
    }
    if (staying == 0) return false;
  }
  const std::string frame0 = wire.Frame0();
  const size_t frames = 1 + wire.payload.size();
  try {
    auto flags = frames > 1 ? zmq::send_flags::sndmore : zmq::send_flags::none;
    if (!conn.socket->send(zmq::buffer(frame0), flags)) {
      ++send_blocked_;
      return false;
    }
    for (size_t i = 0; i < wire.payload.size(); ++i) {
      flags = i + 1 < wire.payload.size() ? zmq::send_flags::sndmore
                                          : zmq::send_flags::none;
      (void)conn.socket->send(zmq::buffer(wire.payload[i]), flags);
    }
  } catch (const zmq::error_t&) {
    ++send_blocked_;
    return false;
  }
  ++executions_;
  (valid ? valid_sent_ : mutated_sent_)++;
  if (!valid) step_mutated_ = true;
  // What the server may now believe about the slot named as sender.
  if (sent.decodes && sent.slot >= 0) {
    Slot& slot = slots_[sent.slot];
    const pb::MessageType type = sent.header.type();
    if (type == pb::HELLO) conn.hello_slots.insert(sent.slot);
    if (sent.from_owner && type != pb::HELLO &&
        sent.header.sequence() > slot.seq_floor) {
      if (sent.header.sequence() > slot.seq_known + 1000) {
        slot.resync = true;  // far ahead: rejoin to know where it stands
      } else {
        slot.seq_floor = sent.header.sequence();
      }
    }
    if (sent.from_owner) slot.last_sent = SteadyClock::now();
  }
  if (sent.may_apply) ++expected_.inflight;
  if (sent.held_by_front) ++outcomes_[action]["held-by-front"];
  if (!conn.reading) sent.awaited = false;
  if (!sent.expects_reply) sent.awaited = false;
  std::string what =
      sent.decodes ? DescribeHeader(sent.header)
      : sent.parsed
          ? "undecodable " + pb::MessageType_Name(sent.header.type())
          : "unparseable frame 0 (" + std::to_string(frame0.size()) + " bytes)";
  if (sent.parsed && sent.header.type() == pb::SHUTDOWN) {
    step_sent_shutdown_ = true;
  }
  Trace("step " + std::to_string(step_) + " conn " + std::to_string(c) + " (" +
        KindName(conn.kind) + ") " + action + ": " + what + ", " +
        std::to_string(frames) + " frames" +
        (sent.held_by_front ? " [held by the front: over the untrusted credit]"
         : sent.must_refuse
             ? " [must refuse: " + Printable(sent.why_refuse, 80) + "]"
             : ""));
  conn.outstanding.push_back(std::move(sent));
  return true;
}

bool Fuzzer::HasAwaited(const Conn& conn) const {
  for (const Sent& sent : conn.outstanding) {
    if (sent.awaited) return true;
  }
  return false;
}

bool Fuzzer::ReadOne(int c, milliseconds wait) {
  Result<Received> received =
      ReceiveMessage(*conns_[c].socket, false, std::max(wait, milliseconds(0)));
  if (!received.ok() || received->timed_out()) return false;
  HandleReply(c, std::move(*received));
  return true;
}

void Fuzzer::Await(int c, milliseconds timeout) {
  Conn& conn = conns_[c];
  await_timed_out_ = false;
  if (!conn.reading) return;
  bool only_short = true;
  for (const Sent& sent : conn.outstanding) {
    if (sent.awaited && !sent.short_wait) only_short = false;
  }
  if (only_short) timeout = std::min(timeout, milliseconds(300));
  const auto deadline = SteadyClock::now() + timeout;
  while (HasAwaited(conn)) {
    const auto now = SteadyClock::now();
    if (now >= deadline) break;
    ReadOne(c, std::chrono::duration_cast<milliseconds>(deadline - now) +
                   milliseconds(1));
  }
  // Whatever else is already here (late replies, answers nobody waits for).
  while (ReadOne(c, milliseconds(0))) {
  }
  for (Sent& sent : conn.outstanding) {
    if (!sent.awaited) continue;
    sent.awaited = false;
    sent.timed_out = true;
    await_timed_out_ = true;
    ++outcomes_[sent.action]["none"];
    Trace("step " + std::to_string(step_) + " conn " + std::to_string(c) + " " +
          sent.action + ": no reply within " + std::to_string(timeout.count()) +
          " ms");
  }
  // Entries nobody waits for any more are dropped after a while; a COMMIT
  // among them may still have been applied.
  while (conn.outstanding.size() > 64 ||
         (!conn.outstanding.empty() && !conn.outstanding.front().awaited &&
          conn.outstanding.front().step + 200 < step_)) {
    if (conn.outstanding.front().may_apply) {
      --expected_.inflight;
      ++expected_.lost;
      expected_.lost_until = SteadyClock::now() + std::chrono::seconds(10);
    }
    conn.outstanding.pop_front();
  }
}

void Fuzzer::Drain(int c, milliseconds idle, milliseconds total) {
  const auto deadline = SteadyClock::now() + total;
  while (SteadyClock::now() < deadline && ReadOne(c, idle)) {
  }
}

std::optional<Sent> Fuzzer::Match(Conn& conn, const pb::Header& reply) {
  auto expected_reply = [](const Sent& sent) -> pb::MessageType {
    if (!sent.decodes) return pb::ERROR;
    switch (sent.header.type()) {
      case pb::HELLO:
        return pb::WELCOME;
      case pb::COMMIT:
      case pb::PULL:
        return pb::MODEL;
      case pb::BYE:
        return pb::BYE;
      case pb::STATUS_REQUEST:
      case pb::SHUTDOWN:
      case pb::SET_PEERS:
        return pb::STATUS_REPLY;
      default:
        return pb::ERROR;
    }
  };
  auto take = [&](std::deque<Sent>::iterator it) {
    Sent sent = std::move(*it);
    conn.outstanding.erase(it);
    return sent;
  };
  auto find = [&](const std::function<bool(const Sent&)>& wanted)
      -> std::optional<Sent> {
    for (auto it = conn.outstanding.begin(); it != conn.outstanding.end();
         ++it) {
      if (wanted(*it)) return take(it);
    }
    return std::nullopt;
  };
  if (reply.type() == pb::ERROR) {
    const uint64_t rejected = reply.error().rejected_sequence();
    // The refused message's own sequence number (0 when it had none).
    // Messages still waited for first: a message given up on may have
    // the same number.
    auto same_sequence = [&](const Sent& sent) {
      return sent.expects_reply && !sent.timed_out && sent.parsed &&
             sent.header.sequence() == rejected;
    };
    auto same_sequence_late = [&](const Sent& sent) {
      return sent.expects_reply && sent.parsed &&
             sent.header.sequence() == rejected;
    };
    // A worker's HEARTBEAT over a connection the server does not know is
    // answered with an ERROR (join again) that names no sequence number.
    auto heartbeat = [](const Sent& sent) {
      return sent.parsed && sent.header.type() == pb::HEARTBEAT;
    };
    if (rejected != 0) {
      if (auto sent = find(same_sequence)) return sent;
      if (auto sent = find(same_sequence_late)) return sent;
    } else if (reply.error().code() == pb::ERROR_UNKNOWN_SENDER) {
      if (auto sent = find(same_sequence)) return sent;
      if (auto sent = find(heartbeat)) return sent;
    }
  }
  // The server answers one connection's messages in order: the oldest
  // message that expects an answer of this type gets it. An ERROR answers
  // anything.
  return find([&](const Sent& sent) {
    return sent.expects_reply && !sent.timed_out &&
           (reply.type() == pb::ERROR || expected_reply(sent) == reply.type());
  });
}

void Fuzzer::HandleReply(int c, Received received) {
  Conn& conn = conns_[c];
  if (received.refused) {
    AddFinding("bad-reply",
               "the server sent connection " + std::to_string(c) +
                   " a message its own decoder refuses: " +
                   pb::ErrorCode_Name(received.refused->rejection.code) + ": " +
                   received.refused->rejection.reason);
    return;
  }
  const Envelope& reply = *received.message;
  const pb::Header& header = reply.header;
  if (header.type() == pb::HEARTBEAT) {
    ++server_heartbeats_;
    return;
  }
  std::optional<Sent> sent = Match(conn, header);
  std::string reply_class = pb::MessageType_Name(header.type());
  if (header.type() == pb::ERROR) {
    reply_class = pb::ErrorCode_Name(header.error().code());
    ++refusals_[reply_class];
    step_refused_ = true;
  }
  if (!sent) ++unmatched_replies_;
  ++outcomes_[sent ? sent->action : std::string("(unmatched)")][reply_class];
  Trace("step " + std::to_string(step_) + " conn " + std::to_string(c) +
        " <- " + reply_class +
        (header.type() == pb::ERROR
             ? ": " + Printable(header.error().message(), 100)
             : "") +
        (sent ? " (for " + sent->action + ")" : " (unmatched)"));
  if (sent && sent->must_refuse && header.type() != pb::ERROR) {
    AddFinding(
        "accepted-invalid",
        "a message the server must refuse (" +
            Printable(sent->why_refuse, 120) + ") was answered with " +
            reply_class +
            (sent->parsed ? ": sent " + DescribeHeader(sent->header) : ""),
        RefusalCause(*sent));
  }
  const bool commit_reply = sent && sent->may_apply;
  if (header.type() == pb::MODEL || header.type() == pb::WELCOME) {
    CheckModelReply(reply, commit_reply,
                    reply_class + " for " + (sent ? sent->action : "?"));
  }
  if (commit_reply) ResolveCommit(header.type() == pb::MODEL);
  if (header.type() == pb::STATUS_REPLY) {
    // A late reply (a connection that stopped reading) says what was.
    CheckStatus(header.status(),
                "STATUS_REPLY for " + (sent ? sent->action : std::string("?")),
                /*fresh=*/sent && sent->awaited);
  }
  const bool stop = (header.type() == pb::MODEL && header.model().stop()) ||
                    (header.type() == pb::WELCOME && header.welcome().stop());
  if (stop) {
    AddFinding("job-finished",
               "the server says the job is over (" + reply_class +
                   " with stop: '" + Printable(header.model().stop_reason()) +
                   "') although its time budget is far away and the fuzzer "
                   "never sent a control token",
               step_sent_shutdown_ ? "shutdown" : "");
  }
  if (sent) Bookkeep(c, *sent, header);
}

void Fuzzer::Bookkeep(int c, const Sent& sent, const pb::Header& reply) {
  if (!sent.decodes || sent.slot < 0) return;
  Slot& slot = slots_[sent.slot];
  const pb::MessageType type = sent.header.type();
  const bool error = reply.type() == pb::ERROR;
  if (sent.valid && error) {
    const std::string key = sent.action + " refused with " +
                            pb::ErrorCode_Name(reply.error().code());
    auto& [count, example] = surprises_[key];
    if (count++ == 0) {
      example = "step " + std::to_string(sent.step) + ": " +
                DescribeHeader(sent.header) + ": " +
                Printable(reply.error().message(), 200);
    }
  }
  if (type == pb::HELLO) {
    if (reply.type() == pb::WELCOME) {
      // Another incarnation (or 0, never "the same") is a new process:
      // the server retires the old one and restarts its commit ids.
      const uint64_t incarnation = sent.header.hello().incarnation();
      if (incarnation == 0 || incarnation != slot.incarnation) {
        if (slot.incarnation != 0 && slot.incarnation != incarnation) {
          slot.past_incarnations.push_back(slot.incarnation);
        }
        slot.incarnation = incarnation;
        slot.commit_id = 0;
      }
      slot.commit_id =
          std::max(slot.commit_id, reply.welcome().last_commit_id());
      slot.owner = c;
      slot.joined = true;
      slot.left = false;
      slot.resync = false;
      slot.new_incarnation = false;
      slot.seq_known = slot.seq_floor = sent.header.sequence();
    } else if (error && sent.valid) {
      // Replaced, already joined (incarnation 0), already left: a new
      // process is what the server wants.
      slot.new_incarnation = true;
    }
    return;
  }
  if (slot.owner != c) return;  // someone else's slot: refused, no change
  if (type == pb::COMMIT || type == pb::PULL || type == pb::BYE) {
    if (!error) {
      slot.seq_known = std::max(slot.seq_known, sent.header.sequence());
      slot.seq_floor = std::max(slot.seq_floor, sent.header.sequence());
      // Applied (or answered as a duplicate): ids up to this one are used.
      if (type == pb::COMMIT) {
        slot.commit_id =
            std::max(slot.commit_id, sent.header.commit().commit_id());
      }
      if (type == pb::BYE && reply.type() == pb::BYE) {
        slot.left = true;
        slot.joined = false;
      }
    } else if (sent.valid) {
      if (reply.error().code() == pb::ERROR_UNKNOWN_SENDER) {
        slot.joined = false;
      } else {
        slot.resync = true;
      }
      if (reply.error().message().find("left") != std::string::npos) {
        slot.left = true;
        slot.joined = false;
      }
    }
  } else if (type == pb::HEARTBEAT && error && sent.valid) {
    slot.joined = false;  // the server does not know this connection
  }
}

void Fuzzer::Forget(int c) {
  for (const Sent& sent : conns_[c].outstanding) {
    if (sent.may_apply) {
      --expected_.inflight;
      ++expected_.lost;
      expected_.lost_until = SteadyClock::now() + std::chrono::seconds(10);
    }
  }
  conns_[c].outstanding.clear();
}

// Closes connection `c` and opens a new one in its place (a new peer for
// the server). Slots it owned must join again.
void Fuzzer::ReplaceConnection(int c) {
  if (conns_[c].reading) Await(c, milliseconds(options_.reply_timeout_ms));
  Forget(c);
  for (Slot& slot : slots_) {
    if (slot.owner == c) {
      slot.owner = -1;
      slot.joined = false;
    }
  }
  if (slow_conn_ == c) {
    slow_conn_ = slow_slot_ = -1;
    slow_steps_left_ = 0;
  }
  OpenConnection(c, conns_[c].kind);
}

// ---- checks
// ----------------------------------------------------------------------

int Fuzzer::Allowance() const {
  const bool lost =
      expected_.lost > 0 && SteadyClock::now() < expected_.lost_until;
  return std::max(
      0, expected_.inflight + (lost ? expected_.lost : 0) - expected_.consumed);
}

void Fuzzer::ResolveCommit(bool applied) {
  --expected_.inflight;
  if (applied && expected_.consumed > 0) --expected_.consumed;
  if (expected_.lost > 0 && SteadyClock::now() >= expected_.lost_until) {
    expected_.lost = 0;
  }
  expected_.consumed = std::clamp(
      expected_.consumed, 0, std::max(0, expected_.inflight + expected_.lost));
}

void Fuzzer::CheckModelReply(const Envelope& reply, bool commit_reply,
                             const std::string& what) {
  const pb::Header& header = reply.header;
  if (header.type() == pb::MODEL && header.model().stop()) return;
  const uint64_t version = header.type() == pb::WELCOME
                               ? header.welcome().model_version()
                               : header.model().version();
  // Where each slice's values go in the flat model, and whether the reply
  // is the whole model in layout order.
  struct Range {
    uint64_t begin;
    uint64_t length;
    const char* bytes;  // little-endian floats, maybe unaligned
  };
  std::vector<Range> ranges;
  uint64_t floats = 0;
  bool full =
      header.slices_size() == static_cast<int>(layout_.tensors().size());
  for (int i = 0; i < header.slices_size(); ++i) {
    const pb::TensorSlice& slice = header.slices(i);
    const TensorInfo* tensor = layout_.Find(slice.tensor());
    if (tensor == nullptr || slice.offset() > tensor->size ||
        slice.length() > tensor->size - slice.offset() ||
        reply.payload[i].size() != slice.length() * sizeof(float)) {
      AddFinding("bad-reply", what + ": slice " + std::to_string(i) +
                                  " does not fit the model layout");
      return;
    }
    floats += slice.length();
    full = full && tensor == &layout_.tensors()[i] && slice.offset() == 0 &&
           slice.length() == tensor->size;
    ranges.push_back({tensor->offset + slice.offset(), slice.length(),
                      static_cast<const char*>(reply.payload[i].data())});
  }
  if (floats > max_reply_floats_) {
    AddFinding("reply-limit",
               what + " carried " + std::to_string(floats) +
                   " floats, more than server.limits.max_reply_floats (default "
                   "= the model's " +
                   std::to_string(params_) +
                   " parameters): one small request made the server build a "
                   "reply of " +
                   Mb(floats * 4) + ", " + std::to_string(floats / params_) +
                   "x the model",
               "big-pull");
  }
  auto differences = [&](const std::vector<float>& model, std::string* first) {
    uint64_t differ = 0;
    for (const Range& range : ranges) {
      if (std::memcmp(model.data() + range.begin, range.bytes,
                      range.length * sizeof(float)) == 0) {
        continue;
      }
      for (uint64_t i = 0; i < range.length; ++i) {
        if (std::memcmp(&model[range.begin + i], range.bytes + 4 * i, 4) == 0) {
          continue;
        }
        if (differ++ == 0) {
          float got;
          std::memcpy(&got, range.bytes + 4 * i, 4);
          char text[160];
          std::snprintf(text, sizeof(text),
                        "element %" PRIu64 ": expected %.9g, got %.9g",
                        range.begin + i, model[range.begin + i], got);
          *first = text;
        }
      }
    }
    compared_floats_ += floats;
    return differ;
  };
  auto flat = [&] {
    std::vector<float> model(params_);
    for (const Range& range : ranges) {
      std::memcpy(model.data() + range.begin, range.bytes,
                  range.length * sizeof(float));
    }
    return model;
  };
  auto adopt = [&](std::vector<float> model) {
    expected_.ok = true;
    expected_.version = version;
    expected_.history[version] = model;
    while (expected_.history.size() > kHistoryVersions) {
      expected_.history.erase(expected_.history.begin());
    }
    expected_.values = std::move(model);
  };
  if (!expected_.ok) {
    if (full && version >= expected_.version) adopt(flat());
    return;
  }
  std::string first;
  if (version < expected_.version) {
    auto it = expected_.history.find(version);
    if (it != expected_.history.end()) {
      if (uint64_t differ = differences(it->second, &first)) {
        AddFinding("model-changed",
                   what + " at model version " + std::to_string(version) +
                       " differs from the model the fuzzer saw at that "
                       "version in " +
                       std::to_string(differ) + " of " +
                       std::to_string(floats) + " values (" + first + ")");
      }
    }
    return;
  }
  if (version == expected_.version) {
    if (uint64_t differ = differences(expected_.values, &first)) {
      AddFinding("model-changed",
                 what + ": model version " + std::to_string(version) +
                     " unchanged but " + std::to_string(differ) + " of " +
                     std::to_string(floats) +
                     " values differ from the expected model (" + first +
                     "); no COMMIT was accepted since");
      if (full) adopt(flat());
    }
    return;
  }
  const uint64_t jump = version - expected_.version;
  const int allowance = Allowance();
  if (jump > static_cast<uint64_t>(allowance)) {
    AddFinding("model-changed",
               what + ": model version " + std::to_string(expected_.version) +
                   " -> " + std::to_string(version) + " but only " +
                   std::to_string(allowance) +
                   " COMMIT(s) that could have been applied were "
                   "outstanding (refused messages changed the model)");
  } else {
    expected_.consumed += static_cast<int>(jump);
  }
  if (full) {
    adopt(flat());
  } else {
    expected_.ok = false;
    expected_.version = version;
  }
  (void)commit_reply;
}

void Fuzzer::CheckStatus(const pb::SiteStatus& status, const std::string& what,
                         bool fresh) {
  if (status.front().untrusted_credit() > 0) {
    untrusted_credit_ = status.front().untrusted_credit();
  }
  if (status.finished()) {
    AddFinding("job-finished",
               what +
                   ": the job is finished (no control token was ever "
                   "sent, the time budget is far away)",
               step_sent_shutdown_ ? "shutdown" : "");
  }
  if (fresh && expected_.ok && Allowance() == 0 && expected_.inflight == 0 &&
      status.model_version() != expected_.version) {
    AddFinding("model-changed", what + " says model version " +
                                    std::to_string(status.model_version()) +
                                    ", the fuzzer expects " +
                                    std::to_string(expected_.version) +
                                    " (no COMMIT outstanding)");
  }
}

// PULLs the whole model from a ready slot; the reply is compared with the
// expected model (CheckModelReply).
void Fuzzer::CheckModel() {
  const int slot = ReadySlot();
  if (slot < 0) return;
  ++model_checks_;
  Request(slot, Pull(slot, NextSeq(slot)), "check");
}

void Fuzzer::Probe() {
  zmq::socket_t socket(context_, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.connect(server_.endpoint());
  Wire wire = Simple(pb::STATUS_REQUEST, ClientEndpoint(), 1);
  const std::string frame0 = wire.Frame0();
  const auto start = SteadyClock::now();
  ++probes_;
  ++executions_;
  // A fresh connection queues at least this one message.
  (void)socket.send(zmq::buffer(frame0), zmq::send_flags::dontwait);
  const auto deadline = start + milliseconds(options_.probe_timeout_ms);
  while (true) {
    const auto now = SteadyClock::now();
    if (now >= deadline) {
      AddFinding("probe-timeout",
                 "a STATUS_REQUEST from a fresh connection was not answered "
                 "within " +
                     std::to_string(options_.probe_timeout_ms) +
                     " ms (the event loop is blocked or starved)");
      return;
    }
    Result<Received> received = ReceiveMessage(
        socket, false,
        std::chrono::duration_cast<milliseconds>(deadline - now) +
            milliseconds(1));
    if (!received.ok() || received->timed_out()) continue;
    if (!received->message ||
        received->message->header.type() == pb::HEARTBEAT) {
      continue;
    }
    const pb::Header& reply = received->message->header;
    const double latency = SecondsSince(start);
    probe_max_s_ = std::max(probe_max_s_, latency);
    if (reply.type() != pb::STATUS_REPLY) {
      AddFinding("probe-refused", "a STATUS_REQUEST probe was answered with " +
                                      DescribeHeader(reply));
      return;
    }
    CheckStatus(reply.status(), "probe STATUS_REPLY", /*fresh=*/true);
    return;
  }
}

void Fuzzer::CheckServer() {
  if (!server_.Alive()) {
    AddFinding("server-exit",
               "the server process ended: " + server_.DescribeExit());
    return;
  }
  const uint64_t rss = server_.Rss();
  rss_max_ = std::max(rss_max_, rss);
  if (rss_bound_ > 0 && rss > rss_bound_) {
    AddFinding("rss", "server RSS " + Mb(rss) + " exceeds the bound " +
                          Mb(rss_bound_) + " (idle " + Mb(idle_rss_) + ")");
  }
}

void Fuzzer::ReportLogs() const {
  uint64_t lines = 0, rejected = 0, foreign = 0;
  std::string example;
  for (int run = 1; run <= run_; ++run) {
    std::ifstream in(dir_ + "/site-" + std::to_string(run) + ".log");
    std::string line;
    while (std::getline(in, line)) {
      ++lines;
      if (line.find(" rejected ") != std::string::npos) ++rejected;
      // "HH:MM:SS.mmm L role: text"
      const bool formatted = line.size() > 15 && line[2] == ':' &&
                             line[5] == ':' && line[8] == '.' &&
                             line[12] == ' ' && line[14] == ' ';
      if (!formatted) {
        if (foreign++ == 0) example = line;
      }
    }
  }
  uint64_t refusals = 0;
  for (const auto& [code, count] : refusals_) refusals += count;
  std::printf("protocol_fuzz: server log: %" PRIu64 " lines, %" PRIu64
              " of them 'rejected ...' for %" PRIu64 " refusals",
              lines, rejected, refusals);
  if (foreign > 0) {
    std::printf("; %" PRIu64
                " lines not in the log format (untrusted bytes written "
                "verbatim?), e.g. '%s'",
                foreign, Printable(example, 100).c_str());
  }
  std::printf("\n");
}

void Fuzzer::Trace(std::string line) {
  if (options_.trace) std::printf("  %s\n", line.c_str());
  trace_.push_back(std::move(line));
  while (trace_.size() > kTraceLines) trace_.pop_front();
}

void Fuzzer::AddFinding(const std::string& kind, const std::string& detail,
                        std::string cause) {
  // One finding of a kind per step is enough.
  for (const Finding& finding : findings_) {
    if (finding.kind == kind && finding.step == step_) return;
  }
  Finding finding;
  finding.kind = kind;
  finding.step = step_;
  finding.detail = detail;
  if (cause.empty()) {
    if (slow_conn_ >= 0 || slow_ended_) {
      cause = "slow";
    } else {
      cause = "action:" + step_action_;
    }
  }
  finding.cause = cause;
  finding.trace.assign(trace_.begin(), trace_.end());
  finding.log_tail = server_.LogTail(12);
  std::printf("protocol_fuzz: FINDING [%s] at step %" PRIu64 " (seed %" PRIu64
              "): %s\n",
              kind.c_str(), step_, options_.seed,
              Printable(detail, 600).c_str());
  std::fflush(stdout);
  findings_.push_back(std::move(finding));
  const bool fatal = kind == "server-exit" || kind == "probe-timeout" ||
                     kind == "job-finished" || kind == "rss";
  if (!options_.keep_going) {
    stop_ = true;
  } else {
    suppressed_.insert(cause);
    if (fatal) restart_ = true;
    if (kind == "model-changed") expected_.ok = false;
  }
}

// ---- slots
// -------------------------------------------------------------------------

int Fuzzer::OwnerOrHome(int slot) const {
  const int owner = slots_[slot].owner;
  if (owner >= 0 && conns_[owner].reading &&
      conns_[owner].kind != ConnKind::kRaw) {
    return owner;
  }
  return HomeConn(slot);
}

bool Fuzzer::EnsureReady(int s) {
  Slot& slot = slots_[s];
  const int c = OwnerOrHome(s);
  if (!conns_[c].reading) return false;
  if (slot.owner != c) slot.joined = false;
  if (slot.joined && !slot.resync && !slot.left) {
    Await(c, milliseconds(options_.reply_timeout_ms));
    return slot.joined && !slot.resync && !slot.left;
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    const bool fresh = slot.left || slot.incarnation == 0 ||
                       slot.new_incarnation || attempt > 0;
    if (fresh) slot.new_incarnation = true;
    const uint64_t incarnation = fresh ? NewIncarnation() : slot.incarnation;
    // The same process goes on counting; a new one starts at 1.
    const uint64_t seq = !fresh && slot.seq_known < kMaxU64 - 2 &&
                                 slot.seq_floor <= slot.seq_known + 1000
                             ? slot.seq_floor + 1
                             : 1;
    Transmit(c, Hello(s, seq, incarnation), "rejoin", true);
    Await(c, milliseconds(options_.reply_timeout_ms));
    if (slot.joined && slot.owner == c) return true;
    if (stop_ || restart_ || await_timed_out_) return false;
  }
  return false;
}

int Fuzzer::ReadySlot() {
  const int start = static_cast<int>(Rand(options_.workers));
  for (int i = 0; i < options_.workers; ++i) {
    const int s = (start + i) % options_.workers;
    if (s == slow_slot_) continue;
    if (EnsureReady(s)) return s;
    if (stop_ || restart_ || await_timed_out_) return -1;
  }
  return -1;
}

void Fuzzer::Request(int slot, Wire wire, const std::string& action) {
  const int c = slots_[slot].owner;
  if (Transmit(c, wire, action, true)) {
    Await(c, milliseconds(options_.reply_timeout_ms));
  }
}

// ---- actions
// -------------------------------------------------------------------------

void Fuzzer::ActValidCommit() {
  const int s = ReadySlot();
  if (s < 0) return;
  Slot& slot = slots_[s];
  const uint64_t base = expected_.version > 0 && Chance(0.2)
                            ? expected_.version - 1 - Rand(expected_.version)
                            : expected_.version;
  Request(s, Commit(s, NextSeq(s), base, ++slot.commit_id), "commit");
}

void Fuzzer::ActValidPull(bool ranges) {
  const int s = ReadySlot();
  if (s < 0) return;
  if (!ranges) return Request(s, Pull(s, NextSeq(s)), "pull");
  Request(s, PullRanges(s, NextSeq(s), 1 + static_cast<int>(Rand(8)), false),
          "pull-ranges");
}

void Fuzzer::ActHeartbeat() {
  const int s = ReadySlot();
  if (s < 0) return;
  const int c = slots_[s].owner;
  Transmit(c, Simple(pb::HEARTBEAT, WorkerEndpoint(s), NextSeq(s)), "heartbeat",
           true);
}

void Fuzzer::ActStatus() {
  const int c = RandomAnon();
  if (!conns_[c].reading) return;
  pb::Endpoint sender = ClientEndpoint();
  if (Chance(0.5)) sender.set_site("site-" + std::to_string(Rand(5)));
  if (Transmit(c, Simple(pb::STATUS_REQUEST, sender, 1 + Rand(1000)), "status",
               true)) {
    Await(c, milliseconds(options_.reply_timeout_ms));
  }
}

void Fuzzer::HeartbeatIdleSlots() {
  for (int s = 0; s < options_.workers; ++s) {
    Slot& slot = slots_[s];
    if (!slot.joined || slot.left || slot.owner < 0 || s == slow_slot_ ||
        !conns_[slot.owner].reading) {
      continue;
    }
    if (SecondsSince(slot.last_sent) < 2.0) continue;
    Transmit(slot.owner, Simple(pb::HEARTBEAT, WorkerEndpoint(s), NextSeq(s)),
             "heartbeat", true);
  }
}

void Fuzzer::ActByeAndLeave() {
  const int s = ReadySlot();
  if (s < 0) return;
  Request(s, Simple(pb::BYE, WorkerEndpoint(s), NextSeq(s)), "bye");
  // The slot rejoins later as a new process (EnsureReady).
}

// Another connection joins as slot s: the same process over a new
// connection (the server moves the slot there), or a new process that
// replaces it.
void Fuzzer::ActTakeover() {
  const int s = static_cast<int>(Rand(options_.workers));
  if (s == slow_slot_) return;
  Slot& slot = slots_[s];
  int c = Chance(0.5) ? RandomAnon() : static_cast<int>(Rand(worker_conns_));
  if (!conns_[c].reading || c == slot.owner || c == slow_conn_) return;
  const bool same = slot.incarnation != 0 && !slot.left && Chance(0.6);
  if (!same) slot.new_incarnation = true;
  const uint64_t seq = same ? slot.seq_floor + 1 : 1;
  Transmit(c, Hello(s, seq, same ? slot.incarnation : NewIncarnation()),
           same ? "takeover-same" : "takeover-new", true);
  Await(c, milliseconds(options_.reply_timeout_ms));
}

void Fuzzer::ActReconnect() {
  const int c = static_cast<int>(Rand(worker_conns_ + anon_conns_));
  if (c == slow_conn_) return;
  ReplaceConnection(c);
}

// A request while the previous one is still in flight: two valid requests
// of one slot back to back.
void Fuzzer::ActInFlight() {
  const int s = ReadySlot();
  if (s < 0) return;
  Slot& slot = slots_[s];
  const int c = slot.owner;
  Transmit(c, Pull(s, NextSeq(s)), "in-flight", true);
  if (Chance(0.5)) {
    Transmit(c, Commit(s, NextSeq(s), expected_.version, ++slot.commit_id),
             "in-flight", true);
  } else {
    Transmit(c, PullRanges(s, NextSeq(s), 2, false), "in-flight", true);
  }
  Await(c, milliseconds(options_.reply_timeout_ms));
}

// An anonymous connection sends many requests without waiting, then reads.
void Fuzzer::ActAnonBurst() {
  const int c = RandomAnon();
  if (!conns_[c].reading) return;
  const int count = 10 + static_cast<int>(Rand(90));
  for (int i = 0; i < count; ++i) {
    Wire wire = Simple(pb::STATUS_REQUEST, ClientEndpoint(), 1 + i);
    if (Chance(0.3)) {
      wire.raw_frame0 = std::string(1 + Rand(64), '\0');
      for (char& ch : *wire.raw_frame0) ch = static_cast<char>(Rand(256));
    }
    if (!Transmit(c, wire, "anon-burst", !wire.raw_frame0)) break;
  }
  // A server with a bounded send queue drops what does not fit (one
  // request in flight is the rule): the rest is not waited for long.
  Await(c, milliseconds(std::min(options_.reply_timeout_ms, 1000)));
}

// A connection stops reading its replies and keeps sending (SlowBurst each
// step) for a while.
void Fuzzer::ActSlowStart() {
  if (slow_conn_ >= 0 || suppressed_.count("slow")) return;
  int c = -1;
  int s = -1;
  if (Chance(0.7)) {
    s = ReadySlot();
    if (s < 0) return;
    c = slots_[s].owner;
  } else {
    c = RandomAnon();
    for (int i = 0; i < options_.workers; ++i) {
      if (slots_[i].owner == c) return;  // keep slots out of it
    }
  }
  if (!conns_[c].reading) return;
  Await(c, milliseconds(options_.reply_timeout_ms));
  conns_[c].reading = false;
  slow_conn_ = c;
  slow_slot_ = s;
  slow_steps_left_ = 5 + static_cast<int>(Rand(40));
  Trace("step " + std::to_string(step_) + " conn " + std::to_string(c) +
        " stops reading for " + std::to_string(slow_steps_left_) + " steps");
  SlowBurst();
}

void Fuzzer::SlowBurst() {
  const int c = slow_conn_;
  const int count = 1 + static_cast<int>(Rand(Chance(0.3) ? 1000 : 50));
  for (int i = 0; i < count; ++i) {
    Wire wire = slow_slot_ >= 0
                    ? Pull(slow_slot_, NextSeq(slow_slot_))
                    : Simple(pb::STATUS_REQUEST, ClientEndpoint(), 1 + i);
    if (!Transmit(c, wire, "slow-burst", true)) break;
  }
}

// The connection reads again: everything it was sent is checked, then its
// slot joins again (the server may have declared it dead meanwhile).
void Fuzzer::SlowEnd() {
  const int c = slow_conn_;
  conns_[c].reading = true;
  Drain(c, milliseconds(300), milliseconds(30000));
  for (const Sent& sent : conns_[c].outstanding) {
    if (sent.expects_reply) ++outcomes_[sent.action]["none"];
  }
  Forget(c);
  // Its slots may have been declared dead meanwhile: they join again.
  for (Slot& slot : slots_) {
    if (slot.owner == c) slot.resync = true;
  }
  Trace("step " + std::to_string(step_) + " conn " + std::to_string(c) +
        " reads again");
  slow_conn_ = slow_slot_ = -1;
  slow_steps_left_ = 0;
}

// Opens a raw connection, completes the ZMTP handshake and starts a message
// that never ends. A server that does not greet within 10 s is a finding.
void Fuzzer::ActEndlessStart() {
  if (endless_.size() >= kMaxEndlessStreams) return;
  EndlessStream stream;
  stream.fd = testing::ConnectRawTcp(server_.endpoint());
  if (stream.fd < 0) {
    AddFinding("endless-connect", "a raw TCP connection to " +
                                      server_.endpoint() + " was refused");
    return;
  }
  if (!testing::ZmtpHandshake(stream.fd)) {
    ::close(stream.fd);
    AddFinding("endless-handshake",
               "the server did not complete a ZMTP handshake within 10 s");
    return;
  }
  ::fcntl(stream.fd, F_SETFL, ::fcntl(stream.fd, F_GETFL) | O_NONBLOCK);
  stream.frame_bytes = Chance(0.5) ? 1024 : 0;
  while (stream.block.size() < (64u << 10)) {
    stream.block += testing::ZmtpMoreFrame(stream.frame_bytes);
  }
  stream.steps_left = 20 + static_cast<int>(Rand(400));
  ++endless_opened_;
  Trace("step " + std::to_string(step_) + " endless message in " +
        std::to_string(stream.frame_bytes) + "-byte frames for " +
        std::to_string(stream.steps_left) + " steps");
  endless_.push_back(std::move(stream));
}

void Fuzzer::PushEndless() {
  for (size_t i = endless_.size(); i-- > 0;) {
    EndlessStream& stream = endless_[i];
    uint64_t pushed = 0;
    bool closed = false;
    while (pushed < kEndlessPushBytes) {
      const ssize_t n =
          ::send(stream.fd, stream.block.data() + stream.offset,
                 stream.block.size() - stream.offset, MSG_NOSIGNAL);
      if (n < 0) {
        closed = errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
        break;
      }
      pushed += static_cast<uint64_t>(n);
      stream.offset =
          (stream.offset + static_cast<size_t>(n)) % stream.block.size();
    }
    stream.sent += pushed;
    endless_bytes_ += pushed;
    endless_max_stream_bytes_ =
        std::max(endless_max_stream_bytes_, stream.sent);
    if (closed || --stream.steps_left <= 0) CloseEndless(i, closed);
  }
}

void Fuzzer::CloseEndless(size_t i, bool by_server) {
  ::close(endless_[i].fd);
  if (by_server) ++endless_closed_by_server_;
  endless_.erase(endless_.begin() + static_cast<std::ptrdiff_t>(i));
}

void Fuzzer::Step() {
  ++step_;
  step_mutated_ = step_refused_ = step_sent_shutdown_ = slow_ended_ = false;
  step_action_.clear();
  if (slow_conn_ >= 0) {
    if (Chance(0.6)) SlowBurst();
    if (--slow_steps_left_ <= 0) {
      slow_ended_ = true;
      SlowEnd();
    }
  }
  struct Action {
    const char* name;
    int weight;
    std::function<void()> run;
  };
  const std::vector<Action> actions = {
      {"commit", 14, [&] { ActValidCommit(); }},
      {"pull", 8, [&] { ActValidPull(false); }},
      {"pull-ranges", 4, [&] { ActValidPull(true); }},
      {"heartbeat", 3, [&] { ActHeartbeat(); }},
      {"status", 4, [&] { ActStatus(); }},
      {"bye", 2, [&] { ActByeAndLeave(); }},
      {"takeover", 3, [&] { ActTakeover(); }},
      {"reconnect", 2, [&] { ActReconnect(); }},
      {"in-flight", 3, [&] { ActInFlight(); }},
      {"anon-burst", 2, [&] { ActAnonBurst(); }},
      {"slow-start", 1, [&] { ActSlowStart(); }},
      {"endless", 1, [&] { ActEndlessStart(); }},
      {"mutation", 54, [&] { ActMutation(); }},
  };
  int total = 0;
  for (const Action& action : actions) total += action.weight;
  int pick = static_cast<int>(Rand(total));
  for (const Action& action : actions) {
    if (pick < action.weight) {
      step_action_ = action.name;
      if (!suppressed_.count(std::string("action:") + action.name)) {
        action.run();
      }
      break;
    }
    pick -= action.weight;
  }
  if (stop_ || restart_) return;
  PushEndless();
  HeartbeatIdleSlots();
  if (step_mutated_ || step_refused_) CheckModel();
  if (stop_ || restart_) return;
  if (step_ % options_.probe_every == 0) Probe();
  CheckServer();
}

// ---- mutations
// ---------------------------------------------------------------------

void Fuzzer::ActMutation() {
  // The connection and the template message.
  const int kinds = 3;
  const int kind = static_cast<int>(Rand(kinds));  // 0 worker, 1 anon, 2 raw
  int c = -1;
  int s = -1;
  if (kind == 0) {
    s = ReadySlot();
    if (s < 0) return;
    c = slots_[s].owner;
  } else if (kind == 1) {
    c = RandomAnon();
    s = static_cast<int>(Rand(options_.workers));
  } else {
    c = RawConn();
    s = static_cast<int>(Rand(options_.workers));
  }
  if (!conns_[c].reading) return;
  Slot& slot = slots_[s];
  auto seq = [&] { return kind == 0 ? NextSeq(s) : 1 + Rand(100); };
  auto commit = [&] {
    return Commit(s, seq(), expected_.version,
                  kind == 0 ? ++slot.commit_id : 1);
  };
  auto random_bytes = [&](size_t size) {
    std::string bytes(size, '\0');
    for (char& ch : bytes) ch = static_cast<char>(Rand(256));
    return bytes;
  };
  auto any_valid = [&]() -> Wire {
    switch (Rand(7)) {
      case 0:
        return commit();
      case 1:
        return Pull(s, seq());
      case 2:
        return PullRanges(s, seq(), 1 + static_cast<int>(Rand(4)), false);
      case 3:
        return Hello(s, seq(), slot.incarnation);
      case 4:
        return Simple(pb::HEARTBEAT, WorkerEndpoint(s), seq());
      case 5:
        return Simple(pb::STATUS_REQUEST, ClientEndpoint(), seq());
      default:
        return Simple(pb::BYE, WorkerEndpoint(s), seq());
    }
  };
  std::string name;
  Wire wire;
  bool replace_after = false;
  switch (Rand(24)) {
    case 0: {  // bit flips in frame 0
      name = "bitflip";
      wire = any_valid();
      std::string bytes = wire.Frame0();
      const int flips = 1 + static_cast<int>(Rand(8));
      for (int i = 0; i < flips && !bytes.empty(); ++i) {
        bytes[Rand(bytes.size())] ^= static_cast<char>(1 << Rand(8));
      }
      wire.raw_frame0 = bytes;
      break;
    }
    case 1: {
      name = "truncate";
      wire = any_valid();
      const std::string bytes = wire.Frame0();
      wire.raw_frame0 = bytes.substr(0, Rand(bytes.size()));
      break;
    }
    case 2: {
      name = "garbage";
      wire.raw_frame0 =
          random_bytes(Chance(0.8) ? Rand(256) : 1024 + Rand(65536));
      for (uint64_t i = Rand(4); i > 0; --i) {
        wire.payload.push_back(random_bytes(Rand(512)));
      }
      break;
    }
    case 3: {  // missing or extra payload frames
      wire = Chance(0.5) ? commit() : Pull(s, seq());
      if (!wire.payload.empty() && Chance(0.5)) {
        name = "drop-frame";
        wire.payload.erase(wire.payload.begin() + Rand(wire.payload.size()));
      } else {
        name = "extra-frame";
        wire.payload.push_back(random_bytes(Rand(64) * 4));
      }
      break;
    }
    case 4: {  // payload frame size disagrees with the header
      name = "frame-size";
      wire = commit();
      std::string& frame = wire.payload[Rand(wire.payload.size())];
      if (Chance(0.5) && frame.size() > 8) {
        frame.resize(frame.size() - 1 - Rand(8));
      } else {
        frame.resize(frame.size() + 1 + Rand(8), '\0');
      }
      break;
    }
    case 5: {  // slice sizes and offsets that do not fit the tensor
      name = "slice-size";
      wire = commit();
      const int i = static_cast<int>(Rand(wire.payload.size()));
      pb::TensorSlice* slice = wire.header.mutable_slices(i);
      const uint64_t size = slice->length();
      uint64_t length = size;
      switch (Rand(4)) {
        case 0:
          length = size > 1 ? size - 1 - Rand(size - 1) : 2;
          break;
        case 1:
          length = size + 1 + Rand(16);
          break;
        case 2:
          slice->set_offset(1 + Rand(size));
          break;
        default:
          slice->set_offset(Chance(0.5) ? kMaxU64 - Rand(4)
                                        : uint64_t{1} << 63);
          break;
      }
      slice->set_length(length);
      slice->set_payload_bytes(length * 4);
      wire.payload[i].resize(length * 4, '\0');
      break;
    }
    case 6: {  // huge lengths
      name = "slice-length-huge";
      wire = commit();
      pb::TensorSlice* slice = wire.header.mutable_slices(
          static_cast<int>(Rand(wire.payload.size())));
      const uint64_t length = Chance(0.5) ? kMaxU64 / 4 + 1 + Rand(1000)
                                          : (uint64_t{1} << 62) + Rand(1000);
      slice->set_length(length);
      if (Chance(0.5)) slice->set_payload_bytes(length * 4);  // wraps
      break;
    }
    case 7: {  // wrong tensors: unknown, reordered, duplicated, missing
      name = "slice-tensor";
      wire = commit();
      auto* slices = wire.header.mutable_slices();
      const int n = slices->size();
      const int i = static_cast<int>(Rand(n));
      const int j = static_cast<int>((i + 1 + Rand(n - 1)) % n);
      switch (Rand(4)) {
        case 0:
          slices->Mutable(i)->set_tensor(Chance(0.5) ? "fc9.weight"
                                                     : "fc1.weight\nforged");
          break;
        case 1:
          slices->SwapElements(i, j);
          std::swap(wire.payload[i], wire.payload[j]);
          break;
        case 2:
          *slices->Mutable(j) = slices->Get(i);
          wire.payload[j] = wire.payload[i];
          break;
        default:
          slices->DeleteSubrange(i, 1);
          wire.payload.erase(wire.payload.begin() + i);
          break;
      }
      break;
    }
    case 8: {  // codecs and dtypes a commit may not use
      name = "slice-codec";
      wire = commit();
      pb::TensorSlice* slice = wire.header.mutable_slices(
          static_cast<int>(Rand(wire.payload.size())));
      if (Chance(0.5)) {
        slice->set_codec(pb::CODEC_PIPELINE);
      } else {
        slice->set_dtype(pb::DTYPE_UNSPECIFIED);
      }
      break;
    }
    case 9: {  // NaN and Inf in an update
      name = "non-finite";
      wire = commit();
      std::string& frame = wire.payload[Rand(wire.payload.size())];
      const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::signaling_NaN()};
      const float value = bad[Rand(4)];
      std::memcpy(&frame[Rand(frame.size() / 4) * 4], &value, 4);
      break;
    }
    case 10: {  // a commit from the future
      name = "future-base";
      wire = commit();
      wire.header.mutable_commit()->set_base_version(
          Chance(0.5) ? expected_.version + 1 + Rand(1000) : kMaxU64);
      break;
    }
    case 11: {  // PULL ranges outside the model
      name = "pull-out-of-range";
      wire = Pull(s, seq());
      pb::TensorSlice* range = wire.header.mutable_pull()->add_ranges();
      const TensorInfo& tensor =
          layout_.tensors()[Rand(layout_.tensors().size())];
      range->set_tensor(tensor.name);
      switch (Rand(4)) {
        case 0:
          range->set_tensor("nope");
          range->set_length(1);
          break;
        case 1:
          range->set_offset(tensor.size - Rand(2));
          range->set_length(2 + Rand(100));
          break;
        case 2:
          range->set_offset(Rand(tensor.size));
          range->set_length(kMaxU64 - Rand(3));
          break;
        default:
          range->set_offset(kMaxU64 - Rand(3));
          range->set_length(1 + Rand(3));
          break;
      }
      break;
    }
    case 12: {  // many ranges: a reply far larger than the model
      name = "pull-many-ranges";
      const int counts[] = {2, 16, 64, 512, 4096};
      wire = PullRanges(s, seq(), counts[Rand(5)], Chance(0.7));
      break;
    }
    case 13: {  // sequence numbers
      name = "sequence";
      wire = Chance(0.7) ? Pull(s, 0) : commit();
      uint64_t value = 0;
      switch (Rand(5)) {
        case 0:
          value = 0;
          break;
        case 1:
          value = slot.seq_known;  // replayed
          break;
        case 2:
          value = kMaxU64;
          break;
        case 3:
          value = slot.seq_known + kSequenceWindow + 1 + Rand(1000);
          break;
        default:
          value = slot.seq_known > 0 ? Rand(slot.seq_known) : 0;
          break;
      }
      wire.header.set_sequence(value);
      break;
    }
    case 14: {  // wrong sender, role, site; another slot's identity
      name = "sender";
      wire = Chance(0.5) ? commit() : Pull(s, seq());
      pb::Endpoint* sender = wire.header.mutable_sender();
      switch (Rand(5)) {
        case 0:
          sender->set_role(pb::ROLE_CLIENT);
          break;
        case 1:
          sender->set_site("site-b");
          break;
        case 2:
          sender->set_id(static_cast<uint32_t>(options_.workers + Rand(100)));
          break;
        case 3:
          sender->set_role(Chance(0.5) ? pb::ROLE_SITE_SERVER
                                       : pb::ROLE_LAUNCHER);
          break;
        default: {  // foreign routing: another slot over this connection
          const int other = static_cast<int>(
              (s + 1 + Rand(options_.workers - 1)) % options_.workers);
          if (other == s) break;
          sender->set_id(static_cast<uint32_t>(other));
          wire.header.set_sequence(slots_[other].seq_floor + 1);
          name = "foreign-routing";
          break;
        }
      }
      break;
    }
    case 15: {  // control messages without the token
      name = "control";
      if (Chance(0.5)) {
        wire =
            Simple(pb::SHUTDOWN,
                   Chance(0.5) ? ClientEndpoint() : WorkerEndpoint(s), seq());
        wire.header.mutable_shutdown()->set_reason("protocol fuzz");
      } else {
        wire = Simple(pb::SET_PEERS, ClientEndpoint(), seq());
        pb::Peer* peer = wire.header.mutable_peers()->add_peer();
        peer->set_site("site-b");
        peer->set_endpoint("tcp://127.0.0.1:1");
      }
      switch (Rand(3)) {
        case 0:
          break;  // no token
        case 1:
          // One character off (the token may itself end in 'x').
          wire.header.set_control_token(token_.substr(0, 39) +
                                        (token_.back() == 'x' ? "y" : "x"));
          break;
        default:
          wire.header.set_control_token(random_bytes(Rand(64)));
          break;
      }
      if (wire.header.type() == pb::SET_PEERS && Chance(0.2)) {
        wire.header.set_control_token(token_);  // refused: no peers here
      }
      break;
    }
    case 16: {  // message types a site server does not serve
      name = "wrong-type";
      const pb::MessageType types[] = {pb::WELCOME,
                                       pb::MODEL,
                                       pb::ERROR,
                                       pb::STATUS_REPLY,
                                       pb::MIRROR_HELLO,
                                       pb::MIRROR_UPDATE,
                                       pb::MIRROR_CLOCK,
                                       pb::MIRROR_INDICES,
                                       pb::MIRROR_ACK,
                                       pb::MIRROR_TRAVEL,
                                       pb::MIRROR_TRAVEL_RESULT};
      const pb::MessageType type = types[Rand(11)];
      wire = Simple(type, Chance(0.5) ? WorkerEndpoint(s) : ClientEndpoint(),
                    seq());
      switch (type) {
        case pb::WELCOME:
          LayoutToSpecs(layout_, wire.header.mutable_welcome()->mutable_layout());
          break;
        case pb::MODEL:
          wire.header.mutable_model()->set_version(expected_.version + 1);
          AddLayoutSlices(layout_, &wire.header);
          for (const TensorInfo& tensor : layout_.tensors()) {
            wire.payload.emplace_back(tensor.size * 4, '\0');
          }
          break;
        case pb::ERROR:
          wire.header.mutable_error()->set_code(pb::ERROR_MALFORMED);
          break;
        case pb::STATUS_REPLY:
          wire.header.mutable_status()->set_finished(true);
          break;
        case pb::MIRROR_HELLO:
          LayoutToSpecs(layout_, wire.header.mutable_mirror_hello()->mutable_layout());
          break;
        case pb::MIRROR_UPDATE:
        case pb::MIRROR_INDICES:
          wire.header.mutable_mirror_update()->set_origin_site("site-b");
          AddLayoutSlices(layout_, &wire.header);
          for (const TensorInfo& tensor : layout_.tensors()) {
            wire.payload.emplace_back(tensor.size * 4, '\0');
          }
          break;
        case pb::MIRROR_CLOCK:
          wire.header.mutable_mirror_clock()->set_clock(1);
          break;
        case pb::MIRROR_TRAVEL:
          wire.header.mutable_mirror_travel()->set_travel_id(1);
          AddLayoutSlices(layout_, &wire.header);
          for (const TensorInfo& tensor : layout_.tensors()) {
            wire.payload.emplace_back(tensor.size * 4, '\0');
          }
          break;
        case pb::MIRROR_TRAVEL_RESULT:
          wire.header.mutable_mirror_travel_result()->set_own_accuracy(2);
          break;
        default:
          wire.header.mutable_mirror_ack()->set_applied_sequence(1);
          break;
      }
      break;
    }
    case 17: {  // protocol versions
      name = "version";
      wire = any_valid();
      const uint32_t versions[] = {0, 2, 0xffffffffu};
      wire.header.set_protocol_version(versions[Rand(3)]);
      break;
    }
    case 18: {  // HELLOs the server must refuse, and incarnation games
      name = "hello";
      wire = Hello(s, kind == 0 ? slot.seq_floor + 1 : 1, slot.incarnation);
      pb::Hello* hello = wire.header.mutable_hello();
      switch (Rand(6)) {
        case 0: {  // another model
          hello->clear_layout();
          ModelLayout other;
          for (const TensorInfo& tensor : layout_.tensors()) {
            std::vector<uint64_t> shape = tensor.shape;
            if (&tensor == &layout_.tensors().front()) shape[0] += 1;
            (void)other.Add(tensor.name, shape);
          }
          LayoutToSpecs(other, hello->mutable_layout());
          break;
        }
        case 1:
          hello->set_worker_index(
              static_cast<uint32_t>(options_.workers + Rand(1000)));
          wire.header.mutable_sender()->set_id(hello->worker_index());
          break;
        case 2:
          wire.header.mutable_sender()->set_site(Chance(0.5) ? "site-z"
                                                             : "site-a\n");
          break;
        case 3:
          wire.header.mutable_sender()->set_role(pb::ROLE_CLIENT);
          break;
        case 4:
          wire.header.mutable_sender()->set_id(
              static_cast<uint32_t>((s + 1) % options_.workers + 1000));
          break;
        default:
          if (!slot.past_incarnations.empty()) {
            hello->set_incarnation(
                slot.past_incarnations[Rand(slot.past_incarnations.size())]);
          } else {
            hello->clear_layout();
          }
          break;
      }
      break;
    }
    case 19: {  // requests out of order
      name = "out-of-order";
      if (kind == 0 && slot.left) {
        wire = Chance(0.5) ? Pull(s, seq())
                           : Simple(pb::BYE, WorkerEndpoint(s), seq());
      } else {
        // A worker's request over a connection that never joined as it.
        const int anon = RandomAnon();
        if (conns_[anon].reading) c = anon;
        wire = Chance(0.5) ? Commit(s, 1 + Rand(100), expected_.version, 1)
                           : Pull(s, 1 + Rand(100));
      }
      break;
    }
    case 20: {  // many frames
      name = "raw-frames";
      c = RawConn();
      wire.raw_frame0 = random_bytes(Rand(32));
      for (uint64_t i = 1 + Rand(64); i > 0; --i) {
        wire.payload.push_back(random_bytes(Rand(100)));
      }
      break;
    }
    case 21: {  // an oversized frame
      name = "big-frame";
      if (Chance(0.5)) {
        c = RawConn();
        wire.raw_frame0 = random_bytes(kMiB + 1 + Rand(3 * kMiB));
      } else {
        wire = commit();
        std::string& frame = wire.payload[Rand(wire.payload.size())];
        frame.resize(kMiB + 1 + Rand(2 * kMiB), '\0');
      }
      replace_after = true;
      break;
    }
    case 22: {  // a STATUS_REQUEST or HEARTBEAT that carries what it must not
      name = "bad-body";
      wire = Simple(Chance(0.5) ? pb::STATUS_REQUEST : pb::PULL,
                    ClientEndpoint(), seq());
      if (wire.header.type() == pb::STATUS_REQUEST) {
        wire.header.mutable_bye();
      } else {
        wire.header.mutable_commit();
      }
      break;
    }
    default: {  // a HEARTBEAT from someone else, and odd empty messages
      name = "odd";
      switch (Rand(3)) {
        case 0:
          wire = Simple(pb::HEARTBEAT, ClientEndpoint(), seq());
          break;
        case 1:
          wire.raw_frame0 = std::string();
          break;
        default:
          wire = Simple(pb::HEARTBEAT, WorkerEndpoint(s), seq());
          c = RandomAnon();
          break;
      }
      break;
    }
  }
  step_action_ = name;
  if (!conns_[c].reading) return;
  if (!Transmit(c, wire, name, false)) return;
  Await(c, milliseconds(options_.reply_timeout_ms));
  // A server that enforces max_frame_bytes dropped the connection.
  if (replace_after || sent_oversized_) ReplaceConnection(c);
}

// ---- the run
// -----------------------------------------------------------------------

int Fuzzer::Run() {
  if (options_.seed == 0) {
    options_.seed =
        static_cast<uint64_t>(
            std::chrono::system_clock::now().time_since_epoch().count()) %
            1000000007 +
        1;
    rng_.seed(options_.seed);
  }
  worker_conns_ = options_.workers;
  anon_conns_ = options_.connections - options_.workers - 1;
  if (Status status = Prepare(); !status.ok()) {
    std::fprintf(stderr, "protocol_fuzz: %s\n", status.ToString().c_str());
    return 2;
  }
  std::printf("protocol_fuzz: seed %" PRIu64
              ", %.0f s, %d connections (%d workers, "
              "%d anonymous, 1 raw), MLP 784-%d-10 (%" PRIu64
              " parameters), server %s\n",
              options_.seed, options_.seconds, options_.connections,
              worker_conns_, anon_conns_, options_.hidden, params_,
              options_.meridian.c_str());
  std::printf("protocol_fuzz: work dir %s\n", dir_.c_str());
  std::fflush(stdout);
  if (Status status = StartServer(); !status.ok()) {
    std::fprintf(stderr, "protocol_fuzz: cannot start the server: %s\n",
                 status.ToString().c_str());
    return 2;
  }
  MeasureIdle();
  start_ = SteadyClock::now();
  while (!stop_ && SecondsSince(start_) < options_.seconds &&
         (options_.max_steps == 0 || step_ < options_.max_steps)) {
    Step();
    if (restart_ && !stop_) {
      restart_ = false;
      ++restarts_;
      std::printf("protocol_fuzz: restarting the server (--keep-going)\n");
      std::fflush(stdout);
      server_.Stop(10);
      if (Status status = StartServer(); !status.ok()) {
        std::fprintf(stderr, "protocol_fuzz: cannot restart the server: %s\n",
                     status.ToString().c_str());
        break;
      }
      MeasureIdle();
    }
  }
  const double elapsed = SecondsSince(start_);
  if (slow_conn_ >= 0 && !stop_) SlowEnd();
  if (!stop_) {
    CheckModel();
    Probe();
    CheckServer();
  }
  while (!endless_.empty()) CloseEndless(endless_.size() - 1, false);
  conns_.clear();
  const std::string exit_problem = server_.Stop(30);
  if (!exit_problem.empty()) {
    AddFinding("unclean-exit", "the server " + exit_problem);
  }

  // ---- report
  std::printf("\nprotocol_fuzz: seed %" PRIu64 ", %.1f s, %" PRIu64
              " steps, %" PRIu64 " executions (messages sent: %" PRIu64
              " valid, %" PRIu64 " mutated, %" PRIu64 " probes), %" PRIu64
              " sends refused by a full queue\n",
              options_.seed, elapsed, step_, executions_, valid_sent_,
              mutated_sent_, probes_, send_blocked_);
  std::printf(
      "protocol_fuzz: model checks %" PRIu64 " (%" PRIu64
      " floats compared bit for bit), probes %" PRIu64
      " (slowest %.3f s), max RSS %s (bound %s), server restarts %" PRIu64 "\n",
      model_checks_, compared_floats_, probes_, probe_max_s_,
      Mb(rss_max_).c_str(), Mb(rss_bound_).c_str(), restarts_);
  std::printf("protocol_fuzz: endless messages: %" PRIu64
              " streams, %s pushed (at most %s into one), %" PRIu64
              " closed by the server\n",
              endless_opened_, Mb(endless_bytes_).c_str(),
              Mb(endless_max_stream_bytes_).c_str(),
              endless_closed_by_server_);
  std::string refusals;
  for (const auto& [code, count] : refusals_) {
    refusals += " " + code + "=" + std::to_string(count);
  }
  std::printf("protocol_fuzz: refusals by code:%s\n", refusals.c_str());
  std::printf("protocol_fuzz: replies by action:\n");
  for (const auto& [action, replies] : outcomes_) {
    std::string line;
    for (const auto& [reply, count] : replies) {
      line += " " + reply + "=" + std::to_string(count);
    }
    std::printf("  %-18s%s\n", action.c_str(), line.c_str());
  }
  ReportLogs();
  if (!surprises_.empty()) {
    std::printf(
        "protocol_fuzz: valid requests refused (the fuzzer rejoined):\n");
    for (const auto& [key, value] : surprises_) {
      std::printf("  %s: %" PRIu64 " (first: %s)\n", key.c_str(), value.first,
                  value.second.c_str());
    }
  }
  if (findings_.empty()) {
    std::printf("protocol_fuzz: no finding\n");
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    return 0;
  }
  std::printf("protocol_fuzz: server logs and job in %s\n", dir_.c_str());
  std::printf("protocol_fuzz: %zu finding(s):\n", findings_.size());
  for (const Finding& finding : findings_) {
    std::printf("\n[%s] step %" PRIu64 ", seed %" PRIu64 ": %s\n",
                finding.kind.c_str(), finding.step, options_.seed,
                finding.detail.c_str());
    std::printf(
        "  reproduce (same actions; timing may differ): protocol_fuzz "
        "--seed %" PRIu64 " --max-steps %" PRIu64
        " --connections %d --workers %d --hidden %d%s\n",
        options_.seed, finding.step, options_.connections, options_.workers,
        options_.hidden, options_.keep_going ? " --keep-going" : "");
    std::printf("  attributed to: %s\n", finding.cause.c_str());
    std::printf("  last messages:\n");
    const size_t from =
        finding.trace.size() > 12 ? finding.trace.size() - 12 : 0;
    for (size_t i = from; i < finding.trace.size(); ++i) {
      std::printf("    %s\n", Printable(finding.trace[i], 220).c_str());
    }
    if (!finding.log_tail.empty()) {
      std::printf("  server log tail:\n");
      std::istringstream lines(finding.log_tail);
      std::string line;
      while (std::getline(lines, line)) {
        std::printf("    %s\n", Printable(line, 220).c_str());
      }
    }
  }
  return 1;
}

void Usage(const char* argv0) {
  std::fprintf(
      stderr,
      "usage: %s --seconds N [--seed S] [--connections C] [--meridian PATH]\n"
      "          [--workers W] [--hidden H] [--probe-every K]\n"
      "          [--reply-timeout-ms T] [--probe-timeout-ms T]\n"
      "          [--memory-limit-mb M] [--max-steps N] [--keep-going] "
      "[--trace]\n",
      argv0);
}

}  // namespace
}  // namespace meridian::protocol_fuzz

int main(int argc, char** argv) {
  using meridian::protocol_fuzz::Options;
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        meridian::protocol_fuzz::Usage(argv[0]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--seconds") {
      options.seconds = std::atof(value().c_str());
    } else if (arg == "--seed") {
      options.seed = std::strtoull(value().c_str(), nullptr, 10);
    } else if (arg == "--connections") {
      options.connections = std::atoi(value().c_str());
    } else if (arg == "--workers") {
      options.workers = std::atoi(value().c_str());
    } else if (arg == "--hidden") {
      options.hidden = std::atoi(value().c_str());
    } else if (arg == "--meridian") {
      options.meridian = value();
    } else if (arg == "--probe-every") {
      options.probe_every = std::max(1, std::atoi(value().c_str()));
    } else if (arg == "--reply-timeout-ms") {
      options.reply_timeout_ms = std::atoi(value().c_str());
    } else if (arg == "--probe-timeout-ms") {
      options.probe_timeout_ms = std::atoi(value().c_str());
    } else if (arg == "--memory-limit-mb") {
      options.memory_limit_mb = std::strtoull(value().c_str(), nullptr, 10);
    } else if (arg == "--max-steps") {
      options.max_steps = std::strtoull(value().c_str(), nullptr, 10);
    } else if (arg == "--keep-going") {
      options.keep_going = true;
    } else if (arg == "--trace") {
      options.trace = true;
    } else {
      meridian::protocol_fuzz::Usage(argv[0]);
      return 2;
    }
  }
  if (options.seconds <= 0 || options.workers < 2 ||
      options.connections < options.workers + 2 || options.hidden < 1) {
    std::fprintf(stderr,
                 "protocol_fuzz: need --seconds > 0, --workers >= 2 and "
                 "--connections >= workers + 2\n");
    return 2;
  }
  if (options.meridian.empty()) {
    options.meridian =
        (std::filesystem::read_symlink("/proc/self/exe").parent_path() /
         "meridian")
            .string();
  }
  if (!std::filesystem::exists(options.meridian)) {
    std::fprintf(stderr, "protocol_fuzz: no meridian binary at %s\n",
                 options.meridian.c_str());
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  meridian::protocol_fuzz::Fuzzer fuzzer(options);
  return fuzzer.Run();
}
