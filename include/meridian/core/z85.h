// Z85 text of CURVE keys (rfc.zeromq.org/spec/32), checked without ZeroMQ:
// the job-file validation (config) and the CURVE set-up (net) share this
// one check, and config may not depend on net. Pure functions, thread-safe.
#ifndef MERIDIAN_CORE_Z85_H_
#define MERIDIAN_CORE_Z85_H_

#include <cstddef>
#include <string_view>

namespace meridian {

// Length of a Z85-encoded 32-byte CURVE key.
inline constexpr size_t kCurveKeyZ85Length = 40;

// Whether `key` is 40 characters of the Z85 alphabet that decode to 32
// bytes (every 5-character group at most 2^32 - 1): exactly what
// zmq_z85_decode accepts for a CURVE key.
bool IsZ85Key(std::string_view key);

}  // namespace meridian

#endif  // MERIDIAN_CORE_Z85_H_
