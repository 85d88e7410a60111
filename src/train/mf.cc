// Matrix factorisation (Gaia's MF workload): a rating is predicted as
// kRatingOffset + user_bias[u] + item_bias[i] + user_factors[u] .
// item_factors[i]. A minibatch touches a few rows of the factor and bias
// tensors, so the gradient is sparse: only those rows are written, and the
// worker steps and commits them alone (Model::SparseRows).
//
// No trained global bias: every rating would move it, so it is the one
// dense parameter, and the changes of many workers added up (apply rule SUM,
// which sparse rows want: a row is usually touched by one worker at a
// time) would overshoot it. The user and item biases learn the data's mean
// offset from the fixed centre instead.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "meridian/train/dataset.h"
#include "meridian/train/model.h"
#include "train/model_internal.h"

namespace meridian {
namespace {

constexpr float kMinRating = 1.0f;
constexpr float kMaxRating = 5.0f;
// The centre predictions start from: the middle of the rating scale.
constexpr float kRatingOffset = 3.0f;
// Initial factors: uniform in [-kFactorInit, kFactorInit) / sqrt(rank), so
// that initial dot products are small whatever the rank.
constexpr float kFactorInit = 0.1f;

// The rows of one side (users or items) a batch touches, each once, and
// how many of the batch's ratings touch each. Scratch of one
// LossAndGradient: each row's slot in rows() is kept per row (-1: not
// touched) and reset by Finish, so O(batch) per step, O(rows) memory once.
class TouchedRows {
 public:
  explicit TouchedRows(uint32_t rows) : slot_(rows, -1) {}

  // Forgets the last batch's rows (Finish freed their slots).
  void Clear() {
    rows_.clear();
    counts_.clear();
  }
  // Gives `row` a slot; false when the batch touched it already.
  bool Add(uint32_t row) {
    if (slot_[row] >= 0) return false;
    slot_[row] = static_cast<int32_t>(rows_.size());
    rows_.push_back(row);
    counts_.push_back(0);
    return true;
  }
  // One more rating of the batch touches `row` (added before).
  void Count(uint32_t row) { ++counts_[static_cast<size_t>(slot_[row])]; }
  // The rows in the order they were added, and the count of each.
  const std::vector<uint32_t>& rows() const { return rows_; }
  uint32_t count(size_t k) const { return counts_[k]; }
  // The batch is done: rows() ascending from now on (counts no longer
  // match them), and the slots free for the next batch.
  void Finish() {
    std::sort(rows_.begin(), rows_.end());
    for (uint32_t row : rows_) slot_[row] = -1;
  }

 private:
  std::vector<int32_t> slot_;
  std::vector<uint32_t> rows_;
  std::vector<uint32_t> counts_;  // by slot
};

class MatrixFactorization final : public Model {
 public:
  MatrixFactorization(uint32_t users, uint32_t items, uint32_t rank, float l2)
      : users_(users),
        items_(items),
        rank_(rank),
        l2_(l2),
        touched_users_(users),
        touched_items_(items) {
    // Cannot fail: the names differ and no dimension is 0.
    (void)layout_.Add("user_factors", {users, rank});
    (void)layout_.Add("item_factors", {items, rank});
    (void)layout_.Add("user_bias", {users});
    (void)layout_.Add("item_bias", {items});
    user_factors_ = layout_.Find("user_factors")->offset;
    item_factors_ = layout_.Find("item_factors")->offset;
    user_bias_ = layout_.Find("user_bias")->offset;
    item_bias_ = layout_.Find("item_bias")->offset;
  }

  const ModelLayout& layout() const override { return layout_; }
  int input_dim() const override { return 2; }
  // Labels are ratings 1..5.
  int num_classes() const override { return 6; }
  MetricSpec metric() const override {
    pb::ModelConfig config;
    config.set_kind(pb::MATRIX_FACTORIZATION);
    return ModelMetric(config);
  }
  const std::vector<ElementRange>* SparseRows() const override {
    return &ranges_;
  }

  void SampleRows(const Eigen::Ref<const Eigen::MatrixXf>& features,
                  std::vector<ElementRange>* ranges) const override {
    ranges->clear();
    if (features.rows() != 2) return;
    std::vector<uint32_t> users;
    std::vector<uint32_t> items;
    for (Eigen::Index j = 0; j < features.cols(); ++j) {
      if (!IsIndex(features(0, j), users_) || !IsIndex(features(1, j), items_))
        continue;
      users.push_back(static_cast<uint32_t>(features(0, j)));
      items.push_back(static_cast<uint32_t>(features(1, j)));
    }
    for (std::vector<uint32_t>* rows : {&users, &items}) {
      std::sort(rows->begin(), rows->end());
      rows->erase(std::unique(rows->begin(), rows->end()), rows->end());
    }
    RowRanges(users, items, ranges);
  }

  void Initialize(uint64_t seed, std::span<float> params) const override {
    if (!model_internal::SizedForInitialize(params, layout_.num_elements())) {
      return;
    }
    std::mt19937_64 rng(seed);
    const float limit = kFactorInit / std::sqrt(static_cast<float>(rank_));
    for (uint64_t i = 0; i < uint64_t{users_} * rank_; ++i) {
      params[user_factors_ + i] = model_internal::UniformSymmetric(rng, limit);
    }
    for (uint64_t i = 0; i < uint64_t{items_} * rank_; ++i) {
      params[item_factors_ + i] = model_internal::UniformSymmetric(rng, limit);
    }
    std::fill_n(params.begin() + static_cast<ptrdiff_t>(user_bias_), users_,
                0.0f);
    std::fill_n(params.begin() + static_cast<ptrdiff_t>(item_bias_), items_,
                0.0f);
  }

  // Mean squared error of the batch (before regularisation). Each rating's
  // loss is (prediction - rating)^2 / 2 + l2 / 2 * (|u|^2 + |v|^2 + b_u^2 +
  // b_i^2); a touched row's gradient is the mean of that loss's gradient
  // over the batch's ratings of the row (not over the whole batch): each
  // row takes a step as if it had a minibatch of its own. A popular item in
  // every batch then moves no faster than a rare one touched once, so one
  // learning rate suits both (with the batch mean, the rate a rare row
  // needs makes a popular one overshoot).
  float LossAndGradient(std::span<const float> params,
                        const Eigen::Ref<const Eigen::MatrixXf>& features,
                        std::span<const uint8_t> labels,
                        std::span<float> grad) override {
    ranges_.clear();
    const auto n = static_cast<int64_t>(labels.size());
    if (!Fits(params, features, labels) || grad.size() != params.size()) {
      std::fill(grad.begin(), grad.end(), 0.0f);
      return std::numeric_limits<float>::quiet_NaN();
    }
    if (n == 0) return 0;
    // Rows the batch touches, each once, and their gradient zeroed.
    touched_users_.Clear();
    touched_items_.Clear();
    for (int64_t j = 0; j < n; ++j) {
      const auto u = static_cast<uint32_t>(features(0, j));
      const auto i = static_cast<uint32_t>(features(1, j));
      Touch(u, user_factors_, user_bias_, &touched_users_, grad);
      Touch(i, item_factors_, item_bias_, &touched_items_, grad);
    }
    const float l2 = l2_;
    double squared_error = 0;
    for (int64_t j = 0; j < n; ++j) {
      const auto u = static_cast<uint32_t>(features(0, j));
      const auto i = static_cast<uint32_t>(features(1, j));
      const float* pu = params.data() + user_factors_ + uint64_t{u} * rank_;
      const float* pv = params.data() + item_factors_ + uint64_t{i} * rank_;
      const float err = Predict(params, u, i) -
                        static_cast<float>(labels[static_cast<size_t>(j)]);
      squared_error += static_cast<double>(err) * err;
      const float e = err;
      touched_users_.Count(u);
      touched_items_.Count(i);
      float* gu = grad.data() + user_factors_ + uint64_t{u} * rank_;
      float* gv = grad.data() + item_factors_ + uint64_t{i} * rank_;
      for (uint32_t k = 0; k < rank_; ++k) {
        gu[k] += e * pv[k] + l2 * pu[k];
        gv[k] += e * pu[k] + l2 * pv[k];
      }
      grad[user_bias_ + u] += e + l2 * params[user_bias_ + u];
      grad[item_bias_ + i] += e + l2 * params[item_bias_ + i];
    }
    // Sums to means per row.
    MeanRows(touched_users_, user_factors_, user_bias_, grad);
    MeanRows(touched_items_, item_factors_, item_bias_, grad);
    // The ranges, ascending (tensor order, then row order), adjacent bias
    // elements merged; the slots are reset for the next batch.
    touched_users_.Finish();
    touched_items_.Finish();
    RowRanges(touched_users_.rows(), touched_items_.rows(), &ranges_);
    return static_cast<float>(squared_error / static_cast<double>(n));
  }

 protected:
  EvalResult EvaluateInto(std::span<const float> params, const Dataset& data,
                          uint64_t max_samples,
                          std::vector<uint8_t>* correct) override {
    if (correct != nullptr) correct->clear();
    EvalResult result;
    uint64_t total = std::min<uint64_t>(
        data.labels.size(), static_cast<uint64_t>(data.features.cols()));
    if (max_samples > 0) total = std::min(total, max_samples);
    const std::span<const uint8_t> labels(data.labels.data(), total);
    if (!Fits(params, data.features.leftCols(static_cast<Eigen::Index>(total)),
              labels)) {
      result.loss = result.metric = std::numeric_limits<double>::quiet_NaN();
      return result;
    }
    if (total == 0) return result;
    if (correct != nullptr) correct->reserve(total);
    double squared_error = 0;
    uint64_t hits = 0;
    for (uint64_t j = 0; j < total; ++j) {
      const auto col = static_cast<Eigen::Index>(j);
      const auto u = static_cast<uint32_t>(data.features(0, col));
      const auto i = static_cast<uint32_t>(data.features(1, col));
      const float prediction =
          std::clamp(Predict(params, u, i), kMinRating, kMaxRating);
      const float err = prediction - static_cast<float>(labels[j]);
      squared_error += static_cast<double>(err) * err;
      const bool hit = std::lround(prediction) == labels[j];
      hits += hit ? 1 : 0;
      if (correct != nullptr) correct->push_back(hit ? 1 : 0);
    }
    result.samples = total;
    result.loss = squared_error / static_cast<double>(total);
    result.metric = std::sqrt(result.loss);
    result.accuracy = static_cast<double>(hits) / static_cast<double>(total);
    return result;
  }

 private:
  float Predict(std::span<const float> params, uint32_t u, uint32_t i) const {
    const float* pu = params.data() + user_factors_ + uint64_t{u} * rank_;
    const float* pv = params.data() + item_factors_ + uint64_t{i} * rank_;
    float dot = 0;
    for (uint32_t k = 0; k < rank_; ++k) dot += pu[k] * pv[k];
    return kRatingOffset + params[user_bias_ + u] + params[item_bias_ + i] +
           dot;
  }

  // Whether the parameters and samples are this model's: every column a
  // (user, item) pair of exact in-range indices, every label a rating.
  bool Fits(std::span<const float> params,
            const Eigen::Ref<const Eigen::MatrixXf>& features,
            std::span<const uint8_t> labels) const {
    if (params.size() != layout_.num_elements() || features.rows() != 2 ||
        static_cast<uint64_t>(features.cols()) != labels.size()) {
      return false;
    }
    for (Eigen::Index j = 0; j < features.cols(); ++j) {
      if (!IsIndex(features(0, j), users_) || !IsIndex(features(1, j), items_))
        return false;
      const uint8_t rating = labels[static_cast<size_t>(j)];
      if (rating < kMinRating || rating > kMaxRating) return false;
    }
    return true;
  }

  static bool IsIndex(float value, uint32_t limit) {
    // NaN fails both comparisons.
    return value >= 0.0f && value < static_cast<float>(limit) &&
           value == std::floor(value);
  }

  // Adds `row` (of the factor and bias tensors at `factors`, `bias`) to
  // `touched` the first time the batch touches it, with a zeroed gradient.
  void Touch(uint32_t row, uint64_t factors, uint64_t bias,
             TouchedRows* touched, std::span<float> grad) const {
    if (!touched->Add(row)) return;
    ZeroRow(grad, factors + uint64_t{row} * rank_);
    grad[bias + row] = 0;
  }

  // Divides the gradient of every row in `touched` (of the tensors at
  // `factors`, `bias`) by the number of the batch's ratings of it.
  void MeanRows(const TouchedRows& touched, uint64_t factors, uint64_t bias,
                std::span<float> grad) const {
    for (size_t k = 0; k < touched.rows().size(); ++k) {
      const uint32_t row = touched.rows()[k];
      const float scale = 1.0f / static_cast<float>(touched.count(k));
      float* g = grad.data() + factors + uint64_t{row} * rank_;
      for (uint32_t d = 0; d < rank_; ++d) g[d] *= scale;
      grad[bias + row] *= scale;
    }
  }

  void ZeroRow(std::span<float> grad, uint64_t offset) const {
    std::fill_n(grad.begin() + static_cast<ptrdiff_t>(offset), rank_, 0.0f);
  }

  // The element ranges of `users` and `items` (each sorted, unique) in
  // every tensor, ascending, adjacent ones merged, appended to `ranges`.
  void RowRanges(const std::vector<uint32_t>& users,
                 const std::vector<uint32_t>& items,
                 std::vector<ElementRange>* ranges) const {
    auto add_rows = [&](const std::vector<uint32_t>& rows, uint64_t offset,
                        uint32_t width) {
      for (uint32_t row : rows) {
        const uint64_t begin = offset + uint64_t{row} * width;
        if (!ranges->empty() && ranges->back().end == begin) {
          ranges->back().end = begin + width;
        } else {
          ranges->push_back({begin, begin + width});
        }
      }
    };
    add_rows(users, user_factors_, rank_);
    add_rows(items, item_factors_, rank_);
    add_rows(users, user_bias_, 1);
    add_rows(items, item_bias_, 1);
  }

  const uint32_t users_;
  const uint32_t items_;
  const uint32_t rank_;
  const float l2_;
  ModelLayout layout_;
  uint64_t user_factors_ = 0;
  uint64_t item_factors_ = 0;
  uint64_t user_bias_ = 0;
  uint64_t item_bias_ = 0;
  // Scratch of one LossAndGradient.
  TouchedRows touched_users_;
  TouchedRows touched_items_;
  std::vector<ElementRange> ranges_;
};

}  // namespace

Result<std::unique_ptr<Model>> MakeMatrixFactorization(
    const pb::ModelConfig& config, uint32_t users, uint32_t items) {
  if (users < 1 || users > kMaxMatrixRows || items < 1 ||
      items > kMaxMatrixRows) {
    return InvalidArgumentError(
        "matrix factorisation needs 1 to 2^24 users and items, got " +
        std::to_string(users) + " users and " + std::to_string(items) +
        " items");
  }
  if (config.rank() < 1 || config.rank() > kMaxFactorRank) {
    return InvalidArgumentError("model.rank must be in [1, 1024], got " +
                                std::to_string(config.rank()));
  }
  if (!std::isfinite(config.l2()) || config.l2() < 0) {
    return InvalidArgumentError("model.l2 must be a finite number >= 0, got " +
                                std::to_string(config.l2()));
  }
  const uint64_t params =
      (uint64_t{users} + items) * (uint64_t{config.rank()} + 1);
  if (params > model_internal::kMaxParams) {
    return InvalidArgumentError(
        "matrix factorisation of " + std::to_string(users) + " users x " +
        std::to_string(items) + " items at rank " +
        std::to_string(config.rank()) + " has " + std::to_string(params) +
        " parameters, more than 2^30");
  }
  return std::unique_ptr<Model>(new MatrixFactorization(
      users, items, config.rank(), static_cast<float>(config.l2())));
}

}  // namespace meridian
