#include "meridian/ps/param_store.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>

namespace meridian {
namespace {

using ConstVec = Eigen::Map<const Eigen::VectorXf, Eigen::Unaligned>;
using Vec = Eigen::Map<Eigen::VectorXf, Eigen::Unaligned>;

}  // namespace

ApplyRule ApplyRule::FromConfig(const pb::ServerConfig& config,
                                uint32_t workers) {
  ApplyRule rule;
  rule.rule = config.apply_rule();
  rule.learning_rate = config.learning_rate();
  rule.momentum = config.momentum();
  rule.workers = std::max<uint32_t>(workers, 1);
  return rule;
}

float ApplyRule::Scale() const {
  const double divisor = rule == pb::MEAN ? static_cast<double>(workers) : 1.0;
  return static_cast<float>(learning_rate / divisor);
}

ParameterStore::ParameterStore(ModelLayout layout, uint32_t num_shards,
                               ApplyRule rule)
    : layout_(std::move(layout)),
      rule_(rule),
      values_(layout_.num_elements(), 0.0f) {
  const uint64_t n = layout_.num_elements();
  const uint64_t shards =
      std::clamp<uint64_t>(num_shards, 1, std::max<uint64_t>(n, 1));
  if (rule_.momentum > 0) velocity_.assign(n, 0.0f);
  // Exactly `shards` non-empty ranges: the first n % shards get one more
  // element. (Rounding a per-shard size up would yield fewer shards than
  // asked for, e.g. 5 instead of 6 for 10 elements.)
  const uint64_t base = n / shards;
  const uint64_t extra = n % shards;
  uint64_t begin = 0;
  for (uint64_t s = 0; s < shards; ++s) {
    const uint64_t size = base + (s < extra ? 1 : 0);
    auto shard = std::make_unique<Shard>();
    shard->range = KeyRange{begin, begin + size};
    // No other thread sees the store yet; the lock keeps the analysis
    // simple.
    MutexLock lock(&shard->mu);
    shard->values = std::span<float>(values_).subspan(begin, size);
    if (!velocity_.empty()) {
      shard->velocity = std::span<float>(velocity_).subspan(begin, size);
    }
    shards_.push_back(std::move(shard));
    begin += size;
  }
}

namespace {

// The part of [offset, offset + size) inside `range`; empty when disjoint.
KeyRange Overlap(uint64_t offset, uint64_t size, const KeyRange& range) {
  const uint64_t lo = std::max(offset, range.begin);
  const uint64_t hi = std::min(offset + size, range.end);
  return lo < hi ? KeyRange{lo, hi} : KeyRange{lo, lo};
}

}  // namespace

template <typename Fn>
void ParameterStore::ForEachShardLocked(Fn&& fn) const {
  for (const auto& shard : shards_) {
    MutexLock lock(&shard->mu);
    // Spelled fn.operator()(...) rather than fn(...): clang 14's analysis
    // then matches the lambda's REQUIRES(shard.mu) with the argument (with
    // fn(...) it misreads the call and reports a false warning).
    fn.operator()(*shard);
  }
}

void ParameterStore::CopyOut(const Shard& shard,
                             std::span<const ReadSegment> reads) {
  for (const ReadSegment& read : reads) {
    const KeyRange part = Overlap(read.offset, read.values.size(), shard.range);
    if (part.size() == 0) continue;
    std::memcpy(read.values.data() + (part.begin - read.offset),
                shard.values.data() + (part.begin - shard.range.begin),
                part.size() * sizeof(float));
  }
}

Status ParameterStore::Assign(std::span<const float> values) {
  if (values.size() != values_.size()) {
    return InvalidArgumentError("model has " + std::to_string(values_.size()) +
                                " elements, got " +
                                std::to_string(values.size()));
  }
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    std::memcpy(shard.values.data(), values.data() + shard.range.begin,
                shard.range.size() * sizeof(float));
    std::fill(shard.velocity.begin(), shard.velocity.end(), 0.0f);
  });
  return Status::Ok();
}

uint64_t ParameterStore::Snapshot(std::span<float> out) const {
  const uint64_t version = this->version();
  Read(0, out.first(std::min<uint64_t>(out.size(), values_.size())));
  return version;
}

void ParameterStore::Read(uint64_t offset, std::span<float> out) const {
  const ReadSegment read{offset, out};
  Read(std::span<const ReadSegment>(&read, 1));
}

void ParameterStore::Read(std::span<const ReadSegment> reads) const {
  ForEachShardLocked([&](const Shard& shard)
                         REQUIRES(shard.mu) { CopyOut(shard, reads); });
}

void ParameterStore::SetMomentum(double momentum) {
  rule_.momentum = momentum;
  if (momentum > 0) EnsureVelocity();
}

void ParameterStore::EnsureVelocity() {
  if (!velocity_.empty()) return;
  velocity_.assign(layout_.num_elements(), 0.0f);
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    shard.velocity = std::span<float>(velocity_).subspan(shard.range.begin,
                                                         shard.range.size());
  });
}

uint64_t ParameterStore::AddSegments(std::span<const UpdateSegment> segments,
                                     float scale, std::optional<float> momentum,
                                     std::span<const size_t> accumulate,
                                     std::span<const ReadSegment> read_back,
                                     bool hold) {
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    for (const UpdateSegment& segment : segments) {
      const KeyRange part =
          Overlap(segment.offset, segment.values.size(), shard.range);
      if (part.size() == 0) continue;
      const auto len = static_cast<Eigen::Index>(part.size());
      const uint64_t at = part.begin - shard.range.begin;  // in the shard
      ConstVec u(segment.values.data() + (part.begin - segment.offset), len);
      // The model, or with `hold` the held buffer, gets the change.
      Vec w(hold ? shard.held.data() + at : shard.values.data() + at, len);
      if (!momentum) {
        w += scale * u;
        for (size_t id : accumulate) {
          Vec(shard.accumulators[id].data() + at, len) += scale * u;
        }
      } else {
        Vec v(shard.velocity.data() + at, len);
        v = *momentum * v + scale * u;
        w += v;
        for (size_t id : accumulate) {
          Vec(shard.accumulators[id].data() + at, len) += v;
        }
      }
    }
    CopyOut(shard, read_back);
  });
  return version_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

uint64_t ParameterStore::Apply(std::span<const UpdateSegment> segments,
                               std::span<const ReadSegment> read_back) {
  std::optional<float> momentum;
  if (!velocity_.empty()) momentum = static_cast<float>(rule_.momentum);
  return AddSegments(segments, rule_.Scale(), momentum, accumulator_ids_,
                     read_back, !held_.empty());
}

void ParameterStore::HoldOwnChanges() {
  if (!held_.empty()) return;
  held_.assign(values_.size(), 0.0f);
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    shard.held = std::span<float>(held_).subspan(shard.range.begin,
                                                 shard.range.size());
  });
}

void ParameterStore::TakeHeld(std::span<float> out,
                              std::span<const size_t> unsent_in) {
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    if (shard.held.empty()) return;
    float* taken = out.data() + shard.range.begin;
    if (unsent_in.empty()) {
      std::memcpy(taken, shard.held.data(),
                  shard.range.size() * sizeof(float));
      std::fill(shard.held.begin(), shard.held.end(), 0.0f);
      return;
    }
    for (size_t i = 0; i < shard.held.size(); ++i) {
      float unsent = 0.0f;
      for (size_t id : unsent_in) {
        const float value = shard.accumulators[id][i];
        if (std::abs(value) > std::abs(unsent)) unsent = value;
      }
      taken[i] = shard.held[i] - unsent;
      shard.held[i] = unsent;
    }
  });
}

void ParameterStore::AddHeldTo(std::span<float> out) const {
  ForEachShardLocked([&](const Shard& shard) REQUIRES(shard.mu) {
    if (shard.held.empty()) return;
    Vec(out.data() + shard.range.begin,
        static_cast<Eigen::Index>(shard.range.size())) +=
        ConstVec(shard.held.data(),
                 static_cast<Eigen::Index>(shard.range.size()));
  });
}

size_t ParameterStore::AddAccumulator() {
  std::vector<float>& acc = accumulators_.emplace_back(values_.size(), 0.0f);
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    shard.accumulators.push_back(
        std::span<float>(acc).subspan(shard.range.begin, shard.range.size()));
  });
  accumulator_ids_.push_back(accumulators_.size() - 1);
  return accumulators_.size() - 1;
}

uint64_t ParameterStore::ApplyExternal(std::span<const UpdateSegment> segments,
                                       std::span<const size_t> accumulate) {
  // scale 1 adds the values exactly as they are (1.0f * u == u).
  return AddSegments(segments, 1.0f, std::nullopt, accumulate, {},
                     /*hold=*/false);
}

uint64_t ParameterStore::ApplyExternalSparse(
    std::span<const uint64_t> indices, std::span<const float> values,
    std::span<const size_t> accumulate) {
  size_t next = 0;  // indices ascend: each shard takes the next run
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    while (next < indices.size() && indices[next] < shard.range.end) {
      const uint64_t at = indices[next] - shard.range.begin;
      shard.values[at] += values[next];
      for (size_t id : accumulate) shard.accumulators[id][at] += values[next];
      ++next;
    }
  });
  return version_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

void ParameterStore::VisitAccumulator(
    size_t id, const std::function<void(const KeyRange&, std::span<const float>,
                                        std::span<float>)>& fn) {
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    fn(shard.range, shard.values, shard.accumulators[id]);
  });
}

void ParameterStore::AddToAccumulator(size_t id,
                                      std::span<const uint64_t> indices,
                                      std::span<const float> values) {
  // Indices arrive sorted from the filter: each shard takes the next run.
  size_t next = 0;
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    std::span<float> acc = shard.accumulators[id];
    while (next < indices.size() && indices[next] < shard.range.end) {
      acc[indices[next] - shard.range.begin] += values[next];
      ++next;
    }
  });
}

std::vector<float> ParameterStore::CopyVelocity() const {
  std::vector<float> out(velocity_.size());
  if (out.empty()) return out;
  ForEachShardLocked([&](const Shard& shard) REQUIRES(shard.mu) {
    std::copy(shard.velocity.begin(), shard.velocity.end(),
              out.begin() + static_cast<std::ptrdiff_t>(shard.range.begin));
  });
  return out;
}

std::vector<float> ParameterStore::CopyAccumulator(size_t id) const {
  std::vector<float> out(values_.size());
  ForEachShardLocked([&](const Shard& shard) REQUIRES(shard.mu) {
    const std::span<float> acc = shard.accumulators[id];
    std::copy(acc.begin(), acc.end(),
              out.begin() + static_cast<std::ptrdiff_t>(shard.range.begin));
  });
  return out;
}

Status ParameterStore::Restore(std::span<const float> values,
                               std::span<const float> velocity,
                               uint64_t version) {
  if (!velocity.empty() && velocity.size() != values_.size()) {
    return InvalidArgumentError(
        "velocity has " + std::to_string(velocity.size()) +
        " elements, the model " + std::to_string(values_.size()));
  }
  MERIDIAN_RETURN_IF_ERROR(Assign(values));
  if (!velocity.empty()) {
    EnsureVelocity();
    ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
      std::copy_n(
          velocity.begin() + static_cast<std::ptrdiff_t>(shard.range.begin),
          shard.range.size(), shard.velocity.begin());
    });
  }
  version_.store(version, std::memory_order_release);
  return Status::Ok();
}

Status ParameterStore::RestoreAccumulator(size_t id,
                                          std::span<const float> values) {
  if (id >= accumulators_.size() || values.size() != values_.size()) {
    return InvalidArgumentError("accumulator " + std::to_string(id) + " of " +
                                std::to_string(accumulators_.size()) +
                                " with " + std::to_string(values.size()) +
                                " elements, the model has " +
                                std::to_string(values_.size()));
  }
  ForEachShardLocked([&](Shard& shard) REQUIRES(shard.mu) {
    std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(shard.range.begin),
                shard.range.size(), shard.accumulators[id].begin());
  });
  return Status::Ok();
}

UpdateAccumulator::UpdateAccumulator(uint64_t num_elements)
    : sum_(num_elements, 0.0f) {}

Status UpdateAccumulator::Restore(std::span<const float> sum, uint32_t count) {
  if (sum.size() != sum_.size()) {
    return InvalidArgumentError(
        "barrier aggregate of " + std::to_string(sum.size()) +
        " elements, the model has " + std::to_string(sum_.size()));
  }
  std::copy(sum.begin(), sum.end(), sum_.begin());
  count_ = count;
  return Status::Ok();
}

void UpdateAccumulator::Add(std::span<const UpdateSegment> segments) {
  for (const UpdateSegment& segment : segments) {
    const auto len = static_cast<Eigen::Index>(segment.values.size());
    Vec(sum_.data() + segment.offset, len) +=
        ConstVec(segment.values.data(), len);
  }
  ++count_;
}

std::vector<UpdateSegment> UpdateAccumulator::Segments() const {
  return {UpdateSegment{0, std::span<const float>(sum_)}};
}

void UpdateAccumulator::Clear() {
  std::fill(sum_.begin(), sum_.end(), 0.0f);
  count_ = 0;
}

}  // namespace meridian
