#include "sync/outer_rounds.h"

#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "meridian/core/log.h"

namespace meridian {
namespace {

// `decoded` as the dense values of `range` (missing elements zero); an
// error when it has an element outside the range.
Status ScatterRange(const KeyRange& range, const DecodedUpdate& decoded,
                    std::vector<float>* out) {
  out->assign(range.end - range.begin, 0.0f);
  for (size_t j = 0; j < decoded.indices.size(); ++j) {
    const uint64_t index = decoded.indices[j];
    if (index < range.begin || index >= range.end) {
      return InvalidArgumentError(
          "outer gradient has parameter " + std::to_string(index) +
          " outside its fragment [" + std::to_string(range.begin) + ", " +
          std::to_string(range.end) + ")");
    }
    (*out)[index - range.begin] = decoded.values[j];
  }
  return Status::Ok();
}

// `model`'s values in `range`.
double Norm(std::span<const float> values) {
  double squares = 0;
  for (float value : values) squares += static_cast<double>(value) * value;
  return std::sqrt(squares);
}

std::span<const float> InRange(const std::vector<float>& model,
                               const KeyRange& range) {
  return std::span<const float>(model).subspan(range.begin,
                                               range.end - range.begin);
}

// Bits of one value of `coding` (0: unknown).
uint32_t ValueBits(pb::ValueCoding coding) {
  switch (coding) {
    case pb::VALUE_FP32:
      return 32;
    case pb::VALUE_FP16:
    case pb::VALUE_BF16:
      return 16;
    case pb::VALUE_INT8:
      return 8;
    case pb::VALUE_INT4:
      return 4;
    case pb::VALUE_INT2:
      return 2;
    default:
      return 0;
  }
}

}  // namespace

OuterRounds::OuterRounds(const SyncContext& context, PeerTable& peers,
                         Outbox& outbox, const SkewScoutTravel& skew,
                         OuterSteps steps)
    : context_(context),
      peers_(peers),
      outbox_(outbox),
      skew_(skew),
      steps_(std::move(steps)) {}

void OuterRounds::Start() {
  if (steps_.started()) return;
  std::vector<float> model(context_.store->num_elements());
  context_.store->Snapshot(model);
  steps_.Start(model);
}

void OuterRounds::StartIfDue(int64_t clock) {
  if (steps_.adaptive()) {
    // The round's clock is the agreed one; this site may have passed it
    // while the previous round was open (commits already under way).
    const int64_t due = steps_.NextRoundClock();
    if (!steps_.AnyOpen() && clock >= due) StartRound(due, 0);
    return;
  }
  std::optional<uint32_t> fragment = steps_.FragmentDueAt(clock);
  if (!fragment) return;
  if (steps_.Open(*fragment) || deferred_ != 0) {
    if (deferred_ == 0) {
      deferred_ = clock;
      ++deferred_count_;
    }
    return;
  }
  StartRound(clock, *fragment);
}

void OuterRounds::StartRound(int64_t clock, uint32_t fragment) {
  const KeyRange range = steps_.RangeOf(fragment);
  std::vector<float> model(context_.store->num_elements());
  context_.store->Snapshot(model);
  std::vector<float> delta;
  steps_.OuterGradient(fragment, InRange(model, range), &delta);
  // Error feedback: the message is β·e + Δ (a no-op without it).
  steps_.AddResidual(fragment, &delta);
  const EncodedSlices encoded =
      outbox_.codec().EncodeRange(context_.store->layout(), range.begin, delta);
  // What the peers will add is the decoded Δ: use the same here, so that
  // every site's anchor stays the same.
  pb::Header header;
  for (const pb::TensorSlice& slice : encoded.slices) {
    *header.add_slices() = slice;
  }
  const uint32_t proposal = ProposedPeriod();
  std::vector<float> decoded;
  Result<DecodedUpdate> own = DecodeUpdate(
      context_.store->layout(), header,
      FrameSpans(std::span<const std::string>(encoded.frames)), decoder_);
  Status status = own.status();
  if (status.ok()) status = ScatterRange(range, *own, &decoded);
  // Without error feedback the base is anchor - decoded (the coding's
  // loss stays in the model); with it, the model Δ was taken from (the
  // loss waits in the residual instead).
  const bool feedback = steps_.options().error_feedback;
  if (status.ok()) {
    status = steps_.AddOwn(
        clock, decoded,
        feedback ? InRange(model, range) : std::span<const float>(), proposal);
  }
  if (!status.ok()) {
    // Our own encoding does not decode: a bug, not a peer's fault.
    MLOG(ERROR) << "outer round " << clock
                << ": this site's outer gradient does not decode: " << status;
    return;
  }
  steps_.KeepResidual(fragment, delta, decoded);
  CountSent(range, own->indices.size(), encoded.bytes);
  for (const auto& peer : peers_.all()) {
    outbox_.SendUpdate(encoded, pb::MIRROR_UPDATE, /*average=*/true, *peer,
                       clock, proposal);
  }
}

uint32_t OuterRounds::ProposedPeriod() const {
  if (!steps_.adaptive()) return 0;
  if (!skew_.enabled()) return steps_.period();
  return meridian::ProposedPeriod(skew_.knob(), context_.sync.skewscout());
}

Check OuterRounds::AddPeer(const Peer& peer, const MirrorUpdate& update) {
  const int64_t round = update.outer_round;
  std::optional<uint32_t> fragment = steps_.FragmentOfTag(round);
  if (!fragment) {
    return Rejection{pb::ERROR_MALFORMED, "outer gradient tagged with round " +
                                              std::to_string(round) +
                                              ", at which no round starts"};
  }
  std::vector<float> values;
  if (Status status =
          ScatterRange(steps_.RangeOf(*fragment), update.decoded, &values);
      !status.ok()) {
    return Rejection{pb::ERROR_MALFORMED, status.message()};
  }
  if (Status status = steps_.AddPeer(round, peers_.PositionOf(peer), values,
                                     peers_.local_clock(), update.next_period);
      !status.ok()) {
    // What no sender may send (a wrong size, a clock off the agreed
    // schedule, a proposal outside the bounds) against what arrives at the
    // wrong time.
    const pb::ErrorCode code = status.code() == StatusCode::kInvalidArgument
                                   ? pb::ERROR_MALFORMED
                                   : pb::ERROR_STALE;
    return Rejection{code, status.message()};
  }
  return Check();
}

void OuterRounds::CloseReady() {
  bool closed = false;
  uint64_t dropped_before = steps_.rounds_dropped();
  while (std::optional<OuterSteps::Step> step = steps_.CloseReady()) {
    std::vector<uint64_t> indices(step->correction.size());
    for (size_t i = 0; i < indices.size(); ++i) {
      indices[i] = step->range.begin + i;
    }
    context_.store->ApplyExternalSparse(indices, step->correction);
    closed = true;
    if (steps_.adaptive()) {
      if (steps_.rounds_dropped() != dropped_before) {
        MLOG(ERROR) << "outer round " << step->clock << " agreed a period of "
                    << steps_.period() << " clocks; "
                    << steps_.rounds_dropped() - dropped_before
                    << " outer gradient round(s) tagged with another clock "
                       "were dropped (a peer computed another period)";
        dropped_before = steps_.rounds_dropped();
      }
      // The next round may be due already (a short agreed period).
      StartIfDue(peers_.local_clock());
    }
  }
  if (closed && deferred_ != 0) {
    const int64_t clock = deferred_;
    const uint32_t fragment = *steps_.FragmentDueAt(clock);
    if (!steps_.Open(fragment)) {
      deferred_ = 0;
      StartRound(clock, fragment);
      CloseReady();
    }
  }
}

Status OuterRounds::Recover(const pb::Header& header,
                            const pb::LoggedMessage& record) {
  const int64_t round = header.mirror_update().outer_round();
  if (steps_.HasOwn(round)) return Status::Ok();  // sent to every peer
  std::optional<uint32_t> fragment = steps_.FragmentOfTag(round);
  const std::string where = "the outgoing log's outer gradient " +
                            std::to_string(record.sequence()) + " for site '" +
                            record.peer() + "'";
  if (!fragment) {
    return DataLossError(where + " names round " + std::to_string(round) +
                         ", at which no round starts");
  }
  Result<DecodedUpdate> own = DecodeUpdate(
      context_.store->layout(), header, FrameSpans(record.frames()), decoder_);
  if (!own.ok()) return own.status().WithContext(where);
  const KeyRange range = steps_.RangeOf(*fragment);
  std::vector<float> decoded;
  MERIDIAN_RETURN_IF_ERROR(
      ScatterRange(range, *own, &decoded).WithContext(where));
  std::vector<float> model(context_.store->num_elements());
  context_.store->Snapshot(model);
  // The site had reached the round's clock (it may have died before
  // announcing it).
  peers_.set_local_clock(std::max(peers_.local_clock(), round));
  // Error feedback: the residual of a round sent after the checkpoint is
  // measured from the restored model too (its base): what the crash lost
  // is lost from both alike.
  std::vector<float> message;
  steps_.OuterGradient(*fragment, InRange(model, range), &message);
  steps_.AddResidual(*fragment, &message);
  MERIDIAN_RETURN_IF_ERROR(steps_
                               .AddOwn(round, decoded, InRange(model, range),
                                       header.mirror_update().next_period())
                               .WithContext(where));
  steps_.KeepResidual(*fragment, message, decoded);
  uint64_t bytes = 0;
  for (const std::string& frame : record.frames()) bytes += frame.size();
  CountSent(range, own->indices.size(), bytes);
  return Status::Ok();
}

void OuterRounds::CountSent(const KeyRange& range, uint64_t entries,
                            uint64_t bytes) {
  ++sent_.rounds;
  sent_.parameters += range.end - range.begin;
  sent_.entries += entries;
  sent_.bytes += bytes;
}

bool OuterRounds::HoldsReads() const {
  if (deferred_ != 0) return true;
  const bool overlap =
      context_.sync.kind() == pb::DILOCO && context_.sync.diloco().overlap();
  return !overlap && steps_.AnyOpen();
}

void OuterRounds::FillSummary(pb::SyncSummary* summary) const {
  pb::OuterStepSummary* diloco = summary->mutable_diloco();
  diloco->set_steps(steps_.steps());
  diloco->set_open_at_end(steps_.open_rounds());
  diloco->set_deferred(deferred_count_);
  const OuterStepOptions& options = steps_.options();
  diloco->set_outer_lr(options.lr);
  diloco->set_outer_momentum(options.momentum);
  diloco->set_fragments(options.fragments);
  diloco->set_period(steps_.period());
  if (steps_.adaptive()) {
    diloco->set_adaptive_period(true);
    for (const OuterSteps::PeriodChange& change : steps_.period_changes()) {
      pb::OuterPeriodChange* out = diloco->add_period_changes();
      out->set_round(change.round);
      out->set_period(change.period);
    }
    diloco->set_rounds_dropped(steps_.rounds_dropped());
  }
  diloco->set_anchor_norm(Norm(steps_.anchor()));
  diloco->set_rounds_sent(sent_.rounds);
  diloco->set_parameters_sent(sent_.parameters);
  diloco->set_entries_sent(sent_.entries);
  diloco->set_bytes_sent(sent_.bytes);
  const uint32_t bits = ValueBits(context_.sync.compression().value_coding());
  diloco->set_value_bits(bits);
  if (sent_.parameters > 0) {
    const double density =
        static_cast<double>(sent_.entries) / static_cast<double>(sent_.parameters);
    diloco->set_density(density);
    char text[64];
    std::snprintf(text, sizeof(text), "%.2f%%, %u-bit", 100 * density, bits);
    diloco->set_coding(text);
  }
  if (options.error_feedback) {
    diloco->set_error_feedback(true);
    diloco->set_error_feedback_decay(options.feedback_decay);
    diloco->set_residual_norm(Norm(steps_.residual()));
  }
}

void OuterRounds::SaveTo(pb::SyncCheckpoint* out) const {
  steps_.SaveTo(out->mutable_outer());
  out->set_outer_deferred(deferred_);
  pb::OuterStepCheckpoint* outer = out->mutable_outer();
  outer->set_rounds_sent(sent_.rounds);
  outer->set_parameters_sent(sent_.parameters);
  outer->set_entries_sent(sent_.entries);
  outer->set_bytes_sent(sent_.bytes);
}

Status OuterRounds::RestoreFrom(const pb::SyncCheckpoint& state,
                                const Checkpoint* arrays) {
  if (!state.has_outer()) return Status::Ok();
  if (arrays == nullptr) {
    return DataLossError(
        "the outer rounds' state (DILOCO, "
        "MODEL_AVERAGING) needs the checkpoint's arrays");
  }
  MERIDIAN_RETURN_IF_ERROR(steps_.RestoreFrom(state.outer(), *arrays));
  deferred_ = state.outer_deferred();
  sent_.rounds = state.outer().rounds_sent();
  sent_.parameters = state.outer().parameters_sent();
  sent_.entries = state.outer().entries_sent();
  sent_.bytes = state.outer().bytes_sent();
  return Status::Ok();
}

}  // namespace meridian
