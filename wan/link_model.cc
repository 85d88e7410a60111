#include "meridian/wan/link_model.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "meridian/wan/units.h"

namespace meridian::wan {
namespace {

constexpr uint64_t kMiB = 1024 * 1024;
// Smallest explicit queue limit: less would make the reader crawl.
constexpr uint64_t kMinQueueLimit = 1024;

std::string FieldName(std::string_view prefix, std::string_view name) {
  if (prefix.empty()) return std::string(name);
  return std::string(prefix) + "." + std::string(name);
}

}  // namespace

DirectionModel DefaultDirectionModel() { return DirectionModel{}; }

uint64_t DefaultQueueLimit(const DirectionModel& model) {
  if (model.bandwidth_bps <= 0) return 16 * kMiB;
  const double seconds = ToSeconds(model.latency + model.jitter);
  const double bdp_bytes = model.bandwidth_bps / 8.0 * seconds;
  const double limit = std::max<double>(kMiB, 2.0 * bdp_bytes);
  // The largest bandwidth (1tbit) x latency (60s) x 2 fits in 2^64.
  return static_cast<uint64_t>(std::ceil(limit));
}

size_t ChunkBytes(const DirectionModel& model, size_t max_bytes) {
  if (model.bandwidth_bps <= 0) return max_bytes;
  const double per_ms = model.bandwidth_bps / 8.0 / 1000.0;
  const double clamped = std::clamp(
      per_ms, 64.0, static_cast<double>(std::max<size_t>(64, max_bytes)));
  return static_cast<size_t>(clamped);
}

Status ApplyDirectionConfig(const pb::LinkDirectionConfig& change,
                            std::string_view prefix, DirectionModel* model) {
  DirectionModel next = *model;
  if (change.has_bandwidth()) {
    Result<double> bps = ParseBandwidth(change.bandwidth());
    if (!bps.ok()) {
      return bps.status().WithContext(FieldName(prefix, "bandwidth"));
    }
    next.bandwidth_bps = *bps;
  }
  if (change.has_latency()) {
    Result<Duration> latency = ParseDuration(change.latency());
    if (!latency.ok()) {
      return latency.status().WithContext(FieldName(prefix, "latency"));
    }
    next.latency = *latency;
  }
  if (change.has_jitter()) {
    Result<Duration> jitter = ParseDuration(change.jitter());
    if (!jitter.ok()) {
      return jitter.status().WithContext(FieldName(prefix, "jitter"));
    }
    next.jitter = *jitter;
  }
  if (change.has_jitter_distribution()) {
    switch (change.jitter_distribution()) {
      case pb::JITTER_UNIFORM:
      case pb::JITTER_NORMAL:
        next.jitter_distribution = change.jitter_distribution();
        break;
      default:
        return InvalidArgumentError(
            FieldName(prefix, "jitter_distribution") +
            ": must be JITTER_UNIFORM or JITTER_NORMAL");
    }
  }
  if (change.has_queue_limit()) {
    Result<uint64_t> limit = ParseByteSize(change.queue_limit());
    if (!limit.ok()) {
      return limit.status().WithContext(FieldName(prefix, "queue_limit"));
    }
    if (*limit < kMinQueueLimit) {
      return InvalidArgumentError(FieldName(prefix, "queue_limit") +
                                  ": at least 1kb");
    }
    next.queue_limit_bytes = *limit;
  }
  *model = next;
  return Status::Ok();
}

std::string DescribeDirection(const DirectionModel& model) {
  std::string out = FormatBandwidth(model.bandwidth_bps) + " " +
                    FormatDuration(model.latency);
  if (model.jitter > Duration::zero()) {
    out += " jitter " + FormatDuration(model.jitter) +
           (model.jitter_distribution == pb::JITTER_NORMAL ? "(normal)"
                                                           : "(uniform)");
  }
  out += " queue " + FormatBytes(EffectiveQueueLimit(model));
  if (model.queue_limit_bytes == 0) out += "(auto)";
  return out;
}

}  // namespace meridian::wan
