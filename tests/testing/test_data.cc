#include "testing/test_data.h"

#include <google/protobuf/text_format.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <vector>

#include "meridian/train/dataset.h"

namespace meridian::testing {
namespace {

constexpr int kClasses = 10;

void Generate(uint32_t count, const std::vector<std::vector<float>>& prototypes,
              const SyntheticDataOptions& options, std::mt19937_64& rng,
              IdxImages* images, std::vector<uint8_t>* labels) {
  images->count = count;
  images->rows = options.rows;
  images->cols = options.cols;
  const uint32_t dim = options.rows * options.cols;
  images->pixels.resize(static_cast<size_t>(count) * dim);
  labels->resize(count);
  std::normal_distribution<double> noise(0.0, options.noise);
  for (uint32_t i = 0; i < count; ++i) {
    const auto label = static_cast<uint8_t>(i % kClasses);
    (*labels)[i] = label;
    for (uint32_t p = 0; p < dim; ++p) {
      const double value = prototypes[label][p] + noise(rng);
      images->pixels[static_cast<size_t>(i) * dim + p] =
          static_cast<uint8_t>(std::clamp(value, 0.0, 255.0));
    }
  }
}

std::atomic<bool (*)()> remove_temp_dirs_if{nullptr};

// The directories MakeTempDir made in this process, removed when the
// process exits unless MERIDIAN_KEEP_TEST_DIRS is set or the check set by
// SetTempDirCleanupCheck says no (a failed test's files are kept for its
// reader). Only the process that made them removes them: a child forked
// by a test that exits normally must not delete its parent's files. A
// full `tools/test` run makes several thousand directories; without this
// they piled up in /tmp, gigabytes a day.
class TempDirRegistry {
 public:
  static TempDirRegistry& Get() {
    static TempDirRegistry registry;
    return registry;
  }
  void Add(std::string dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(std::move(dir));
  }
  ~TempDirRegistry() {
    if (::getpid() != owner_) return;
    if (std::getenv("MERIDIAN_KEEP_TEST_DIRS") != nullptr) return;
    const auto check = remove_temp_dirs_if.load();
    if (check != nullptr && !check()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const std::string& dir : dirs_) {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  }

 private:
  TempDirRegistry() : owner_(::getpid()) {}
  const pid_t owner_;
  std::mutex mutex_;
  std::vector<std::string> dirs_;
};

}  // namespace

Status WriteSyntheticIdx(const std::string& dir,
                         const SyntheticDataOptions& options) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return InvalidArgumentError("cannot create " + dir);
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> pixel(0.0, 255.0);
  const uint32_t dim = options.rows * options.cols;
  std::vector<std::vector<float>> prototypes(kClasses, std::vector<float>(dim));
  for (auto& prototype : prototypes) {
    for (float& p : prototype) p = static_cast<float>(pixel(rng));
  }
  IdxImages images;
  std::vector<uint8_t> labels;
  Generate(options.train_samples, prototypes, options, rng, &images, &labels);
  MERIDIAN_RETURN_IF_ERROR(
      WriteIdxImages(dir + "/train-images-idx3-ubyte.gz", images));
  MERIDIAN_RETURN_IF_ERROR(
      WriteIdxLabels(dir + "/train-labels-idx1-ubyte.gz", labels));
  Generate(options.test_samples, prototypes, options, rng, &images, &labels);
  MERIDIAN_RETURN_IF_ERROR(
      WriteIdxImages(dir + "/t10k-images-idx3-ubyte.gz", images));
  return WriteIdxLabels(dir + "/t10k-labels-idx1-ubyte.gz", labels);
}

void SetTempDirCleanupCheck(bool (*remove_if)()) {
  remove_temp_dirs_if.store(remove_if);
}

std::string MakeTempDir(const std::string& prefix) {
  static std::atomic<int> counter{0};
  const char* base = std::getenv("TEST_TMPDIR");
  std::string root = base != nullptr ? base : "/tmp";
  std::string templ = root + "/" + prefix + "-" +
                      std::to_string(counter.fetch_add(1)) + "-XXXXXX";
  std::vector<char> buffer(templ.begin(), templ.end());
  buffer.push_back('\0');
  const char* made = ::mkdtemp(buffer.data());
  if (made == nullptr) return templ;
  TempDirRegistry::Get().Add(made);
  return made;
}

pb::JobConfig SmallJob(const std::string& data_dir, uint32_t workers,
                       uint32_t hidden) {
  pb::JobConfig job;
  job.set_name("small");
  job.set_seed(3);
  job.set_time_budget_s(60);
  pb::SiteConfig* site = job.add_site();
  site->set_name("site-a");
  site->set_address("tcp://127.0.0.1:0");
  site->add_workers()->set_count(workers);
  job.mutable_model()->set_kind(pb::MLP);
  job.mutable_model()->add_hidden(hidden);
  job.mutable_data()->set_dir(data_dir);
  job.mutable_optimizer()->set_learning_rate(0.05);
  job.mutable_optimizer()->set_momentum(0.9);
  job.mutable_optimizer()->set_batch_size(32);
  job.mutable_server()->set_eval_period_s(0.5);
  job.mutable_server()->set_join_timeout_s(30);
  job.mutable_policy()->set_kind(pb::ASYNC);
  return job;
}

Status WriteJobFile(const pb::JobConfig& job, const std::string& path) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(job, &text)) {
    return InternalError("cannot print the job");
  }
  std::ofstream out(path);
  out << text;
  return out ? Status::Ok() : InvalidArgumentError("cannot write " + path);
}

}  // namespace meridian::testing
