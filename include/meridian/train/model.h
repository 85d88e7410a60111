// Models: a set of named dense tensors laid end to end in one flat float
// vector (the "key space" that shards, wire slices and updates address),
// plus forward/backward passes in Eigen.
#ifndef MERIDIAN_TRAIN_MODEL_H_
#define MERIDIAN_TRAIN_MODEL_H_

#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/config/config.h"
#include "meridian/job.pb.h"
#include "meridian/core/layout.h"
#include "meridian/core/status.h"

namespace meridian {

struct Dataset;

// Loss and accuracy of a model on a data set.
struct EvalResult {
  double loss = 0;      // mean cross-entropy (nats); MSE for regression
  double accuracy = 0;  // fraction of samples classified correctly
  uint64_t samples = 0;
  // The model's metric (Model::metric()): accuracy for classifiers, RMSE
  // for matrix factorisation.
  double metric = 0;
};

// What a model is judged by: its name in reports and plots and which way
// is better.
struct MetricSpec {
  std::string name = "accuracy";
  bool higher_is_better = true;

  // Whether `value` reaches `target` (>= when higher is better, else <=).
  bool Reached(double value, double target) const {
    return higher_is_better ? value >= target : value <= target;
  }
};

// Elements [begin, end) of a model's flat parameter vector.
struct ElementRange {
  uint64_t begin = 0;
  uint64_t end = 0;
};

// A classifier over column-sample features. Instances hold scratch buffers:
// not thread-safe, use one per thread. Parameters live outside the model in
// a flat vector of layout().num_elements() floats.
class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelLayout& layout() const = 0;
  virtual int input_dim() const = 0;
  virtual int num_classes() const = 0;
  virtual MetricSpec metric() const { return MetricSpec{}; }

  // Models whose gradient touches a few rows of big tensors (matrix
  // factorisation's user and item rows) return the element ranges the last
  // LossAndGradient wrote, ascending and disjoint; LossAndGradient then
  // writes only those ranges of `grad` and leaves the rest as it was, and
  // callers step and commit those ranges alone. nullptr: dense (every
  // element of `grad` is written).
  virtual const std::vector<ElementRange>* SparseRows() const {
    return nullptr;
  }

  // Sparse models: the element ranges a LossAndGradient on these samples
  // would write (what SparseRows would then report), ascending and
  // disjoint; samples that are not the model's are skipped. Dense models:
  // none. A worker asks its server for these rows of its next batches.
  virtual void SampleRows(const Eigen::Ref<const Eigen::MatrixXf>& /*features*/,
                          std::vector<ElementRange>* ranges) const {
    ranges->clear();
  }

  // Writes initial parameters (He-uniform for ReLU layers, Glorot-uniform
  // for the output layer, zero biases). Deterministic in `seed`. A `params`
  // of the wrong size is filled with NaN instead.
  virtual void Initialize(uint64_t seed, std::span<float> params) const = 0;

  // Mean cross-entropy over the batch at `params`; writes its gradient with
  // respect to every parameter into `grad` (overwritten, same size as
  // params). `features` is input_dim() x batch (one column per sample);
  // labels has one entry per column, each < num_classes(). When any of
  // this does not hold, returns NaN and zeroes `grad`. Scratch buffers grow
  // to the largest batch seen and are reused (on the SIMD kernels a step
  // then allocates nothing).
  virtual float LossAndGradient(
      std::span<const float> params,
      const Eigen::Ref<const Eigen::MatrixXf>& features,
      std::span<const uint8_t> labels, std::span<float> grad) = 0;

  // Mean loss and accuracy on the first `max_samples` samples of `data`
  // (all when 0), processed in chunks to bound memory. loss is NaN when the
  // data does not fit the model (rows != input_dim(), label too large).
  EvalResult Evaluate(std::span<const float> params, const Dataset& data,
                      uint64_t max_samples = 0) {
    return EvaluateInto(params, data, max_samples, nullptr);
  }

  // Writes the state that is not trained by gradient (BatchNorm's running
  // statistics) as the last LossAndGradient computed it into `params`.
  // Call after the optimizer step of that batch, so the step does not
  // touch it; a no-op for models without such state, when no training pass
  // preceded, or for a `params` of the wrong size.
  virtual void ApplyStateUpdate(std::span<float> /*params*/) {}

  // Restarts the stream of random numbers training draws (dropout masks)
  // from `seed`; models that draw none ignore it. Models start from a fixed
  // seed, so two instances draw the same masks unless seeded apart.
  virtual void SeedRandom(uint64_t /*seed*/) {}

  // Evaluate over all of `data`, also writing per sample whether it was
  // classified correctly (1) or not (0) into `correct` (resized to the
  // samples evaluated; empty when the data does not fit the model). For
  // paired comparisons of two models on the same samples.
  EvalResult EvaluateSamples(std::span<const float> params, const Dataset& data,
                             std::vector<uint8_t>* correct) {
    return EvaluateInto(params, data, 0, correct);
  }

 protected:
  // Both of the above: the first `max_samples` (all when 0), per-sample
  // correctness into `correct` when not null.
  virtual EvalResult EvaluateInto(std::span<const float> params,
                                  const Dataset& data, uint64_t max_samples,
                                  std::vector<uint8_t>* correct) = 0;
};

// Builds the model the config describes:
//  - SOFTMAX (no hidden layers) or MLP with config.hidden() ReLU layers.
//    Tensor names are "fc<i>.weight" ([out, in]) and "fc<i>.bias" ([out]).
//  - CNN: config.layers() or config.preset() over input_channels square
//    images, then a dense layer to the classes. Tensors are named by layer
//    index: "conv<i>.weight" [out, in, k, k], "conv<i>.bias", "bn<i>.weight",
//    "bn<i>.bias", "bn<i>.running_mean", "bn<i>.running_var", "gn<i>.weight",
//    "gn<i>.bias", "fc<i>.weight" [out, in (C, H, W flattened)],
//    "fc<i>.bias".
// InvalidArgument naming the field for a config that does not describe a
// model of this input (e.g. SOFTMAX with hidden layers, a window larger than
// its input, groups that do not divide the channels), input_dim <= 0,
// num_classes outside [1, 256] or more than 2^30 parameters. The products
// run on AVX-512 or AVX2/FMA kernels when the CPU has them (checked at run
// time) and on Eigen otherwise; for the models built while it is set,
// MERIDIAN_NO_SIMD=1 in the environment forces the Eigen path and
// MERIDIAN_NO_AVX512=1 stops at AVX2. Models run on one thread.
Result<std::unique_ptr<Model>> MakeModel(const pb::ModelConfig& config,
                                         int input_dim, int num_classes);

// The kernels models built now would run on: "avx512", "avx2" or
// "portable" (the CPU and the two variables above decide). For logs and
// benchmark reports, so that a speed is read next to what produced it.
const char* ModelKernels();

// MATRIX_FACTORIZATION over a users x items rating matrix (config.rank
// factors, config.l2). Tensors: "user_factors" [users, rank],
// "item_factors" [items, rank], "user_bias" [users], "item_bias" [items];
// predictions are 3 + b_u + b_i + u . v (no global bias: see mf.cc). Its
// samples are ratings: a feature column is (user,
// item) as exact floats, the label the rating (1..5). Its metric is RMSE
// (predictions clamped to [1, 5]); accuracy is the share of ratings the
// rounded prediction hits exactly. InvalidArgument for users or items
// outside [1, 2^24], rank outside [1, 1024], l2 negative or not finite.
Result<std::unique_ptr<Model>> MakeMatrixFactorization(
    const pb::ModelConfig& config, uint32_t users, uint32_t items);

// The metric of the models `config` builds (Model::metric() without
// building one): rmse for MATRIX_FACTORIZATION, else accuracy.
MetricSpec ModelMetric(const pb::ModelConfig& config);

// The job's model for its data: MakeMatrixFactorization over
// job.data().ratings() for MATRIX_FACTORIZATION, else MakeModel(job.model(),
// input_dim, num_classes).
Result<std::unique_ptr<Model>> MakeJobModel(const pb::JobConfig& job,
                                            int input_dim, int num_classes);

// A model that computes each LossAndGradient on replicas.size() threads:
// the batch is split into contiguous column slices, one per replica (each
// with its own scratch buffers), and the slices' gradients and losses are
// combined as their sample-weighted mean, which is the whole batch's for
// per-sample losses. As in PyTorch's DataParallel without SyncBatchNorm,
// BatchNorm normalises each slice by the slice's own statistics and the
// running statistics ApplyStateUpdate writes are the first slice's. A slice
// holds at least kMinSliceSamples samples: small batches use fewer
// threads. Replicas are seeded apart (SeedRandom). Evaluation runs on the
// first replica. The threads live as long as the model; the model itself is
// not thread-safe (one caller at a time). InvalidArgument for no replicas,
// more than kMaxWorkerThreads, replicas of different layouts or inputs, or
// a sparse model (SparseRows:
// matrix factorisation's per-row steps run on one thread).
inline constexpr int64_t kMinSliceSamples = 4;
Result<std::unique_ptr<Model>> MakeParallelModel(
    std::vector<std::unique_ptr<Model>> replicas);

// MakeJobModel on `threads` threads: the model itself for 1, else
// MakeParallelModel over that many instances. InvalidArgument for threads
// outside [1, kMaxWorkerThreads] and as the two above.
Result<std::unique_ptr<Model>> MakeJobModelOnThreads(const pb::JobConfig& job,
                                                     int input_dim,
                                                     int num_classes,
                                                     int threads);

// The CNN presets (model.preset) and the layers each stands for.
std::vector<std::string> CnnPresetNames();
Result<std::vector<pb::LayerConfig>> CnnPresetLayers(const std::string& name);

}  // namespace meridian

#endif  // MERIDIAN_TRAIN_MODEL_H_
