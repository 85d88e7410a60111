#include "durable/fingerprint.h"

#include <string>

namespace meridian {

std::string CheckpointFingerprint(std::string_view job, std::string_view site,
                                  uint64_t seed,
                                  std::string_view layout_digest) {
  return "job '" + std::string(job) + "' site '" + std::string(site) +
         "' seed " + std::to_string(seed) + " layout " +
         std::string(layout_digest);
}

namespace durable {

Status ValidateFingerprint(std::string_view fingerprint) {
  if (fingerprint.empty()) {
    return InvalidArgumentError("the fingerprint is empty");
  }
  if (fingerprint.size() > kMaxFingerprintBytes) {
    return InvalidArgumentError(
        "the fingerprint has " + std::to_string(fingerprint.size()) +
        " bytes, more than " + std::to_string(kMaxFingerprintBytes));
  }
  return Status::Ok();
}

}  // namespace durable
}  // namespace meridian
