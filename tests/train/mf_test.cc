// Matrix factorisation: the rating generator, the model's gradient (against
// finite differences of an independent statement of its loss), its sparse
// rows, the sparse optimizer step, evaluation and training.

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "meridian/train/dataset.h"
#include "meridian/train/model.h"
#include "meridian/train/optimizer.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

pb::RatingsConfig SmallMatrix() {
  pb::RatingsConfig config;
  config.set_users(300);
  config.set_items(80);
  config.set_rank(4);
  config.set_ratings(6000);
  config.set_noise_stddev(0.3);
  config.set_seed(7);
  return config;
}

pb::ModelConfig MfConfig(uint32_t rank, double l2) {
  pb::ModelConfig config;
  config.set_kind(pb::MATRIX_FACTORIZATION);
  config.set_rank(rank);
  config.set_l2(l2);
  return config;
}

std::unique_ptr<Model> BuildMf(uint32_t users, uint32_t items, uint32_t rank,
                               double l2) {
  Result<std::unique_ptr<Model>> model =
      MakeMatrixFactorization(MfConfig(rank, l2), users, items);
  EXPECT_OK(model);
  return model.ok() ? std::move(model).value() : nullptr;
}

// ---- the generator ---------------------------------------------------------

TEST(GenerateRatingsTest, IsDeterministicInItsSeedAndHasTheAskedShape) {
  const pb::RatingsConfig config = SmallMatrix();
  Result<RawData> a = GenerateRatings(config);
  Result<RawData> b = GenerateRatings(config);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_TRUE(a->ratings);
  EXPECT_EQ(a->train_pairs, b->train_pairs);
  EXPECT_EQ(a->train_labels, b->train_labels);
  EXPECT_EQ(a->test_pairs, b->test_pairs);
  EXPECT_EQ(a->test_labels, b->test_labels);
  EXPECT_EQ(a->input_dim(), 2);
  // 10% held out (the default test_fraction), the rest for training.
  EXPECT_EQ(a->test_labels.size(), 600u);
  EXPECT_EQ(a->train_labels.size(), 5400u);
  EXPECT_EQ(a->train_pairs.size(), 2 * a->train_labels.size());
  EXPECT_EQ(a->test_pairs.size(), 2 * a->test_labels.size());

  pb::RatingsConfig other = config;
  other.set_seed(8);
  Result<RawData> c = GenerateRatings(other);
  ASSERT_OK(c);
  EXPECT_NE(a->train_pairs, c->train_pairs);
}

TEST(GenerateRatingsTest, PairsAreDistinctInRangeAndItemsFollowPopularity) {
  const pb::RatingsConfig config = SmallMatrix();
  Result<RawData> raw = GenerateRatings(config);
  ASSERT_OK(raw);
  std::set<std::pair<uint32_t, uint32_t>> pairs;
  std::vector<uint64_t> per_item(config.items(), 0);
  std::map<int, uint64_t> per_rating;
  for (const auto* set : {&raw->train_pairs, &raw->test_pairs}) {
    for (size_t k = 0; k + 1 < set->size(); k += 2) {
      const uint32_t user = (*set)[k];
      const uint32_t item = (*set)[k + 1];
      ASSERT_LT(user, config.users());
      ASSERT_LT(item, config.items());
      EXPECT_TRUE(pairs.insert({user, item}).second)
          << "pair (" << user << ", " << item << ") rated twice";
      ++per_item[item];
    }
  }
  EXPECT_EQ(pairs.size(), config.ratings());
  for (const auto* labels : {&raw->train_labels, &raw->test_labels}) {
    for (uint8_t rating : *labels) {
      ASSERT_GE(rating, 1);
      ASSERT_LE(rating, 5);
      ++per_rating[rating];
    }
  }
  // Every rating value occurs (the planted mean is 3.6 with a spread of
  // about 1).
  EXPECT_EQ(per_rating.size(), 5u);
  // Zipf(1) popularity: the most rated item has several times the ratings
  // of the median one.
  std::sort(per_item.begin(), per_item.end());
  EXPECT_GT(per_item.back(), 3 * per_item[per_item.size() / 2]);
}

TEST(GenerateRatingsTest, RefusesSettingsItCannotMeetNamingTheField) {
  struct Case {
    void (*mutate)(pb::RatingsConfig*);
    const char* field;
  };
  const Case cases[] = {
      {[](pb::RatingsConfig* c) { c->set_users(0); }, "users"},
      {[](pb::RatingsConfig* c) { c->set_items(1u << 25); }, "items"},
      {[](pb::RatingsConfig* c) { c->set_rank(0); }, "rank"},
      {[](pb::RatingsConfig* c) { c->set_ratings(300 * 80 / 2 + 1); },
       "ratings"},
      {[](pb::RatingsConfig* c) { c->set_zipf_exponent(-1); }, "zipf_exponent"},
      {[](pb::RatingsConfig* c) {
         c->set_noise_stddev(std::numeric_limits<double>::quiet_NaN());
       },
       "noise_stddev"},
      {[](pb::RatingsConfig* c) { c->set_test_fraction(1); }, "test_fraction"},
  };
  for (const Case& c : cases) {
    pb::RatingsConfig config = SmallMatrix();
    c.mutate(&config);
    Result<RawData> raw = GenerateRatings(config);
    ASSERT_FALSE(raw.ok()) << c.field;
    EXPECT_NE(
        raw.status().message().find(std::string("data.ratings.") + c.field),
        std::string::npos)
        << raw.status();
  }
  // So concentrated that half the matrix's cells cannot be found.
  pb::RatingsConfig config = SmallMatrix();
  config.set_zipf_exponent(6);
  config.set_user_zipf_exponent(6);
  config.set_ratings(300 * 80 / 2);
  Result<RawData> raw = GenerateRatings(config);
  ASSERT_FALSE(raw.ok());
  EXPECT_EQ(raw.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(raw.status().message().find("lower zipf_exponent"),
            std::string::npos);
}

TEST(GenerateRatingsTest, DatasetsCarryUserAndItemAsExactFeatures) {
  Result<RawData> raw = GenerateRatings(SmallMatrix());
  ASSERT_OK(raw);
  const std::vector<uint32_t> some = {0, 5, 99999999};  // last: skipped
  const Dataset train = MakeTrainDataset(*raw, some, pb::STANDARDIZE);
  ASSERT_EQ(train.size(), 2u);
  EXPECT_EQ(train.input_dim(), 2);
  EXPECT_EQ(train.features(0, 1), static_cast<float>(raw->train_pairs[10]));
  EXPECT_EQ(train.features(1, 1), static_cast<float>(raw->train_pairs[11]));
  EXPECT_EQ(train.labels[1], raw->train_labels[5]);
  const Dataset test = MakeTestDataset(*raw, pb::STANDARDIZE);
  EXPECT_EQ(test.size(), raw->test_labels.size());
}

// ---- the model -------------------------------------------------------------

// The objective LossAndGradient differentiates, stated independently: the
// mean over the batch of (prediction - rating)^2 / 2 + l2 / 2 * (|u|^2 +
// |v|^2 + b_u^2 + b_i^2).
double Objective(const std::vector<float>& p, const ModelLayout& layout,
                 uint32_t rank, double l2, const Eigen::MatrixXf& features,
                 const std::vector<uint8_t>& labels) {
  const uint64_t uf = layout.Find("user_factors")->offset;
  const uint64_t vf = layout.Find("item_factors")->offset;
  const uint64_t ub = layout.Find("user_bias")->offset;
  const uint64_t vb = layout.Find("item_bias")->offset;
  double total = 0;
  for (Eigen::Index j = 0; j < features.cols(); ++j) {
    const auto u = static_cast<uint64_t>(features(0, j));
    const auto i = static_cast<uint64_t>(features(1, j));
    double dot = 0;
    double norms = 0;
    for (uint32_t k = 0; k < rank; ++k) {
      dot += double{p[uf + u * rank + k]} * p[vf + i * rank + k];
      norms += double{p[uf + u * rank + k]} * p[uf + u * rank + k] +
               double{p[vf + i * rank + k]} * p[vf + i * rank + k];
    }
    norms += double{p[ub + u]} * p[ub + u] + double{p[vb + i]} * p[vb + i];
    const double err =
        3.0 + p[ub + u] + p[vb + i] + dot - labels[static_cast<size_t>(j)];
    total += err * err / 2 + l2 / 2 * norms;
  }
  return total / static_cast<double>(features.cols());
}

struct RatingBatch {
  Eigen::MatrixXf features;
  std::vector<uint8_t> labels;
};

// `size` ratings over few users and items, so that rows repeat.
RatingBatch RandomRatings(uint32_t users, uint32_t items, int size,
                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  RatingBatch batch;
  batch.features.resize(2, size);
  for (int j = 0; j < size; ++j) {
    batch.features(0, j) = static_cast<float>(rng() % users);
    batch.features(1, j) = static_cast<float>(rng() % items);
    batch.labels.push_back(static_cast<uint8_t>(1 + rng() % 5));
  }
  return batch;
}

TEST(MatrixFactorizationTest, LayoutNamesAndShapesTheFactorsAndBiases) {
  std::unique_ptr<Model> model = BuildMf(7, 5, 3, 0.1);
  ASSERT_NE(model, nullptr);
  EXPECT_EQ(model->layout().DebugString(),
            "user_factors[7,3] item_factors[5,3] user_bias[7] item_bias[5]");
  EXPECT_EQ(model->input_dim(), 2);
  EXPECT_EQ(model->metric().name, "rmse");
  EXPECT_FALSE(model->metric().higher_is_better);
  EXPECT_TRUE(model->metric().Reached(0.79, 0.80));
  EXPECT_FALSE(model->metric().Reached(0.81, 0.80));
  EXPECT_EQ(ModelMetric(MfConfig(3, 0.1)).name, "rmse");
}

TEST(MatrixFactorizationTest, RowGradientsMatchFiniteDifferencesOnTouchedRows) {
  constexpr uint32_t kUsers = 7, kItems = 5, kRank = 3;
  constexpr double kL2 = 0.1;
  std::unique_ptr<Model> model = BuildMf(kUsers, kItems, kRank, kL2);
  ASSERT_NE(model, nullptr);
  const uint64_t n = model->layout().num_elements();
  std::vector<float> params(n);
  model->Initialize(3, params);
  // Bigger factors than the initial ones, so the products matter.
  std::mt19937_64 rng(5);
  for (float& p : params) {
    p += static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 2000.0f;
  }
  const RatingBatch batch = RandomRatings(4, 3, 12, 9);  // users 4+ untouched
  // Sentinels: what the model does not write stays as it was.
  std::vector<float> grad(n, 123.0f);
  const float mse =
      model->LossAndGradient(params, batch.features, batch.labels, grad);
  ASSERT_TRUE(std::isfinite(mse));
  const std::vector<ElementRange>* rows = model->SparseRows();
  ASSERT_NE(rows, nullptr);
  std::vector<bool> written(n, false);
  for (size_t r = 0; r < rows->size(); ++r) {
    const ElementRange& range = (*rows)[r];
    ASSERT_LT(range.begin, range.end);
    ASSERT_LE(range.end, n);
    if (r > 0) {
      ASSERT_LT((*rows)[r - 1].end, range.begin + 1);
    }
    for (uint64_t e = range.begin; e < range.end; ++e) written[e] = true;
  }
  // The batch's ratings of the row element e belongs to.
  const ModelLayout& layout = model->layout();
  auto RatingsOf = [&](uint64_t e) {
    int row_kind = 0;  // 0 user, 1 item
    uint64_t row = 0;
    if (e < layout.Find("item_factors")->offset) {
      row = e / kRank;
    } else if (e < layout.Find("user_bias")->offset) {
      row_kind = 1;
      row = (e - layout.Find("item_factors")->offset) / kRank;
    } else if (e < layout.Find("item_bias")->offset) {
      row = e - layout.Find("user_bias")->offset;
    } else {
      row_kind = 1;
      row = e - layout.Find("item_bias")->offset;
    }
    int count = 0;
    for (Eigen::Index j = 0; j < batch.features.cols(); ++j) {
      count += static_cast<uint64_t>(batch.features(row_kind, j)) == row;
    }
    return count;
  };
  const double h = 1e-3;
  for (uint64_t e = 0; e < n; ++e) {
    std::vector<float> plus = params, minus = params;
    plus[e] += static_cast<float>(h);
    minus[e] -= static_cast<float>(h);
    const double numeric = (Objective(plus, model->layout(), kRank, kL2,
                                      batch.features, batch.labels) -
                            Objective(minus, model->layout(), kRank, kL2,
                                      batch.features, batch.labels)) /
                           (2 * h);
    if (written[e]) {
      // A row's gradient is the mean over its own ratings: the batch
      // mean's scaled by batch size / the row's ratings in the batch.
      const double expected = numeric * batch.labels.size() / RatingsOf(e);
      EXPECT_NEAR(grad[e], expected, 2e-3 + 2e-3 * std::abs(expected))
          << "element " << e;
    } else {
      // Not a row of the batch: no gradient, and left untouched.
      EXPECT_NEAR(numeric, 0, 1e-6) << "element " << e;
      EXPECT_EQ(grad[e], 123.0f) << "element " << e;
    }
  }
  // The rows are those of the batch: users 0..3 and items 0..2; users
  // 4..6 and items 3..4 are not touched.
  const uint64_t user_bias = model->layout().Find("user_bias")->offset;
  EXPECT_FALSE(written[user_bias + 5]);
}

TEST(MatrixFactorizationTest, RefusesRatingsThatAreNotItsOwn) {
  std::unique_ptr<Model> model = BuildMf(7, 5, 3, 0.1);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(1, params);
  std::vector<float> grad(params.size());
  for (const auto& [user, item, rating] :
       std::vector<std::tuple<float, float, uint8_t>>{
           {7, 0, 3},     // user out of range
           {0, 5, 3},     // item out of range
           {1.5f, 0, 3},  // not an index
           {-1, 0, 3},    // negative
           {std::numeric_limits<float>::quiet_NaN(), 0, 3},
           {0, 0, 0},     // rating below 1
           {0, 0, 6}}) {  // above 5
    Eigen::MatrixXf features(2, 1);
    features << user, item;
    const std::vector<uint8_t> labels = {rating};
    EXPECT_TRUE(
        std::isnan(model->LossAndGradient(params, features, labels, grad)));
    EXPECT_TRUE(model->SparseRows()->empty());
  }
  Result<std::unique_ptr<Model>> bad =
      MakeMatrixFactorization(MfConfig(0, 0.1), 7, 5);
  EXPECT_FALSE(bad.ok());
  bad = MakeMatrixFactorization(MfConfig(3, -1), 7, 5);
  EXPECT_FALSE(bad.ok());
  bad = MakeMatrixFactorization(MfConfig(3, 0.1), 0, 5);
  EXPECT_FALSE(bad.ok());
  // MakeModel needs the matrix's dimensions, which only the job has.
  EXPECT_FALSE(MakeModel(MfConfig(3, 0.1), 2, 6).ok());
}

TEST(MatrixFactorizationTest, SparseStepMovesOnlyTheRangesItIsGiven) {
  pb::OptimizerConfig config;
  config.set_learning_rate(0.5);
  config.set_momentum(0.9);
  SgdOptimizer optimizer(config, 10);
  std::vector<float> params(10, 1.0f);
  const std::vector<float> grad(10, 2.0f);
  optimizer.Step(params, grad, {{1, 3}, {7, 8}});
  for (int e = 0; e < 10; ++e) {
    const bool moved = (e >= 1 && e < 3) || e == 7;
    EXPECT_FLOAT_EQ(params[e], moved ? 0.0f : 1.0f) << e;
  }
  EXPECT_EQ(optimizer.steps(), 1u);
  // Momentum applies to those elements alone: element 1 moves by lr *
  // (0.9 * 2 + 2), element 4 (no velocity yet) by lr * 2.
  optimizer.Step(params, grad, {{1, 2}, {4, 5}});
  EXPECT_FLOAT_EQ(params[1], 0.0f - 0.5f * 3.8f);
  EXPECT_FLOAT_EQ(params[4], 1.0f - 0.5f * 2.0f);
  EXPECT_FLOAT_EQ(params[2], 0.0f);
  // A range outside the parameters refuses the step.
  optimizer.Step(params, grad, {{9, 11}});
  EXPECT_EQ(optimizer.steps(), 2u);
  EXPECT_FLOAT_EQ(params[9], 1.0f);
}

TEST(MatrixFactorizationTest, EvaluatesRmseOnClampedPredictions) {
  std::unique_ptr<Model> model = BuildMf(3, 2, 2, 0);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements(), 0.0f);
  const uint64_t item_bias = model->layout().Find("item_bias")->offset;
  params[item_bias + 1] = 9.0f;  // item 1 predicted 3 + 9, clamped to 5
  Dataset data;
  data.features.resize(2, 3);
  data.features << 0, 1, 2,  //
      0, 0, 1;
  data.labels = {3, 4, 5};  // errors 0, -1, 0
  const EvalResult result = model->Evaluate(params, data);
  EXPECT_EQ(result.samples, 3u);
  EXPECT_NEAR(result.loss, 1.0 / 3, 1e-9);
  EXPECT_NEAR(result.metric, std::sqrt(1.0 / 3), 1e-9);
  EXPECT_NEAR(result.accuracy, 2.0 / 3, 1e-9);
  std::vector<uint8_t> correct;
  model->EvaluateSamples(params, data, &correct);
  EXPECT_EQ(correct, (std::vector<uint8_t>{1, 0, 1}));
  data.features(0, 2) = 3;  // no such user
  EXPECT_TRUE(std::isnan(model->Evaluate(params, data).metric));
}

TEST(MatrixFactorizationTest, SgdOnGeneratedRatingsLearnsThePlantedStructure) {
  pb::RatingsConfig matrix = SmallMatrix();
  Result<RawData> raw = GenerateRatings(matrix);
  ASSERT_OK(raw);
  const Dataset train = MakeTrainDataset(*raw, {}, pb::STANDARDIZE);
  const Dataset test = MakeTestDataset(*raw, pb::STANDARDIZE);
  std::unique_ptr<Model> model =
      BuildMf(matrix.users(), matrix.items(), 8, 0.02);
  ASSERT_NE(model, nullptr);
  std::vector<float> params(model->layout().num_elements());
  model->Initialize(1, params);
  std::vector<float> grad(params.size());
  pb::OptimizerConfig config;
  config.set_learning_rate(0.05);
  config.set_momentum(0);
  SgdOptimizer optimizer(config, params.size());
  const double before = model->Evaluate(params, test).metric;
  constexpr int kBatch = 32;
  Eigen::MatrixXf features(2, kBatch);
  std::vector<uint8_t> labels(kBatch);
  std::mt19937_64 rng(3);
  for (int step = 0; step < 40 * static_cast<int>(train.size()) / kBatch;
       ++step) {
    for (int j = 0; j < kBatch; ++j) {
      const auto k = static_cast<Eigen::Index>(rng() % train.size());
      features.col(j) = train.features.col(k);
      labels[static_cast<size_t>(j)] = train.labels[static_cast<size_t>(k)];
    }
    ASSERT_TRUE(
        std::isfinite(model->LossAndGradient(params, features, labels, grad)));
    optimizer.Step(params, grad, *model->SparseRows());
  }
  const double after = model->Evaluate(params, test).metric;
  // A model of the mean alone scores the ratings' spread (about 1.1); the
  // planted structure plus noise 0.3 and rounding leaves about 0.4.
  EXPECT_GT(before, 1.0);
  EXPECT_LT(after, 0.85) << "before " << before;
}

}  // namespace
}  // namespace meridian
