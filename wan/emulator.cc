#include "wan/emulator.h"

#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <vector>

#include "meridian/core/log.h"
#include "meridian/core/mutex.h"
#include "meridian/core/thread_annotations.h"
#include "meridian/wan/units.h"
#include "wan/connection_gate.h"
#include "wan/shaper.h"
#include "wan/socket_util.h"
#include "wan/splice_pipe.h"
#include "wan/zmtp.h"

namespace meridian::wan {
namespace {

using Buffer = std::shared_ptr<uint8_t[]>;

std::string Uptime(const Clock* clock, Duration start) {
  char text[32];
  std::snprintf(text, sizeof(text), "t=%.3fs", ToSeconds(clock->Now() - start));
  return text;
}

struct Connection;

// One direction of a link: its shaper, the chunks it holds, its counters
// and the thread that releases chunks on time. Threads: the readers of
// every connection on the link enqueue, its shaper thread releases, the
// writers give queue room back, and the control thread changes the model,
// all under mu; the counters are atomic.
struct Direction {
  Direction(std::string from_site, std::string to_site,
            const DirectionModel& model, const Clock* clock, size_t read_bytes)
      : from(std::move(from_site)),
        to(std::move(to_site)),
        read_bytes(read_bytes),
        shaper(model, clock) {
    Refresh();
  }

  // Recomputes what depends on the model and the partition. Holds mu.
  void Refresh() {
    passthrough = shaper.model().passthrough() && !shaper.partitioned();
    chunk_bytes = ChunkBytes(shaper.model(), read_bytes);
    const uint64_t limit = shaper.queue_limit();
    room_threshold =
        std::max<uint64_t>(1, std::min<uint64_t>(read_bytes / 4, limit / 2));
  }

  // Queue room neither accepted bytes nor reads under way have taken.
  // Holds mu.
  uint64_t FreeRoom() const {
    const uint64_t room = shaper.Room();
    return room > reserved ? room - reserved : 0;
  }

  const std::string from;
  const std::string to;
  const size_t read_bytes;

  std::mutex mu;
  std::condition_variable wake;  // the shaper thread
  std::condition_variable room;  // readers waiting for queue room
  Shaper shaper;                 // guarded by mu
  struct Chunk {
    Buffer buffer;
    size_t offset = 0;
    size_t size = 0;
    uint32_t messages = 0;
    bool eof = false;
    std::shared_ptr<Connection> connection;
    bool upstream = true;  // which half of the connection
  };
  std::deque<Chunk> pending;    // guarded by mu; same order as the shaper's
  bool passthrough = false;     // guarded by mu
  size_t chunk_bytes = 0;       // guarded by mu
  uint64_t room_threshold = 1;  // guarded by mu
  // Room taken by shaped reads under way (Reserve): so that readers of
  // many connections never accept more than the queue limit together.
  uint64_t reserved = 0;  // guarded by mu
  bool stop = false;            // guarded by mu
  bool started = false;         // guarded by the emulator's mu_
  std::thread thread;

  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> messages{0};
};

// One direction of a connection: reads `src`, writes `dst`. Threads: its
// reader alone uses zmtp, chunks and the pipe; the shaper thread (or the
// reader, when direct) appends to `out` and its writer takes from it, under
// mu; Abort closes it from any thread. dir, src and dst are set before the
// reader and writer start.
struct Half {
  Direction* dir = nullptr;
  int src = -1;
  int dst = -1;
  ZmtpCounter zmtp;  // the reader's
  // The reader's chunks of one read, kept to reuse their storage.
  std::vector<Direction::Chunk> chunks;
  Mutex mu;
  std::condition_variable_any cv;  // the writer waits for out or closed
  std::deque<Direction::Chunk> out GUARDED_BY(mu);  // released, to be written
  bool closed GUARDED_BY(mu) = false;               // stop writing
  std::atomic<uint64_t> pending{0};  // chunks accepted, not yet written
  SplicePipe pipe;  // the reader's
};

struct Route;

// Threads: main_thread connects (ConnectionMain) and then reads upstream;
// others[] read downstream and write both ways; the route's accept thread
// creates, reaps and joins it; Abort comes from any of them or from Stop.
struct Connection : std::enable_shared_from_this<Connection> {
  Emulator::Impl* emulator = nullptr;
  Route* route = nullptr;
  Mutex mu;            // orders Abort() with the set-up in ConnectionMain
  int client_fd = -1;  // set before main_thread starts
  int server_fd GUARDED_BY(mu) = -1;  // set once connected
  Half up;                            // client -> server
  Half down;                          // server -> client
  std::atomic<bool> aborted{false};
  std::atomic<int> running{0};
  std::thread main_thread;
  std::thread others[3];

  ~Connection() {
    CloseFd(&client_fd);
    CloseFd(&server_fd);
  }
  bool finished() const { return running.load(std::memory_order_acquire) == 0; }
  void Abort();
  void Join() {
    if (main_thread.joinable()) main_thread.join();
    for (std::thread& t : others) {
      if (t.joinable()) t.join();
    }
  }
};

// Threads: its accept thread adds and reaps connections; connection threads
// count failed forward connections; Stop and the status readers (control
// endpoint, metrics) take the connection list; all under mu. The other
// fields are fixed before the accept thread starts.
struct Route {
  RouteSpec spec;
  std::string bound;
  HostPort forward;
  Direction* up = nullptr;    // from_site -> other site
  Direction* down = nullptr;  // back
  int listen_fd = -1;
  std::thread accept_thread;
  Mutex mu;
  std::list<std::shared_ptr<Connection>> connections GUARDED_BY(mu);
  // Failed forward connections, for a rate-limited warning (ZeroMQ peers
  // retry every 100 ms while the far side is down).
  uint64_t connect_failures GUARDED_BY(mu) = 0;
  Duration last_warning GUARDED_BY(mu) = -std::chrono::hours(1);
};

struct Link {
  LinkModel model;  // as created; the live models are in the shapers
  std::unique_ptr<Direction> a_to_b;
  std::unique_ptr<Direction> b_to_a;
  std::atomic<bool> partitioned{false};
};

}  // namespace

class Emulator::Impl {
 public:
  explicit Impl(EmulatorOptions options)
      : options_(std::move(options)),
        start_(options_.clock->Now()),
        gate_(options_.max_connections, options_.max_connections_per_route,
              DescriptorLimit()) {
    for (const LinkModel& model : options_.links) {
      auto link = std::make_unique<Link>();
      link->model = model;
      link->a_to_b = std::make_unique<Direction>(
          model.a, model.b, model.a_to_b, options_.clock, options_.read_bytes);
      link->b_to_a = std::make_unique<Direction>(
          model.b, model.a, model.b_to_a, options_.clock, options_.read_bytes);
      by_name_[model.name()] = link.get();
      links_.push_back(std::move(link));
    }
    MLOG(INFO) << "connections: at most " << gate_.max_per_route()
               << " per route, " << gate_.max_total() << " in all ("
               << DescriptorLimit() << " descriptors)";
  }

  ~Impl() { Stop(); }

  Result<Link*> FindLink(std::string_view name) const {
    auto it = by_name_.find(std::string(name));
    if (it == by_name_.end()) {
      std::string known;
      for (const auto& link : links_) {
        known += (known.empty() ? "" : ", ") + link->model.name();
      }
      return NotFoundError("no link '" + std::string(name) +
                           "'; links: " + (known.empty() ? "none" : known));
    }
    return it->second;
  }

  Result<std::string> AddRoute(const RouteSpec& spec) {
    MERIDIAN_ASSIGN_OR_RETURN(Link * link, FindLink(spec.link));
    auto route = std::make_unique<Route>();
    route->spec = spec;
    if (spec.from_site == link->model.a) {
      route->up = link->a_to_b.get();
      route->down = link->b_to_a.get();
    } else if (spec.from_site == link->model.b) {
      route->up = link->b_to_a.get();
      route->down = link->a_to_b.get();
    } else {
      return InvalidArgumentError(
          "from_site '" + spec.from_site + "' is not an end of link '" +
          spec.link + "' (" + link->model.a + " or " + link->model.b + ")");
    }
    Result<HostPort> listen = ParseHostPort(spec.listen, true);
    if (!listen.ok()) return listen.status().WithContext("listen");
    Result<HostPort> forward = ParseHostPort(spec.forward, false);
    if (!forward.ok()) return forward.status().WithContext("forward");
    if (Status resolved = ResolveTcp(*forward); !resolved.ok()) {
      if (!spec.allow_unresolved) return resolved.WithContext("forward");
      MLOG(WARNING) << "route " << spec.link << " from " << spec.from_site
                    << ": forward address " << spec.forward
                    << " does not resolve yet (" << resolved.message()
                    << "); looked up again on each connection";
    }
    route->forward = *forward;

    MutexLock lock(&mu_);
    if (stopping_) return FailedPreconditionError("the emulator is stopping");
    MERIDIAN_ASSIGN_OR_RETURN(route->listen_fd, ListenTcp(*listen));
    Result<std::string> bound = LocalAddress(route->listen_fd);
    if (!bound.ok()) {
      CloseFd(&route->listen_fd);
      return bound.status();
    }
    route->bound = *bound;
    StartDirection(link->a_to_b.get());
    StartDirection(link->b_to_a.get());
    Route* raw = route.get();
    route->accept_thread = std::thread([this, raw] { AcceptLoop(raw); });
    routes_.push_back(std::move(route));
    MLOG(INFO) << Uptime(options_.clock, start_) << " link " << spec.link
               << ": route from " << spec.from_site << " listening on "
               << raw->bound << " -> " << raw->forward.ToString();
    return raw->bound;
  }

  Status SetLinkModels(std::string_view name, pb::LinkDirection direction,
                       const pb::LinkDirectionConfig* change,
                       const DirectionModel* replacement) {
    MERIDIAN_ASSIGN_OR_RETURN(Link * link, FindLink(name));
    if (direction == pb::LINK_DIRECTION_UNSPECIFIED) direction = pb::BOTH;
    if (direction != pb::A_TO_B && direction != pb::B_TO_A &&
        direction != pb::BOTH) {
      return InvalidArgumentError("direction: must be A_TO_B, B_TO_A or BOTH");
    }
    std::vector<Direction*> targets;
    if (direction != pb::B_TO_A) targets.push_back(link->a_to_b.get());
    if (direction != pb::A_TO_B) targets.push_back(link->b_to_a.get());
    // Compute every new model first, so that an error changes nothing.
    std::vector<DirectionModel> models;
    for (Direction* dir : targets) {
      DirectionModel model;
      {
        std::lock_guard<std::mutex> lock(dir->mu);
        model = dir->shaper.model();
      }
      if (replacement != nullptr) {
        const uint64_t seed = model.seed;
        model = *replacement;
        model.seed = seed;
      } else {
        MERIDIAN_RETURN_IF_ERROR(
            ApplyDirectionConfig(*change, "change", &model));
      }
      models.push_back(model);
    }
    for (size_t i = 0; i < targets.size(); ++i) {
      Direction* dir = targets[i];
      std::string before;
      {
        std::lock_guard<std::mutex> lock(dir->mu);
        before = DescribeDirection(dir->shaper.model());
        dir->shaper.SetModel(models[i]);
        dir->Refresh();
      }
      dir->wake.notify_all();
      dir->room.notify_all();
      MLOG(INFO) << Uptime(options_.clock, start_) << " link " << name << " "
                 << dir->from << "->" << dir->to << ": set "
                 << DescribeDirection(models[i]) << " (was " << before << ")";
    }
    return Status::Ok();
  }

  Status SetPartitioned(std::string_view name, bool partitioned) {
    MERIDIAN_ASSIGN_OR_RETURN(Link * link, FindLink(name));
    const bool was = link->partitioned.exchange(partitioned);
    for (Direction* dir : {link->a_to_b.get(), link->b_to_a.get()}) {
      {
        std::lock_guard<std::mutex> lock(dir->mu);
        if (partitioned) {
          dir->shaper.Partition();
        } else {
          dir->shaper.Heal();
        }
        dir->Refresh();
      }
      dir->wake.notify_all();
      dir->room.notify_all();
    }
    MLOG(INFO) << Uptime(options_.clock, start_) << " link " << name << ": "
               << (partitioned ? "partitioned" : "healed")
               << (was == partitioned ? " (already)" : "");
    return Status::Ok();
  }

  Status ResetConnections(std::string_view name) {
    MERIDIAN_RETURN_IF_ERROR(FindLink(name).status());
    std::vector<std::shared_ptr<Connection>> reset;
    {
      MutexLock lock(&mu_);
      for (const auto& route : routes_) {
        if (route->spec.link != name) continue;
        MutexLock route_lock(&route->mu);
        for (const auto& connection : route->connections) {
          if (!connection->finished()) reset.push_back(connection);
        }
      }
    }
    // The accept threads reap them as usual.
    for (const auto& connection : reset) connection->Abort();
    MLOG(INFO) << Uptime(options_.clock, start_) << " link " << name
               << ": reset " << reset.size() << " connections";
    return Status::Ok();
  }

  pb::WanLinkState State(const Link& link) const {
    pb::WanLinkState state;
    state.set_link(link.model.name());
    state.set_a(link.model.a);
    state.set_b(link.model.b);
    state.set_partitioned(link.partitioned.load());
    FillDirection(*link.a_to_b, state.mutable_a_to_b());
    FillDirection(*link.b_to_a, state.mutable_b_to_a());
    MutexLock lock(&mu_);
    for (const auto& route : routes_) {
      if (route->spec.link != link.model.name()) continue;
      pb::WanRouteState* r = state.add_routes();
      r->set_from_site(route->spec.from_site);
      r->set_listen(route->bound);
      r->set_forward(route->forward.ToString());
      MutexLock route_lock(&route->mu);
      uint32_t open = 0;
      for (const auto& connection : route->connections) {
        if (!connection->finished()) ++open;
      }
      r->set_connections(open);
    }
    return state;
  }

  Result<pb::WanLinkState> LinkState(std::string_view name) const {
    MERIDIAN_ASSIGN_OR_RETURN(Link * link, FindLink(name));
    return State(*link);
  }

  std::vector<pb::WanLinkState> LinkStates() const {
    std::vector<pb::WanLinkState> states;
    for (const auto& link : links_) states.push_back(State(*link));
    return states;
  }

  std::vector<std::string> LinkNames() const {
    std::vector<std::string> names;
    for (const auto& link : links_) names.push_back(link->model.name());
    return names;
  }

  double UptimeSeconds() const {
    return ToSeconds(options_.clock->Now() - start_);
  }
  const Clock* clock() const { return options_.clock; }

  void Stop() {
    // No route is added once stopping_ is set, so the routes taken here
    // are all there are.
    std::vector<Route*> routes;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
      for (const auto& route : routes_) routes.push_back(route.get());
    }
    for (Route* route : routes) {
      if (route->accept_thread.joinable()) route->accept_thread.join();
      CloseFd(&route->listen_fd);
    }
    for (Route* route : routes) {
      std::list<std::shared_ptr<Connection>> connections;
      {
        MutexLock lock(&route->mu);
        connections.swap(route->connections);
      }
      for (auto& connection : connections) connection->Abort();
      for (auto& connection : connections) connection->Join();
    }
    for (auto& link : links_) {
      for (Direction* dir : {link->a_to_b.get(), link->b_to_a.get()}) {
        {
          std::lock_guard<std::mutex> lock(dir->mu);
          dir->stop = true;
        }
        dir->wake.notify_all();
        dir->room.notify_all();
        if (dir->thread.joinable()) dir->thread.join();
        // Chunks still held belong to closed connections.
        std::lock_guard<std::mutex> lock(dir->mu);
        dir->pending.clear();
      }
    }
    MLOG(INFO) << Uptime(options_.clock, start_) << " emulator stopped";
  }

  // Called by the threads of a connection.
  void ConnectionMain(Connection* c);
  void ReadLoop(Connection* c, bool upstream);
  void WriteLoop(Connection* c, bool upstream);
  void Drop(Direction* dir, Half* half, const Direction::Chunk& chunk);

 private:
  static void FillDirection(Direction& dir, pb::WanDirectionState* out) {
    out->set_from_site(dir.from);
    out->set_to_site(dir.to);
    std::lock_guard<std::mutex> lock(dir.mu);
    const DirectionModel& model = dir.shaper.model();
    out->set_bandwidth_bps(model.bandwidth_bps);
    out->set_latency_s(ToSeconds(model.latency));
    out->set_jitter_s(ToSeconds(model.jitter));
    out->set_jitter_distribution(model.jitter_distribution);
    out->set_queue_limit_bytes(dir.shaper.queue_limit());
    out->set_bytes(dir.bytes.load());
    out->set_messages(dir.messages.load());
    out->set_queued_bytes(dir.shaper.in_flight_bytes());
  }

  // Starts the shaper thread of `dir` once (dir->started is guarded by
  // mu_).
  void StartDirection(Direction* dir) REQUIRES(mu_) {
    if (dir->started) return;
    dir->started = true;
    dir->thread = std::thread([this, dir] { ShaperLoop(dir); });
  }

  void ShaperLoop(Direction* dir);
  void AcceptLoop(Route* route);
  // Joins and closes the route's finished connections (the accept thread).
  void Reap(Route* route);
  // Admits the connection `fd` just accepted on `route`, or closes it
  // with a log line naming the cap that refuses it.
  void Admit(Route* route, int fd);
  void Deliver(Direction::Chunk chunk);
  // Passes the end of the stream on, in order: delivered at once when
  // `direct`, else queued behind the half's chunks in the shaper.
  void EndOfStream(Connection* c, bool upstream, bool direct);
  template <typename Bytes>
  bool PassOn(Connection* c, bool upstream, ssize_t n, const char* what,
              const Bytes& bytes);

  EmulatorOptions options_;
  const Duration start_;
  ConnectionGate gate_;  // thread-safe
  std::vector<std::unique_ptr<Link>> links_;
  std::map<std::string, Link*> by_name_;
  // Threads: the owner and the control endpoint call the public methods;
  // each route has an accept thread, each link direction a shaper thread,
  // each connection four threads (see Connection). links_ and by_name_
  // are fixed at construction; mu_ guards the routes and the stop flag.
  mutable Mutex mu_;
  std::vector<std::unique_ptr<Route>> routes_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
};

namespace {

void Connection::Abort() {
  MutexLock guard(&mu);
  if (aborted.exchange(true)) return;
  // Wakes readers blocked in recv() and writers blocked in send().
  if (client_fd >= 0) ::shutdown(client_fd, SHUT_RDWR);
  if (server_fd >= 0) ::shutdown(server_fd, SHUT_RDWR);
  for (Half* half : {&up, &down}) {
    {
      MutexLock lock(&half->mu);
      half->closed = true;
    }
    half->cv.notify_all();
    if (half->dir != nullptr) {
      // Taking the lock orders this with a reader's predicate check.
      { std::lock_guard<std::mutex> lock(half->dir->mu); }
      half->dir->room.notify_all();
    }
  }
}

// What the reader of a half may do next: read up to `want` bytes, which go
// straight to the far side when `direct`.
struct ReadTurn {
  bool direct = false;
  size_t want = 0;
};

// Waits until the reader of `half` may read: the link direction has queue
// room, or it passes bytes through and none of this half's are queued.
// nullopt once the connection is aborted or the emulator stops.
std::optional<ReadTurn> WaitForRoom(Connection* c, Half* half,
                                    size_t read_bytes) {
  Direction* dir = half->dir;
  std::unique_lock<std::mutex> lock(dir->mu);
  auto can_read = [&] {
    return c->aborted.load() || dir->stop ||
           (dir->passthrough && half->pending.load() == 0) ||
           dir->FreeRoom() >= dir->room_threshold;
  };
  while (!can_read()) {
    dir->room.wait_for(lock, std::chrono::milliseconds(200));
  }
  if (c->aborted.load() || dir->stop) return std::nullopt;
  ReadTurn turn;
  turn.direct = dir->passthrough && half->pending.load() == 0;
  // A direct read can still end up queued (the link may be partitioned or
  // shaped while it blocks), so it never exceeds the limit either. A
  // shaped read takes its room once the socket is readable (Reserve).
  turn.want = static_cast<size_t>(
      std::min<uint64_t>(read_bytes, dir->shaper.queue_limit()));
  return turn;
}

// Waits until the source of `half` has bytes (or an end or error, which
// the read then reports). False once the connection is aborted.
bool WaitReadable(Connection* c, Half* half) {
  while (!c->aborted.load()) {
    pollfd item{half->src, POLLIN, 0};
    const int ready = ::poll(&item, 1, 200);
    if (ready > 0 || (ready < 0 && errno != EINTR)) return true;
  }
  return false;
}

// Takes up to `read_bytes` of the direction's free queue room for a read
// about to happen (Unreserve gives it back once the bytes are queued); 0
// when other readers took the room meanwhile.
size_t Reserve(Half* half, size_t read_bytes) {
  Direction* dir = half->dir;
  std::lock_guard<std::mutex> lock(dir->mu);
  const uint64_t want = std::min<uint64_t>(read_bytes, dir->FreeRoom());
  if (want < dir->room_threshold) return 0;
  dir->reserved += want;
  return static_cast<size_t>(want);
}

void Unreserve(Direction* dir, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(dir->mu);
    dir->reserved -= bytes;
  }
  dir->room.notify_all();
}

// Whether bytes read now may be written straight away (no shaping, and
// nothing of this connection direction still queued ahead of them).
bool IsDirect(Half* half) {
  std::lock_guard<std::mutex> lock(half->dir->mu);
  return half->dir->passthrough && half->pending.load() == 0;
}

// Closes the connection after its read step `what` failed (errno says why).
void ReadFailed(Connection* c, Direction* dir, const char* what) {
  if (!c->aborted.load()) {
    MLOG(DEBUG) << "link " << c->route->spec.link << " " << dir->from << "->"
                << dir->to << ": " << what << ": " << std::strerror(errno)
                << "; closing the connection";
  }
  c->Abort();
}

// Hands `size` bytes of `data` to the link's shaper in chunks, after the
// half's chunks already queued.
void Enqueue(Connection* c, bool upstream, const Buffer& data, size_t size) {
  Half* half = upstream ? &c->up : &c->down;
  Direction* dir = half->dir;
  size_t chunk_bytes;
  {
    std::lock_guard<std::mutex> lock(dir->mu);
    chunk_bytes = dir->chunk_bytes;
  }
  std::vector<Direction::Chunk>& chunks = half->chunks;
  chunks.clear();
  for (size_t offset = 0; offset < size; offset += chunk_bytes) {
    Direction::Chunk chunk;
    chunk.buffer = data;
    chunk.offset = offset;
    chunk.size = std::min(chunk_bytes, size - offset);
    chunk.messages = static_cast<uint32_t>(
        half->zmtp.Consume({data.get() + offset, chunk.size}));
    chunk.connection = c->shared_from_this();
    chunk.upstream = upstream;
    chunks.push_back(std::move(chunk));
  }
  half->pending.fetch_add(chunks.size());
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(dir->mu);
    was_empty = dir->pending.empty();
    for (Direction::Chunk& chunk : chunks) {
      dir->shaper.Enqueue(chunk.size);
      dir->pending.push_back(std::move(chunk));
    }
  }
  if (was_empty) dir->wake.notify_all();
}

// The bytes of one read, where the reader holds them until it knows their
// way (Emulator::Impl::PassOn takes either kind):
//   Forward(size) writes them to the far side and returns the ZeroMQ
//     messages they complete; nullopt when the far side is gone.
//   Take(size) returns a buffer holding them, to be queued; null (errno
//     set) when they cannot be had; kTake names that step for the log.

// Bytes recv()'d into the reader's buffer.
struct BufferBytes {
  static constexpr const char* kTake = "copy";
  Half* half;
  const Buffer& buffer;
  size_t read_bytes;

  std::optional<uint64_t> Forward(size_t size) const {
    const uint64_t messages = half->zmtp.Consume({buffer.get(), size});
    if (!WriteAll(half->dst, buffer.get(), size)) return std::nullopt;
    return messages;
  }
  Buffer Take(size_t size) const {
    // Small reads get a buffer of their own so that held chunks do not pin
    // whole read buffers.
    if (size >= read_bytes / 4) return buffer;
    Buffer data = std::make_shared_for_overwrite<uint8_t[]>(size);
    std::memcpy(data.get(), buffer.get(), size);
    return data;
  }
};

// Bytes splice()'d into the half's pipe: ones the message counter need not
// see, so it skips them.
struct PipeBytes {
  static constexpr const char* kTake = "pipe";
  Half* half;

  std::optional<uint64_t> Forward(size_t size) const {
    if (!half->pipe.Out(half->dst, size)) return std::nullopt;
    return half->zmtp.SkipOpaque(size);
  }
  // Shaped or partitioned since the read: the bytes join the queue after
  // all.
  Buffer Take(size_t size) const {
    Buffer data = std::make_shared_for_overwrite<uint8_t[]>(size);
    if (!half->pipe.Read(data.get(), size)) return nullptr;
    return data;
  }
};

}  // namespace

void Emulator::Impl::ShaperLoop(Direction* dir) {
  // Wake up on time: the default 50 us timer slack would show as jitter.
  ::prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  std::vector<Shaper::Released> released;
  std::vector<Direction::Chunk> due;
  std::unique_lock<std::mutex> lock(dir->mu);
  while (!dir->stop) {
    released.clear();
    const size_t count = dir->shaper.Poll(&released);
    for (size_t i = 0; i < count; ++i) {
      due.push_back(std::move(dir->pending.front()));
      dir->pending.pop_front();
    }
    if (!due.empty()) {
      lock.unlock();
      for (Direction::Chunk& chunk : due) Deliver(std::move(chunk));
      due.clear();
      lock.lock();
      continue;
    }
    const std::optional<Duration> next = dir->shaper.NextEventTime();
    if (!next) {
      dir->wake.wait(lock);
      continue;
    }
    const Duration wait = *next - options_.clock->Now();
    if (wait > Duration::zero()) dir->wake.wait_for(lock, wait);
  }
}

void Emulator::Impl::Deliver(Direction::Chunk chunk) {
  Connection* c = chunk.connection.get();
  Half* half = chunk.upstream ? &c->up : &c->down;
  {
    MutexLock lock(&half->mu);
    if (!half->closed) {
      half->out.push_back(std::move(chunk));
      half->cv.notify_one();
      return;
    }
  }
  Drop(half->dir, half, chunk);
}

void Emulator::Impl::Drop(Direction* dir, Half* half,
                          const Direction::Chunk& chunk) {
  {
    std::lock_guard<std::mutex> lock(dir->mu);
    dir->shaper.Delivered(chunk.size);
  }
  half->pending.fetch_sub(1);
  dir->room.notify_all();
}

void Emulator::Impl::Reap(Route* route) {
  std::list<std::shared_ptr<Connection>> finished;
  {
    MutexLock lock(&route->mu);
    for (auto it = route->connections.begin();
         it != route->connections.end();) {
      if ((*it)->finished()) {
        finished.push_back(std::move(*it));
        it = route->connections.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& connection : finished) {
    connection->Join();
    // Chunks still in a shaper may keep the object alive; the sockets go
    // now.
    CloseFd(&connection->client_fd);
    {
      MutexLock lock(&connection->mu);
      CloseFd(&connection->server_fd);
    }
    gate_.Release();
  }
}

void Emulator::Impl::AcceptLoop(Route* route) {
  while (true) {
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
    }
    Reap(route);
    pollfd item{route->listen_fd, POLLIN, 0};
    const int ready = ::poll(&item, 1, 100);
    if (ready <= 0) continue;
    const int fd = ::accept4(route->listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      Admit(route, fd);
      continue;
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
      // Out of descriptors or memory: the gate keeps connections under
      // the descriptor limit, so something else holds them; wait rather
      // than fail in a loop.
      MLOG_EVERY_KEY(WARNING, "wanem cannot accept on " + route->bound)
          << Uptime(options_.clock, start_) << " link " << route->spec.link
          << ": accept on " << route->bound << ": " << std::strerror(errno)
          << "; accepting again in 100 ms";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void Emulator::Impl::Admit(Route* route, int fd) {
  Reap(route);  // what ended while the loop waited makes room now
  size_t route_open = 0;
  {
    MutexLock lock(&route->mu);
    route_open = route->connections.size();
  }
  if (std::optional<std::string> refused = gate_.TryAdmit(route_open)) {
    MLOG_EVERY_KEY(WARNING, "wanem refuses connections on " + route->bound)
        << Uptime(options_.clock, start_) << " link " << route->spec.link
        << ": route " << route->bound << " refused a connection from "
        << RemoteAddress(fd) << ": " << *refused;
    ResetAndClose(fd);
    return;
  }
  SetNoDelay(fd);
  auto connection = std::make_shared<Connection>();
  connection->emulator = this;
  connection->route = route;
  connection->client_fd = fd;
  connection->running.store(1);
  Connection* raw = connection.get();
  {
    MutexLock lock(&route->mu);
    route->connections.push_back(connection);
  }
  try {
    raw->main_thread = std::thread([this, raw] { ConnectionMain(raw); });
  } catch (const std::system_error& error) {
    MLOG_EVERY_KEY(WARNING, "wanem threads on " + route->bound)
        << "link " << route->spec.link << ": route " << route->bound
        << ": no thread for a new connection (" << error.what()
        << "); closing it";
    raw->running.store(0);  // the next Reap closes and releases it
  }
}

void Emulator::Impl::ConnectionMain(Connection* c) {
  Route* route = c->route;
  Result<int> server = ConnectTcp(route->forward, options_.connect_timeout);
  if (!server.ok()) {
    bool warn = false;
    uint64_t failures = 0;
    {
      MutexLock lock(&route->mu);
      failures = ++route->connect_failures;
      const Duration now = options_.clock->Now();
      if (now - route->last_warning >= std::chrono::seconds(10)) {
        route->last_warning = now;
        warn = true;
      }
    }
    if (warn) {
      MLOG(WARNING) << Uptime(options_.clock, start_) << " link "
                    << route->spec.link << ": route " << route->bound
                    << ": closing the client connection: " << server.status()
                    << " (" << failures << " failed so far)";
    }
    ::shutdown(c->client_fd, SHUT_RDWR);
    c->running.fetch_sub(1, std::memory_order_acq_rel);
    return;
  }
  {
    MutexLock lock(&c->mu);
    c->server_fd = *server;
    if (c->aborted.load()) {  // stopped while connecting
      ::shutdown(c->server_fd, SHUT_RDWR);
      c->running.fetch_sub(1, std::memory_order_acq_rel);
      return;
    }
    c->up.dir = route->up;
    c->up.src = c->client_fd;
    c->up.dst = c->server_fd;
    c->down.dir = route->down;
    c->down.src = c->server_fd;
    c->down.dst = c->client_fd;
  }
  MLOG(DEBUG) << "link " << route->spec.link << ": connection via "
              << route->bound << " to " << route->forward.ToString();
  c->running.fetch_add(3, std::memory_order_acq_rel);
  int started = 0;
  try {
    c->others[0] = std::thread([this, c] {
      ReadLoop(c, false);
      c->running.fetch_sub(1, std::memory_order_acq_rel);
    });
    ++started;
    for (bool upstream : {true, false}) {
      c->others[started] = std::thread([this, c, upstream] {
        WriteLoop(c, upstream);
        c->running.fetch_sub(1, std::memory_order_acq_rel);
      });
      ++started;
    }
  } catch (const std::system_error& error) {
    MLOG_EVERY_KEY(WARNING, "wanem threads on " + route->bound)
        << "link " << route->spec.link << ": route " << route->bound
        << ": no thread for a connection (" << error.what()
        << "); closing it";
    c->running.fetch_sub(3 - started, std::memory_order_acq_rel);
    c->Abort();
  }
  ReadLoop(c, true);
  c->running.fetch_sub(1, std::memory_order_acq_rel);
}

void Emulator::Impl::EndOfStream(Connection* c, bool upstream, bool direct) {
  Half* half = upstream ? &c->up : &c->down;
  Direction* dir = half->dir;
  Direction::Chunk eof;
  eof.eof = true;
  eof.connection = c->shared_from_this();
  eof.upstream = upstream;
  half->pending.fetch_add(1);
  if (direct) {
    Deliver(std::move(eof));
    return;
  }
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(dir->mu);
    dir->shaper.Enqueue(0);
    was_empty = dir->pending.empty();
    dir->pending.push_back(std::move(eof));
  }
  if (was_empty) dir->wake.notify_all();
}

// Passes on what the read step `what` (recv or splice) returned in `n`:
// nothing after EINTR; the end of the stream; or the bytes, written straight
// through while the direction is direct, else queued in the link's shaper.
// Returns false when this half's reader is done (end of stream, or an error
// that closed the connection).
template <typename Bytes>
bool Emulator::Impl::PassOn(Connection* c, bool upstream, ssize_t n,
                            const char* what, const Bytes& bytes) {
  Half* half = upstream ? &c->up : &c->down;
  Direction* dir = half->dir;
  if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
    return true;
  }
  if (n < 0) {
    ReadFailed(c, dir, what);
    return false;
  }
  if (n == 0) {
    EndOfStream(c, upstream, IsDirect(half));
    return false;
  }
  const size_t size = static_cast<size_t>(n);
  if (IsDirect(half)) {
    const std::optional<uint64_t> messages = bytes.Forward(size);
    if (!messages) {
      c->Abort();
      return false;
    }
    dir->bytes.fetch_add(size, std::memory_order_relaxed);
    dir->messages.fetch_add(*messages, std::memory_order_relaxed);
    return true;
  }
  const Buffer data = bytes.Take(size);
  if (!data) {
    ReadFailed(c, dir, Bytes::kTake);
    return false;
  }
  Enqueue(c, upstream, data, size);
  return true;
}

void Emulator::Impl::ReadLoop(Connection* c, bool upstream) {
  Half* half = upstream ? &c->up : &c->down;
  const size_t read_bytes = options_.read_bytes;
  Buffer buffer;  // reused while no queued chunk holds it
  while (true) {
    const std::optional<ReadTurn> turn = WaitForRoom(c, half, read_bytes);
    if (!turn) return;
    // Zero-copy path: bytes the message counter need not see (frame bodies,
    // or everything once a stream is not ZMTP) go socket -> pipe -> socket.
    if (turn->direct && half->pipe.usable() &&
        half->zmtp.OpaqueBytesAhead() >= kSpliceMinBytes) {
      const ssize_t n = half->pipe.In(
          half->src, static_cast<size_t>(std::min<uint64_t>(
                         {half->zmtp.OpaqueBytesAhead(), kSpliceMaxBytes,
                          uint64_t{turn->want}})));
      if (n == kSpliceUnsupported) continue;
      if (!PassOn(c, upstream, n, "splice", PipeBytes{half})) return;
      continue;
    }
    // A shaped read waits for bytes first, then takes its queue room, so
    // that an idle connection holds none.
    size_t want = turn->want;
    size_t reserved = 0;
    if (!turn->direct) {
      if (!WaitReadable(c, half)) return;
      reserved = Reserve(half, read_bytes);
      if (reserved == 0) continue;
      want = reserved;
    }
    if (!buffer || buffer.use_count() > 1) {
      buffer = std::make_shared_for_overwrite<uint8_t[]>(read_bytes);
    }
    const ssize_t n = ::recv(half->src, buffer.get(), want,
                             reserved > 0 ? MSG_DONTWAIT : 0);
    const bool more =
        PassOn(c, upstream, n, "read", BufferBytes{half, buffer, read_bytes});
    if (reserved > 0) Unreserve(half->dir, reserved);
    if (!more) return;
  }
}

void Emulator::Impl::WriteLoop(Connection* c, bool upstream) {
  Half* half = upstream ? &c->up : &c->down;
  Direction* dir = half->dir;
  std::deque<Direction::Chunk> batch;
  // Leaving: nothing more is written; what is still queued for this half
  // (now or later) is dropped and its queue room given back. Chunks hold
  // their connection, so none may stay behind in `out`.
  auto finish = [&](size_t first_unwritten) {
    for (size_t i = first_unwritten; i < batch.size(); ++i) {
      Drop(dir, half, batch[i]);
    }
    batch.clear();
    std::deque<Direction::Chunk> rest;
    {
      MutexLock lock(&half->mu);
      half->closed = true;
      rest.swap(half->out);
    }
    for (const Direction::Chunk& chunk : rest) Drop(dir, half, chunk);
  };
  while (true) {
    {
      MutexLock lock(&half->mu);
      while (!half->closed && half->out.empty()) half->cv.wait(half->mu);
      batch.swap(half->out);
    }
    if (c->aborted.load()) {
      finish(0);
      return;
    }
    uint64_t bytes = 0;
    uint64_t messages = 0;
    size_t written = 0;
    bool failed = false;
    bool eof = false;
    for (const Direction::Chunk& chunk : batch) {
      if (chunk.eof) {
        ::shutdown(half->dst, SHUT_WR);
        eof = true;
        ++written;
        break;
      }
      if (!WriteAll(half->dst, chunk.buffer.get() + chunk.offset, chunk.size)) {
        failed = true;
        break;
      }
      bytes += chunk.size;
      messages += chunk.messages;
      ++written;
    }
    {
      std::lock_guard<std::mutex> lock(dir->mu);
      dir->shaper.Delivered(bytes);
    }
    dir->bytes.fetch_add(bytes, std::memory_order_relaxed);
    dir->messages.fetch_add(messages, std::memory_order_relaxed);
    half->pending.fetch_sub(written);
    dir->room.notify_all();
    if (failed) c->Abort();
    if (failed || eof) {
      finish(written);
      return;
    }
    batch.clear();
  }
}

Emulator::Emulator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Emulator::~Emulator() { Stop(); }

Result<std::unique_ptr<Emulator>> Emulator::Create(EmulatorOptions options) {
  if (options.clock == nullptr) options.clock = SystemClock();
  if (options.read_bytes < 1024) {
    return InvalidArgumentError("read_bytes must be at least 1024");
  }
  std::set<std::string> names;
  std::set<std::pair<std::string, std::string>> pairs;
  for (const LinkModel& link : options.links) {
    if (link.a.empty() || link.b.empty()) {
      return InvalidArgumentError("a link needs two site names");
    }
    if (link.a == link.b) {
      return InvalidArgumentError("link '" + link.name() +
                                  "' joins a site to itself");
    }
    if (!names.insert(link.name()).second) {
      return InvalidArgumentError("duplicate link name '" + link.name() + "'");
    }
    if (!pairs.insert(std::minmax(link.a, link.b)).second) {
      return InvalidArgumentError("two links join " + link.a + " and " +
                                  link.b);
    }
  }
  for (const LinkModel& link : options.links) {
    MLOG(INFO) << "link " << link.name() << ": " << link.a << "->" << link.b
               << " " << DescribeDirection(link.a_to_b) << "; " << link.b
               << "->" << link.a << " " << DescribeDirection(link.b_to_a);
  }
  return std::unique_ptr<Emulator>(
      new Emulator(std::make_unique<Impl>(std::move(options))));
}

Result<std::string> Emulator::AddRoute(const RouteSpec& route) {
  return impl_->AddRoute(route);
}

Status Emulator::SetLink(std::string_view link, pb::LinkDirection direction,
                         const pb::LinkDirectionConfig& change) {
  return impl_->SetLinkModels(link, direction, &change, nullptr);
}

Status Emulator::SetLinkModel(std::string_view link,
                              pb::LinkDirection direction,
                              const DirectionModel& model) {
  return impl_->SetLinkModels(link, direction, nullptr, &model);
}

Status Emulator::Partition(std::string_view link) {
  return impl_->SetPartitioned(link, true);
}

Status Emulator::Heal(std::string_view link) {
  return impl_->SetPartitioned(link, false);
}

Status Emulator::ResetConnections(std::string_view link) {
  return impl_->ResetConnections(link);
}

Result<pb::WanLinkState> Emulator::LinkState(std::string_view link) const {
  return impl_->LinkState(link);
}

std::vector<pb::WanLinkState> Emulator::LinkStates() const {
  return impl_->LinkStates();
}

std::vector<std::string> Emulator::LinkNames() const {
  return impl_->LinkNames();
}

double Emulator::UptimeSeconds() const { return impl_->UptimeSeconds(); }
const Clock* Emulator::clock() const { return impl_->clock(); }

void Emulator::Stop() { impl_->Stop(); }

}  // namespace meridian::wan
