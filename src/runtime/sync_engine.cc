#include "runtime/sync_engine.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "meridian/addresses.h"
#include "meridian/compression.h"
#include "meridian/config.h"
#include "meridian/log.h"
#include "meridian/message.h"
#include "meridian/security.h"
#include "meridian/sync.h"
#include "meridian/transport.h"
#include "meridian/wan_presets.h"
#include "meridian/wan_units.h"

namespace meridian {
namespace {

constexpr auto kFinishPoll = std::chrono::milliseconds(20);
// How long a mirror connection keeps unsent messages when the server shuts
// down: long enough for a final flush to cross a slow link.
constexpr int kLingerMs = 10000;

// Outgoing channel to one peer site.
struct Channel {
  int site = -1;
  std::string name;
  std::string endpoint;
  std::unique_ptr<zmq::socket_t> socket;  // DEALER
  int64_t announced = 0;                  // last clock sent on this channel
  uint64_t sequence = 0;
  uint64_t bytes = 0;
  bool final_sent = false;
  // Bandwidth-adaptive threshold of this link (when enabled).
  std::optional<AdaptiveThreshold> adaptive;
  uint64_t period_bytes = 0;
  double period_start_s = 0;
};

// What this site knows of a peer's channel towards it.
struct Incoming {
  std::string routing_id;  // of the connection that said MIRROR_HELLO
  bool hello = false;
  bool final = false;
  uint64_t bytes = 0;  // of its mirror messages (metrics)
  uint64_t messages = 0;
};

// One encoded update: a slice and a payload frame per tensor that changed.
struct Encoded {
  std::vector<pb::TensorSlice> slices;
  std::vector<zmq::message_t> frames;
  uint64_t entries = 0;
  uint64_t bytes = 0;
  bool empty() const { return slices.empty(); }
};

pb::CompressionConfig LosslessConfig(int zstd_level) {
  pb::CompressionConfig config;
  config.set_selection(pb::SELECT_ALL);
  config.set_index_coding(pb::INDEX_AUTO);
  config.set_value_coding(pb::VALUE_FP32);
  config.set_zstd_level(zstd_level);
  return config;
}

}  // namespace

class SyncEngine::Impl {
 public:
  explicit Impl(SyncEngineOptions options)
      : options_(std::move(options)),
        job_(*options_.job),
        sync_(job_.sync()),
        site_index_(options_.site_index),
        name_(job_.site(site_index_).name()),
        store_(options_.store),
        clock_(options_.clock),
        role_(RoleOf(job_, site_index_)),
        schedule_(sync_, job_.optimizer(), job_.policy().local_steps()),
        clocks_(PeerNames()),
        mirror_(*options_.context, zmq::socket_type::router) {
    self_.set_site(name_);
    self_.set_role(pb::ROLE_SITE_SERVER);
  }

  Status Init() {
    pb::CompressionConfig main = sync_.compression();
    if (sync_.kind() == pb::DENSE) main.set_index_coding(pb::INDEX_DENSE);
    MERIDIAN_ASSIGN_OR_RETURN(UpdateEncoder encoder,
                              UpdateEncoder::Create(main));
    encoder_.emplace(std::move(encoder));
    MERIDIAN_ASSIGN_OR_RETURN(
        UpdateEncoder lossless,
        UpdateEncoder::Create(LosslessConfig(main.zstd_level())));
    lossless_.emplace(std::move(lossless));
    pb::CompressionConfig indices = LosslessConfig(1);
    indices.set_value_coding(pb::VALUE_FP16);  // zeros: only indices matter
    MERIDIAN_ASSIGN_OR_RETURN(UpdateEncoder index_encoder,
                              UpdateEncoder::Create(indices));
    index_encoder_.emplace(std::move(index_encoder));

    // Local changes feed every accumulator. A mesh site or member keeps one
    // for its peers. A hub keeps one towards the other hubs (its own and its
    // members' changes) and one per member: its own changes plus everything
    // it receives that did not come from that member, so each member gets
    // one filtered sum per clock however many sites are behind the hub.
    if (role_.kind != SyncRole::Kind::kHub ||
        sync_.kind() == pb::MODEL_AVERAGING) {
      main_acc_ = store_->AddAccumulator();
    }
    if (role_.kind == SyncRole::Kind::kHub) {
      out_acc_ = store_->AddAccumulator();
      for (int member : role_.members) {
        member_acc_[member] = store_->AddAccumulator();
      }
    }

    const std::string bind =
        options_.mirror_bind.empty()
            ? BindEndpointFor(job_.site(site_index_).mirror_address())
            : options_.mirror_bind;
    MERIDIAN_RETURN_IF_ERROR(SecureMirror());
    try {
      mirror_.set(zmq::sockopt::linger, 0);
      mirror_.set(zmq::sockopt::router_mandatory, 1);
      mirror_.bind(bind);
    } catch (const zmq::error_t& error) {
      return UnavailableError("site '" + name_ +
                              "' cannot listen for peers on '" + bind +
                              "': " + error.what());
    }
    MERIDIAN_ASSIGN_OR_RETURN(mirror_endpoint_, BoundEndpoint(mirror_));
    for (int peer : role_.Peers()) {
      Channel channel;
      channel.site = peer;
      channel.name = job_.site(peer).name();
      channel.endpoint = PeerMirrorEndpoint(job_, site_index_, peer);
      channels_.push_back(std::move(channel));
      incoming_[job_.site(peer).name()] = Incoming{};
    }
    MLOG(INFO) << "sync " << pb::SyncKind_Name(sync_.kind()) << " as "
               << RoleName() << " with " << PeerList() << "; mirror socket "
               << mirror_endpoint_ << "; theta0 " << sync_.threshold() << " ("
               << pb::ThresholdMode_Name(sync_.threshold_mode()) << ", "
               << pb::ThresholdSchedule_Name(sync_.threshold_schedule())
               << "), DS " << sync_.max_clock_skew() << ", "
               << DescribeCompressionConfig(sync_.compression());
    return Status::Ok();
  }

  const std::string& mirror_endpoint() const { return mirror_endpoint_; }

  // With security.curve: loads the keys, starts the ZAP handler (before
  // the mirror socket binds, so no connection is ever admitted without
  // it) and makes the mirror socket a CURVE server. Channels become CURVE
  // clients as they open. Without: says the links are plaintext.
  Status SecureMirror() {
    if (!job_.security().curve()) {
      MLOG(WARNING) << "cross-site links are plaintext: security { curve: "
                       "false }";
      return Status::Ok();
    }
    const std::vector<int> peers = role_.Peers();
    MERIDIAN_ASSIGN_OR_RETURN(
        SiteCurveKeys keys,
        LoadSiteCurveKeys(job_, site_index_, peers, options_.secret_key_file));
    std::map<std::string, std::string> allowed;
    for (const auto& [site, key] : keys.peers) allowed[key] = site;
    MERIDIAN_ASSIGN_OR_RETURN(
        zap_, ZapHandler::Start(*options_.context, std::move(allowed),
                                "mirror socket of site '" + name_ + "'"));
    MERIDIAN_RETURN_IF_ERROR(MakeCurveServer(mirror_, keys.own)
                                 .WithContext("mirror socket of site '" +
                                              name_ + "'"));
    MLOG(INFO) << "CURVE on: links to and from " << PeerList()
               << " are encrypted; admitting only their keys; this site's "
                  "public key "
               << keys.own.public_key;
    curve_.emplace(std::move(keys));
    return Status::Ok();
  }

  std::vector<std::string> peers() const {
    std::vector<std::string> names;
    for (const Channel& channel : channels_) names.push_back(channel.name);
    return names;
  }

  std::vector<std::string> silent_peers() const {
    std::vector<std::string> names;
    for (const Channel& channel : channels_) {
      auto it = incoming_.find(channel.name);
      if (it == incoming_.end() || !it->second.hello) {
        names.push_back(channel.name + " (" + channel.endpoint + ")");
      }
    }
    return names;
  }

  Status SetPeerEndpoints(const std::map<std::string, std::string>& endpoints) {
    for (const auto& [site, endpoint] : endpoints) {
      auto it = std::find_if(channels_.begin(), channels_.end(),
                             [&](const Channel& c) { return c.name == site; });
      if (it == channels_.end()) {
        return InvalidArgumentError("site '" + name_ +
                                    "' does not sync with a site named '" +
                                    site + "' (its peers: " + PeerList() + ")");
      }
      if (it->socket && it->endpoint != endpoint) {
        return FailedPreconditionError("the channel to site '" + site +
                                       "' is already connected to " +
                                       it->endpoint);
      }
      it->endpoint = endpoint;
    }
    return Status::Ok();
  }

  Status Connect() {
    for (Channel& channel : channels_) MERIDIAN_RETURN_IF_ERROR(Open(channel));
    return Status::Ok();
  }

  void AddPollItems(std::vector<zmq::pollitem_t>* items) {
    items->push_back({mirror_.handle(), 0, ZMQ_POLLIN, 0});
    for (Channel& channel : channels_) {
      items->push_back({channel.socket ? channel.socket->handle() : nullptr, -1,
                        channel.socket ? short(ZMQ_POLLIN) : short(0), 0});
    }
  }

  void HandleReadable(std::span<const zmq::pollitem_t> items) {
    if (!items.empty() && (items[0].revents & ZMQ_POLLIN)) DrainMirror();
    for (size_t i = 0; i < channels_.size() && i + 1 < items.size(); ++i) {
      if (items[i + 1].revents & ZMQ_POLLIN) DrainChannel(channels_[i]);
    }
  }

  void OnLocalClock(int64_t clock) {
    local_clock_ = clock;
    if (sync_.kind() == pb::MODEL_AVERAGING) {
      if (clock % sync_.averaging_period() == 0) SendModelForAveraging(clock);
    } else {
      SendLocalChanges(Theta(clock));
    }
    AnnounceClocks();
    MaybeAverage();
  }

  bool ReadsAllowed(int64_t local_clock,
                    std::span<const KeyRange> ranges) const {
    if (ranges.empty()) {
      if (!blocked_.empty()) return false;
    } else {
      for (const KeyRange& range : ranges) {
        if (blocked_.Intersects(range.begin, range.end)) return false;
      }
    }
    if (sync_.kind() == pb::MODEL_AVERAGING) {
      return !averaging_round_open_;
    }
    return ViewWithinBound(local_clock);
  }

  void NoteHeld(double seconds) { blocked_s_ += seconds; }

  bool peer_finished() const { return !finished_peer_.empty(); }
  const std::string& finished_peer() const { return finished_peer_; }

  bool Finish(double timeout_s) {
    finishing_ = true;
    const double deadline = clock_->NowSeconds() + timeout_s;
    auto wait_for = [&](const std::vector<int>& sites) {
      while (!AllFinal(sites) && clock_->NowSeconds() < deadline) PollOnce();
      return AllFinal(sites);
    };
    bool complete = true;
    switch (role_.kind) {
      case SyncRole::Kind::kMesh:
        FlushTo(main_acc_, AllChannels());
        SendFinal(AllChannels());
        complete = wait_for(role_.mesh);
        break;
      case SyncRole::Kind::kMember:
        FlushTo(main_acc_, AllChannels());
        SendFinal(AllChannels());
        complete = wait_for({role_.hub});
        break;
      case SyncRole::Kind::kHub:
        // Members first: their last changes must reach the other hubs.
        complete = wait_for(role_.members);
        FlushTo(out_acc_, ChannelsOf(role_.hubs));
        SendFinal(ChannelsOf(role_.hubs));
        complete = wait_for(role_.hubs) && complete;
        for (Channel* channel : ChannelsOf(role_.members)) {
          FlushTo(member_acc_.at(channel->site), {channel});
        }
        SendFinal(ChannelsOf(role_.members));
        break;
    }
    flushed_ = complete;
    if (!complete) {
      std::string missing;
      for (const auto& [site, in] : incoming_) {
        if (!in.final) missing += (missing.empty() ? "" : ", ") + site;
      }
      MLOG(WARNING) << "no final flush from [" << missing << "] within "
                    << timeout_s << " s: their last changes may be missing";
    }
    return complete;
  }

  double theta() const { return last_theta_; }
  uint64_t bytes_sent() const {
    uint64_t total = 0;
    for (const Channel& channel : channels_) total += channel.bytes;
    return total;
  }
  int64_t slowest_peer_clock() const {
    return channels_.empty() ? local_clock_ : clocks_.Min();
  }

  std::vector<SyncEngine::PeerCounters> peer_counters() const {
    std::map<std::string, SyncEngine::PeerCounters> peers;
    for (const Channel& channel : channels_) {
      peers[channel.name].bytes_sent = channel.bytes;
    }
    for (const auto& [site, in] : incoming_) {
      SyncEngine::PeerCounters& peer = peers[site];
      peer.bytes_received = in.bytes;
      peer.messages_received = in.messages;
      peer.connected = in.hello;
      peer.clock = clocks_.ClockOf(site).value_or(0);
    }
    std::vector<SyncEngine::PeerCounters> out;
    for (auto& [site, peer] : peers) {
      peer.site = site;
      out.push_back(std::move(peer));
    }
    return out;
  }

  pb::SyncSummary Summary() const {
    pb::SyncSummary summary;
    summary.set_clock(static_cast<uint32_t>(local_clock_));
    summary.set_final_theta(last_theta_);
    summary.set_bytes_sent(static_cast<double>(bytes_sent()));
    summary.set_updates_sent(static_cast<double>(updates_sent_));
    summary.set_entries_sent(static_cast<double>(entries_sent_));
    summary.set_entries_received(static_cast<double>(entries_received_));
    summary.set_updates_received(static_cast<double>(updates_received_));
    summary.set_rejected(static_cast<double>(rejected_));
    summary.set_blocked_s(blocked_s_);
    summary.set_flushed(flushed_);
    return summary;
  }

 private:
  // ---- naming ---------------------------------------------------------------
  std::vector<std::string> PeerNames() const {
    std::vector<std::string> names;
    for (int peer : role_.Peers()) names.push_back(job_.site(peer).name());
    return names;
  }

  std::string PeerList() const {
    std::string out;
    for (const std::string& name : PeerNames()) {
      out += (out.empty() ? "" : ", ") + name;
    }
    return out.empty() ? "nobody" : out;
  }

  std::string RoleName() const {
    switch (role_.kind) {
      case SyncRole::Kind::kMesh:
        return "mesh node";
      case SyncRole::Kind::kHub:
        return "hub";
      case SyncRole::Kind::kMember:
        return "member of hub '" + job_.site(role_.hub).name() + "'";
    }
    return "?";
  }

  std::vector<Channel*> AllChannels() {
    std::vector<Channel*> all;
    for (Channel& channel : channels_) all.push_back(&channel);
    return all;
  }

  std::vector<Channel*> ChannelsOf(const std::vector<int>& sites) {
    std::vector<Channel*> selected;
    for (Channel& channel : channels_) {
      if (std::find(sites.begin(), sites.end(), channel.site) != sites.end()) {
        selected.push_back(&channel);
      }
    }
    return selected;
  }

  Channel* ChannelTo(const std::string& site) {
    for (Channel& channel : channels_) {
      if (channel.name == site) return &channel;
    }
    return nullptr;
  }

  bool IsMember(const std::string& site) const {
    for (int member : role_.members) {
      if (job_.site(member).name() == site) return true;
    }
    return false;
  }

  bool AllFinal(const std::vector<int>& sites) const {
    for (int site : sites) {
      auto it = incoming_.find(job_.site(site).name());
      if (it == incoming_.end() || !it->second.final) return false;
    }
    return true;
  }

  // ---- thresholds and budgets -------------------------------------------
  // The link budget in bytes/s: sync.bandwidth_budget, else the emulated
  // bandwidth of the direction towards `peer`; 0 when neither is known.
  double LinkBudget(int peer) const {
    if (sync_.has_bandwidth_budget()) {
      Result<double> budget = wan::ParseBandwidth(sync_.bandwidth_budget());
      return budget.ok() ? *budget / 8 : 0;
    }
    Result<std::vector<wan::LinkModel>> links = wan::ResolveJobLinks(job_);
    if (!links.ok()) return 0;
    const std::string& self = name_;
    const std::string& other = job_.site(peer).name();
    for (const wan::LinkModel& link : *links) {
      if (link.a == self && link.b == other)
        return link.a_to_b.bandwidth_bps / 8;
      if (link.b == self && link.a == other)
        return link.b_to_a.bandwidth_bps / 8;
    }
    return 0;
  }

  double Theta(int64_t clock) {
    if (sync_.kind() == pb::DENSE) return 0;
    double theta =
        schedule_.At(static_cast<uint64_t>(std::max<int64_t>(clock, 1)));
    if (theta > 0) {
      double adjustment = 0;
      for (const Channel& channel : channels_) {
        if (channel.adaptive) {
          adjustment = std::max(adjustment, channel.adaptive->adjustment());
        }
      }
      theta += adjustment;
    }
    last_theta_ = theta;
    return theta;
  }

  void ObserveBandwidth() {
    const double now = clock_->NowSeconds();
    for (Channel& channel : channels_) {
      if (!channel.adaptive) continue;
      channel.adaptive->Observe(channel.period_bytes,
                                now - channel.period_start_s);
      channel.period_bytes = 0;
      channel.period_start_s = now;
    }
  }

  bool ViewWithinBound(int64_t local_clock) const {
    return clocks_.WithinBound(local_clock, sync_.max_clock_skew());
  }

  // ---- sending ------------------------------------------------------------
  // Connects the channel and introduces this site on it, once. Channels
  // open when training starts, or earlier when a hub must relay a member's
  // update before its own workers have joined.
  Status Open(Channel& channel) {
    if (channel.socket) return Status::Ok();
    try {
      auto socket = std::make_unique<zmq::socket_t>(*options_.context,
                                                    zmq::socket_type::dealer);
      socket->set(zmq::sockopt::linger, kLingerMs);
      // Never drop: while a link is slow or partitioned, updates wait in
      // the queue (the DS bound keeps it finite).
      socket->set(zmq::sockopt::sndhwm, 0);
      if (curve_) {
        const std::string& peer_key = curve_->peers.at(channel.name);
        MERIDIAN_RETURN_IF_ERROR(
            MakeCurveClient(*socket, curve_->own, peer_key)
                .WithContext("channel to site '" + channel.name + "'"));
      }
      socket->connect(channel.endpoint);
      channel.socket = std::move(socket);
    } catch (const zmq::error_t& error) {
      return InvalidArgumentError("cannot connect to site '" + channel.name +
                                  "' at '" + channel.endpoint +
                                  "': " + error.what());
    }
    const double budget = LinkBudget(channel.site);
    if (sync_.adaptive_threshold() && budget > 0) {
      channel.adaptive.emplace(budget, sync_.adaptive_step(),
                               sync_.adaptive_max() - sync_.threshold());
    }
    channel.period_start_s = clock_->NowSeconds();
    pb::Header hello = MakeHeader(pb::MIRROR_HELLO, self_, ++channel.sequence);
    store_->layout().ToSpecs(hello.mutable_mirror_hello()->mutable_layout());
    Send(channel, hello, {});
    MLOG(INFO) << "connected to site '" << channel.name << "' at "
               << channel.endpoint;
    return Status::Ok();
  }

  void Send(Channel& channel, const pb::Header& header,
            std::vector<zmq::message_t> frames) {
    if (!channel.socket) {
      if (Status status = Open(channel); !status.ok()) {
        MLOG(ERROR) << status << "; update not sent";
        return;
      }
    }
    uint64_t bytes = header.ByteSizeLong();
    for (const zmq::message_t& frame : frames) bytes += frame.size();
    if (Status status = SendMessage(*channel.socket, header, std::move(frames));
        !status.ok()) {
      // With an unlimited queue a send only fails when the context is
      // going away; say so rather than lose it quietly.
      MLOG(ERROR) << "update to site '" << channel.name
                  << "' not queued: " << status;
      return;
    }
    channel.bytes += bytes;
    channel.period_bytes += bytes;
  }

  // Takes what passes `theta` out of accumulator `acc` and encodes it, one
  // slice per tensor; lossy residuals go back into the accumulator.
  Encoded TakeAndEncode(size_t acc, double theta, UpdateEncoder& encoder) {
    indices_.clear();
    values_.clear();
    const pb::ThresholdMode mode = sync_.threshold_mode();
    store_->VisitAccumulator(
        acc, [&](const KeyRange& range, std::span<const float> w,
                 std::span<float> a) {
          TakeSignificant(a, w, theta, mode, range.begin, &indices_, &values_);
        });
    return EncodeEntries(acc, encoder);
  }

  // Encodes (indices_, values_) per tensor; residuals to accumulator `acc`.
  Encoded EncodeEntries(size_t acc, UpdateEncoder& encoder) {
    Encoded encoded;
    encoded.entries = indices_.size();
    residual_indices_.clear();
    residual_values_.clear();
    size_t next = 0;
    for (const TensorInfo& tensor : store_->layout().tensors()) {
      const uint64_t end = tensor.offset + tensor.size;
      local_indices_.clear();
      local_values_.clear();
      const size_t first = next;
      while (next < indices_.size() && indices_[next] < end) {
        local_indices_.push_back(
            static_cast<uint32_t>(indices_[next] - tensor.offset));
        local_values_.push_back(values_[next]);
        ++next;
      }
      if (local_indices_.empty()) continue;
      residual_.assign(local_values_.size(), 0.0f);
      Result<EncodedUpdate> result = encoder.EncodeSparse(
          tensor.size, local_indices_, local_values_, residual_);
      if (!result.ok()) {
        // Cannot happen for finite values; keep the change rather than
        // lose it.
        MLOG(ERROR) << "cannot encode the update of '" << tensor.name
                    << "': " << result.status() << "; kept for later";
        for (size_t j = 0; j < local_values_.size(); ++j) {
          residual_indices_.push_back(indices_[first + j]);
          residual_values_.push_back(local_values_[j]);
        }
        continue;
      }
      for (size_t j = 0; j < residual_.size(); ++j) {
        if (residual_[j] != 0.0f) {
          residual_indices_.push_back(indices_[first + j]);
          residual_values_.push_back(residual_[j]);
        }
      }
      pb::TensorSlice slice;
      slice.set_tensor(tensor.name);
      slice.set_offset(0);
      slice.set_length(tensor.size);
      slice.set_dtype(pb::DTYPE_FLOAT32);
      slice.set_codec(pb::CODEC_PIPELINE);
      slice.set_payload_bytes(result->bytes.size());
      encoded.slices.push_back(slice);
      encoded.frames.emplace_back(result->bytes.data(), result->bytes.size());
      encoded.bytes += result->bytes.size();
    }
    if (!residual_indices_.empty()) {
      store_->AddToAccumulator(acc, residual_indices_, residual_values_);
    }
    return encoded;
  }

  // Sends `update` to `targets` as a MIRROR_UPDATE (or MIRROR_INDICES).
  void SendUpdate(const Encoded& update, pb::MessageType type,
                  const std::string& origin, bool average,
                  const std::vector<Channel*>& targets) {
    if (update.empty()) return;
    for (Channel* channel : targets) {
      if (channel->final_sent) continue;
      pb::Header header = MakeHeader(type, self_, ++channel->sequence);
      header.set_clock(channel->announced + 1);
      for (const pb::TensorSlice& slice : update.slices) {
        *header.add_slices() = slice;
      }
      pb::MirrorUpdate* body = header.mutable_mirror_update();
      body->set_origin_site(origin);
      body->set_entries(update.entries);
      body->set_average(average);
      std::vector<zmq::message_t> frames;
      for (const zmq::message_t& frame : update.frames) {
        frames.emplace_back(frame.data(), frame.size());
      }
      Send(*channel, header, std::move(frames));
      if (type == pb::MIRROR_UPDATE) {
        ++updates_sent_;
        entries_sent_ += update.entries;
      }
    }
  }

  void SendLocalChanges(double theta) {
    ObserveBandwidth();
    switch (role_.kind) {
      case SyncRole::Kind::kMesh:
      case SyncRole::Kind::kMember: {
        const Encoded update = TakeAndEncode(main_acc_, theta, *encoder_);
        SendWithBarrier(update, AllChannels());
        break;
      }
      case SyncRole::Kind::kHub: {
        // Members get their sums when their channel's clock advances
        // (AnnounceClocks), which may wait for the slowest site.
        const Encoded to_hubs = TakeAndEncode(out_acc_, theta, *encoder_);
        SendWithBarrier(to_hubs, ChannelsOf(role_.hubs));
        break;
      }
    }
  }

  void SendWithBarrier(const Encoded& update,
                       const std::vector<Channel*>& targets) {
    if (update.empty()) return;
    if (sync_.selective_barrier_fraction() > 0 &&
        static_cast<double>(update.entries) >
            sync_.selective_barrier_fraction() *
                static_cast<double>(store_->num_elements())) {
      SendUpdate(IndicesOnly(update), pb::MIRROR_INDICES, name_, false,
                 targets);
    }
    SendUpdate(update, pb::MIRROR_UPDATE, name_, false, targets);
  }

  // The same slices with every value zero (MIRROR_INDICES).
  Encoded IndicesOnly(const Encoded& update) {
    Encoded indices;
    indices.entries = update.entries;
    for (size_t i = 0; i < update.slices.size(); ++i) {
      const pb::TensorSlice& slice = update.slices[i];
      SparseUpdate sparse;
      if (!decoder_
               .DecodeSparse(BytesOf(update.frames[i]), slice.length(), &sparse)
               .ok()) {
        continue;
      }
      std::fill(sparse.values.begin(), sparse.values.end(), 0.0f);
      Result<EncodedUpdate> result = index_encoder_->EncodeSparse(
          sparse.size, sparse.indices, sparse.values, {});
      if (!result.ok()) continue;
      pb::TensorSlice copy = slice;
      copy.set_payload_bytes(result->bytes.size());
      indices.slices.push_back(copy);
      indices.frames.emplace_back(result->bytes.data(), result->bytes.size());
    }
    return indices;
  }

  void SendModelForAveraging(int64_t clock) {
    // The whole model, losslessly, for this round's average.
    std::vector<float> model(store_->num_elements());
    store_->Snapshot(model);
    indices_.clear();
    values_.clear();
    for (uint64_t i = 0; i < model.size(); ++i) {
      indices_.push_back(i);
      values_.push_back(model[i]);
    }
    const Encoded encoded = EncodeEntries(main_acc_, *lossless_);
    // The accumulator is not used by averaging: keep it empty.
    store_->VisitAccumulator(
        main_acc_,
        [](const KeyRange&, std::span<const float>, std::span<float> a) {
          std::fill(a.begin(), a.end(), 0.0f);
        });
    SendUpdate(encoded, pb::MIRROR_UPDATE, name_, /*average=*/true,
               AllChannels());
    averaging_round_open_ = true;
    averaging_clock_ = clock;
  }

  // Sends clock announcements that became due on each channel. A hub
  // first sends a member what of its sum is significant, so the clock
  // still follows the updates it covers.
  void AnnounceClocks() {
    for (Channel& channel : channels_) {
      const int64_t due = DueClock(channel);
      if (channel.announced >= due || channel.final_sent) continue;
      if (auto acc = member_acc_.find(channel.site); acc != member_acc_.end()) {
        const Encoded update =
            TakeAndEncode(acc->second, Theta(local_clock_), *encoder_);
        SendWithBarrier(update, {&channel});
      }
      while (channel.announced < due && !channel.final_sent) {
        ++channel.announced;
        pb::Header header =
            MakeHeader(pb::MIRROR_CLOCK, self_, ++channel.sequence);
        header.set_clock(channel.announced);
        header.mutable_mirror_clock()->set_clock(channel.announced);
        header.mutable_mirror_clock()->set_relayed(role_.kind ==
                                                   SyncRole::Kind::kHub);
        Send(channel, header, {});
      }
    }
  }

  // The clock a channel should have announced by now: the local clock for
  // a mesh node or member; for a hub, the slowest of its group towards
  // other hubs, and the slowest of everyone towards its members.
  int64_t DueClock(const Channel& channel) const {
    if (role_.kind != SyncRole::Kind::kHub) return local_clock_;
    int64_t group = local_clock_;
    for (int member : role_.members) {
      group = std::min(group,
                       clocks_.ClockOf(job_.site(member).name()).value_or(0));
    }
    if (std::find(role_.hubs.begin(), role_.hubs.end(), channel.site) !=
        role_.hubs.end()) {
      return group;
    }
    int64_t global = group;
    for (int hub : role_.hubs) {
      global =
          std::min(global, clocks_.ClockOf(job_.site(hub).name()).value_or(0));
    }
    return global;
  }

  // Lossless flush of accumulator `acc` to `targets` (theta = 0).
  void FlushTo(size_t acc, const std::vector<Channel*>& targets) {
    const Encoded update = TakeAndEncode(acc, 0.0, *lossless_);
    SendUpdate(update, pb::MIRROR_UPDATE, name_, false, targets);
  }

  void SendFinal(const std::vector<Channel*>& targets) {
    for (Channel* channel : targets) {
      if (channel->final_sent) continue;
      ++channel->announced;
      pb::Header header =
          MakeHeader(pb::MIRROR_CLOCK, self_, ++channel->sequence);
      header.set_clock(channel->announced);
      header.mutable_mirror_clock()->set_clock(channel->announced);
      header.mutable_mirror_clock()->set_final(true);
      Send(*channel, header, {});
      channel->final_sent = true;
    }
  }

  // ---- receiving ----------------------------------------------------------
  void PollOnce() {
    std::vector<zmq::pollitem_t> items;
    AddPollItems(&items);
    try {
      zmq::poll(items.data(), items.size(), kFinishPoll);
    } catch (const zmq::error_t& error) {
      if (error.num() != EINTR) MLOG(WARNING) << "poll: " << error.what();
      return;
    }
    HandleReadable(items);
  }

  void DrainMirror() {
    while (true) {
      Result<Received> received =
          ReceiveMessage(mirror_, true, std::chrono::milliseconds(0));
      if (!received.ok() || received->timed_out()) return;
      if (received->refused) {
        Refuse(received->refused->routing_id, received->refused->header,
               received->refused->rejection);
        continue;
      }
      HandleMirror(*received->message);
    }
  }

  // Replies on our outgoing channels are errors about what we sent.
  void DrainChannel(Channel& channel) {
    while (true) {
      Result<Received> received =
          ReceiveMessage(*channel.socket, false, std::chrono::milliseconds(0));
      if (!received.ok() || received->timed_out()) return;
      if (received->message && received->message->header.type() == pb::ERROR) {
        MLOG(ERROR) << "site '" << channel.name << "' refused our "
                    << "message: "
                    << pb::ErrorCode_Name(
                           received->message->header.error().code())
                    << ": " << received->message->header.error().message();
      }
    }
  }

  void Refuse(const std::string& routing_id, const pb::Header& header,
              const Rejection& rejection) {
    ++rejected_;
    MLOG(ERROR) << "rejected " << DescribeHeader(header) << ": "
                << pb::ErrorCode_Name(rejection.code) << ": "
                << rejection.reason;
    if (Status status = SendError(mirror_, self_, ++error_sequence_, rejection,
                                  header.sequence(), routing_id);
        !status.ok()) {
      MLOG(WARNING) << "cannot send the error reply: " << status;
    }
  }

  void HandleMirror(Envelope& message) {
    const pb::Header& header = message.header;
    const std::string& site = header.sender().site();
    auto it = incoming_.find(site);
    if (header.sender().role() != pb::ROLE_SITE_SERVER ||
        it == incoming_.end()) {
      return Refuse(message.routing_id, header,
                    {pb::ERROR_UNKNOWN_SENDER,
                     "'" + site + "' is not a site that '" + name_ +
                         "' syncs with (its peers: " + PeerList() + ")"});
    }
    if (curve_ && message.user_id != site) {
      // Any listed key is admitted; a peer may speak only for its own site.
      return Refuse(message.routing_id, header,
                    {pb::ERROR_UNKNOWN_SENDER,
                     "a connection authenticated as site '" + message.user_id +
                         "' sent a message as site '" + site + "'"});
    }
    Incoming& in = it->second;
    in.bytes += header.ByteSizeLong();
    for (const zmq::message_t& frame : message.payload) {
      in.bytes += frame.size();
    }
    ++in.messages;
    if (header.type() == pb::MIRROR_HELLO) {
      Result<ModelLayout> layout =
          ModelLayout::FromSpecs(header.mirror_hello().layout());
      if (!layout.ok() || !(*layout == store_->layout())) {
        return Refuse(
            message.routing_id, header,
            {pb::ERROR_LAYOUT_MISMATCH,
             "site '" + site + "' has model [" +
                 (layout.ok() ? layout->DebugString()
                              : layout.status().message()) +
                 "], this site [" + store_->layout().DebugString() + "]"});
      }
      in.hello = true;
      in.routing_id = message.routing_id;
      MLOG(INFO) << "site '" << site << "' connected";
      return;
    }
    if (!in.hello || in.routing_id != message.routing_id) {
      return Refuse(message.routing_id, header,
                    {pb::ERROR_UNKNOWN_SENDER,
                     "site '" + site +
                         "' must introduce itself (MIRROR_HELLO) on this "
                         "connection first"});
    }
    if (in.final) {
      return Refuse(message.routing_id, header,
                    {pb::ERROR_UNEXPECTED,
                     "site '" + site + "' already sent its final flush"});
    }
    switch (header.type()) {
      case pb::MIRROR_CLOCK:
        return HandleClock(message, in);
      case pb::MIRROR_UPDATE:
      case pb::MIRROR_INDICES:
        return HandleUpdate(message);
      default:
        return Refuse(
            message.routing_id, header,
            {pb::ERROR_UNEXPECTED, pb::MessageType_Name(header.type()) +
                                       " is not served on the mirror socket"});
    }
  }

  void HandleClock(const Envelope& message, Incoming& in) {
    const pb::Header& header = message.header;
    const std::string& site = header.sender().site();
    if (Status status = clocks_.Advance(site, header.mirror_clock().clock());
        !status.ok()) {
      return Refuse(message.routing_id, header,
                    {pb::ERROR_STALE, status.message()});
    }
    if (header.mirror_clock().final()) {
      in.final = true;
      if (!finishing_ && finished_peer_.empty()) finished_peer_ = site;
    }
    // A hub's announcements depend on what it hears.
    if (role_.kind == SyncRole::Kind::kHub) AnnounceClocks();
    MaybeAverage();
  }

  void HandleUpdate(Envelope& message) {
    const pb::Header& header = message.header;
    const std::string& site = header.sender().site();
    const int64_t expected = clocks_.ClockOf(site).value_or(0) + 1;
    if (header.clock() != expected) {
      return Refuse(
          message.routing_id, header,
          {pb::ERROR_STALE,
           "update tagged with clock " + std::to_string(header.clock()) +
               " from '" + site + "', expected " + std::to_string(expected) +
               " (updates of a clock come before it)"});
    }
    if (Verdict verdict = CheckSlicesAgainstLayout(header, store_->layout(),
                                                   /*whole_model=*/false)) {
      return Refuse(message.routing_id, header, *verdict);
    }
    if (Verdict verdict = CheckCodec(header, pb::CODEC_PIPELINE)) {
      return Refuse(message.routing_id, header, *verdict);
    }
    // Decode everything before touching the model: a bad slice leaves it
    // untouched.
    received_indices_.clear();
    received_values_.clear();
    for (int i = 0; i < header.slices_size(); ++i) {
      const pb::TensorSlice& slice = header.slices(i);
      const TensorInfo* tensor = store_->layout().Find(slice.tensor());
      SparseUpdate& sparse = sparse_;
      Status decoded = decoder_.DecodeSparse(BytesOf(message.payload[i]),
                                             slice.length(), &sparse);
      if (decoded.ok() && sparse.size != slice.length()) {
        decoded = InvalidArgumentError(
            "encoded slice has " + std::to_string(sparse.size) +
            " elements, the header says " + std::to_string(slice.length()));
      }
      if (!decoded.ok()) {
        return Refuse(message.routing_id, header,
                      {pb::ERROR_MALFORMED, "slice " + std::to_string(i) +
                                                " ('" + slice.tensor() +
                                                "'): " + decoded.message()});
      }
      const uint64_t base = tensor->offset + slice.offset();
      for (size_t j = 0; j < sparse.indices.size(); ++j) {
        received_indices_.push_back(base + sparse.indices[j]);
        received_values_.push_back(sparse.values[j]);
      }
    }
    if (!std::is_sorted(received_indices_.begin(), received_indices_.end()) ||
        std::adjacent_find(received_indices_.begin(),
                           received_indices_.end()) !=
            received_indices_.end()) {
      return Refuse(
          message.routing_id, header,
          {pb::ERROR_MALFORMED, "slices overlap or are out of order"});
    }
    if (header.type() == pb::MIRROR_INDICES) {
      blocked_.Block(site, header.clock(), received_indices_);
      return;
    }
    const pb::MirrorUpdate& body = header.mirror_update();
    if (body.average()) {
      AddToAveragingRound(header.clock(), site);
      return;
    }
    // A hub passes a member's changes on to the other hubs (through its
    // out accumulator) and every change to each member it did not come
    // from (through that member's accumulator).
    std::vector<size_t> accumulate;
    if (role_.kind == SyncRole::Kind::kHub) {
      if (IsMember(site)) accumulate.push_back(out_acc_);
      for (const auto& [member, acc] : member_acc_) {
        if (job_.site(member).name() != site) accumulate.push_back(acc);
      }
    }
    store_->ApplyExternalSparse(received_indices_, received_values_,
                                accumulate);
    ++updates_received_;
    entries_received_ += received_indices_.size();
    blocked_.Release(site, header.clock());
  }

  void AddToAveragingRound(int64_t clock, const std::string& site) {
    std::vector<float>& sum = rounds_[clock];
    if (sum.empty()) sum.assign(store_->num_elements(), 0.0f);
    for (size_t j = 0; j < received_indices_.size(); ++j) {
      sum[received_indices_[j]] += received_values_[j];
    }
    round_sites_[clock].push_back(site);
    ++updates_received_;
    entries_received_ += received_indices_.size();
    MaybeAverage();
  }

  // Averages once this site has reached the round's clock and every peer's
  // model of that round arrived.
  void MaybeAverage() {
    if (!averaging_round_open_) return;
    auto it = rounds_.find(averaging_clock_);
    if (it == rounds_.end() ||
        round_sites_[averaging_clock_].size() < channels_.size()) {
      return;
    }
    store_->AverageWith(it->second, static_cast<uint32_t>(channels_.size()));
    rounds_.erase(it);
    round_sites_.erase(averaging_clock_);
    averaging_round_open_ = false;
  }

  SyncEngineOptions options_;
  const pb::JobConfig& job_;
  const pb::SyncConfig& sync_;
  const int site_index_;
  const std::string name_;
  ParameterStore* store_;
  Clock* clock_;
  const SyncRole role_;
  ThresholdSchedule schedule_;
  MirrorClocks clocks_;
  BlockedKeys blocked_;
  pb::Endpoint self_;

  // CURVE (security.curve): this site's keys and its peers' public keys,
  // and the ZAP handler of the context that admits only those peers. The
  // handler is declared before mirror_ so that it outlives the socket.
  std::optional<SiteCurveKeys> curve_;
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t mirror_;
  std::string mirror_endpoint_;
  std::vector<Channel> channels_;
  std::map<std::string, Incoming> incoming_;
  uint64_t error_sequence_ = 0;

  std::optional<UpdateEncoder> encoder_;
  std::optional<UpdateEncoder> lossless_;
  std::optional<UpdateEncoder> index_encoder_;
  UpdateDecoder decoder_;
  size_t main_acc_ = 0;
  size_t out_acc_ = 0;
  std::map<int, size_t> member_acc_;  // hub: site index -> accumulator

  int64_t local_clock_ = 0;
  double last_theta_ = 0;
  bool finishing_ = false;
  bool flushed_ = false;
  std::string finished_peer_;

  bool averaging_round_open_ = false;
  int64_t averaging_clock_ = 0;
  std::map<int64_t, std::vector<float>> rounds_;
  std::map<int64_t, std::vector<std::string>> round_sites_;

  // Counters.
  uint64_t updates_sent_ = 0;
  uint64_t entries_sent_ = 0;
  uint64_t updates_received_ = 0;
  uint64_t entries_received_ = 0;
  uint64_t rejected_ = 0;
  double blocked_s_ = 0;

  // Scratch, reused across clocks.
  std::vector<uint64_t> indices_;
  std::vector<float> values_;
  std::vector<uint32_t> local_indices_;
  std::vector<float> local_values_;
  std::vector<float> residual_;
  std::vector<uint64_t> residual_indices_;
  std::vector<float> residual_values_;
  std::vector<uint64_t> received_indices_;
  std::vector<float> received_values_;
  SparseUpdate sparse_;
};

Result<std::unique_ptr<SyncEngine>> SyncEngine::Create(
    SyncEngineOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  MERIDIAN_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<SyncEngine>(new SyncEngine(std::move(impl)));
}

SyncEngine::SyncEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SyncEngine::~SyncEngine() = default;

const std::string& SyncEngine::mirror_endpoint() const {
  return impl_->mirror_endpoint();
}
std::vector<std::string> SyncEngine::peers() const { return impl_->peers(); }
std::vector<std::string> SyncEngine::silent_peers() const {
  return impl_->silent_peers();
}
Status SyncEngine::SetPeerEndpoints(
    const std::map<std::string, std::string>& endpoints) {
  return impl_->SetPeerEndpoints(endpoints);
}
Status SyncEngine::Connect() { return impl_->Connect(); }
void SyncEngine::AddPollItems(std::vector<zmq::pollitem_t>* items) {
  impl_->AddPollItems(items);
}
void SyncEngine::HandleReadable(std::span<const zmq::pollitem_t> items) {
  impl_->HandleReadable(items);
}
void SyncEngine::OnLocalClock(int64_t clock) { impl_->OnLocalClock(clock); }
bool SyncEngine::ReadsAllowed(int64_t local_clock,
                              std::span<const KeyRange> ranges) const {
  return impl_->ReadsAllowed(local_clock, ranges);
}
void SyncEngine::NoteHeld(double seconds) { impl_->NoteHeld(seconds); }
bool SyncEngine::peer_finished() const { return impl_->peer_finished(); }
const std::string& SyncEngine::finished_peer() const {
  return impl_->finished_peer();
}
bool SyncEngine::Finish(double timeout_s) { return impl_->Finish(timeout_s); }
double SyncEngine::theta() const { return impl_->theta(); }
uint64_t SyncEngine::bytes_sent() const { return impl_->bytes_sent(); }
int64_t SyncEngine::slowest_peer_clock() const {
  return impl_->slowest_peer_clock();
}
pb::SyncSummary SyncEngine::Summary() const { return impl_->Summary(); }
std::vector<SyncEngine::PeerCounters> SyncEngine::peer_counters() const {
  return impl_->peer_counters();
}

}  // namespace meridian
