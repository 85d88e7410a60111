// What the model tests share: building a model on each kernel set and
// random batches.
#ifndef MERIDIAN_TESTS_TRAIN_MODEL_TEST_UTIL_H_
#define MERIDIAN_TESTS_TRAIN_MODEL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#include "meridian/train/model.h"
#include "train/kernels.h"
#include "testing/status_matchers.h"

namespace meridian::testing {

// The kernel sets this CPU runs, portable first.
inline std::vector<kernels::Isa> CpuIsas() {
  std::vector<kernels::Isa> isas;
  for (kernels::Isa isa :
       {kernels::Isa::kPortable, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    if (isa <= kernels::CpuIsa()) isas.push_back(isa);
  }
  return isas;
}

// Builds a model on the kernels of `isa` (through the switches
// kernels::WantedIsa() reads: MERIDIAN_NO_SIMD, MERIDIAN_NO_AVX512). Null
// (and a test failure) when MakeModel refuses the config.
inline std::unique_ptr<Model> Build(const pb::ModelConfig& config,
                                    int input_dim, int num_classes,
                                    kernels::Isa isa = kernels::CpuIsa()) {
  if (isa == kernels::Isa::kPortable) setenv("MERIDIAN_NO_SIMD", "1", 1);
  if (isa == kernels::Isa::kAvx2) setenv("MERIDIAN_NO_AVX512", "1", 1);
  Result<std::unique_ptr<Model>> model =
      MakeModel(config, input_dim, num_classes);
  unsetenv("MERIDIAN_NO_SIMD");
  unsetenv("MERIDIAN_NO_AVX512");
  EXPECT_OK(model);
  return model.ok() ? std::move(model).value() : nullptr;
}

struct Batch {
  Eigen::MatrixXf features;
  std::vector<uint8_t> labels;
};

// Standard-normal features and uniform labels, deterministic in `seed`.
inline Batch RandomBatch(int input_dim, int size, int num_classes,
                         uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Batch batch;
  batch.features.resize(input_dim, size);
  for (int j = 0; j < size; ++j) {
    for (int i = 0; i < input_dim; ++i) batch.features(i, j) = normal(rng);
    batch.labels.push_back(static_cast<uint8_t>(rng() % num_classes));
  }
  return batch;
}

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_TRAIN_MODEL_TEST_UTIL_H_
