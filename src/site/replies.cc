#include "site/replies.h"

#include <algorithm>
#include <utility>

namespace meridian {

Replies::Replies(const SiteContext& site, WorkerEndpoint* endpoint,
                 WorkerTable* workers, const ParameterStore* store,
                 const IntraSitePolicy* policy, SyncEngine* sync,
                 const TrainingPhase* phase, const SiteClock* clock)
    : site_(site),
      endpoint_(endpoint),
      workers_(workers),
      store_(store),
      policy_(policy),
      sync_(sync),
      phase_(phase),
      clock_(clock) {}

bool Replies::ReadsAllowed() const {
  return sync_ == nullptr || phase_->finished() ||
         sync_->ReadsAllowed(clock_->value());
}

bool Replies::ReadsAllowed(uint32_t worker) const {
  if (sync_ == nullptr || phase_->finished()) return true;
  const ModelLayout& layout = site_.layout;
  std::vector<KeyRange> ranges;
  for (const pb::TensorSlice& slice : (*workers_)[worker].read_ranges) {
    const TensorInfo* tensor = layout.Find(slice.tensor());
    const uint64_t begin = tensor->offset + slice.offset();
    ranges.push_back(KeyRange{begin, begin + slice.length()});
  }
  const RowReads& rows = (*workers_)[worker].read_rows;
  for (size_t t = 0; t < rows.size(); ++t) {
    const TensorInfo& tensor = layout.tensors()[t];
    if (!rows[t]) {
      ranges.push_back(KeyRange{tensor.offset, tensor.offset + tensor.size});
      continue;
    }
    const uint64_t length = RowLength(tensor);
    for (uint32_t row : *rows[t]) {
      const uint64_t begin = tensor.offset + row * length;
      ranges.push_back(KeyRange{begin, begin + length});
    }
  }
  return sync_->ReadsAllowed(clock_->value(), ranges);
}

void Replies::Answer(uint32_t worker) {
  if (ReadsAllowed(worker)) return SendReply(worker);
  WorkerSlot& slot = (*workers_)[worker];
  if (!slot.held) {
    slot.held = true;
    slot.held_since_s = site_.Now();
  }
}

void Replies::ReleaseHeld() {
  const double now = site_.Now();
  int still_held = 0;
  double longest_s = 0;
  for (uint32_t i = 0; i < workers_->size(); ++i) {
    WorkerSlot& slot = (*workers_)[i];
    if (!slot.held) continue;
    if (!ReadsAllowed(i)) {
      ++still_held;
      longest_s = std::max(longest_s, now - slot.held_since_s);
      continue;
    }
    slot.held = false;
    sync_->NoteHeld(now - slot.held_since_s);
    if (slot.awaiting_reply() && slot.state == SlotState::kLive) {
      SendReply(i);
    }
  }
  NoteHeldWorkers(still_held, longest_s, now);
}

void Replies::AnswerAllWaiting() {
  for (uint32_t i = 0; i < workers_->size(); ++i) {
    WorkerSlot& slot = (*workers_)[i];
    slot.held = false;
    if (slot.state == SlotState::kLive && slot.awaiting_reply()) {
      SendReply(i);
    }
  }
}

void Replies::NoteHeldWorkers(int held, double longest_s, double now) {
  if (phase_->finished() || longest_s < kHeldNoticeS) {
    held_notice_.Reset();
    return;
  }
  if (!held_notice_.Due(now)) return;
  MLOG(WARNING) << held << " worker(s) held by the sync for up to " << longest_s
                << " s: " << sync_->DescribeWait(clock_->value());
}

Replies::ModelReply Replies::NewModelReply(
    pb::MessageType type, std::span<const pb::TensorSlice> ranges,
    const RowReads& rows) {
  ModelReply reply;
  reply.header = endpoint_->NewHeader(type);
  reply.header.set_clock(clock_->value());
  if (!rows.empty()) return RowsReply(std::move(reply), rows);
  if (ranges.empty()) {
    AddLayoutSlices(site_.layout, &reply.header);
  } else {
    for (const pb::TensorSlice& range : ranges) {
      pb::TensorSlice* slice = reply.header.add_slices();
      slice->set_tensor(range.tensor());
      slice->set_offset(range.offset());
      slice->set_length(range.length());
      slice->set_payload_bytes(range.length() * sizeof(float));
    }
  }
  for (const pb::TensorSlice& slice : reply.header.slices()) {
    reply.frames.push_back(MakeFloatFrame(slice.length()));
  }
  // Only now point into the frames: a small ZeroMQ message keeps its
  // bytes inside the message object, which moved while the vector grew.
  for (int i = 0; i < reply.header.slices_size(); ++i) {
    const pb::TensorSlice& slice = reply.header.slices(i);
    const TensorInfo* tensor = site_.layout.Find(slice.tensor());
    reply.reads.push_back(ReadSegment{
        tensor->offset + slice.offset(),
        std::span<float>(static_cast<float*>(reply.frames[i].data()),
                         slice.length())});
  }
  return reply;
}

Replies::ModelReply Replies::RowsReply(ModelReply reply, const RowReads& rows) {
  const std::vector<TensorInfo>& tensors = site_.layout.tensors();
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (rows[t]) {
      reply.frames.emplace_back(
          RowsPayloadBytes(rows[t]->size(), RowLength(tensors[t])));
    } else {
      reply.frames.push_back(MakeFloatFrame(tensors[t].size));
    }
  }
  // The frames are in place: now point into them (see NewModelReply).
  for (size_t t = 0; t < tensors.size(); ++t) {
    const TensorInfo& tensor = tensors[t];
    zmq::message_t& frame = reply.frames[t];
    if (!rows[t]) {
      AddTensorSlice(tensor, &reply.header);
      reply.reads.push_back(ReadSegment{
          tensor.offset,
          std::span<float>(static_cast<float*>(frame.data()), tensor.size)});
      continue;
    }
    float* values =
        AddRowsSlice(tensor, *rows[t],
                     std::span<std::byte>(static_cast<std::byte*>(frame.data()),
                                          frame.size()),
                     &reply.header);
    const uint64_t length = RowLength(tensor);
    for (uint32_t row : *rows[t]) {
      reply.reads.push_back(ReadSegment{tensor.offset + row * length,
                                        std::span<float>(values, length)});
      values += length;
    }
  }
  return reply;
}

void Replies::SendReply(uint32_t worker) {
  if ((*workers_)[worker].pending == Pending::kHello) {
    return SendWelcome(worker);
  }
  SendModel(worker);
}

void Replies::SendWelcome(uint32_t worker) {
  ModelReply reply = NewModelReply(pb::WELCOME);
  pb::Welcome* welcome = reply.header.mutable_welcome();
  LayoutToSpecs(site_.layout, welcome->mutable_layout());
  welcome->set_model_version(store_->version());
  store_->Read(reply.reads);
  *welcome->mutable_plan() = policy_->PlanFor(worker);
  welcome->set_site_workers(workers_->size());
  welcome->set_last_commit_id((*workers_)[worker].last_commit_id);
  if (workers_->durable_points()) {
    *welcome->mutable_durable() = workers_->DurablePointOf(worker);
  }
  if (phase_->finished()) welcome->set_stop(true);
  Deliver(worker, reply.header, std::move(reply.frames));
}

void Replies::SendModel(uint32_t worker) {
  if (phase_->finished()) {
    pb::Header header = endpoint_->NewHeader(pb::MODEL);
    header.set_clock(clock_->value());
    pb::Model* model = header.mutable_model();
    model->set_version(store_->version());
    model->set_stop(true);
    model->set_stop_reason(phase_->stop_reason());
    Deliver(worker, header, {});
    return;
  }
  const WorkerSlot& slot = (*workers_)[worker];
  ModelReply reply = NewModelReply(pb::MODEL, slot.read_ranges, slot.read_rows);
  const uint64_t version = store_->version();  // only the event loop applies
  store_->Read(reply.reads);
  SendModelReply(worker, version, std::move(reply));
}

void Replies::SendModelReply(uint32_t worker, uint64_t version,
                             ModelReply reply) {
  pb::Model* model = reply.header.mutable_model();
  model->set_version(version);
  *model->mutable_plan() = policy_->PlanFor(worker);
  if (workers_->durable_points()) {
    *model->mutable_durable() = workers_->DurablePointOf(worker);
  }
  Deliver(worker, reply.header, std::move(reply.frames));
}

void Replies::Deliver(uint32_t worker, const pb::Header& header,
                      std::vector<zmq::message_t> frames) {
  workers_->NoteAnswered(worker, site_.Now());
  const WorkerSlot& slot = (*workers_)[worker];
  const Status status =
      endpoint_->Send(header, std::move(frames), slot.routing_id);
  if (status.ok()) return;
  if (status.code() == StatusCode::kResourceExhausted) {
    // The worker does not read: its connection's queue is full. The
    // reply is dropped and, once the event loop is back at its top, the
    // worker declared dead; it must join again (its applied commits
    // stay applied: WELCOME.last_commit_id tells it which).
    endpoint_->NoteNotReading(worker, slot.routing_id);
    return;
  }
  // The worker's connection is gone; it will rejoin, and learns from
  // WELCOME.last_commit_id what was applied.
  MLOG(WARNING) << "cannot reply to worker " << slot.Name() << ": " << status;
}

}  // namespace meridian
