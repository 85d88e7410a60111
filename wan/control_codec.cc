// The pure half of the control protocol: decoding, validation and request
// builders. No ZeroMQ, no emulator (this file is fuzzed).
#include <string>

#include "meridian/wan/control.h"
#include "meridian/wan/link_model.h"
#include "wan/host_port.h"

namespace meridian::wan {
namespace {

constexpr size_t kMaxNameBytes = 256;

Status CheckName(const std::string& value, const std::string& field) {
  if (value.empty()) return InvalidArgumentError(field + ": required");
  if (value.size() > kMaxNameBytes) {
    return InvalidArgumentError(field + ": longer than 256 bytes");
  }
  return Status::Ok();
}

Status CheckChange(const pb::LinkDirectionConfig& change,
                   const std::string& field) {
  if (!change.has_bandwidth() && !change.has_latency() &&
      !change.has_jitter() && !change.has_jitter_distribution() &&
      !change.has_queue_limit()) {
    return InvalidArgumentError(field +
                                ": nothing to change (set bandwidth, latency, "
                                "jitter, jitter_distribution or queue_limit)");
  }
  DirectionModel scratch;
  return ApplyDirectionConfig(change, field, &scratch);
}

}  // namespace

Result<pb::WanControlRequest> DecodeControlRequest(
    std::span<const uint8_t> bytes) {
  pb::WanControlRequest request;
  if (bytes.size() > (1 << 20)) {
    return InvalidArgumentError("control request larger than 1 MiB");
  }
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return InvalidArgumentError("not a WanControlRequest (" +
                                std::to_string(bytes.size()) + " bytes)");
  }
  MERIDIAN_RETURN_IF_ERROR(ValidateControlRequest(request));
  return request;
}

Status ValidateControlRequest(const pb::WanControlRequest& request) {
  if (request.protocol_version() != kWanControlProtocolVersion) {
    return InvalidArgumentError(
        "protocol_version: " + std::to_string(request.protocol_version()) +
        " is not supported; this wanem speaks " +
        std::to_string(kWanControlProtocolVersion));
  }
  switch (request.command_case()) {
    case pb::WanControlRequest::kSet: {
      const pb::WanSetLink& set = request.set();
      MERIDIAN_RETURN_IF_ERROR(CheckName(set.link(), "set.link"));
      switch (set.direction()) {
        case pb::A_TO_B:
        case pb::B_TO_A:
        case pb::BOTH:
          break;
        default:
          return InvalidArgumentError(
              "set.direction: must be A_TO_B, B_TO_A or BOTH");
      }
      return CheckChange(set.change(), "set.change");
    }
    case pb::WanControlRequest::kPartition:
      return CheckName(request.partition().link(), "partition.link");
    case pb::WanControlRequest::kHeal:
      return CheckName(request.heal().link(), "heal.link");
    case pb::WanControlRequest::kReset:
      return CheckName(request.reset().link(), "reset.link");
    case pb::WanControlRequest::kAddRoute: {
      const pb::WanAddRoute& route = request.add_route();
      MERIDIAN_RETURN_IF_ERROR(CheckName(route.link(), "add_route.link"));
      MERIDIAN_RETURN_IF_ERROR(
          CheckName(route.from_site(), "add_route.from_site"));
      Result<HostPort> listen = ParseHostPort(route.listen(), true);
      if (!listen.ok()) return listen.status().WithContext("add_route.listen");
      Result<HostPort> forward = ParseHostPort(route.forward(), false);
      if (!forward.ok()) {
        return forward.status().WithContext("add_route.forward");
      }
      return Status::Ok();
    }
    case pb::WanControlRequest::kStatus:
      return Status::Ok();
    case pb::WanControlRequest::COMMAND_NOT_SET:
      break;
  }
  return InvalidArgumentError(
      "no command: set one of set, partition, heal, add_route, status");
}

pb::WanControlRequest MakeStatusRequest() {
  pb::WanControlRequest request;
  request.set_protocol_version(kWanControlProtocolVersion);
  request.mutable_status();
  return request;
}

pb::WanControlRequest MakePartitionRequest(std::string_view link) {
  pb::WanControlRequest request;
  request.set_protocol_version(kWanControlProtocolVersion);
  request.mutable_partition()->set_link(std::string(link));
  return request;
}

pb::WanControlRequest MakeHealRequest(std::string_view link) {
  pb::WanControlRequest request;
  request.set_protocol_version(kWanControlProtocolVersion);
  request.mutable_heal()->set_link(std::string(link));
  return request;
}

pb::WanControlRequest MakeResetRequest(std::string_view link) {
  pb::WanControlRequest request;
  request.set_protocol_version(kWanControlProtocolVersion);
  request.mutable_reset()->set_link(std::string(link));
  return request;
}

pb::WanControlRequest MakeAddRouteRequest(std::string_view link,
                                          std::string_view from_site,
                                          std::string_view listen,
                                          std::string_view forward) {
  pb::WanControlRequest request;
  request.set_protocol_version(kWanControlProtocolVersion);
  pb::WanAddRoute* route = request.mutable_add_route();
  route->set_link(std::string(link));
  route->set_from_site(std::string(from_site));
  route->set_listen(std::string(listen));
  route->set_forward(std::string(forward));
  return request;
}

Result<pb::WanControlRequest> MakeSetRequest(
    std::string_view link, std::string_view direction,
    std::string_view bandwidth, std::string_view latency,
    std::string_view jitter, std::string_view jitter_distribution,
    std::string_view queue_limit) {
  pb::WanControlRequest request;
  request.set_protocol_version(kWanControlProtocolVersion);
  pb::WanSetLink* set = request.mutable_set();
  set->set_link(std::string(link));
  if (direction.empty() || direction == "both") {
    set->set_direction(pb::BOTH);
  } else if (direction == "a-to-b") {
    set->set_direction(pb::A_TO_B);
  } else if (direction == "b-to-a") {
    set->set_direction(pb::B_TO_A);
  } else {
    return InvalidArgumentError("--direction '" + std::string(direction) +
                                "': use a-to-b, b-to-a or both");
  }
  pb::LinkDirectionConfig* change = set->mutable_change();
  if (!bandwidth.empty()) change->set_bandwidth(std::string(bandwidth));
  if (!latency.empty()) change->set_latency(std::string(latency));
  if (!jitter.empty()) change->set_jitter(std::string(jitter));
  if (jitter_distribution == "uniform") {
    change->set_jitter_distribution(pb::JITTER_UNIFORM);
  } else if (jitter_distribution == "normal") {
    change->set_jitter_distribution(pb::JITTER_NORMAL);
  } else if (!jitter_distribution.empty()) {
    return InvalidArgumentError("--jitter-distribution '" +
                                std::string(jitter_distribution) +
                                "': use uniform or normal");
  }
  if (!queue_limit.empty()) change->set_queue_limit(std::string(queue_limit));
  MERIDIAN_RETURN_IF_ERROR(ValidateControlRequest(request));
  return request;
}

}  // namespace meridian::wan
