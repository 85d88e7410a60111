#include "sync/outer_steps.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace meridian {
namespace {

std::string RoundName(int64_t clock) {
  return "outer/round/" + std::to_string(clock);
}

// The checkpoint's array `name` of outer state, which must have `size`
// elements.
Result<const NamedArray*> FindOuterArray(const Checkpoint& arrays,
                                         const std::string& name,
                                         size_t size) {
  const NamedArray* array = arrays.Find(name);
  if (array == nullptr) {
    return DataLossError("the checkpoint has no array '" + name +
                         "' (DiLoCo's outer state)");
  }
  if (array->values.size() != size) {
    return DataLossError("the checkpoint's array '" + name + "' has " +
                         std::to_string(array->values.size()) +
                         " elements, expected " + std::to_string(size));
  }
  return array;
}

}  // namespace

bool HasOuterRounds(pb::SyncKind kind) {
  return kind == pb::DILOCO || kind == pb::MODEL_AVERAGING;
}

OuterStepOptions OuterStepOptionsFrom(const pb::SyncConfig& sync,
                                      uint32_t peers) {
  OuterStepOptions options;
  options.period = sync.averaging_period();
  options.peers = peers;
  if (sync.skewscout().enabled()) {
    options.adaptive = true;
    options.min_period = sync.skewscout().min_averaging_period();
    options.max_period = sync.skewscout().max_averaging_period();
  }
  if (sync.kind() == pb::MODEL_AVERAGING) {
    // anchor - mean(anchor - model) = mean(model).
    options.fragments = 1;
    options.lr = 1;
    options.momentum = 0;
    options.nesterov = false;
    return options;
  }
  options.fragments = sync.diloco().fragments();
  options.lr = sync.diloco().outer_lr();
  options.momentum = sync.diloco().outer_momentum();
  options.nesterov = sync.diloco().nesterov();
  options.error_feedback = sync.diloco().error_feedback();
  options.feedback_decay = sync.diloco().error_feedback_decay();
  options.peers = peers;
  return options;
}

Result<OuterSteps> OuterSteps::Create(const OuterStepOptions& options,
                                      uint64_t num_elements) {
  if (options.period == 0) {
    return InvalidArgumentError(
        "the outer period (sync.averaging_period) "
        "must be at least 1 clock");
  }
  if (options.fragments == 0 || options.period % options.fragments != 0) {
    return InvalidArgumentError(
        "sync.diloco.fragments (" + std::to_string(options.fragments) +
        ") must divide the outer period sync.averaging_period (" +
        std::to_string(options.period) + ")");
  }
  if (options.fragments > num_elements) {
    return InvalidArgumentError("sync.diloco.fragments (" +
                                std::to_string(options.fragments) +
                                ") exceeds the model's " +
                                std::to_string(num_elements) + " parameters");
  }
  if (!(options.lr > 0) || !std::isfinite(options.lr)) {
    return InvalidArgumentError("sync.diloco.outer_lr must be positive");
  }
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    return InvalidArgumentError(
        "sync.diloco.outer_momentum must lie in [0, 1)");
  }
  if (options.error_feedback &&
      !(options.feedback_decay >= 0 && options.feedback_decay <= 1)) {
    return InvalidArgumentError(
        "sync.diloco.error_feedback_decay must lie in [0, 1]");
  }
  if (options.peers == 0) {
    return InvalidArgumentError("DiLoCo needs at least one other site");
  }
  if (options.adaptive && (options.fragments != 1 || options.min_period == 0 ||
                           options.min_period > options.period ||
                           options.period > options.max_period)) {
    return InvalidArgumentError(
        "an adaptive averaging period needs one fragment and "
        "1 <= sync.skewscout.min_averaging_period <= sync.averaging_period "
        "(" +
        std::to_string(options.period) +
        ") <= sync.skewscout.max_averaging_period");
  }
  OuterSteps steps(options, num_elements);
  steps.closed_.assign(options.fragments, 0);
  steps.period_ = options.period;
  return steps;
}

void OuterSteps::Start(std::span<const float> model) {
  anchor_.assign(model.begin(), model.end());
  momentum_.assign(model.size(), 0.0f);
  if (options_.error_feedback) residual_.assign(model.size(), 0.0f);
  started_ = true;
}

std::optional<uint32_t> OuterSteps::FragmentDueAt(int64_t clock) const {
  if (options_.adaptive) {
    return clock == NextRoundClock() ? std::optional<uint32_t>(0)
                                     : std::nullopt;
  }
  const int64_t stride = options_.period / options_.fragments;
  if (clock <= 0 || clock % stride != 0) return std::nullopt;
  return FragmentOf(clock);
}

std::optional<uint32_t> OuterSteps::FragmentOfTag(int64_t clock) const {
  if (options_.adaptive) return 0;
  return FragmentDueAt(clock);
}

int64_t OuterSteps::NextRoundClock() const {
  return closed_[0] + static_cast<int64_t>(period_);
}

uint32_t OuterSteps::FragmentOf(int64_t clock) const {
  if (options_.adaptive) return 0;
  const int64_t stride = options_.period / options_.fragments;
  return static_cast<uint32_t>((clock / stride - 1) % options_.fragments);
}

KeyRange OuterSteps::RangeOf(uint32_t fragment) const {
  const uint64_t f = options_.fragments;
  return {num_elements_ * fragment / f, num_elements_ * (fragment + 1) / f};
}

bool OuterSteps::Open(uint32_t fragment) const {
  for (const auto& [clock, round] : rounds_) {
    if (round.own && round.fragment == fragment) return true;
  }
  return false;
}

bool OuterSteps::AnyOpen() const { return open_rounds() > 0; }

uint32_t OuterSteps::open_rounds() const {
  uint32_t open = 0;
  for (const auto& [clock, round] : rounds_) open += round.own ? 1 : 0;
  return open;
}

int64_t OuterSteps::OpenOwnClock() const {
  for (const auto& [clock, round] : rounds_) {
    if (round.own) return clock;
  }
  return -1;
}

bool OuterSteps::HasOwn(int64_t clock) const {
  auto it = rounds_.find(clock);
  return it != rounds_.end() && it->second.own;
}

void OuterSteps::OuterGradient(uint32_t fragment,
                               std::span<const float> model_range,
                               std::vector<float>* out) const {
  const KeyRange range = RangeOf(fragment);
  out->resize(range.end - range.begin);
  for (uint64_t i = 0; i < out->size() && i < model_range.size(); ++i) {
    (*out)[i] = anchor_[range.begin + i] - model_range[i];
  }
}

void OuterSteps::AddResidual(uint32_t fragment,
                             std::vector<float>* delta) const {
  if (!options_.error_feedback || residual_.empty()) return;  // not started
  const KeyRange range = RangeOf(fragment);
  const float beta = static_cast<float>(options_.feedback_decay);
  for (uint64_t i = 0; i < delta->size() && range.begin + i < range.end; ++i) {
    (*delta)[i] += beta * residual_[range.begin + i];
  }
}

void OuterSteps::KeepResidual(uint32_t fragment,
                              std::span<const float> message,
                              std::span<const float> decoded) {
  if (!options_.error_feedback || residual_.empty()) return;  // not started
  const KeyRange range = RangeOf(fragment);
  for (uint64_t i = 0; i < message.size() && i < decoded.size() &&
                       range.begin + i < range.end;
       ++i) {
    residual_[range.begin + i] = message[i] - decoded[i];
  }
}

Status OuterSteps::CheckAdaptiveClock(int64_t clock, const char* whose) const {
  const int64_t next = NextRoundClock();
  if (clock == next) return Status::Ok();
  if (clock <= closed_[0]) {
    return FailedPreconditionError(
        std::string(whose) + " outer gradient for round " +
        std::to_string(clock) + " arrived after the round closed");
  }
  const int64_t open = OpenOwnClock();
  if (open != next) {
    return InvalidArgumentError(
        std::string(whose) + " outer gradient is tagged with clock " +
        std::to_string(clock) + "; the agreed next round is at clock " +
        std::to_string(next));
  }
  // This site's Δ of the next round is out: a peer that has every Δ of
  // it may have closed it and started the one after, at a clock this site
  // learns when its own round closes.
  if (clock > next + static_cast<int64_t>(options_.max_period)) {
    return OutOfRangeError(
        std::string(whose) + " outer gradient for round " +
        std::to_string(clock) + " is more than the longest period (" +
        std::to_string(options_.max_period) +
        " clocks) after the open round at clock " + std::to_string(next));
  }
  return Status::Ok();
}

Status OuterSteps::CheckProposal(uint32_t proposal, const char* whose) const {
  if (!options_.adaptive) return Status::Ok();
  if (proposal < options_.min_period || proposal > options_.max_period) {
    return InvalidArgumentError(
        std::string(whose) +
        " outer gradient proposes an averaging period of " +
        std::to_string(proposal) + " clocks, outside [" +
        std::to_string(options_.min_period) + ", " +
        std::to_string(options_.max_period) + "]");
  }
  return Status::Ok();
}

Status OuterSteps::CheckRound(int64_t clock, size_t size, const char* whose,
                              bool own) const {
  if (options_.adaptive && own) {
    // This site's own rounds: the next, or (replayed from its outgoing
    // log after a restart) later ones it agreed before it died.
    if (clock < NextRoundClock()) {
      return InvalidArgumentError(
          std::string(whose) + " outer gradient is tagged with clock " +
          std::to_string(clock) + ", before the agreed next round at " +
          std::to_string(NextRoundClock()));
    }
  } else if (options_.adaptive) {
    MERIDIAN_RETURN_IF_ERROR(CheckAdaptiveClock(clock, whose));
  }
  std::optional<uint32_t> fragment = FragmentOfTag(clock);
  if (!fragment) {
    return InvalidArgumentError(
        std::string(whose) + " outer gradient is tagged with clock " +
        std::to_string(clock) + ", at which no round starts (every " +
        std::to_string(options_.period / options_.fragments) + " clocks)");
  }
  if (clock <= closed_[*fragment]) {
    return FailedPreconditionError(
        std::string(whose) + " outer gradient for round " +
        std::to_string(clock) + " arrived after the round closed");
  }
  const KeyRange range = RangeOf(*fragment);
  if (size != range.end - range.begin) {
    return InvalidArgumentError(
        std::string(whose) + " outer gradient for round " +
        std::to_string(clock) + " has " + std::to_string(size) +
        " values; its fragment has " + std::to_string(range.end - range.begin));
  }
  return Status::Ok();
}

OuterSteps::Round& OuterSteps::RoundAt(int64_t clock) {
  auto [it, added] = rounds_.try_emplace(clock);
  Round& round = it->second;
  if (added) {
    round.fragment = FragmentOf(clock);
    const KeyRange range = RangeOf(round.fragment);
    round.sum.assign(range.end - range.begin, 0.0f);
    round.from_peer.assign(options_.peers, false);
    round.peer_proposals.assign(options_.peers, 0);
  }
  return round;
}

Status OuterSteps::AddOwn(int64_t clock, std::span<const float> decoded,
                          std::span<const float> base, uint32_t proposal) {
  MERIDIAN_RETURN_IF_ERROR(
      CheckRound(clock, decoded.size(), "this site's", /*own=*/true));
  MERIDIAN_RETURN_IF_ERROR(CheckProposal(proposal, "this site's"));
  if (!base.empty() && base.size() != decoded.size()) {
    return InvalidArgumentError("the base of round " + std::to_string(clock) +
                                " has the wrong size");
  }
  if (HasOwn(clock)) {
    return FailedPreconditionError("this site's outer gradient for round " +
                                   std::to_string(clock) + " was added twice");
  }
  Round& round = RoundAt(clock);
  const KeyRange range = RangeOf(round.fragment);
  round.own = true;
  round.own_proposal = proposal;
  ++round.contributions;
  round.base.resize(decoded.size());
  for (size_t i = 0; i < decoded.size(); ++i) {
    round.sum[i] += decoded[i];
    round.base[i] =
        base.empty() ? anchor_[range.begin + i] - decoded[i] : base[i];
  }
  return Status::Ok();
}

Status OuterSteps::AddPeer(int64_t clock, uint32_t peer,
                           std::span<const float> decoded, int64_t local_clock,
                           uint32_t proposal) {
  MERIDIAN_RETURN_IF_ERROR(
      CheckRound(clock, decoded.size(), "a peer's", /*own=*/false));
  MERIDIAN_RETURN_IF_ERROR(CheckProposal(proposal, "a peer's"));
  if (peer >= options_.peers) {
    return InvalidArgumentError("no peer number " + std::to_string(peer));
  }
  if (options_.adaptive) {
    // One round per peer ahead of the next: what an honest peer can be.
    // (CheckAdaptiveClock bounds how far ahead.)
    for (const auto& [other, round] : rounds_) {
      if (clock != NextRoundClock() && other != clock &&
          other > NextRoundClock() && round.from_peer[peer]) {
        return FailedPreconditionError(
            "a peer's outer gradient for round " + std::to_string(clock) +
            " while its gradient for round " + std::to_string(other) +
            " waits for the open round to close");
      }
    }
  } else if (clock > local_clock + 2 * static_cast<int64_t>(options_.period)) {
    return OutOfRangeError("outer gradient for round " + std::to_string(clock) +
                           " is more than two periods (" +
                           std::to_string(options_.period) +
                           " clocks each) ahead of this site's clock " +
                           std::to_string(local_clock));
  }
  auto it = rounds_.find(clock);
  if (it != rounds_.end() && it->second.from_peer[peer]) {
    return FailedPreconditionError("a second outer gradient for round " +
                                   std::to_string(clock) +
                                   " from the same peer");
  }
  Round& round = RoundAt(clock);
  round.from_peer[peer] = true;
  round.peer_proposals[peer] = proposal;
  ++round.contributions;
  for (size_t i = 0; i < decoded.size(); ++i) round.sum[i] += decoded[i];
  return Status::Ok();
}

std::optional<OuterSteps::Step> OuterSteps::CloseReady() {
  for (auto it = rounds_.begin(); it != rounds_.end(); ++it) {
    Round& round = it->second;
    if (!round.own || round.contributions < options_.peers + 1) continue;
    if (options_.adaptive && it->first != NextRoundClock()) continue;
    const KeyRange range = RangeOf(round.fragment);
    const float mu = static_cast<float>(options_.momentum);
    const float lr = static_cast<float>(options_.lr);
    const float inverse_sites = 1.0f / static_cast<float>(options_.peers + 1);
    Step step;
    step.clock = it->first;
    step.range = range;
    step.correction.resize(round.sum.size());
    for (size_t i = 0; i < round.sum.size(); ++i) {
      const uint64_t k = range.begin + i;
      const float mean = round.sum[i] * inverse_sites;
      momentum_[k] = mu * momentum_[k] + mean;
      const float direction =
          options_.nesterov ? mean + mu * momentum_[k] : momentum_[k];
      anchor_[k] -= lr * direction;
      step.correction[i] = anchor_[k] - round.base[i];
    }
    closed_[round.fragment] = it->first;
    if (options_.adaptive) AgreePeriod(it->first, round);
    rounds_.erase(it);
    ++steps_;
    if (options_.adaptive) DropRoundsOffSchedule();
    return step;
  }
  return std::nullopt;
}

void OuterSteps::AgreePeriod(int64_t clock, const Round& round) {
  uint32_t agreed = round.own_proposal;
  for (uint32_t proposal : round.peer_proposals) {
    agreed = std::min(agreed, proposal);
  }
  agreed = std::clamp(agreed, options_.min_period, options_.max_period);
  if (agreed == period_) return;
  period_ = agreed;
  period_changes_.push_back({clock, agreed});
  if (period_changes_.size() > kMaxPeriodChanges) period_changes_.pop_front();
}

void OuterSteps::DropRoundsOffSchedule() {
  const int64_t next = NextRoundClock();
  for (auto it = rounds_.begin(); it != rounds_.end();) {
    // Rounds after the next are checked when it closes.
    if (it->first < next) {
      it = rounds_.erase(it);
      ++rounds_dropped_;
    } else {
      ++it;
    }
  }
}

void OuterSteps::SaveTo(pb::OuterStepCheckpoint* out) const {
  out->set_started(started_);
  out->set_steps(steps_);
  out->set_has_residual(started_ && options_.error_feedback);
  for (int64_t clock : closed_) out->add_closed(clock);
  if (options_.adaptive) {
    out->set_period(period_);
    out->set_rounds_dropped(rounds_dropped_);
    for (const PeriodChange& change : period_changes_) {
      pb::OuterPeriodChange* saved = out->add_period_changes();
      saved->set_round(change.round);
      saved->set_period(change.period);
    }
  }
  for (const auto& [clock, round] : rounds_) {
    pb::OuterRoundCheckpoint* saved = out->add_rounds();
    saved->set_clock(clock);
    saved->set_own(round.own);
    if (options_.adaptive && round.own) {
      saved->set_own_proposal(round.own_proposal);
    }
    for (uint32_t p = 0; p < round.from_peer.size(); ++p) {
      if (!round.from_peer[p]) continue;
      saved->add_peers(p);
      if (options_.adaptive) saved->add_peer_proposals(round.peer_proposals[p]);
    }
  }
}

void OuterSteps::AppendArrays(std::vector<NamedArray>* arrays) const {
  if (started_) {
    arrays->push_back({"outer/anchor", anchor_});
    arrays->push_back({"outer/momentum", momentum_});
    if (options_.error_feedback) {
      arrays->push_back({"outer/residual", residual_});
    }
  }
  for (const auto& [clock, round] : rounds_) {
    arrays->push_back({RoundName(clock) + "/sum", round.sum});
    if (round.own) arrays->push_back({RoundName(clock) + "/base", round.base});
  }
}

Status OuterSteps::RestoreFrom(const pb::OuterStepCheckpoint& saved,
                               const Checkpoint& arrays) {
  if (saved.closed_size() != static_cast<int>(options_.fragments)) {
    return DataLossError("the checkpoint's DiLoCo state has " +
                         std::to_string(saved.closed_size()) +
                         " fragments, the job " +
                         std::to_string(options_.fragments));
  }
  OuterSteps restored = *this;
  restored.rounds_.clear();
  restored.started_ = saved.started();
  restored.steps_ = saved.steps();
  restored.closed_.assign(saved.closed().begin(), saved.closed().end());
  if (options_.adaptive) {
    MERIDIAN_RETURN_IF_ERROR(restored.RestorePeriod(saved));
  }
  if (saved.started()) {
    MERIDIAN_ASSIGN_OR_RETURN(
        const NamedArray* anchor,
        FindOuterArray(arrays, "outer/anchor", num_elements_));
    MERIDIAN_ASSIGN_OR_RETURN(
        const NamedArray* momentum,
        FindOuterArray(arrays, "outer/momentum", num_elements_));
    restored.anchor_ = anchor->values;
    restored.momentum_ = momentum->values;
    restored.residual_.clear();
    if (options_.error_feedback && saved.has_residual()) {
      MERIDIAN_ASSIGN_OR_RETURN(
          const NamedArray* residual,
          FindOuterArray(arrays, "outer/residual", num_elements_));
      restored.residual_ = residual->values;
    } else if (options_.error_feedback) {
      restored.residual_.assign(num_elements_, 0.0f);
    }
  }
  for (const pb::OuterRoundCheckpoint& round_state : saved.rounds()) {
    MERIDIAN_RETURN_IF_ERROR(restored.RestoreRound(round_state, arrays));
  }
  *this = std::move(restored);
  return Status::Ok();
}

Status OuterSteps::RestorePeriod(const pb::OuterStepCheckpoint& saved) {
  // A checkpoint of a fixed period (none saved) continues at the job's.
  period_ = saved.has_period() ? saved.period() : options_.period;
  if (period_ < options_.min_period || period_ > options_.max_period) {
    return DataLossError("the checkpoint's averaging period (" +
                         std::to_string(period_) + " clocks) lies outside [" +
                         std::to_string(options_.min_period) + ", " +
                         std::to_string(options_.max_period) + "]");
  }
  rounds_dropped_ = saved.rounds_dropped();
  period_changes_.clear();
  const int first = std::max(
      0, saved.period_changes_size() - static_cast<int>(kMaxPeriodChanges));
  for (int i = first; i < saved.period_changes_size(); ++i) {
    period_changes_.push_back(
        {saved.period_changes(i).round(), saved.period_changes(i).period()});
  }
  return Status::Ok();
}

Status OuterSteps::RestoreRound(const pb::OuterRoundCheckpoint& round_state,
                                const Checkpoint& arrays) {
  const int64_t clock = round_state.clock();
  // An adaptive period's rounds after the next were accepted when their
  // clock could not be checked yet (a peer's, or this site's replayed
  // after a restart: any number of rounds ahead); the schedule checks
  // them as it reaches them.
  const bool starts_round = options_.adaptive
                                ? clock > closed_[0]
                                : FragmentDueAt(clock).has_value();
  if (!starts_round) {
    return DataLossError("the checkpoint has an outer round at clock " +
                         std::to_string(clock) + ", which starts no round");
  }
  if (options_.adaptive &&
      (round_state.peer_proposals_size() != round_state.peers_size() ||
       (round_state.own() &&
        !CheckProposal(round_state.own_proposal(), "").ok()))) {
    return DataLossError("the checkpoint's outer round " +
                         std::to_string(clock) +
                         " lacks the averaging periods its sites proposed");
  }
  Round& round = RoundAt(clock);
  MERIDIAN_ASSIGN_OR_RETURN(
      const NamedArray* sum,
      FindOuterArray(arrays, RoundName(clock) + "/sum", round.sum.size()));
  round.sum = sum->values;
  round.own = round_state.own();
  round.contributions = round.own ? 1 : 0;
  if (round.own) {
    MERIDIAN_ASSIGN_OR_RETURN(
        const NamedArray* base,
        FindOuterArray(arrays, RoundName(clock) + "/base", round.sum.size()));
    round.base = base->values;
  }
  for (uint32_t peer : round_state.peers()) {
    if (peer >= options_.peers || round.from_peer[peer]) {
      return DataLossError("the checkpoint's outer round " +
                           std::to_string(clock) + " names peer " +
                           std::to_string(peer) + " wrongly");
    }
    round.from_peer[peer] = true;
    ++round.contributions;
  }
  if (!options_.adaptive) return Status::Ok();
  round.own_proposal = round.own ? round_state.own_proposal() : 0;
  for (int i = 0; i < round_state.peers_size(); ++i) {
    const uint32_t proposal = round_state.peer_proposals(i);
    if (!CheckProposal(proposal, "").ok()) {
      return DataLossError("the checkpoint's outer round " +
                           std::to_string(clock) +
                           " has a proposed period of " +
                           std::to_string(proposal) + " clocks");
    }
    round.peer_proposals[round_state.peers(i)] = proposal;
  }
  return Status::Ok();
}

}  // namespace meridian
