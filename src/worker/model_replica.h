// A worker's copy of the model: the parameters it trains (params), the
// model it last loaded from its site server (base) and that model's
// version; the change it commits is params - base. A sparse model's worker
// also tracks the rows its steps wrote since base, and commits only those
// (CODEC_ROWS) when that is smaller.
//
// Ownership and threads: owned by Worker::Impl and used by the worker's
// thread alone. Size: two copies of the model, and per tensor a flag per
// row and the list of rows written.
#ifndef MERIDIAN_WORKER_MODEL_REPLICA_H_
#define MERIDIAN_WORKER_MODEL_REPLICA_H_

#include <algorithm>
#include <cstdint>
#include <vector>
#include <zmq.hpp>

#include "meridian/core/layout.h"
#include "meridian/net/message.h"
#include "meridian/train/model.h"
#include "meridian/wire.pb.h"

namespace meridian {

// Calls fn(tensor index, row) for every row of `layout` the element ranges
// (ascending, disjoint) cover, in order, each once.
template <typename Fn>
void ForEachRow(const ModelLayout& layout,
                const std::vector<ElementRange>& ranges, Fn&& fn) {
  const std::vector<TensorInfo>& tensors = layout.tensors();
  size_t t = 0;
  int64_t last_row = -1;
  for (const ElementRange& range : ranges) {
    while (t < tensors.size() &&
           range.begin >= tensors[t].offset + tensors[t].size) {
      ++t;
      last_row = -1;
    }
    if (t == tensors.size()) return;
    const uint64_t row_length = std::max<uint64_t>(RowLength(tensors[t]), 1);
    const uint64_t rows = tensors[t].shape.empty() ? 1 : tensors[t].shape[0];
    const uint64_t first = (range.begin - tensors[t].offset) / row_length;
    const uint64_t end = std::min<uint64_t>(
        (range.end - tensors[t].offset + row_length - 1) / row_length, rows);
    for (uint64_t row = first; row < end; ++row) {
      if (static_cast<int64_t>(row) <= last_row) continue;
      fn(t, static_cast<uint32_t>(row));
      last_row = static_cast<int64_t>(row);
    }
  }
}

class ModelReplica {
 public:
  explicit ModelReplica(const ModelLayout& layout);
  ModelReplica(const ModelReplica&) = delete;
  ModelReplica& operator=(const ModelReplica&) = delete;

  // The parameters the worker trains.
  std::vector<float>& params() { return params_; }
  // The version of the model last loaded (what a commit is based on).
  uint64_t base_version() const { return base_version_; }

  // Loads a model the site server sent (parsed: ParseModelPayload) at
  // `version`. A whole model replaces params and base. A reply with rows
  // (the answer to a commit that asked for rows, Commit.reads): the rows
  // this worker changed are committed (base = params there), then the rows
  // and whole tensors of the reply replace both; rows neither changed nor
  // sent keep their last values (the next batches do not read them).
  void Load(const ModelPayload& model, uint64_t version);

  // A sparse model's step wrote `ranges` (SparseRows).
  void NoteTouched(const std::vector<ElementRange>& ranges);

  // The change since base (params - base, which stay as they are until
  // the answer is loaded) as payload frames, one per tensor, their slices
  // appended to `header`: whole tensors, or for a `sparse` model the rows
  // it wrote where that is smaller (CODEC_ROWS).
  std::vector<zmq::message_t> UpdateFrames(bool sparse, pb::Header* header);
  // The change since base (params - base) into `out` (resized to the
  // model's size): what the site applies of the next commit.
  void ChangeInto(std::vector<float>* out) const;

 private:
  void LoadRows(const ModelPayload& model);
  void ClearTouched();
  // Whether tensor t's touched rows make a smaller frame than the tensor.
  bool SparseIsSmaller(size_t t) const;
  // A CODEC_ROWS frame of the change of `rows` of `tensor` (sorted here).
  zmq::message_t RowsFrame(const TensorInfo& tensor,
                           std::vector<uint32_t>& rows, pb::Header* header);

  const ModelLayout& layout_;
  std::vector<float> params_;  // the local model
  std::vector<float> base_;    // the model last pulled
  uint64_t base_version_ = 0;
  // touched_rows_[t] lists the rows of tensor t the steps since base_ wrote
  // (unordered, each once, flagged in touched_flags_[t]). Bounded by the
  // tensor's rows.
  std::vector<std::vector<uint32_t>> touched_rows_;
  std::vector<std::vector<uint8_t>> touched_flags_;
};

}  // namespace meridian

#endif  // MERIDIAN_WORKER_MODEL_REPLICA_H_
