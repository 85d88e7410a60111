#include "site/builtin_evaluator.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "meridian/core/log.h"

namespace meridian {
namespace {

// `count` of the positions [0, total) (all when fewer), the same for the
// same seed, sorted: the training samples of the policy's loss evaluations
// (one seed at every site), and SkewScout's held-out sample of a site's
// share (a seed per site).
std::vector<uint32_t> SeededSample(size_t total, uint64_t count,
                                   uint64_t seed) {
  std::vector<uint32_t> all(total);
  std::iota(all.begin(), all.end(), 0u);
  std::mt19937_64 rng(seed ^ 0x6c6f7373ull);  // "loss"
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(std::min<uint64_t>(count, total));
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace

Result<EvaluationSets> MakeEvaluationSets(const pb::JobConfig& job,
                                          int site_index, const RawData& raw) {
  EvaluationSets sets;
  sets.test = MakeTestDataset(raw, job.data().normalization());
  const pb::PolicyKind kind = job.policy().kind();
  if (kind == pb::ADSP || kind == pb::ADACOMM) {
    const std::vector<uint32_t> sample =
        SeededSample(raw.train_labels.size(),
                     static_cast<uint64_t>(job.policy().loss_eval_batches()) *
                         job.optimizer().batch_size(),
                     job.seed());
    sets.loss = MakeTrainDataset(raw, sample, job.data().normalization());
  }
  if (job.sync().skewscout().enabled()) {
    MERIDIAN_ASSIGN_OR_RETURN(
        const std::vector<uint32_t> share,
        SiteSampleIndices(job, raw.train_labels, site_index));
    const std::vector<uint32_t> positions =
        SeededSample(share.size(), job.sync().skewscout().holdout_samples(),
                     job.seed() ^ static_cast<uint64_t>(site_index + 1));
    std::vector<uint32_t> sample;
    sample.reserve(positions.size());
    for (uint32_t position : positions) sample.push_back(share[position]);
    sets.holdout = MakeTrainDataset(raw, sample, job.data().normalization());
  }
  return sets;
}

BuiltinEvaluator::BuiltinEvaluator(EvaluatorOptions options)
    : options_(std::move(options)),
      timeline_(options_.model->metric(), options_.target, options_.sources) {}

BuiltinEvaluator::~BuiltinEvaluator() { Stop(); }

void BuiltinEvaluator::Start() {
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { Loop(); });
}

void BuiltinEvaluator::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BuiltinEvaluator::RequestLoss() {
  if (!evaluates_loss()) return;
  {
    MutexLock lock(&mu_);
    loss_requested_ = true;
  }
  cv_.notify_all();
}

std::vector<std::pair<double, Duration>> BuiltinEvaluator::TakeLossResults() {
  std::vector<std::pair<double, Duration>> results;
  MutexLock lock(&mu_);
  results.swap(loss_results_);
  return results;
}

bool BuiltinEvaluator::RequestTravelScore(TravelScore request,
                                          std::vector<float> model) {
  if (options_.holdout_set.size() == 0 ||
      model.size() != options_.store->num_elements()) {
    return false;
  }
  {
    MutexLock lock(&mu_);
    if (travel_.has_value() || stop_) return false;
    travel_.emplace(std::move(request), std::move(model));
  }
  cv_.notify_all();
  return true;
}

std::vector<TravelScore> BuiltinEvaluator::TakeTravelScores() {
  std::vector<TravelScore> scores;
  MutexLock lock(&mu_);
  scores.swap(travel_scores_);
  return scores;
}

// Test-set evaluations every eval_period_s, loss evaluations and travelled
// models as soon as they are asked for. The work happens with mu_
// released.
void BuiltinEvaluator::Loop() {
  const auto period = std::chrono::duration_cast<std::chrono::nanoseconds>(
      FromSeconds(options_.eval_period_s));
  std::vector<float> params(options_.store->num_elements());
  auto next_test = std::chrono::steady_clock::now();
  mu_.lock();
  while (!stop_) {
    if (loss_requested_) {
      loss_requested_ = false;
      mu_.unlock();
      const Duration taken_at = options_.clock->Now();
      options_.store->Snapshot(params);
      const EvalResult result =
          options_.model->Evaluate(params, options_.loss_set);
      mu_.lock();
      loss_results_.emplace_back(result.loss, taken_at);
      continue;
    }
    if (travel_.has_value()) {
      // travel_ stays set while it is scored, so a new request is refused.
      TravelScore score = travel_->first;
      const std::vector<float> travelled = std::move(travel_->second);
      mu_.unlock();
      options_.store->Snapshot(params);
      ScoreTravelled(params, travelled, &score.scores);
      mu_.lock();
      travel_scores_.push_back(std::move(score));
      travel_.reset();
      continue;
    }
    if (std::chrono::steady_clock::now() >= next_test) {
      mu_.unlock();
      const uint64_t commits = timeline_.commits();
      const uint64_t version = options_.store->Snapshot(params);
      EvaluateTestSet(params, version, commits);
      next_test = std::chrono::steady_clock::now() + period;
      mu_.lock();
      continue;
    }
    cv_.wait_until(mu_, next_test);
  }
  mu_.unlock();
}

void BuiltinEvaluator::ScoreTravelled(std::span<const float> params,
                                      std::span<const float> travelled,
                                      TravelScores* scores) {
  // Both on the same samples: the gap's noise is only where they disagree.
  std::vector<uint8_t> own_correct;
  std::vector<uint8_t> travelled_correct;
  scores->own_accuracy =
      options_.model
          ->EvaluateSamples(params, options_.holdout_set, &own_correct)
          .accuracy;
  scores->travelled_accuracy =
      options_.model
          ->EvaluateSamples(travelled, options_.holdout_set,
                            &travelled_correct)
          .accuracy;
  scores->samples = static_cast<uint32_t>(own_correct.size());
  scores->discordant = 0;
  if (travelled_correct.size() != own_correct.size()) {
    scores->samples = 0;  // unusable: the controller ignores it
    return;
  }
  for (size_t i = 0; i < own_correct.size(); ++i) {
    scores->discordant += own_correct[i] != travelled_correct[i];
  }
}

Status BuiltinEvaluator::EvaluateFinal(
    const std::function<Status()>& /*poll_once*/) {
  std::vector<float> params(options_.store->num_elements());
  const uint64_t commits = timeline_.commits();
  const uint64_t version = options_.store->Snapshot(params);
  EvaluateTestSet(params, version, commits);
  return Status::Ok();
}

void BuiltinEvaluator::EvaluateTestSet(std::span<const float> params,
                                       uint64_t version, uint64_t commits) {
  const EvalResult result = options_.model->Evaluate(params, options_.test_set);
  pb::EvalPoint point = timeline_.NewPoint(version, commits);
  point.set_accuracy(result.accuracy);
  point.set_loss(result.loss);
  point.set_metric(result.metric);
  // The job's metric (accuracy, or RMSE) and the loss, by name.
  AddMetric(&point, timeline_.metric().name, result.metric);
  AddMetric(&point, "loss", result.loss);
  timeline_.Record(point);
}

std::string BuiltinEvaluator::MissingCurveReason() const {
  return options_.test_set.size() == 0 ? "the job has no test set" : "";
}

std::string BuiltinEvaluator::Describe() const {
  return "test set of " + std::to_string(options_.test_set.size()) +
         " samples";
}

}  // namespace meridian
