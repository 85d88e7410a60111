// How a sync engine turns accumulated change into the slices and payload
// frames of a MIRROR_UPDATE (MIRROR_INDICES) and back: the configured
// codec pipeline (sync.compression; dense indices for DENSE), a lossless
// one (final flushes, MODEL_AVERAGING's whole model) and an index-only one
// (the selective barrier's MIRROR_INDICES). Lossy coding's residuals go
// back into the accumulator the change came from, so nothing is lost.
//
// Decoding (DecodeUpdate) keeps no state here: it returns the decoded
// update as a value.
//
// Ownership and threads: owned by one SyncEngine (its Outbox) and used by
// its event loop alone; not thread-safe. Holds scratch buffers reused
// across calls: their size is bounded by the model (one entry per
// parameter at most).
#ifndef MERIDIAN_SYNC_UPDATE_CODEC_H_
#define MERIDIAN_SYNC_UPDATE_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "meridian/compression/compression.h"
#include "meridian/job.pb.h"
#include "meridian/ps/param_store.h"
#include "meridian/core/status.h"
#include "meridian/wire.pb.h"

namespace meridian {

// One encoded update: a slice and a payload frame per tensor that changed
// (or per part of a tensor, when an update is cut to a message size).
struct EncodedSlices {
  std::vector<pb::TensorSlice> slices;
  std::vector<std::string> frames;
  std::vector<uint64_t> slice_entries;  // parameters each slice changes
  uint64_t entries = 0;  // parameters it changes
  uint64_t bytes = 0;    // payload bytes, summed over frames
  bool empty() const { return slices.empty(); }
};

// Flat parameter indices, ascending and unique, with their values.
struct SparseEntries {
  std::vector<uint64_t> indices;
  std::vector<float> values;

  void Clear() {
    indices.clear();
    values.clear();
  }
  void Add(uint64_t index, float value) {
    indices.push_back(index);
    values.push_back(value);
  }
};
// An update as DecodeUpdate returns it.
using DecodedUpdate = SparseEntries;

class UpdateCodec {
 public:
  enum class Fidelity { kConfigured, kLossless };

  // The codecs of `sync` (its compression, a DENSE kind's dense indices).
  // Fails naming what is wrong in the compression settings.
  static Result<UpdateCodec> Create(const pb::SyncConfig& sync);

  // Takes what passes `theta` (under `mode`) out of accumulator `acc` of
  // `store` and encodes it; lossy residuals go back into `acc`. The update
  // comes as messages of at most `max_message_bytes` of payload each (0:
  // one message): an update that fits is one message of whole-tensor
  // slices; a larger one is cut into parts of tensors, each encoded on its
  // own (SplitIntoMessages). Empty when nothing passes.
  std::vector<EncodedSlices> Take(ParameterStore& store, size_t acc,
                                  double theta, pb::ThresholdMode mode,
                                  Fidelity fidelity,
                                  uint64_t max_message_bytes = 0);
  // The whole of `model` for SkewScout to score elsewhere, its values coded
  // with sync.skewscout.travel_value_coding; the coding's error is
  // dropped (the copy is never applied).
  EncodedSlices EncodeTravel(const ParameterStore& store,
                             std::span<const float> model);
  // `values` as the flat indices [begin, begin + values.size()), through
  // the configured pipeline; what its coding loses is dropped (DiLoCo's
  // outer gradient: the caller keeps that part in its model).
  EncodedSlices EncodeRange(const ModelLayout& layout, uint64_t begin,
                            std::span<const float> values);
  // The configured pipeline's top-k fraction from now on (SkewScout's
  // density knob); UpdateEncoder::SetTopKFraction's errors.
  Status SetTopKFraction(double fraction) {
    return configured_.SetTopKFraction(fraction);
  }
  // The same slices with every value zero, index-coded (MIRROR_INDICES).
  EncodedSlices IndicesOnly(const EncodedSlices& update);

 private:
  UpdateCodec(UpdateEncoder configured, UpdateEncoder lossless,
              UpdateEncoder indices, UpdateEncoder travel);
  // Encodes entries_ per tensor of `layout`, no slice over
  // `max_slice_bytes` (0: no limit) unless it holds one entry; residuals to
  // accumulator `acc` of `residuals_to` (null: dropped).
  EncodedSlices EncodeEntries(const ModelLayout& layout,
                              UpdateEncoder& encoder,
                              ParameterStore* residuals_to, size_t acc,
                              uint64_t max_slice_bytes = 0);
  // Appends entries_[first, last) of `tensor` to `out` as one slice (the
  // whole tensor when `whole`, else from its first entry to its last), or,
  // when that encodes to more than `max_bytes` (0: no limit), as parts
  // encoded on their own; residuals go to residuals_.
  void EncodeSlice(const TensorInfo& tensor, size_t first, size_t last,
                   bool whole, UpdateEncoder& encoder, uint64_t max_bytes,
                   EncodedSlices* out);
  // Puts `values` in entries_ as the flat indices [begin, begin +
  // values.size()).
  void TakeRange(uint64_t begin, std::span<const float> values);

  UpdateEncoder configured_;
  UpdateEncoder lossless_;
  UpdateEncoder indices_;
  UpdateEncoder travel_;
  UpdateDecoder decoder_;
  // Scratch, reused: the entries to encode, one tensor's of them (indices
  // within the tensor), what its coding lost, and the entries that go back
  // to the accumulator.
  SparseEntries entries_;
  std::vector<uint32_t> local_indices_;
  std::vector<float> local_values_;
  std::vector<float> residual_;
  SparseEntries residuals_;
};

// `update` as messages of at most `max_bytes` of payload each (0: one):
// consecutive slices go together while they fit; a slice larger than
// `max_bytes` (one entry) is a message of its own.
std::vector<EncodedSlices> SplitIntoMessages(EncodedSlices update,
                                             uint64_t max_bytes);

// Decodes the slices of `header` (already checked against `layout` and the
// codec: CheckSlicesAgainstLayout, CheckCodec), one payload frame each,
// with `decoder`. Nothing is applied: a bad slice fails naming it, and so
// do slices that overlap or are out of order.
Result<DecodedUpdate> DecodeUpdate(
    const ModelLayout& layout, const pb::Header& header,
    std::span<const std::span<const std::byte>> frames,
    UpdateDecoder& decoder);

// The payload frames of a message as byte views (zmq::message_t as
// received, std::string as kept for a resend or logged).
std::vector<std::span<const std::byte>> FrameSpans(
    std::span<const zmq::message_t> frames);
std::vector<std::span<const std::byte>> FrameSpans(
    const google::protobuf::RepeatedPtrField<std::string>& frames);
std::vector<std::span<const std::byte>> FrameSpans(
    std::span<const std::string> frames);

}  // namespace meridian

#endif  // MERIDIAN_SYNC_UPDATE_CODEC_H_
