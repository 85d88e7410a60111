#include "meridian/param_store.h"

#include <Eigen/Core>
#include <algorithm>
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
  // Exactly `shards` non-empty ranges: the first n % shards get one more
  // element. (Rounding a per-shard size up would yield fewer shards than
  // asked for, e.g. 5 instead of 6 for 10 elements.)
  const uint64_t base = n / shards;
  const uint64_t extra = n % shards;
  uint64_t begin = 0;
  for (uint64_t s = 0; s < shards; ++s) {
    const uint64_t size = base + (s < extra ? 1 : 0);
    shards_.push_back(std::make_unique<Shard>());
    shards_.back()->range = KeyRange{begin, begin + size};
    begin += size;
  }
  if (rule_.momentum > 0) velocity_.assign(n, 0.0f);
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
    std::lock_guard<std::mutex> lock(shard->mu);
    fn(shard->range);
  }
}

void ParameterStore::CopyOut(const KeyRange& shard,
                             std::span<const ReadSegment> reads) const {
  for (const ReadSegment& read : reads) {
    const KeyRange part = Overlap(read.offset, read.values.size(), shard);
    if (part.size() == 0) continue;
    std::memcpy(read.values.data() + (part.begin - read.offset),
                values_.data() + part.begin, part.size() * sizeof(float));
  }
}

Status ParameterStore::Assign(std::span<const float> values) {
  if (values.size() != values_.size()) {
    return InvalidArgumentError("model has " + std::to_string(values_.size()) +
                                " elements, got " +
                                std::to_string(values.size()));
  }
  ForEachShardLocked([&](const KeyRange& shard) {
    std::memcpy(values_.data() + shard.begin, values.data() + shard.begin,
                shard.size() * sizeof(float));
    if (!velocity_.empty()) {
      std::fill(velocity_.begin() + shard.begin, velocity_.begin() + shard.end,
                0.0f);
    }
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
  ForEachShardLocked([&](const KeyRange& shard) { CopyOut(shard, reads); });
}

void ParameterStore::SetMomentum(double momentum) {
  rule_.momentum = momentum;
  if (momentum > 0 && velocity_.empty()) {
    velocity_.assign(layout_.num_elements(), 0.0f);
  }
}

uint64_t ParameterStore::Apply(std::span<const UpdateSegment> segments,
                               std::span<const ReadSegment> read_back) {
  const float scale = rule_.Scale();
  const float momentum = static_cast<float>(rule_.momentum);
  // Shard by shard, each shard locked once for all the segments that touch
  // it, so that a concurrent Snapshot or Read never sees a shard with only
  // part of an update (a commit carries one segment per tensor, and a shard
  // may straddle tensors). The read-back copies the shard while it is
  // locked and still in cache.
  ForEachShardLocked([&](const KeyRange& shard) {
    for (const UpdateSegment& segment : segments) {
      const KeyRange part =
          Overlap(segment.offset, segment.values.size(), shard);
      if (part.size() == 0) continue;
      const auto len = static_cast<Eigen::Index>(part.size());
      ConstVec u(segment.values.data() + (part.begin - segment.offset), len);
      Vec w(values_.data() + part.begin, len);
      if (velocity_.empty()) {
        w += scale * u;
        for (std::vector<float>& acc : accumulators_) {
          Vec(acc.data() + part.begin, len) += scale * u;
        }
      } else {
        Vec v(velocity_.data() + part.begin, len);
        v = momentum * v + scale * u;
        w += v;
        for (std::vector<float>& acc : accumulators_) {
          Vec(acc.data() + part.begin, len) += v;
        }
      }
    }
    CopyOut(shard, read_back);
  });
  return version_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

size_t ParameterStore::AddAccumulator() {
  accumulators_.emplace_back(values_.size(), 0.0f);
  return accumulators_.size() - 1;
}

uint64_t ParameterStore::ApplyExternal(std::span<const UpdateSegment> segments,
                                       std::span<const size_t> accumulate) {
  ForEachShardLocked([&](const KeyRange& shard) {
    for (const UpdateSegment& segment : segments) {
      const KeyRange part =
          Overlap(segment.offset, segment.values.size(), shard);
      if (part.size() == 0) continue;
      const auto len = static_cast<Eigen::Index>(part.size());
      ConstVec u(segment.values.data() + (part.begin - segment.offset), len);
      Vec(values_.data() + part.begin, len) += u;
      for (size_t id : accumulate) {
        Vec(accumulators_[id].data() + part.begin, len) += u;
      }
    }
  });
  return version_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

uint64_t ParameterStore::ApplyExternalSparse(
    std::span<const uint64_t> indices, std::span<const float> values,
    std::span<const size_t> accumulate) {
  size_t next = 0;  // indices ascend: each shard takes the next run
  ForEachShardLocked([&](const KeyRange& shard) {
    while (next < indices.size() && indices[next] < shard.end) {
      const uint64_t key = indices[next];
      values_[key] += values[next];
      for (size_t id : accumulate) accumulators_[id][key] += values[next];
      ++next;
    }
  });
  return version_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

uint64_t ParameterStore::AverageWith(std::span<const float> others_sum,
                                     uint32_t others) {
  const float inverse = 1.0f / static_cast<float>(others + 1);
  ForEachShardLocked([&](const KeyRange& shard) {
    const auto len = static_cast<Eigen::Index>(shard.size());
    Vec w(values_.data() + shard.begin, len);
    w = (w + ConstVec(others_sum.data() + shard.begin, len)) * inverse;
  });
  return version_.fetch_add(1, std::memory_order_acq_rel) + 1;
}

void ParameterStore::VisitAccumulator(
    size_t id, const std::function<void(const KeyRange&, std::span<const float>,
                                        std::span<float>)>& fn) {
  std::vector<float>& acc = accumulators_[id];
  ForEachShardLocked([&](const KeyRange& shard) {
    fn(shard,
       std::span<const float>(values_.data() + shard.begin, shard.size()),
       std::span<float>(acc.data() + shard.begin, shard.size()));
  });
}

void ParameterStore::AddToAccumulator(size_t id,
                                      std::span<const uint64_t> indices,
                                      std::span<const float> values) {
  std::vector<float>& acc = accumulators_[id];
  // Indices arrive sorted from the filter: each shard takes the next run.
  size_t next = 0;
  ForEachShardLocked([&](const KeyRange& shard) {
    while (next < indices.size() && indices[next] < shard.end) {
      acc[indices[next]] += values[next];
      ++next;
    }
  });
}

UpdateAccumulator::UpdateAccumulator(uint64_t num_elements)
    : sum_(num_elements, 0.0f) {}

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
