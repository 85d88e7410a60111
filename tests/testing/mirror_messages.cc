#include "testing/mirror_messages.h"

#include "meridian/compression.h"

namespace meridian::testing {

Status MakeBiasUpdate(const ModelLayout& layout, int64_t clock,
                      const std::string& origin, float value,
                      pb::Header* header, std::vector<zmq::message_t>* frames) {
  const TensorInfo* bias = layout.Find("fc0.bias");
  if (bias == nullptr) return NotFoundError("the layout has no fc0.bias");
  pb::CompressionConfig config;
  config.set_value_coding(pb::VALUE_FP32);
  MERIDIAN_ASSIGN_OR_RETURN(UpdateEncoder encoder,
                            UpdateEncoder::Create(config));
  const std::vector<uint32_t> indices = {0, 1, 2};
  const std::vector<float> values(3, value);
  MERIDIAN_ASSIGN_OR_RETURN(
      EncodedUpdate encoded,
      encoder.EncodeSparse(bias->size, indices, values, {}));
  header->set_type(pb::MIRROR_UPDATE);
  header->set_clock(clock);
  header->mutable_mirror_update()->set_origin_site(origin);
  header->mutable_mirror_update()->set_entries(3);
  pb::TensorSlice* slice = header->add_slices();
  slice->set_tensor("fc0.bias");
  slice->set_offset(0);
  slice->set_length(bias->size);
  slice->set_codec(pb::CODEC_PIPELINE);
  slice->set_payload_bytes(encoded.bytes.size());
  frames->emplace_back(encoded.bytes.data(), encoded.bytes.size());
  return Status::Ok();
}

}  // namespace meridian::testing
