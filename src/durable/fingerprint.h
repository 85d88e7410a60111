// Which job and site a durable file belongs to. Every checkpoint file and
// every log segment carries a fingerprint; loading a file of another job or
// site is refused, never silently used.
#ifndef MERIDIAN_DURABLE_FINGERPRINT_H_
#define MERIDIAN_DURABLE_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "meridian/core/status.h"

namespace meridian {

// Bound of a fingerprint (bytes). It keeps error messages, which quote
// fingerprints, readable.
inline constexpr size_t kMaxFingerprintBytes = 4096;

// A readable fingerprint: "job 'x' site 'us' seed 7 layout 3f2a9c" (the
// layout digest is whatever identifies the model's tensors and shapes).
std::string CheckpointFingerprint(std::string_view job, std::string_view site,
                                  uint64_t seed,
                                  std::string_view layout_digest);

namespace durable {

// InvalidArgument for an empty fingerprint or one longer than
// kMaxFingerprintBytes: what the decoders would refuse.
Status ValidateFingerprint(std::string_view fingerprint);

}  // namespace durable
}  // namespace meridian

#endif  // MERIDIAN_DURABLE_FINGERPRINT_H_
