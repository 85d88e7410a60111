#include "testing/mirror_messages.h"

#include <chrono>

#include "meridian/compression/compression.h"
#include "meridian/net/message.h"
#include "meridian/net/transport.h"

namespace meridian::testing {

Status MakeBiasUpdate(const ModelLayout& layout, int64_t clock,
                      const std::string& origin, float value,
                      pb::Header* header, std::vector<zmq::message_t>* frames) {
  const TensorInfo* bias = layout.Find("fc0.bias");
  if (bias == nullptr) return NotFoundError("the layout has no fc0.bias");
  pb::CompressionConfig config;
  config.set_value_coding(pb::VALUE_FP32);
  MERIDIAN_ASSIGN_OR_RETURN(UpdateEncoder encoder,
                            UpdateEncoder::Create(config));
  const std::vector<uint32_t> indices = {0, 1, 2};
  const std::vector<float> values(3, value);
  MERIDIAN_ASSIGN_OR_RETURN(
      EncodedUpdate encoded,
      encoder.EncodeSparse(bias->size, indices, values, {}));
  header->set_type(pb::MIRROR_UPDATE);
  header->set_clock(clock);
  header->mutable_mirror_update()->set_origin_site(origin);
  header->mutable_mirror_update()->set_entries(3);
  pb::TensorSlice* slice = header->add_slices();
  slice->set_tensor("fc0.bias");
  slice->set_offset(0);
  slice->set_length(bias->size);
  slice->set_codec(pb::CODEC_PIPELINE);
  slice->set_payload_bytes(encoded.bytes.size());
  frames->emplace_back(encoded.bytes.data(), encoded.bytes.size());
  return Status::Ok();
}

AckingPeer::AckingPeer(zmq::socket_t* socket, std::string site,
                       bool says_flushed)
    : socket_(socket), site_(std::move(site)), says_flushed_(says_flushed) {
  thread_ = std::thread([this] { Serve(); });
}

AckingPeer::~AckingPeer() {
  stop_ = true;
  thread_.join();
}

std::optional<pb::Header> AckingPeer::first() const {
  MutexLock lock(&mu_);
  return first_;
}

void AckingPeer::Serve() {
  pb::Endpoint self;
  self.set_site(site_);
  self.set_role(pb::ROLE_SITE_SERVER);
  uint64_t incarnation = 0;
  uint64_t applied = 0;
  bool final_received = false;
  while (!stop_) {
    Result<Received> received =
        ReceiveMessage(*socket_, true, std::chrono::milliseconds(20));
    if (!received.ok() || !received->message) continue;
    const pb::Header& header = received->message->header;
    {
      MutexLock lock(&mu_);
      if (!first_) first_ = header;
    }
    if (header.type() == pb::MIRROR_HELLO) {
      incarnation = header.mirror_hello().incarnation();
      continue;
    }
    if (header.sequence() == 0) {  // a heartbeat
      if (!final_received) continue;
      ++heartbeats_after_final_;
      if (!says_flushed_) continue;
    } else {
      applied = header.sequence();
      if (header.type() == pb::MIRROR_CLOCK && header.mirror_clock().final()) {
        final_received = true;
      }
    }
    pb::Header ack = MakeHeader(pb::MIRROR_ACK, self, 0);
    ack.mutable_mirror_ack()->set_applied_sequence(applied);
    ack.mutable_mirror_ack()->set_durable_sequence(applied);
    ack.mutable_mirror_ack()->set_incarnation(incarnation);
    ack.mutable_mirror_ack()->set_flushed(final_received && says_flushed_);
    (void)SendMessage(*socket_, ack, {}, received->message->routing_id);
  }
}

}  // namespace meridian::testing
