// libFuzzer target for the WAN emulator's control-request decoder
// (DecodeControlRequest / ValidateControlRequest in wan/control_codec.cc)
// and the unit and address parsers it relies on (wan/units.cc,
// wan/model.cc). Requests come from the network (the control endpoint).
//
// The whole input is decoded as a request. Besides "no crash, no leak", it
// checks what an accepted request promises:
//  - exactly one command, the current protocol version;
//  - re-encoding and decoding it again gives an accepted, equal request;
//  - a `set` change applies to a model and yields values in range;
//  - add_route addresses parse.
// The input is also fed, as text, to every unit parser: accepted values
// must be in their documented ranges and survive Format -> Parse.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "meridian/wan_control.pb.h"
#include "meridian/wan/control.h"
#include "meridian/wan/link_model.h"
#include "wan/host_port.h"
#include "meridian/wan/units.h"

namespace {

namespace pb = meridian::pb;
namespace wan = meridian::wan;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "wan_control_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void Require(bool condition, const char* what) {
  if (!condition) Fail(what);
}

void CheckModel(const wan::DirectionModel& m) {
  Require(m.bandwidth_bps == 0 ||
              (m.bandwidth_bps >= 1e3 && m.bandwidth_bps <= 1e12),
          "bandwidth in range");
  Require(m.latency >= meridian::Duration::zero() &&
              m.latency <= std::chrono::seconds(60),
          "latency in range");
  Require(m.jitter >= meridian::Duration::zero() &&
              m.jitter <= std::chrono::seconds(60),
          "jitter in range");
  Require(m.queue_limit_bytes == 0 || m.queue_limit_bytes >= 1024,
          "queue limit in range");
  Require(wan::EffectiveQueueLimit(m) >= 1024, "effective queue limit");
  Require(wan::ChunkBytes(m, 256 * 1024) >= 64, "chunk size");
}

void CheckUnits(std::string_view text) {
  if (auto bps = wan::ParseBandwidth(text); bps.ok()) {
    Require(*bps == 0 || (*bps >= 1e3 && *bps <= 1e12), "ParseBandwidth range");
    auto again = wan::ParseBandwidth(wan::FormatBandwidth(*bps));
    Require(again.ok(), "FormatBandwidth parses");
    Require(std::fabs(*again - *bps) <= 1e-5 * std::max(1.0, *bps),
            "FormatBandwidth round trip");
  }
  if (auto d = wan::ParseDuration(text); d.ok()) {
    Require(*d >= meridian::Duration::zero() && *d <= std::chrono::seconds(60),
            "ParseDuration range");
    Require(wan::ParseDuration(wan::FormatDuration(*d)).ok(),
            "FormatDuration parses");
  }
  if (auto b = wan::ParseByteSize(text); b.ok()) {
    Require(*b >= 1 && *b <= (64ull << 30), "ParseByteSize range");
  }
  if (auto a = wan::ParseHostPort(text, true); a.ok()) {
    Require(!a->host.empty(), "host");
    auto again = wan::ParseHostPort(a->ToString(), true);
    Require(again.ok() && again->port == a->port && again->host == a->host,
            "HostPort round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CheckUnits(std::string_view(reinterpret_cast<const char*>(data), size));

  auto decoded = wan::DecodeControlRequest({data, size});
  if (!decoded.ok()) {
    Require(!decoded.status().message().empty(), "errors say why");
    return 0;
  }
  const pb::WanControlRequest& request = *decoded;
  Require(request.protocol_version() == wan::kWanControlProtocolVersion,
          "version");
  Require(request.command_case() != pb::WanControlRequest::COMMAND_NOT_SET,
          "a command");
  Require(wan::ValidateControlRequest(request).ok(), "decoded is valid");

  const std::string bytes = request.SerializeAsString();
  auto again = wan::DecodeControlRequest(
      {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
  Require(again.ok(), "re-encoded request decodes");
  Require(again->SerializeAsString() == bytes, "round trip");

  switch (request.command_case()) {
    case pb::WanControlRequest::kSet: {
      wan::DirectionModel model;
      Require(wan::ApplyDirectionConfig(request.set().change(), "set.change",
                                        &model)
                  .ok(),
              "a valid change applies");
      CheckModel(model);
      Require(!request.set().link().empty(), "set names a link");
      break;
    }
    case pb::WanControlRequest::kAddRoute:
      Require(wan::ParseHostPort(request.add_route().listen(), true).ok(),
              "listen parses");
      Require(wan::ParseHostPort(request.add_route().forward(), false).ok(),
              "forward parses");
      break;
    case pb::WanControlRequest::kPartition:
      Require(!request.partition().link().empty(), "partition names a link");
      break;
    case pb::WanControlRequest::kHeal:
      Require(!request.heal().link().empty(), "heal names a link");
      break;
    default:
      break;
  }
  return 0;
}
