// Micro-benchmarks of the hot paths of one site, each next to its ceiling:
//
//   BM_Memcpy                  memcpy of 1 MiB: the ceiling of an apply
//   BM_ApplyUpdate/plain       ParameterStore::Apply of a 1 MiB update
//   BM_ApplyUpdate/momentum    the same with server momentum 0.9
//   BM_TakeSignificant/<pct>   Gaia's significance filter over 1 MiB of
//                              accumulator, <pct>% of its rows significant
//   BM_GradientStep            one worker step of a 784-256-10 MLP, batch 64
//   BM_KeepAnsweredCommit      what a worker spends per commit keeping it
//                              for a replay (same MLP): a small fraction
//                              of a step
//   ModelStep/<model>/batch:B  one step of each CNN preset, the MLP and
//                              matrix factorisation (mf), for workload_speed
//   BM_ZmqRawRoundTrip         1 MiB each way over a raw DEALER/ROUTER pair:
//                              the ceiling of a commit/pull round trip
//   BM_CommitPullRoundTrip     COMMIT + MODEL of a ~1 MiB model through a
//                              real SiteServer, this process as its worker
//   BM_ZmqCurveRoundTrip       BM_ZmqRawRoundTrip over CURVE (encrypted and
//                              authenticated, as links between sites are):
//                              its ratio to the raw one is CURVE's overhead
//
// After Google Benchmark's console output, main() prints a markdown table
// of each hot path against its ceiling and goal. Goals never change the exit
// status: it is 0 unless a benchmark failed to run.
//
// All benchmarks measure wall time (UseRealTime): round trips spend most of
// their time waiting for other threads, so CPU time would flatter them.

#include <benchmark/benchmark.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "bench_util.h"
#include "meridian/train/dataset.h"
#include "meridian/job.pb.h"
#include "meridian/core/layout.h"
#include "meridian/core/log.h"
#include "meridian/net/message.h"
#include "meridian/train/model.h"
#include "meridian/train/optimizer.h"
#include "meridian/ps/param_store.h"
#include "meridian/report.pb.h"
#include "meridian/net/security.h"
#include "meridian/site/site_server.h"
#include "meridian/core/status.h"
#include "meridian/sync/sync.h"
#include "meridian/net/transport.h"
#include "meridian/wire.pb.h"
#include "testing/test_data.h"
#include "worker/undurable_commits.h"

namespace meridian {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr uint64_t kUpdateFloats = kMiB / sizeof(float);  // 262144

// Small, finite update values: a long run never overflows the model.
constexpr float kUpdateValue = 1e-6f;

// ---- 1. memcpy: the ceiling of applying an update --------------------------

void BM_Memcpy(benchmark::State& state) {
  std::vector<char> src(kMiB, 1);
  std::vector<char> dst(kMiB, 0);
  for ([[maybe_unused]] auto _ : state) {
    std::memcpy(dst.data(), src.data(), kMiB);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kMiB);
}
BENCHMARK(BM_Memcpy)->UseRealTime();

// ---- 2. ParameterStore::Apply ----------------------------------------------

void BM_ApplyUpdate(benchmark::State& state, double momentum) {
  ModelLayout layout;
  if (Status status = layout.Add("w", {kUpdateFloats}); !status.ok()) {
    state.SkipWithError(status.ToString().c_str());
    return;
  }
  ApplyRule rule;
  rule.rule = pb::MEAN;
  rule.learning_rate = 1.0;
  rule.momentum = momentum;
  rule.workers = 1;
  ParameterStore store(layout, /*num_shards=*/4, rule);
  const std::vector<float> update(kUpdateFloats, kUpdateValue);
  const UpdateSegment segment{0, update};
  for ([[maybe_unused]] auto _ : state) {
    benchmark::DoNotOptimize(store.Apply({&segment, 1}));
  }
  state.SetBytesProcessed(state.iterations() * kMiB);
}
BENCHMARK_CAPTURE(BM_ApplyUpdate, plain, 0.0)->UseRealTime();
BENCHMARK_CAPTURE(BM_ApplyUpdate, momentum, 0.9)->UseRealTime();

// ---- 2b. the significance filter --------------------------------------------

// BM_TakeSignificant/<percent>: Gaia's filter (RELATIVE, theta 0.05) over a
// 1 MiB accumulator whose every entry is non-zero and whose rows of 16
// (matrix factorisation's rows) are significant with probability
// <percent>%, the rest changed by 1% of their weight. A site runs it per
// peer and clock over the whole model. Bytes: the accumulator read (its
// weights are read too), so its ratio to memcpy of 1 MiB is comparable.
void BM_TakeSignificant(benchmark::State& state) {
  constexpr size_t kFloats = kMiB / sizeof(float);
  constexpr size_t kRow = 16;
  const double share = static_cast<double>(state.range(0)) / 100.0;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<float> w(kFloats);
  std::vector<float> fresh(kFloats);
  for (size_t row = 0; row < kFloats; row += kRow) {
    const float change = uniform(rng) < share ? 0.2f : 0.01f;
    for (size_t i = row; i < row + kRow; ++i) {
      w[i] = normal(rng);
      fresh[i] = change * w[i];
    }
  }
  std::vector<float> acc(kFloats);
  std::vector<uint64_t> indices;
  std::vector<float> values;
  indices.reserve(kFloats);
  values.reserve(kFloats);
  for ([[maybe_unused]] auto _ : state) {
    state.PauseTiming();
    std::copy(fresh.begin(), fresh.end(), acc.begin());
    indices.clear();
    values.clear();
    state.ResumeTiming();
    benchmark::DoNotOptimize(
        TakeSignificant(acc, w, 0.05, pb::RELATIVE, 0, &indices, &values));
  }
  state.SetBytesProcessed(state.iterations() * kMiB);
}
BENCHMARK(BM_TakeSignificant)->Arg(0)->Arg(5)->Arg(100)->UseRealTime();

// ---- 3. one worker step ----------------------------------------------------

constexpr int kInputDim = 784;
constexpr int kClasses = 10;
constexpr int kBatch = 64;
// Batches cycled through, so that the step does not run on one memorised
// batch (whose vanishing gradients would not be representative).
constexpr int kBatches = 8;

// A model trained by a step benchmark: its parameters (initialised with
// seed 1), its gradient and its optimizer.
class ModelTrainer {
 public:
  // `made` ready to train; null when it was not made (the benchmark is
  // then skipped with the error).
  static std::unique_ptr<ModelTrainer> Make(
      benchmark::State& state, Result<std::unique_ptr<Model>> made,
      const pb::OptimizerConfig& optimizer) {
    if (!made.ok()) {
      state.SkipWithError(made.status().ToString().c_str());
      return nullptr;
    }
    return std::unique_ptr<ModelTrainer>(
        new ModelTrainer(std::move(made).value(), optimizer));
  }

  // Forward and backward only: the batch's loss, and its gradient kept
  // for nothing.
  float LossAndGradient(const Eigen::MatrixXf& features,
                        const std::vector<uint8_t>& labels) {
    return model_->LossAndGradient(params_, features, labels, grad_);
  }

  // One training step as a worker takes it: forward, backward, the
  // optimizer's step (on the rows the batch touched, for a sparse model)
  // and the model's state update. Returns the batch's loss.
  float Step(const Eigen::MatrixXf& features,
             const std::vector<uint8_t>& labels) {
    const float loss = LossAndGradient(features, labels);
    if (const std::vector<ElementRange>* rows = model_->SparseRows()) {
      optimizer_.Step(params_, grad_, *rows);
    } else {
      optimizer_.Step(params_, grad_);
    }
    model_->ApplyStateUpdate(params_);
    return loss;
  }

  const SgdOptimizer& optimizer() const { return optimizer_; }

 private:
  ModelTrainer(std::unique_ptr<Model> model,
               const pb::OptimizerConfig& optimizer)
      : model_(std::move(model)),
        params_(model_->layout().num_elements()),
        grad_(params_.size()),
        optimizer_(optimizer, params_.size()) {
    model_->Initialize(/*seed=*/1, params_);
  }

  std::unique_ptr<Model> model_;
  std::vector<float> params_;
  std::vector<float> grad_;
  SgdOptimizer optimizer_;
};

// One training step as a worker takes it (ModelTrainer::Step, SGD with
// momentum) on batches of `batch` samples.
// `threads` > 1: the model on that many threads (MakeParallelModel).
void RunModelStep(benchmark::State& state, const pb::ModelConfig& config,
                  int batch, int threads = 1) {
  std::vector<std::unique_ptr<Model>> replicas;
  for (int i = 0; i < threads; ++i) {
    Result<std::unique_ptr<Model>> replica =
        MakeModel(config, kInputDim, kClasses);
    if (!replica.ok()) {
      state.SkipWithError(replica.status().ToString().c_str());
      return;
    }
    replicas.push_back(std::move(replica).value());
  }
  std::unique_ptr<ModelTrainer> trainer =
      ModelTrainer::Make(state, MakeParallelModel(std::move(replicas)),
                         pb::OptimizerConfig());  // documented defaults
  if (trainer == nullptr) return;

  // Standardised-looking features and uniform labels.
  std::mt19937_64 rng(11);
  std::normal_distribution<float> feature(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, kClasses - 1);
  std::vector<Eigen::MatrixXf> features(kBatches,
                                        Eigen::MatrixXf(kInputDim, batch));
  std::vector<std::vector<uint8_t>> labels(kBatches,
                                           std::vector<uint8_t>(batch));
  for (int b = 0; b < kBatches; ++b) {
    for (Eigen::Index i = 0; i < features[b].size(); ++i) {
      features[b].data()[i] = feature(rng);
    }
    for (uint8_t& l : labels[b]) l = static_cast<uint8_t>(label(rng));
  }

  // One untimed forward and backward pass: the model's scratch buffers
  // grow to the batch once and are reused after that.
  float loss = trainer->LossAndGradient(features[0], labels[0]);
  // The first step whose loss was not finite (-1: none; 0: the untimed
  // one), so that a divergence says where it began.
  int64_t first_non_finite = std::isfinite(loss) ? -1 : 0;
  int64_t step = 0;
  int b = 0;
  for ([[maybe_unused]] auto _ : state) {
    loss = trainer->Step(features[b], labels[b]);
    ++step;
    if (first_non_finite < 0 && !std::isfinite(loss)) first_non_finite = step;
    b = (b + 1) % kBatches;
  }
  benchmark::DoNotOptimize(loss);
  if (first_non_finite >= 0) {
    // With the SSE control register (rounding, masked exceptions; 0x1f80
    // by default): a process whose floating-point mode was changed under it
    // would show here.
    char mxcsr[16];
    std::snprintf(mxcsr, sizeof(mxcsr), "%#x", _mm_getcsr());
    const std::string error =
        "training diverged: the loss is not finite from step " +
        std::to_string(first_non_finite) + " of " + std::to_string(step) +
        " (0: the untimed first step); MXCSR " + mxcsr;
    state.SkipWithError(error.c_str());
    return;
  }
  state.SetBytesProcessed(state.iterations() * kInputDim * batch *
                          static_cast<int64_t>(sizeof(float)));
  state.SetItemsProcessed(state.iterations() * batch);
}

pb::ModelConfig DefaultMlp() {
  pb::ModelConfig config;
  config.set_kind(pb::MLP);
  config.add_hidden(256);
  return config;
}

void BM_GradientStep(benchmark::State& state) {
  RunModelStep(state, DefaultMlp(), kBatch);
}
BENCHMARK(BM_GradientStep)->UseRealTime();

// What keeping answered commits for a replay costs a worker per commit
// (UndurableCommits, at a site that keeps checkpoints): the change since
// the base (params - base), copied in and summed with the commits since
// the durable point, for the 784-256-10 MLP (203,530 floats). Steady
// state: a pending checkpoint 10 commits back, the durable one 50 back.
void BM_KeepAnsweredCommit(benchmark::State& state) {
  constexpr size_t kFloats = 784 * 256 + 256 + 256 * 10 + 10;
  std::vector<float> params(kFloats, 1.5f), base(kFloats, 1.0f), change;
  UndurableCommits kept(kFloats);
  uint64_t id = 0;
  for (auto _ : state) {
    ++id;
    change.resize(kFloats);
    for (size_t k = 0; k < kFloats; ++k) change[k] = params[k] - base[k];
    pb::DurablePoint point;
    point.set_commit_id(id > 50 ? id - 50 : 0);
    if (id > 10) point.add_pending(id - 10);
    kept.Add(id, &change, point);
    benchmark::DoNotOptimize(kept.kept().back().sum.data());
  }
  state.SetBytesProcessed(state.iterations() *
                          static_cast<int64_t>(kFloats * sizeof(float)));
}
BENCHMARK(BM_KeepAnsweredCommit)->UseRealTime();

// ModelStep/<model>/batch:<B>: every CNN preset and the default MLP, one
// thread, for bench/scenarios/workload_speed (which runs PyTorch on the
// same networks beside it).
void RegisterModelSteps() {
  std::vector<std::pair<std::string, pb::ModelConfig>> models = {
      {"mlp", DefaultMlp()}};
  for (const std::string& preset : CnnPresetNames()) {
    pb::ModelConfig config;
    config.set_kind(pb::CNN);
    config.set_preset(preset);
    models.emplace_back(preset, config);
  }
  for (const auto& [name, config] : models) {
    for (int batch : {16, 64}) {
      benchmark::RegisterBenchmark(
          ("ModelStep/" + name + "/batch:" + std::to_string(batch)).c_str(),
          [config = config, batch](benchmark::State& state) {
            RunModelStep(state, config, batch);
          })
          ->UseRealTime();
    }
  }
  // ModelStepThreads/<model>/batch:64/threads:<T>: a worker's workers.threads,
  // against ModelStep/<model>/batch:64 (one thread) measured beside it.
  for (const auto& [name, config] : models) {
    if (name != "mlp" && name != "lenet5" && name != "vgg-small-bn") continue;
    for (int threads : {2, 4}) {
      benchmark::RegisterBenchmark(
          ("ModelStepThreads/" + name +
           "/batch:64/threads:" + std::to_string(threads))
              .c_str(),
          [config = config, threads](benchmark::State& state) {
            RunModelStep(state, config, 64, threads);
          })
          ->UseRealTime();
    }
  }
}

// ModelStep/mf/batch:<B>: one plain-SGD step of matrix factorisation on
// the default job's rating matrix (users 10000, items 2000, rank 16, l2
// 0.02), items processed = ratings; bench/scenarios/torch_models.py has
// the PyTorch twin (preset "mf").
constexpr uint32_t kMfUsers = 10000;
constexpr uint32_t kMfItems = 2000;
constexpr uint32_t kMfRank = 16;
constexpr double kMfL2 = 0.02;
constexpr double kMfLearningRate = 0.05;
// Ratings in the batches cycled through (at least kBatches batches), so
// that a step does not revisit the same few rows every time.
constexpr int kMfRatingsCycled = 65536;

void RunMfStep(benchmark::State& state, int batch) {
  pb::ModelConfig config;
  config.set_kind(pb::MATRIX_FACTORIZATION);
  config.set_rank(kMfRank);
  config.set_l2(kMfL2);
  pb::OptimizerConfig optimizer_config;
  optimizer_config.set_learning_rate(kMfLearningRate);
  optimizer_config.set_momentum(0);  // MF trains with plain SGD
  std::unique_ptr<ModelTrainer> trainer = ModelTrainer::Make(
      state, MakeMatrixFactorization(config, kMfUsers, kMfItems),
      optimizer_config);
  if (trainer == nullptr) return;

  // Batches of the generated rating matrix jobs train on (GenerateRatings:
  // Zipf item popularity and user activity), cycled through.
  const int batches = std::max(kBatches, kMfRatingsCycled / batch);
  pb::RatingsConfig matrix;
  matrix.set_users(kMfUsers);
  matrix.set_items(kMfItems);
  matrix.set_ratings(static_cast<uint64_t>(batches) * batch * 10 / 9 + 2);
  Result<RawData> raw = GenerateRatings(matrix);
  if (!raw.ok()) {
    state.SkipWithError(raw.status().ToString().c_str());
    return;
  }
  const Dataset ratings = MakeTrainDataset(*raw, {}, pb::STANDARDIZE);
  if (ratings.size() < static_cast<uint64_t>(batches) * batch) {
    state.SkipWithError("the generated matrix is smaller than the batches");
    return;
  }
  std::vector<Eigen::MatrixXf> features;
  std::vector<std::vector<uint8_t>> labels;
  for (int b = 0; b < batches; ++b) {
    features.push_back(ratings.features.middleCols(b * batch, batch));
    labels.emplace_back(ratings.labels.begin() + b * batch,
                        ratings.labels.begin() + (b + 1) * batch);
  }

  // One untimed step: the model's scratch buffers grow to the batch once.
  float loss = trainer->Step(features[0], labels[0]);
  int b = 1 % batches;
  for ([[maybe_unused]] auto _ : state) {
    loss = trainer->Step(features[b], labels[b]);
    b = (b + 1) % batches;
  }
  benchmark::DoNotOptimize(loss);
  if (!std::isfinite(loss)) {
    state.SkipWithError("training diverged: the loss is not finite");
    return;
  }
  if (trainer->optimizer().steps() == 0) {
    state.SkipWithError("the optimizer refused every step");
    return;
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

void RegisterMfSteps() {
  for (int batch : {64, 1024}) {
    benchmark::RegisterBenchmark(
        ("ModelStep/mf/batch:" + std::to_string(batch)).c_str(),
        [batch](benchmark::State& state) { RunMfStep(state, batch); })
        ->UseRealTime();
  }
}

// ---- 4. raw ZeroMQ round trip: the ceiling of a commit/pull ----------------

// Both ends copy the payload into a fresh message once per iteration, as
// the worker (building its commit) and the server (reading the model into
// its reply) do; the echo thread sends the received message back as is.
// `curve`: the pair is a CURVE server (with a ZAP handler admitting the
// client's key) and client, as a site's mirror socket and a peer's channel.
void ZmqRoundTrip(benchmark::State& state, bool curve) {
  // One context per side, like a worker process and its site server.
  zmq::context_t server_context;
  zmq::context_t client_context;
  std::atomic<bool> stop{false};
  std::thread echo;
  std::unique_ptr<ZapHandler> zap;  // outlives the router (in `echo`)
  CurveKeyPair server_keys;
  CurveKeyPair client_keys;
  if (curve) {
    Result<CurveKeyPair> server_pair = GenerateCurveKeyPair();
    Result<CurveKeyPair> client_pair = GenerateCurveKeyPair();
    if (!server_pair.ok() || !client_pair.ok()) {
      state.SkipWithError("no CURVE in this libzmq");
      return;
    }
    server_keys = *server_pair;
    client_keys = *client_pair;
    Result<std::unique_ptr<ZapHandler>> started = ZapHandler::Start(
        server_context, {{client_keys.public_key, "client"}}, "benchmark");
    if (!started.ok()) {
      state.SkipWithError(started.status().message().c_str());
      return;
    }
    zap = std::move(*started);
  }
  try {
    zmq::socket_t router(server_context, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    router.set(zmq::sockopt::rcvtimeo, 100);  // to notice `stop`
    if (curve && !MakeCurveServer(router, server_keys).ok()) {
      state.SkipWithError("cannot make a CURVE server");
      return;
    }
    router.bind("tcp://127.0.0.1:*");
    const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
    // The thread owns the router from here on.
    echo = std::thread([&stop, router = std::move(router)]() mutable {
      try {
        std::vector<zmq::message_t> frames;
        while (!stop.load(std::memory_order_relaxed)) {
          frames.clear();
          if (!zmq::recv_multipart(router, std::back_inserter(frames))) {
            continue;  // timed out
          }
          zmq::send_multipart(router, frames);  // [routing id, payload]
        }
      } catch (const zmq::error_t&) {
        // The client side reports the failure (its receive times out).
      }
    });

    zmq::socket_t dealer(client_context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::rcvtimeo, 10000);
    if (curve &&
        !MakeCurveClient(dealer, client_keys, server_keys.public_key).ok()) {
      state.SkipWithError("cannot make a CURVE client");
    } else {
      dealer.connect(endpoint);
    }
    const std::vector<char> payload(kMiB, 1);
    for ([[maybe_unused]] auto _ : state) {
      dealer.send(zmq::message_t(payload.data(), payload.size()),
                  zmq::send_flags::none);
      zmq::message_t reply;
      if (!dealer.recv(reply) || static_cast<int64_t>(reply.size()) != kMiB) {
        state.SkipWithError("no or wrong echo within 10 s");
        break;
      }
    }
  } catch (const zmq::error_t& error) {
    state.SkipWithError((std::string("zmq: ") + error.what()).c_str());
  }
  stop.store(true);
  if (echo.joinable()) echo.join();
  state.SetBytesProcessed(state.iterations() * 2 * kMiB);
}

void BM_ZmqRawRoundTrip(benchmark::State& state) { ZmqRoundTrip(state, false); }
BENCHMARK(BM_ZmqRawRoundTrip)->UseRealTime();

void BM_ZmqCurveRoundTrip(benchmark::State& state) {
  ZmqRoundTrip(state, true);
}
BENCHMARK(BM_ZmqCurveRoundTrip)->UseRealTime();

// ---- 5. COMMIT -> MODEL through a real SiteServer --------------------------

// 784*h + h + 10*h + 10 floats = 262360 (1.0008 MiB) for h = 330.
constexpr uint32_t kRoundTripHidden = 330;
constexpr auto kCallTimeout = std::chrono::seconds(30);
// Any valid token: the harness is the only one that stops its server.
constexpr char kControlToken[] = "meridianBenchControlToken0123456789abcde";

// A site server with one worker slot, run in a thread, and this process as
// its worker. Created once (on the first run of BM_CommitPullRoundTrip) and
// stopped by main() after all benchmarks.
class SiteHarness {
 public:
  static Result<std::unique_ptr<SiteHarness>> Start() {
    std::unique_ptr<SiteHarness> harness(new SiteHarness());
    MERIDIAN_RETURN_IF_ERROR(harness->Init());
    return harness;
  }

  ~SiteHarness() {
    // Only reached without Stop() on an error path: stop the server the
    // hard way (it waits a few seconds for our BYE, then exits).
    stop_requested_.store(true);
    if (server_thread_.joinable()) server_thread_.join();
    RemoveData();
  }

  SiteHarness(const SiteHarness&) = delete;
  SiteHarness& operator=(const SiteHarness&) = delete;

  uint64_t model_bytes() const {
    return layout_.num_elements() * sizeof(float);
  }

  // One COMMIT of a whole-model update, built as a worker builds it, and
  // its MODEL reply. Returns the payload bytes moved (both directions).
  Result<uint64_t> CommitAndPull() {
    pb::Header header;
    header.set_type(pb::COMMIT);
    header.set_clock(static_cast<int64_t>(commits_));
    std::vector<zmq::message_t> frames;
    frames.reserve(layout_.tensors().size());
    uint64_t sent = 0;
    for (const TensorInfo& tensor : layout_.tensors()) {
      zmq::message_t frame = MakeFloatFrame(tensor.size);
      std::memcpy(frame.data(), update_.data() + tensor.offset,
                  tensor.size * sizeof(float));
      sent += frame.size();
      frames.push_back(std::move(frame));
      AddTensorSlice(tensor, &header);
    }
    pb::Commit* commit = header.mutable_commit();
    commit->set_base_version(version_);
    commit->set_local_steps(1);
    commit->mutable_stats()->set_commits(commits_);

    MERIDIAN_ASSIGN_OR_RETURN(
        Envelope reply, client_->Call(header, std::move(frames), kCallTimeout));
    if (reply.header.type() == pb::ERROR) {
      return FailedPreconditionError(
          "COMMIT refused: " + pb::ErrorCode_Name(reply.header.error().code()) +
          ": " + reply.header.error().message());
    }
    if (reply.header.type() != pb::MODEL) {
      return DataLossError("expected MODEL, got " +
                           DescribeHeader(reply.header));
    }
    if (reply.header.model().stop()) {
      return FailedPreconditionError("the site server stopped: " +
                                     reply.header.model().stop_reason());
    }
    uint64_t received = 0;
    for (const zmq::message_t& frame : reply.payload) received += frame.size();
    if (received != model_bytes()) {
      return DataLossError("MODEL carries " + std::to_string(received) +
                           " bytes, expected " + std::to_string(model_bytes()));
    }
    version_ = reply.header.model().version();
    ++commits_;
    return sent + received;
  }

  // SHUTDOWN, then BYE, then waits for the server's Run() to return.
  Status Stop() {
    Status status = Request(pb::SHUTDOWN, pb::STATUS_REPLY);
    if (status.ok()) status = Request(pb::BYE, pb::BYE);
    if (!status.ok()) stop_requested_.store(true);  // make Run() return
    if (server_thread_.joinable()) server_thread_.join();
    RemoveData();
    if (!status.ok()) return status;
    if (!run_status_.ok()) return run_status_.WithContext("SiteServer::Run");
    const pb::SiteSummary& summary = server_->summary();
    if (summary.commits() != commits_) {
      return InternalError(
          "server counted " + std::to_string(summary.commits()) +
          " commits, the worker sent " + std::to_string(commits_));
    }
    return Status::Ok();
  }

 private:
  SiteHarness() = default;

  Status Init() {
    data_dir_ = testing::MakeTempDir("meridian-bench");
    testing::SyntheticDataOptions data;
    data.train_samples = 200;  // read only for normalisation statistics
    data.test_samples = 200;   // evaluated once at start and once at the end
    MERIDIAN_RETURN_IF_ERROR(testing::WriteSyntheticIdx(data_dir_, data));

    pb::JobConfig job =
        testing::SmallJob(data_dir_, /*workers=*/1, kRoundTripHidden);
    job.set_time_budget_s(24 * 3600);
    job.mutable_server()->set_eval_period_s(24 * 3600);

    Result<std::unique_ptr<Model>> model = MakeModel(job.model(), 784, 10);
    if (!model.ok()) return model.status();
    layout_ = (*model)->layout();
    update_.assign(layout_.num_elements(), kUpdateValue);

    SiteServerOptions options;
    options.job = job;
    options.site = job.site(0).name();
    options.bind = "tcp://127.0.0.1:*";
    options.stop_requested = &stop_requested_;
    options.control_token = kControlToken;
    MERIDIAN_ASSIGN_OR_RETURN(server_, SiteServer::Create(std::move(options)));
    server_thread_ = std::thread([this] { run_status_ = server_->Run(); });

    pb::Endpoint self;
    self.set_site(job.site(0).name());
    self.set_role(pb::ROLE_WORKER);
    self.set_id(0);
    client_ = std::make_unique<RpcClient>(context_, server_->endpoint(), self);

    pb::Header hello;
    hello.set_type(pb::HELLO);
    hello.mutable_hello()->set_worker_index(0);
    LayoutToSpecs(layout_, hello.mutable_hello()->mutable_layout());
    MERIDIAN_ASSIGN_OR_RETURN(Envelope welcome,
                              client_->Call(hello, {}, kCallTimeout));
    if (welcome.header.type() != pb::WELCOME) {
      return FailedPreconditionError("expected WELCOME, got " +
                                     DescribeHeader(welcome.header) + " " +
                                     welcome.header.error().message());
    }
    version_ = welcome.header.welcome().model_version();
    return Status::Ok();
  }

  // A request without payload; OK when the reply has type `expected`.
  Status Request(pb::MessageType type, pb::MessageType expected) {
    pb::Header header;
    header.set_type(type);
    if (type == pb::SHUTDOWN) {
      header.set_control_token(kControlToken);
      header.mutable_shutdown()->set_reason("benchmark finished");
    } else if (type == pb::BYE) {
      header.mutable_bye()->mutable_stats()->set_commits(commits_);
    }
    MERIDIAN_ASSIGN_OR_RETURN(Envelope reply,
                              client_->Call(header, {}, kCallTimeout));
    if (reply.header.type() != expected) {
      return DataLossError("expected " + pb::MessageType_Name(expected) +
                           ", got " + DescribeHeader(reply.header) + " " +
                           reply.header.error().message());
    }
    return Status::Ok();
  }

  void RemoveData() {
    if (data_dir_.empty()) return;
    std::error_code ignored;
    std::filesystem::remove_all(data_dir_, ignored);
    data_dir_.clear();
  }

  std::string data_dir_;
  ModelLayout layout_;
  std::vector<float> update_;

  std::atomic<bool> stop_requested_{false};
  std::unique_ptr<SiteServer> server_;
  std::thread server_thread_;
  Status run_status_;  // written by server_thread_, read after join

  zmq::context_t context_;
  std::unique_ptr<RpcClient> client_;  // destroyed before context_
  uint64_t version_ = 0;
  uint64_t commits_ = 0;
};

// The harness shared by every run of BM_CommitPullRoundTrip (Google
// Benchmark calls the function several times to size the iteration count).
struct HarnessSlot {
  bool started = false;
  Status start_status;
  std::unique_ptr<SiteHarness> harness;
};

HarnessSlot& Harness() {
  static HarnessSlot* slot = new HarnessSlot();
  return *slot;
}

void BM_CommitPullRoundTrip(benchmark::State& state) {
  HarnessSlot& slot = Harness();
  if (!slot.started) {
    slot.started = true;
    Result<std::unique_ptr<SiteHarness>> started = SiteHarness::Start();
    if (started.ok()) {
      slot.harness = std::move(started).value();
    } else {
      slot.start_status = started.status();
    }
  }
  if (slot.harness == nullptr) {
    const std::string message =
        "cannot start the site: " + slot.start_status.ToString();
    state.SkipWithError(message.c_str());
    return;
  }
  int64_t bytes = 0;
  for ([[maybe_unused]] auto _ : state) {
    Result<uint64_t> moved = slot.harness->CommitAndPull();
    if (!moved.ok()) {
      state.SkipWithError(moved.status().ToString().c_str());
      break;
    }
    bytes += static_cast<int64_t>(*moved);
  }
  state.SetBytesProcessed(bytes);
  state.counters["model_MiB"] =
      static_cast<double>(slot.harness->model_bytes()) / kMiB;
}
BENCHMARK(BM_CommitPullRoundTrip)->UseRealTime();

// Stops the site of BM_CommitPullRoundTrip if it was started.
Status StopHarness() {
  HarnessSlot& slot = Harness();
  if (slot.harness == nullptr) return slot.start_status;
  Status status = slot.harness->Stop();
  slot.harness.reset();
  return status;
}

// ---- reporting -------------------------------------------------------------

using bench::Format;
using bench::HumanBytesPerSecond;
using bench::Measurement;
using bench::RecordingReporter;
using bench::Usable;

std::string HumanItemsPerSecond(double items, const char* what) {
  const std::string unit = std::string(" ") + what + "/s";
  if (items >= 1e6) return Format("%.2f M", items / 1e6, unit.c_str());
  if (items >= 1e3) return Format("%.1f k", items / 1e3, unit.c_str());
  return Format("%.0f", items, unit.c_str());
}

class SummaryTable {
 public:
  explicit SummaryTable(const std::map<std::string, Measurement>& results)
      : results_(results) {}

  // A row comparing `name` with `baseline`; goal <= 0: informational.
  void Compare(const std::string& label, const std::string& name,
               const std::string& baseline, double goal) {
    const Measurement* m = Find(name);
    const Measurement* b = Find(baseline);
    const std::string goal_text =
        goal > 0 ? Format("≥ %.1f", goal, "×") : std::string("—");
    std::string ratio = "n/a";
    std::string met = goal > 0 ? "n/a" : "—";
    if (Usable(m) && Usable(b) && b->bytes_per_second > 0) {
      const double r = m->bytes_per_second / b->bytes_per_second;
      ratio = Format("%.2f", r, "×");
      if (goal > 0) {
        met = r >= goal ? "yes" : "**no**";
        if (r < goal) ++missed_;
      }
    }
    Row(label, Throughput(m, name), Throughput(b, baseline), ratio, goal_text,
        met);
  }

  // A row with samples/s (and the bytes of features behind them).
  void Items(const std::string& label, const std::string& name,
             const char* what) {
    const Measurement* m = Find(name);
    std::string throughput = Throughput(m, name);
    if (Usable(m)) {
      throughput = HumanItemsPerSecond(m->items_per_second, what) + " (" +
                   HumanBytesPerSecond(m->bytes_per_second) + " of features)";
    }
    Row(label, throughput, "—", "—", "—", "—");
  }

  void Print(std::ostream& out) const {
    out << "\n| benchmark | throughput | baseline | ratio | goal | met |\n"
        << "|---|---|---|---|---|---|\n"
        << rows_;
    bench::PrintMissedGoals(out, missed_);
  }

 private:
  const Measurement* Find(const std::string& name) const {
    return bench::FindMeasurement(results_, name);
  }

  static std::string Throughput(const Measurement* m, const std::string& name) {
    if (m == nullptr) return name + " not run";
    if (m->error) return name + " failed: " + m->error_message;
    return HumanBytesPerSecond(m->bytes_per_second);
  }

  void Row(const std::string& label, const std::string& throughput,
           const std::string& baseline, const std::string& ratio,
           const std::string& goal, const std::string& met) {
    rows_ += "| " + label + " | " + throughput + " | " + baseline + " | " +
             ratio + " | " + goal + " | " + met + " |\n";
  }

  const std::map<std::string, Measurement>& results_;
  std::string rows_;
  int missed_ = 0;
};

template <typename Reporter>
void PrintSummary(const Reporter& reporter, std::ostream& out) {
  if (reporter.results().empty()) return;  // e.g. --benchmark_list_tests
  SummaryTable table(reporter.results());
  table.Compare("ApplyUpdate vs Memcpy", "BM_ApplyUpdate/plain", "BM_Memcpy",
                0.5);
  table.Compare("ApplyUpdate(momentum) vs Memcpy", "BM_ApplyUpdate/momentum",
                "BM_Memcpy", 0);
  table.Compare("TakeSignificant (0% of rows significant) vs Memcpy",
                "BM_TakeSignificant/0", "BM_Memcpy", 0);
  table.Compare("TakeSignificant (5% of rows significant) vs Memcpy",
                "BM_TakeSignificant/5", "BM_Memcpy", 0);
  table.Compare("CommitPullRoundTrip vs ZmqRawRoundTrip",
                "BM_CommitPullRoundTrip", "BM_ZmqRawRoundTrip", 0.5);
  table.Compare("ZmqCurveRoundTrip vs ZmqRawRoundTrip (CURVE overhead)",
                "BM_ZmqCurveRoundTrip", "BM_ZmqRawRoundTrip", 0);
  table.Items("GradientStep", "BM_GradientStep", "samples");
  table.Print(out);
}

using bench::AnyError;
using bench::ConsoleOptions;

// Runs the selected benchmarks with `reporter`, stops the site, prints the
// summary. Returns the process exit status.
template <typename Reporter>
int RunAll(Reporter& reporter, std::ostream& summary_out) {
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const Status stopped = StopHarness();
  benchmark::Shutdown();
  PrintSummary(reporter, summary_out);
  int exit_status = 0;
  if (!stopped.ok()) {
    std::cerr << "site server of BM_CommitPullRoundTrip: " << stopped << "\n";
    exit_status = 1;
  }
  if (AnyError(reporter)) exit_status = 1;
  return exit_status;
}

}  // namespace
}  // namespace meridian

int main(int argc, char** argv) {
  // The site server logs every join and leave; keep the console for results.
  meridian::SetLogLevel(meridian::LogLevel::kWarning);
  const std::string format =
      meridian::bench::FlagValue(argc, argv, "benchmark_format")
          .value_or("console");
  const auto console_options = meridian::ConsoleOptions(argc, argv);
  meridian::RegisterModelSteps();
  meridian::RegisterMfSteps();
  // Which kernels the model steps ran on (in the JSON's "context").
  benchmark::AddCustomContext("meridian_kernels", meridian::ModelKernels());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Machine-readable formats keep stdout clean; the table goes to stderr.
  if (format == "json") {
    meridian::RecordingReporter<benchmark::JSONReporter> reporter;
    return meridian::RunAll(reporter, std::cerr);
  }
  if (format != "console") {
    std::cerr << "--benchmark_format=" << format
              << " is not supported here (console or json); using console\n";
  }
  meridian::RecordingReporter<benchmark::ConsoleReporter> reporter(
      console_options);
  return meridian::RunAll(reporter, std::cout);
}
