// Small generated data sets and jobs for tests and benchmarks: no Debian
// package needed, seconds to train.
#ifndef MERIDIAN_TESTS_TESTING_TEST_DATA_H_
#define MERIDIAN_TESTS_TESTING_TEST_DATA_H_

#include <cstdint>
#include <string>

#include "meridian/job.pb.h"
#include "meridian/core/status.h"

namespace meridian::testing {

struct SyntheticDataOptions {
  uint32_t train_samples = 6000;
  uint32_t test_samples = 1000;
  uint32_t rows = 28;
  uint32_t cols = 28;
  // Pixel noise around each class's prototype image; larger is harder.
  double noise = 60.0;
  uint64_t seed = 7;
};

// Writes Fashion-MNIST-shaped gzip IDX files (train-images-idx3-ubyte.gz,
// train-labels-idx1-ubyte.gz, t10k-...) into `dir` (created if needed):
// 10 classes, each a random prototype image plus noise, so that a linear
// model can learn it but not in one step.
Status WriteSyntheticIdx(const std::string& dir,
                         const SyntheticDataOptions& options = {});

// A fresh directory under $TEST_TMPDIR (or /tmp), unique per call; it and
// everything in it are removed when the process that made it exits
// normally, unless MERIDIAN_KEEP_TEST_DIRS is set or the cleanup check
// returns false. Thread-safe.
std::string MakeTempDir(const std::string& prefix);

// The check run at exit before MakeTempDir's directories are removed
// (nullptr: always remove). Test binaries set "every test passed"
// (temp_dirs_gtest.cc), so a failed test's files stay for its reader.
void SetTempDirCleanupCheck(bool (*remove_if)());

// A one-site job over the data in `data_dir`: `workers` workers, an MLP
// with one hidden layer of `hidden` units, asynchronous, short eval period.
pb::JobConfig SmallJob(const std::string& data_dir, uint32_t workers,
                       uint32_t hidden = 32);

// Writes `job` as text format to `path`.
Status WriteJobFile(const pb::JobConfig& job, const std::string& path);

}  // namespace meridian::testing

#endif  // MERIDIAN_TESTS_TESTING_TEST_DATA_H_
