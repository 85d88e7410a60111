#include "sync/update_codec.h"

#include <algorithm>
#include <utility>

#include "meridian/core/log.h"
#include "meridian/sync/sync.h"

namespace meridian {
namespace {

pb::CompressionConfig LosslessConfig(int zstd_level) {
  pb::CompressionConfig config;
  config.set_selection(pb::SELECT_ALL);
  config.set_index_coding(pb::INDEX_AUTO);
  config.set_value_coding(pb::VALUE_FP32);
  config.set_zstd_level(zstd_level);
  return config;
}

std::span<const std::byte> AsBytes(const std::string& bytes) {
  return {reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()};
}

}  // namespace

Result<UpdateCodec> UpdateCodec::Create(const pb::SyncConfig& sync) {
  pb::CompressionConfig main = sync.compression();
  if (sync.kind() == pb::DENSE) main.set_index_coding(pb::INDEX_DENSE);
  MERIDIAN_ASSIGN_OR_RETURN(UpdateEncoder configured,
                            UpdateEncoder::Create(main));
  MERIDIAN_ASSIGN_OR_RETURN(
      UpdateEncoder lossless,
      UpdateEncoder::Create(LosslessConfig(main.zstd_level())));
  pb::CompressionConfig indices = LosslessConfig(1);
  indices.set_value_coding(pb::VALUE_FP16);  // zeros: only indices matter
  MERIDIAN_ASSIGN_OR_RETURN(UpdateEncoder index_encoder,
                            UpdateEncoder::Create(indices));
  pb::CompressionConfig travel = LosslessConfig(main.zstd_level());
  travel.set_index_coding(pb::INDEX_DENSE);
  travel.set_value_coding(sync.skewscout().travel_value_coding());
  MERIDIAN_ASSIGN_OR_RETURN(UpdateEncoder travel_encoder,
                            UpdateEncoder::Create(travel));
  return UpdateCodec(std::move(configured), std::move(lossless),
                     std::move(index_encoder), std::move(travel_encoder));
}

UpdateCodec::UpdateCodec(UpdateEncoder configured, UpdateEncoder lossless,
                         UpdateEncoder indices, UpdateEncoder travel)
    : configured_(std::move(configured)),
      lossless_(std::move(lossless)),
      indices_(std::move(indices)),
      travel_(std::move(travel)) {}

std::vector<EncodedSlices> UpdateCodec::Take(ParameterStore& store, size_t acc,
                                             double theta,
                                             pb::ThresholdMode mode,
                                             Fidelity fidelity,
                                             uint64_t max_message_bytes) {
  entries_.Clear();
  store.VisitAccumulator(
      acc,
      [&](const KeyRange& range, std::span<const float> w, std::span<float> a) {
        TakeSignificant(a, w, theta, mode, range.begin, &entries_.indices,
                        &entries_.values);
      });
  return SplitIntoMessages(
      EncodeEntries(store.layout(),
                    fidelity == Fidelity::kLossless ? lossless_ : configured_,
                    &store, acc, max_message_bytes),
      max_message_bytes);
}

void UpdateCodec::TakeRange(uint64_t begin, std::span<const float> values) {
  entries_.Clear();
  for (uint64_t i = 0; i < values.size(); ++i) {
    entries_.Add(begin + i, values[i]);
  }
}

EncodedSlices UpdateCodec::EncodeTravel(const ParameterStore& store,
                                        std::span<const float> model) {
  TakeRange(0, model);
  return EncodeEntries(store.layout(), travel_, /*residuals_to=*/nullptr, 0);
}

EncodedSlices UpdateCodec::EncodeRange(const ModelLayout& layout,
                                       uint64_t begin,
                                       std::span<const float> values) {
  TakeRange(begin, values);
  return EncodeEntries(layout, configured_, /*residuals_to=*/nullptr, 0);
}

EncodedSlices UpdateCodec::EncodeEntries(const ModelLayout& layout,
                                         UpdateEncoder& encoder,
                                         ParameterStore* residuals_to,
                                         size_t acc, uint64_t max_slice_bytes) {
  EncodedSlices encoded;
  encoded.entries = entries_.indices.size();
  residuals_.Clear();
  size_t next = 0;
  for (const TensorInfo& tensor : layout.tensors()) {
    const uint64_t end = tensor.offset + tensor.size;
    const size_t first = next;
    while (next < entries_.indices.size() && entries_.indices[next] < end) {
      ++next;
    }
    if (first == next) continue;
    EncodeSlice(tensor, first, next, /*whole=*/true, encoder, max_slice_bytes,
                &encoded);
  }
  if (!residuals_.indices.empty() && residuals_to != nullptr) {
    residuals_to->AddToAccumulator(acc, residuals_.indices, residuals_.values);
  }
  return encoded;
}

void UpdateCodec::EncodeSlice(const TensorInfo& tensor, size_t first,
                              size_t last, bool whole, UpdateEncoder& encoder,
                              uint64_t max_bytes, EncodedSlices* out) {
  // The whole tensor (what every update carried before updates were cut),
  // or a part of it from its first entry to its last.
  const uint64_t begin = whole ? tensor.offset : entries_.indices[first];
  const uint64_t length =
      whole ? tensor.size : entries_.indices[last - 1] - begin + 1;
  local_indices_.clear();
  local_values_.clear();
  for (size_t i = first; i < last; ++i) {
    local_indices_.push_back(static_cast<uint32_t>(entries_.indices[i] - begin));
    local_values_.push_back(entries_.values[i]);
  }
  residual_.assign(local_values_.size(), 0.0f);
  Result<EncodedUpdate> result =
      encoder.EncodeSparse(length, local_indices_, local_values_, residual_);
  if (!result.ok()) {
    // Cannot happen for finite values; keep the change rather than lose
    // it.
    MLOG(ERROR) << "cannot encode the update of '" << tensor.name
                << "': " << result.status() << "; kept for later";
    for (size_t i = first; i < last; ++i) {
      residuals_.Add(entries_.indices[i], entries_.values[i]);
    }
    return;
  }
  const uint64_t bytes = result->bytes.size();
  if (max_bytes > 0 && bytes > max_bytes && last - first > 1) {
    // Too large for one message: parts of about 80% of the limit (a part
    // that still exceeds it is cut again), each encoded on its own.
    const uint64_t target = std::max<uint64_t>(1, max_bytes * 4 / 5);
    const size_t parts = static_cast<size_t>(
        std::min<uint64_t>(last - first, std::max<uint64_t>(
                                             2, (bytes + target - 1) / target)));
    const size_t count = last - first;
    for (size_t p = 0; p < parts; ++p) {
      const size_t from = first + count * p / parts;
      const size_t to = first + count * (p + 1) / parts;
      if (from < to) {
        EncodeSlice(tensor, from, to, /*whole=*/false, encoder, max_bytes, out);
      }
    }
    return;
  }
  for (size_t j = 0; j < residual_.size(); ++j) {
    if (residual_[j] != 0.0f) {
      residuals_.Add(entries_.indices[first + j], residual_[j]);
    }
  }
  pb::TensorSlice slice;
  slice.set_tensor(tensor.name);
  slice.set_offset(begin - tensor.offset);
  slice.set_length(length);
  slice.set_dtype(pb::DTYPE_FLOAT32);
  slice.set_codec(pb::CODEC_PIPELINE);
  slice.set_payload_bytes(bytes);
  out->slices.push_back(slice);
  out->slice_entries.push_back(last - first);
  out->frames.emplace_back(reinterpret_cast<const char*>(result->bytes.data()),
                           bytes);
  out->bytes += bytes;
}

std::vector<EncodedSlices> SplitIntoMessages(EncodedSlices update,
                                             uint64_t max_bytes) {
  std::vector<EncodedSlices> messages;
  if (update.empty()) return messages;
  if (max_bytes == 0 || update.bytes <= max_bytes) {
    messages.push_back(std::move(update));
    return messages;
  }
  EncodedSlices current;
  for (size_t i = 0; i < update.slices.size(); ++i) {
    const uint64_t bytes = update.frames[i].size();
    if (!current.empty() && current.bytes + bytes > max_bytes) {
      messages.push_back(std::move(current));
      current = EncodedSlices();
    }
    const uint64_t entries =
        i < update.slice_entries.size() ? update.slice_entries[i] : 0;
    current.slices.push_back(std::move(update.slices[i]));
    current.frames.push_back(std::move(update.frames[i]));
    current.slice_entries.push_back(entries);
    current.entries += entries;
    current.bytes += bytes;
  }
  messages.push_back(std::move(current));
  return messages;
}

EncodedSlices UpdateCodec::IndicesOnly(const EncodedSlices& update) {
  EncodedSlices indices;
  indices.entries = update.entries;
  for (size_t i = 0; i < update.slices.size(); ++i) {
    const pb::TensorSlice& slice = update.slices[i];
    SparseUpdate sparse;
    if (!decoder_
             .DecodeSparse(AsBytes(update.frames[i]), slice.length(), &sparse)
             .ok()) {
      continue;
    }
    std::fill(sparse.values.begin(), sparse.values.end(), 0.0f);
    Result<EncodedUpdate> result =
        indices_.EncodeSparse(sparse.size, sparse.indices, sparse.values, {});
    if (!result.ok()) continue;
    pb::TensorSlice copy = slice;
    copy.set_payload_bytes(result->bytes.size());
    indices.slices.push_back(copy);
    indices.slice_entries.push_back(
        i < update.slice_entries.size() ? update.slice_entries[i] : 0);
    indices.frames.emplace_back(
        reinterpret_cast<const char*>(result->bytes.data()),
        result->bytes.size());
  }
  return indices;
}

Result<DecodedUpdate> DecodeUpdate(
    const ModelLayout& layout, const pb::Header& header,
    std::span<const std::span<const std::byte>> frames,
    UpdateDecoder& decoder) {
  if (static_cast<size_t>(header.slices_size()) != frames.size()) {
    return InvalidArgumentError(
        "the update has " + std::to_string(frames.size()) +
        " payload frames for " + std::to_string(header.slices_size()) +
        " slices");
  }
  DecodedUpdate decoded;
  SparseUpdate sparse;
  for (int i = 0; i < header.slices_size(); ++i) {
    const pb::TensorSlice& slice = header.slices(i);
    const TensorInfo* tensor = layout.Find(slice.tensor());
    if (tensor == nullptr) {
      return InvalidArgumentError("slice " + std::to_string(i) +
                                  ": unknown tensor '" + slice.tensor() + "'");
    }
    Status status = decoder.DecodeSparse(frames[i], slice.length(), &sparse);
    if (status.ok() && sparse.size != slice.length()) {
      status = InvalidArgumentError(
          "encoded slice has " + std::to_string(sparse.size) +
          " elements, the header says " + std::to_string(slice.length()));
    }
    if (!status.ok()) {
      return InvalidArgumentError("slice " + std::to_string(i) + " ('" +
                                  slice.tensor() + "'): " + status.message());
    }
    const uint64_t base = tensor->offset + slice.offset();
    for (size_t j = 0; j < sparse.indices.size(); ++j) {
      decoded.indices.push_back(base + sparse.indices[j]);
      decoded.values.push_back(sparse.values[j]);
    }
  }
  const std::vector<uint64_t>& indices = decoded.indices;
  if (!std::is_sorted(indices.begin(), indices.end()) ||
      std::adjacent_find(indices.begin(), indices.end()) != indices.end()) {
    return InvalidArgumentError("slices overlap or are out of order");
  }
  return decoded;
}

std::vector<std::span<const std::byte>> FrameSpans(
    std::span<const zmq::message_t> frames) {
  std::vector<std::span<const std::byte>> bytes;
  bytes.reserve(frames.size());
  for (const zmq::message_t& frame : frames) {
    bytes.push_back(
        {static_cast<const std::byte*>(frame.data()), frame.size()});
  }
  return bytes;
}

std::vector<std::span<const std::byte>> FrameSpans(
    const google::protobuf::RepeatedPtrField<std::string>& frames) {
  std::vector<std::span<const std::byte>> bytes;
  bytes.reserve(frames.size());
  for (const std::string& frame : frames) bytes.push_back(AsBytes(frame));
  return bytes;
}

std::vector<std::span<const std::byte>> FrameSpans(
    std::span<const std::string> frames) {
  std::vector<std::span<const std::byte>> bytes;
  bytes.reserve(frames.size());
  for (const std::string& frame : frames) bytes.push_back(AsBytes(frame));
  return bytes;
}

}  // namespace meridian
