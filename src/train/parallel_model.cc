// MakeParallelModel: one training step of a dense model on several
// threads, by splitting the batch (data parallelism inside a worker).

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "meridian/train/model.h"
#include "meridian/core/mutex.h"
#include "meridian/core/thread_annotations.h"

namespace meridian {
namespace {

// Threads that run one function over indices [0, count) and wait for all
// of them: index 0 on the caller, index i on thread i - 1. Steps last
// milliseconds, so the threads stay up between them. Run is called by one
// thread at a time.
class StepThreads {
 public:
  explicit StepThreads(int extra) {
    threads_.reserve(static_cast<size_t>(extra));
    for (int i = 0; i < extra; ++i) {
      threads_.emplace_back([this, i] { Loop(i + 1); });
    }
  }

  ~StepThreads() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (auto& thread : threads_) thread.join();
  }

  StepThreads(const StepThreads&) = delete;
  StepThreads& operator=(const StepThreads&) = delete;

  // Runs fn(i) for every i in [0, count), count <= threads + 1.
  void Run(int count, const std::function<void(int)>& fn) EXCLUDES(mu_) {
    count = std::clamp(count, 1, static_cast<int>(threads_.size()) + 1);
    if (count > 1) {
      {
        MutexLock lock(&mu_);
        fn_ = &fn;
        count_ = count;
        pending_ = count - 1;
        ++generation_;
      }
      start_.notify_all();
    }
    fn(0);
    if (count > 1) {
      mu_.lock();
      while (pending_ > 0) done_.wait(mu_);
      fn_ = nullptr;
      mu_.unlock();
    }
  }

 private:
  void Loop(int index) EXCLUDES(mu_) {
    uint64_t seen = 0;
    mu_.lock();
    while (true) {
      while (!stop_ && generation_ == seen) start_.wait(mu_);
      if (stop_) break;
      seen = generation_;
      if (index >= count_) continue;
      const std::function<void(int)>* fn = fn_;
      mu_.unlock();
      (*fn)(index);
      mu_.lock();
      if (--pending_ == 0) done_.notify_one();
    }
    mu_.unlock();
  }

  Mutex mu_;
  std::condition_variable_any start_;  // a new generation or stop
  std::condition_variable_any done_;   // pending_ reached 0
  const std::function<void(int)>* fn_ GUARDED_BY(mu_) = nullptr;
  int count_ GUARDED_BY(mu_) = 0;
  int pending_ GUARDED_BY(mu_) = 0;
  uint64_t generation_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Seeds replica i's random stream apart from the others'.
constexpr uint64_t kReplicaSeedStride = 0x9e3779b97f4a7c15ULL;

class ParallelModel final : public Model {
 public:
  explicit ParallelModel(std::vector<std::unique_ptr<Model>> replicas)
      : replicas_(std::move(replicas)),
        slice_grads_(replicas_.size()),
        slice_losses_(replicas_.size()),
        slice_weights_(replicas_.size()),
        threads_(static_cast<int>(replicas_.size()) - 1) {
    SeedRandom(0);
  }

  const ModelLayout& layout() const override { return replicas_[0]->layout(); }
  int input_dim() const override { return replicas_[0]->input_dim(); }
  int num_classes() const override { return replicas_[0]->num_classes(); }
  MetricSpec metric() const override { return replicas_[0]->metric(); }

  void Initialize(uint64_t seed, std::span<float> params) const override {
    replicas_[0]->Initialize(seed, params);
  }

  void SeedRandom(uint64_t seed) override {
    for (size_t i = 0; i < replicas_.size(); ++i) {
      replicas_[i]->SeedRandom(seed + i * kReplicaSeedStride);
    }
  }

  float LossAndGradient(std::span<const float> params,
                        const Eigen::Ref<const Eigen::MatrixXf>& features,
                        std::span<const uint8_t> labels,
                        std::span<float> grad) override {
    const int64_t n = features.cols();
    const int64_t slices = std::clamp<int64_t>(
        n / kMinSliceSamples, 1, static_cast<int64_t>(replicas_.size()));
    // Invalid input (the replica's checks answer it: NaN and a zeroed
    // gradient) and batches too small to split run on one thread.
    if (slices == 1 || labels.size() != static_cast<size_t>(n) ||
        grad.size() != params.size()) {
      return replicas_[0]->LossAndGradient(params, features, labels, grad);
    }
    for (int64_t i = 1; i < slices; ++i) {
      slice_grads_[static_cast<size_t>(i)].resize(grad.size());
    }
    threads_.Run(static_cast<int>(slices), [&](int i) {
      const int64_t begin = n * i / slices;
      const int64_t end = n * (i + 1) / slices;
      std::span<float> out =
          i == 0 ? grad
                 : std::span<float>(slice_grads_[static_cast<size_t>(i)]);
      slice_losses_[static_cast<size_t>(i)] =
          replicas_[static_cast<size_t>(i)]->LossAndGradient(
              params, features.middleCols(begin, end - begin),
              labels.subspan(static_cast<size_t>(begin),
                             static_cast<size_t>(end - begin)),
              out);
      slice_weights_[static_cast<size_t>(i)] =
          static_cast<float>(end - begin) / static_cast<float>(n);
    });
    // grad = sum of weight_i * grad_i, each thread over its own share of
    // the elements.
    const int64_t size = static_cast<int64_t>(grad.size());
    threads_.Run(static_cast<int>(slices), [&](int t) {
      const int64_t begin = size * t / slices;
      const int64_t end = size * (t + 1) / slices;
      Eigen::Map<Eigen::VectorXf> sum(grad.data() + begin, end - begin);
      sum *= slice_weights_[0];
      for (int64_t i = 1; i < slices; ++i) {
        sum += slice_weights_[static_cast<size_t>(i)] *
               Eigen::Map<const Eigen::VectorXf>(
                   slice_grads_[static_cast<size_t>(i)].data() + begin,
                   end - begin);
      }
    });
    double loss = 0;
    for (int64_t i = 0; i < slices; ++i) {
      loss += static_cast<double>(slice_weights_[static_cast<size_t>(i)]) *
              slice_losses_[static_cast<size_t>(i)];
    }
    return static_cast<float>(loss);
  }

  void ApplyStateUpdate(std::span<float> params) override {
    replicas_[0]->ApplyStateUpdate(params);
  }

 private:
  EvalResult EvaluateInto(std::span<const float> params, const Dataset& data,
                          uint64_t max_samples,
                          std::vector<uint8_t>* correct) override {
    if (correct != nullptr) {
      return replicas_[0]->EvaluateSamples(params, data, correct);
    }
    return replicas_[0]->Evaluate(params, data, max_samples);
  }

  std::vector<std::unique_ptr<Model>> replicas_;
  // Per slice (index 0 unused: the first slice writes the caller's grad).
  std::vector<std::vector<float>> slice_grads_;
  std::vector<float> slice_losses_;
  std::vector<float> slice_weights_;
  StepThreads threads_;
};

}  // namespace

Result<std::unique_ptr<Model>> MakeParallelModel(
    std::vector<std::unique_ptr<Model>> replicas) {
  if (replicas.empty()) {
    return InvalidArgumentError("a parallel model needs at least one replica");
  }
  for (const auto& replica : replicas) {
    if (replica == nullptr) {
      return InvalidArgumentError("a parallel model's replica is null");
    }
  }
  if (replicas.size() == 1) return std::move(replicas[0]);
  for (const auto& replica : replicas) {
    if (replica->SparseRows() != nullptr) {
      return InvalidArgumentError(
          "a sparse model (matrix factorisation) trains on one thread");
    }
    if (replica->layout().num_elements() !=
            replicas[0]->layout().num_elements() ||
        replica->input_dim() != replicas[0]->input_dim() ||
        replica->num_classes() != replicas[0]->num_classes()) {
      return InvalidArgumentError(
          "a parallel model's replicas differ in layout or input");
    }
  }
  if (replicas.size() > static_cast<size_t>(kMaxWorkerThreads)) {
    return InvalidArgumentError("a parallel model runs on at most " +
                                std::to_string(kMaxWorkerThreads) +
                                " threads, got " +
                                std::to_string(replicas.size()));
  }
  return std::unique_ptr<Model>(new ParallelModel(std::move(replicas)));
}

Result<std::unique_ptr<Model>> MakeJobModelOnThreads(const pb::JobConfig& job,
                                                     int input_dim,
                                                     int num_classes,
                                                     int threads) {
  if (threads < 1 || threads > kMaxWorkerThreads) {
    return InvalidArgumentError("threads must be in [1, " +
                                std::to_string(kMaxWorkerThreads) + "], got " +
                                std::to_string(threads));
  }
  if (threads == 1) return MakeJobModel(job, input_dim, num_classes);
  std::vector<std::unique_ptr<Model>> replicas;
  for (int i = 0; i < threads; ++i) {
    MERIDIAN_ASSIGN_OR_RETURN(auto model,
                              MakeJobModel(job, input_dim, num_classes));
    replicas.push_back(std::move(model));
  }
  return MakeParallelModel(std::move(replicas));
}

}  // namespace meridian
