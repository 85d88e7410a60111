#include "worker/model_replica.h"

#include <cstring>

#include "meridian/net/transport.h"

namespace meridian {

ModelReplica::ModelReplica(const ModelLayout& layout)
    : layout_(layout),
      params_(layout.num_elements()),
      base_(layout.num_elements()) {}

void ModelReplica::Load(const ModelPayload& model, uint64_t version) {
  if (model.has_rows()) {
    LoadRows(model);
  } else {
    for (const TensorPayload& tensor : model.tensors) {
      std::memcpy(params_.data() + tensor.tensor->offset, tensor.values.data(),
                  tensor.values.size_bytes());
    }
    base_ = params_;
  }
  base_version_ = version;
  ClearTouched();
}

void ModelReplica::LoadRows(const ModelPayload& model) {
  const std::vector<TensorInfo>& tensors = layout_.tensors();
  for (size_t t = 0; t < touched_rows_.size(); ++t) {
    const uint64_t length = std::max<uint64_t>(RowLength(tensors[t]), 1);
    for (uint32_t row : touched_rows_[t]) {
      const uint64_t at = tensors[t].offset + row * length;
      std::copy_n(params_.begin() + static_cast<ptrdiff_t>(at), length,
                  base_.begin() + static_cast<ptrdiff_t>(at));
    }
  }
  for (const TensorPayload& tensor : model.tensors) {
    const uint64_t offset = tensor.tensor->offset;
    if (!tensor.rows) {
      std::memcpy(params_.data() + offset, tensor.values.data(),
                  tensor.values.size_bytes());
      std::memcpy(base_.data() + offset, tensor.values.data(),
                  tensor.values.size_bytes());
      continue;
    }
    const DecodedRows& rows = *tensor.rows;
    for (size_t k = 0; k < rows.rows.size(); ++k) {
      const uint64_t at = offset + rows.rows[k] * rows.row_length;
      const float* values = rows.values.data() + k * rows.row_length;
      std::copy_n(values, rows.row_length,
                  params_.begin() + static_cast<ptrdiff_t>(at));
      std::copy_n(values, rows.row_length,
                  base_.begin() + static_cast<ptrdiff_t>(at));
    }
  }
}

void ModelReplica::NoteTouched(const std::vector<ElementRange>& ranges) {
  const std::vector<TensorInfo>& tensors = layout_.tensors();
  if (touched_rows_.empty()) {
    touched_rows_.resize(tensors.size());
    touched_flags_.resize(tensors.size());
    for (size_t t = 0; t < tensors.size(); ++t) {
      touched_flags_[t].assign(
          tensors[t].shape.empty() ? 1 : tensors[t].shape[0], 0);
    }
  }
  ForEachRow(layout_, ranges, [&](size_t t, uint32_t row) {
    if (touched_flags_[t][row] == 0) {
      touched_flags_[t][row] = 1;
      touched_rows_[t].push_back(row);
    }
  });
}

void ModelReplica::ClearTouched() {
  for (size_t t = 0; t < touched_rows_.size(); ++t) {
    for (uint32_t row : touched_rows_[t]) touched_flags_[t][row] = 0;
    touched_rows_[t].clear();
  }
}

bool ModelReplica::SparseIsSmaller(size_t t) const {
  const TensorInfo& tensor = layout_.tensors()[t];
  const uint64_t rows = t < touched_rows_.size() ? touched_rows_[t].size() : 0;
  return RowLength(tensor) > 0 && RowsPayloadBytes(rows, RowLength(tensor)) <
                                      tensor.size * sizeof(float);
}

zmq::message_t ModelReplica::RowsFrame(const TensorInfo& tensor,
                                       std::vector<uint32_t>& rows,
                                       pb::Header* header) {
  std::sort(rows.begin(), rows.end());
  const uint64_t row_length = RowLength(tensor);
  zmq::message_t frame(RowsPayloadBytes(rows.size(), row_length));
  float* values = AddRowsSlice(
      tensor, rows,
      std::span<std::byte>(static_cast<std::byte*>(frame.data()), frame.size()),
      header);
  // memcpy: a small frame's bytes need not be aligned for floats.
  std::vector<float> change(row_length);
  for (uint32_t row : rows) {
    const uint64_t at = tensor.offset + uint64_t{row} * row_length;
    for (uint64_t k = 0; k < row_length; ++k) {
      change[k] = params_[at + k] - base_[at + k];
    }
    std::memcpy(values, change.data(), row_length * sizeof(float));
    values += row_length;
  }
  return frame;
}

std::vector<zmq::message_t> ModelReplica::UpdateFrames(bool sparse,
                                                       pb::Header* header) {
  std::vector<zmq::message_t> frames;
  const std::vector<TensorInfo>& tensors = layout_.tensors();
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorInfo& tensor = tensors[t];
    if (sparse && SparseIsSmaller(t)) {
      frames.push_back(RowsFrame(tensor, touched_rows_[t], header));
      continue;
    }
    zmq::message_t frame = MakeFloatFrame(tensor.size);
    float* update = static_cast<float*>(frame.data());
    const float* now = params_.data() + tensor.offset;
    const float* then = base_.data() + tensor.offset;
    for (uint64_t k = 0; k < tensor.size; ++k) update[k] = now[k] - then[k];
    frames.push_back(std::move(frame));
    AddTensorSlice(tensor, header);
  }
  return frames;
}

void ModelReplica::ChangeInto(std::vector<float>* out) const {
  out->resize(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    (*out)[k] = params_[k] - base_[k];
  }
}

}  // namespace meridian
