// Encode and decode throughput of the compression pipelines
// (include/meridian/compression.h) on a 1M-element (2^20) fp32 update at
// densities 100%, 10%, 1% and 0.1% (the fraction of non-zero elements,
// placed at random), next to memcpy of the same 4 MiB measured in the same
// run:
//
//   BM_Memcpy                       memcpy of the dense update: the ceiling
//   BM_Encode/<pipeline>/<density>  UpdateEncoder::EncodeDense, with error
//                                   feedback into a separate residual buffer
//   BM_Decode/<pipeline>/<density>  UpdateDecoder::DecodeDense into a dense
//                                   buffer
//
// Throughput is in bytes of dense input per second of CPU time (4 MiB per
// call), so that every row compares with memcpy. After Google Benchmark's
// output, main() prints a markdown table: per pipeline and density the encoded
// size and its ratio to dense fp32, encode and decode throughput and their
// ratios to memcpy, and the goals of the issue for the sparse + int8 +
// zstd pipeline. Goals never change the exit status: it is 0 unless a
// benchmark failed to run.
//
// Real updates instead of synthetic ones (docs/guide.md, "Compression"):
//
//   compression_bench --job=FILE [--updates=16] [--warmup_steps=200]
//                     [--steps_per_update=N] [--theta=X]
//
// trains the job's model in this process (its data, optimizer and seed;
// real_updates.h), records `updates` of its changes after `warmup_steps`
// steps and runs every pipeline on them, tensor by tensor as the servers
// encode them:
//
//   BM_EncodeReal/<pipeline>/<kind>, BM_DecodeReal/<pipeline>/<kind>
//     kind: commit (the change over steps_per_update steps [the job's
//     local_steps]), significant (what the significance filter at the
//     job's sync.threshold takes from the accumulated commits), and
//     significant-random (the same values per tensor at random positions:
//     what the real positions' structure is worth)
//
// and prints a table of the encoded size per update, bytes per entry and
// ratio to the dense fp32 model, and throughput in bytes of the dense model
// per second of CPU time, against memcpy of the model.

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "bench_util.h"
#include "meridian/compression/compression.h"
#include "meridian/config/config.h"
#include "meridian/job.pb.h"
#include "meridian/core/status.h"
#include "real_updates.h"

namespace meridian {
namespace {

constexpr size_t kElements = size_t{1} << 20;
constexpr int64_t kDenseBytes = static_cast<int64_t>(kElements * sizeof(float));

struct Density {
  const char* name;  // in benchmark names and the table
  double fraction;
};
const Density kDensities[] = {
    {"100%", 1.0}, {"10%", 0.1}, {"1%", 0.01}, {"0.1%", 0.001}};

struct Pipeline {
  const char* name;  // in benchmark names
  pb::CompressionConfig config;
};

pb::CompressionConfig Config(pb::SelectionKind selection, pb::ValueCoding value,
                             int zstd_level) {
  pb::CompressionConfig config;
  config.set_selection(selection);
  config.set_top_k_fraction(0.01);
  config.set_index_coding(pb::INDEX_AUTO);
  config.set_value_coding(value);
  config.set_block_size(256);
  config.set_rounding(pb::ROUND_NEAREST);
  config.set_zstd_level(zstd_level);
  return config;
}

// The pipeline the goals are about.
constexpr const char* kGoalPipeline = "int8+zstd1";

const std::vector<Pipeline>& Pipelines() {
  static const std::vector<Pipeline>* const pipelines =
      new std::vector<Pipeline>{
          {"fp32", Config(pb::SELECT_ALL, pb::VALUE_FP32, 0)},
          {"fp32+zstd1", Config(pb::SELECT_ALL, pb::VALUE_FP32, 1)},
          {"fp16+zstd1", Config(pb::SELECT_ALL, pb::VALUE_FP16, 1)},
          {kGoalPipeline, Config(pb::SELECT_ALL, pb::VALUE_INT8, 1)},
          {"int4+zstd1", Config(pb::SELECT_ALL, pb::VALUE_INT4, 1)},
          {"topk1%+int8+zstd1", Config(pb::TOP_K, pb::VALUE_INT8, 1)},
          {"topk1%sampled+int8+zstd1",
           Config(pb::TOP_K_SAMPLED, pb::VALUE_INT8, 1)},
      };
  return *pipelines;
}

// The update at `density`: non-zeros at random places, values of a
// gradient-like spread (normal, scale 1e-3). Built once per density.
const std::vector<float>& Update(double density) {
  static std::map<double, std::vector<float>>* const cache =
      new std::map<double, std::vector<float>>;
  auto [it, inserted] = cache->try_emplace(density);
  if (inserted) {
    std::mt19937_64 rng(42);
    std::bernoulli_distribution keep(density);
    std::normal_distribution<float> value(0.0f, 1e-3f);
    it->second.assign(kElements, 0.0f);
    for (float& v : it->second) {
      if (!keep(rng)) continue;
      do {
        v = value(rng);
      } while (v == 0.0f);
    }
  }
  return it->second;
}

void BM_Memcpy(benchmark::State& state) {
  const std::vector<float>& src = Update(1.0);
  std::vector<float> dst(kElements);
  for ([[maybe_unused]] auto _ : state) {
    std::memcpy(dst.data(), src.data(), kDenseBytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kDenseBytes);
}

void BM_Encode(benchmark::State& state, const Pipeline& pipeline,
               Density density) {
  Result<UpdateEncoder> encoder = UpdateEncoder::Create(pipeline.config);
  if (!encoder.ok()) {
    state.SkipWithError(encoder.status().ToString().c_str());
    return;
  }
  const std::vector<float>& update = Update(density.fraction);
  std::vector<float> residual(kElements);
  uint64_t encoded_bytes = 0;
  uint64_t selected = 0;
  for ([[maybe_unused]] auto _ : state) {
    Result<EncodedUpdate> encoded = encoder->EncodeDense(update, residual);
    if (!encoded.ok()) {
      state.SkipWithError(encoded.status().ToString().c_str());
      return;
    }
    encoded_bytes = encoded->summary.encoded_bytes;
    selected = encoded->summary.selected;
    benchmark::DoNotOptimize(encoded->bytes.data());
  }
  state.SetBytesProcessed(state.iterations() * kDenseBytes);
  state.counters["encoded_bytes"] = static_cast<double>(encoded_bytes);
  state.counters["selected"] = static_cast<double>(selected);
}

void BM_Decode(benchmark::State& state, const Pipeline& pipeline,
               Density density) {
  Result<UpdateEncoder> encoder = UpdateEncoder::Create(pipeline.config);
  if (!encoder.ok()) {
    state.SkipWithError(encoder.status().ToString().c_str());
    return;
  }
  Result<EncodedUpdate> encoded =
      encoder->EncodeDense(Update(density.fraction), {});
  if (!encoded.ok()) {
    state.SkipWithError(encoded.status().ToString().c_str());
    return;
  }
  UpdateDecoder decoder;
  std::vector<float> out(kElements);
  for ([[maybe_unused]] auto _ : state) {
    const Status status = decoder.DecodeDense(encoded->bytes, out);
    if (!status.ok()) {
      state.SkipWithError(status.ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kDenseBytes);
}

std::string EncodeName(const Pipeline& p, const Density& d) {
  return std::string("BM_Encode/") + p.name + "/" + d.name;
}
std::string DecodeName(const Pipeline& p, const Density& d) {
  return std::string("BM_Decode/") + p.name + "/" + d.name;
}

// CPU time (Google Benchmark's default): every benchmark is one thread
// doing pure computation, the goal is per core, and CPU time does not
// count the time other processes on a shared machine take the core away.
void RegisterAll() {
  benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy);
  for (const Pipeline& p : Pipelines()) {
    for (const Density& d : kDensities) {
      benchmark::RegisterBenchmark(EncodeName(p, d).c_str(), BM_Encode, p, d);
      benchmark::RegisterBenchmark(DecodeName(p, d).c_str(), BM_Decode, p, d);
    }
  }
}

// ---- real updates (--job) --------------------------------------------------

using bench::RealUpdate;
using bench::RealUpdates;

struct RealKind {
  const char* name;  // in benchmark names and the table
  std::vector<RealUpdate> updates;
};

// Set by main() before registration when --job is given; lives for the run.
struct RealRun {
  RealUpdates recorded;
  std::vector<RealKind> kinds;
  int64_t dense_bytes = 0;  // the model in fp32
};
RealRun* g_real = nullptr;

// `update` with the same values per tensor at positions drawn at random
// (uniformly, without repeats), ascending.
RealUpdate AtRandomPositions(const RealUpdate& update, std::mt19937_64& rng) {
  RealUpdate out = update;
  for (SparseUpdate& slice : out) {
    std::set<uint32_t> chosen;
    std::uniform_int_distribution<uint64_t> position(0, slice.size - 1);
    while (chosen.size() < slice.values.size()) {
      chosen.insert(static_cast<uint32_t>(position(rng)));
    }
    slice.indices.assign(chosen.begin(), chosen.end());
  }
  return out;
}

// One encoded tensor slice: its elements and its bytes.
struct Frame {
  uint64_t size = 0;
  std::string bytes;
};

// What encoding one update took.
struct RealEncodeSize {
  uint64_t bytes = 0;
  uint64_t selected = 0;  // entries the messages carry
};

// Encodes `update` tensor by tensor; the frames are appended to `frames`
// when given. Returns the sizes, or the first error.
Result<RealEncodeSize> EncodeRealUpdate(UpdateEncoder& encoder,
                                        const RealUpdate& update,
                                        std::vector<Frame>* frames) {
  RealEncodeSize size;
  for (const SparseUpdate& slice : update) {
    if (slice.values.empty()) continue;  // an unchanged tensor is not sent
    Result<EncodedUpdate> encoded =
        encoder.EncodeSparse(slice.size, slice.indices, slice.values, {});
    if (!encoded.ok()) return encoded.status();
    size.bytes += encoded->summary.encoded_bytes;
    size.selected += encoded->summary.selected;
    if (frames != nullptr) {
      frames->push_back({slice.size, std::string(reinterpret_cast<const char*>(
                                                     encoded->bytes.data()),
                                                 encoded->bytes.size())});
    }
    benchmark::DoNotOptimize(encoded->bytes.data());
  }
  return size;
}

void BM_MemcpyModel(benchmark::State& state) {
  const size_t n = static_cast<size_t>(g_real->dense_bytes) / sizeof(float);
  std::vector<float> src(n, 1.0f), dst(n);
  for ([[maybe_unused]] auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * g_real->dense_bytes);
}

void BM_EncodeReal(benchmark::State& state, const Pipeline& pipeline,
                   const RealKind& kind) {
  Result<UpdateEncoder> encoder = UpdateEncoder::Create(pipeline.config);
  if (!encoder.ok()) {
    state.SkipWithError(encoder.status().ToString().c_str());
    return;
  }
  // Sizes from one pass over every update, so that they do not depend on
  // how many iterations the timing takes.
  double bytes = 0, entries = 0;
  for (const RealUpdate& update : kind.updates) {
    Result<RealEncodeSize> size = EncodeRealUpdate(*encoder, update, nullptr);
    if (!size.ok()) {
      state.SkipWithError(size.status().ToString().c_str());
      return;
    }
    bytes += static_cast<double>(size->bytes);
    entries += static_cast<double>(size->selected);
  }
  size_t next = 0;
  for ([[maybe_unused]] auto _ : state) {
    Result<RealEncodeSize> size =
        EncodeRealUpdate(*encoder, kind.updates[next], nullptr);
    if (!size.ok()) {
      state.SkipWithError(size.status().ToString().c_str());
      return;
    }
    next = (next + 1) % kind.updates.size();
  }
  state.SetBytesProcessed(state.iterations() * g_real->dense_bytes);
  const double count = static_cast<double>(kind.updates.size());
  state.counters["encoded_bytes"] = bytes / count;
  state.counters["entries"] = entries / count;
  state.counters["model_elements"] =
      static_cast<double>(g_real->recorded.layout.num_elements());
}

void BM_DecodeReal(benchmark::State& state, const Pipeline& pipeline,
                   const RealKind& kind) {
  Result<UpdateEncoder> encoder = UpdateEncoder::Create(pipeline.config);
  if (!encoder.ok()) {
    state.SkipWithError(encoder.status().ToString().c_str());
    return;
  }
  std::vector<std::vector<Frame>> frames(kind.updates.size());
  for (size_t u = 0; u < kind.updates.size(); ++u) {
    Result<RealEncodeSize> size =
        EncodeRealUpdate(*encoder, kind.updates[u], &frames[u]);
    if (!size.ok()) {
      state.SkipWithError(size.status().ToString().c_str());
      return;
    }
  }
  UpdateDecoder decoder;
  std::vector<float> out(g_real->recorded.layout.LargestTensorSize());
  size_t next = 0;
  for ([[maybe_unused]] auto _ : state) {
    for (const Frame& frame : frames[next]) {
      const Status status =
          decoder.DecodeDense(std::as_bytes(std::span<const char>(frame.bytes)),
                              std::span<float>(out.data(), frame.size));
      if (!status.ok()) {
        state.SkipWithError(status.ToString().c_str());
        return;
      }
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    next = (next + 1) % frames.size();
  }
  state.SetBytesProcessed(state.iterations() * g_real->dense_bytes);
}

std::string EncodeRealName(const Pipeline& p, const RealKind& k) {
  return std::string("BM_EncodeReal/") + p.name + "/" + k.name;
}
std::string DecodeRealName(const Pipeline& p, const RealKind& k) {
  return std::string("BM_DecodeReal/") + p.name + "/" + k.name;
}

void RegisterReal() {
  benchmark::RegisterBenchmark("BM_MemcpyModel", BM_MemcpyModel);
  for (const Pipeline& p : Pipelines()) {
    for (const RealKind& k : g_real->kinds) {
      benchmark::RegisterBenchmark(EncodeRealName(p, k).c_str(), BM_EncodeReal,
                                   p, k);
      benchmark::RegisterBenchmark(DecodeRealName(p, k).c_str(), BM_DecodeReal,
                                   p, k);
    }
  }
}

// ---- reporting -------------------------------------------------------------

using bench::FindMeasurement;
using bench::Format;
using bench::HumanBytesPerSecond;
using bench::Measurement;
using bench::RecordingReporter;
using bench::Usable;

std::string HumanBytes(double bytes) {
  if (bytes >= 1e6) return Format("%.2f MB", bytes / 1e6);
  if (bytes >= 1e3) return Format("%.1f kB", bytes / 1e3);
  return Format("%.0f B", bytes);
}

std::string Throughput(const Measurement* m) {
  if (m == nullptr) return "not run";
  if (m->error) return "failed: " + m->error_message;
  return HumanBytesPerSecond(m->bytes_per_second);
}

// Throughput over `ceiling` (memcpy's), e.g. "0.15×".
std::string Ratio(const Measurement* m, double ceiling) {
  if (!Usable(m) || ceiling <= 0) return "n/a";
  return Format("%.2f×", m->bytes_per_second / ceiling);
}

// The goals of the issue, for the sparse + int8 + zstd pipeline.
constexpr double kEncodeGoalBytesPerSecond = 1e9;  // at 1% density
struct SizeGoal {
  const char* density;
  double ratio;  // dense fp32 bytes / encoded bytes, at least
};
const SizeGoal kSizeGoals[] = {{"1%", 25}, {"0.1%", 200}};

class SummaryTable {
 public:
  explicit SummaryTable(const std::map<std::string, Measurement>& results)
      : results_(results) {}

  void Print(std::ostream& out) {
    const Measurement* memcpy_run = Find("BM_Memcpy");
    const double ceiling =
        Usable(memcpy_run) ? memcpy_run->bytes_per_second : 0;
    out << "\nDense input: " << kElements << " fp32 ("
        << HumanBytes(kDenseBytes) << "); memcpy of it: "
        << (ceiling > 0 ? HumanBytesPerSecond(ceiling) : std::string("n/a"))
        << ". Throughput in bytes of dense input per second of CPU time.\n\n"
        << "| pipeline | density | encoded | vs dense fp32 | encode | "
           "× memcpy | decode | × memcpy | goal | met |\n"
        << "|---|---|---|---|---|---|---|---|---|---|\n";
    for (const Pipeline& p : Pipelines()) {
      for (const Density& d : kDensities) Row(out, p, d, ceiling);
    }
    bench::PrintMissedGoals(out, missed_);
  }

 private:
  void Row(std::ostream& out, const Pipeline& p, const Density& d,
           double ceiling) {
    const Measurement* enc = Find(EncodeName(p, d));
    const Measurement* dec = Find(DecodeName(p, d));
    if (enc == nullptr && dec == nullptr) return;  // filtered out
    std::string size = "n/a", ratio = "n/a";
    double size_ratio = 0;
    const double encoded_bytes =
        Usable(enc) ? enc->counter("encoded_bytes") : 0;
    if (encoded_bytes > 0) {
      size = HumanBytes(encoded_bytes);
      size_ratio = kDenseBytes / encoded_bytes;
      ratio = "1/" + Format(size_ratio >= 100 ? "%.0f" : "%.1f", size_ratio);
    }
    std::vector<std::string> goals;
    bool met = true;
    bool has_goal = false;
    if (std::string_view(p.name) == kGoalPipeline) {
      if (std::string_view(d.name) == "1%") {
        has_goal = true;
        goals.push_back("encode ≥ 1 GB/s");
        if (!Usable(enc) || enc->bytes_per_second < kEncodeGoalBytesPerSecond) {
          met = false;
        }
      }
      for (const SizeGoal& goal : kSizeGoals) {
        if (std::string_view(d.name) != goal.density) continue;
        has_goal = true;
        goals.push_back("≤ 1/" + Format("%.0f", goal.ratio));
        if (size_ratio < goal.ratio) met = false;
      }
    }
    std::string goal_text = "—";
    std::string met_text = "—";
    if (has_goal) {
      goal_text.clear();
      for (const std::string& g : goals) {
        goal_text += (goal_text.empty() ? "" : ", ") + g;
      }
      met_text = met ? "yes" : "**no**";
      if (!met) ++missed_;
    }
    out << "| " << DescribeCompressionConfig(p.config) << " | " << d.name
        << " | " << size << " | " << ratio << " | " << Throughput(enc) << " | "
        << Ratio(enc, ceiling) << " | " << Throughput(dec) << " | "
        << Ratio(dec, ceiling) << " | " << goal_text << " | " << met_text
        << " |\n";
  }

  const Measurement* Find(const std::string& name) const {
    return FindMeasurement(results_, name);
  }

  const std::map<std::string, Measurement>& results_;
  int missed_ = 0;
};

// The table of a --job run.
void PrintRealTable(const std::map<std::string, Measurement>& results,
                    const std::string& job_path, std::ostream& out) {
  const RealUpdates& r = g_real->recorded;
  const Measurement* memcpy_run = FindMeasurement(results, "BM_MemcpyModel");
  const double ceiling = Usable(memcpy_run) ? memcpy_run->bytes_per_second : 0;
  const double elements = static_cast<double>(r.layout.num_elements());
  out << "\nReal updates of " << job_path << ": " << r.model << " in "
      << r.layout.tensors().size() << " tensors; "
      << g_real->kinds.front().updates.size() << " updates of "
      << r.steps_per_update << " steps each after " << r.warmup_steps
      << " steps; significance filter θ " << Format("%g", r.theta) << " "
      << pb::ThresholdMode_Name(r.threshold_mode) << ". Dense fp32 model: "
      << HumanBytes(static_cast<double>(g_real->dense_bytes))
      << "; memcpy of it: "
      << (ceiling > 0 ? HumanBytesPerSecond(ceiling) : std::string("n/a"))
      << ". Sizes are means per update; throughput in bytes of the dense "
         "model per second of CPU time.\n\n"
      << "| pipeline | update | entries sent (density) | encoded | bytes per "
         "entry | vs dense fp32 | encode | × memcpy | decode | × memcpy |\n"
      << "|---|---|---|---|---|---|---|---|---|---|\n";
  for (const Pipeline& p : Pipelines()) {
    for (const RealKind& k : g_real->kinds) {
      const Measurement* enc = FindMeasurement(results, EncodeRealName(p, k));
      const Measurement* dec = FindMeasurement(results, DecodeRealName(p, k));
      if (enc == nullptr && dec == nullptr) continue;  // filtered out
      std::string entries = "n/a", size = "n/a", per_entry = "n/a",
                  ratio = "n/a";
      if (Usable(enc) && enc->counter("encoded_bytes") > 0) {
        const double bytes = enc->counter("encoded_bytes");
        const double count = enc->counter("entries");
        entries = Format("%.0f", count) + " (" +
                  Format("%.2f%%", 100.0 * count / elements) + ")";
        size = HumanBytes(bytes);
        if (count > 0) per_entry = Format("%.2f", bytes / count);
        const double vs_dense = g_real->dense_bytes / bytes;
        ratio = "1/" + Format(vs_dense >= 100 ? "%.0f" : "%.1f", vs_dense);
      }
      out << "| " << DescribeCompressionConfig(p.config) << " | " << k.name
          << " | " << entries << " | " << size << " | " << per_entry << " | "
          << ratio << " | " << Throughput(enc) << " | " << Ratio(enc, ceiling)
          << " | " << Throughput(dec) << " | " << Ratio(dec, ceiling) << " |\n";
    }
  }
}

using bench::AnyError;
using bench::ConsoleOptions;

// `job_path` is empty for the synthetic updates.
template <typename Reporter>
int RunAll(Reporter& reporter, const std::string& job_path,
           std::ostream& summary_out) {
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  if (!reporter.results().empty()) {  // empty e.g. with --benchmark_list_tests
    if (job_path.empty()) {
      SummaryTable(reporter.results()).Print(summary_out);
    } else {
      PrintRealTable(reporter.results(), job_path, summary_out);
    }
  }
  return AnyError(reporter) ? 1 : 0;
}

// Parses a non-negative integer flag value; nullopt (after saying why on
// stderr) when it is not one.
std::optional<uint64_t> ParseCount(const std::string& flag,
                                   const std::string& text) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    std::cerr << "--" << flag << "=" << text
              << ": not a non-negative integer\n";
    return std::nullopt;
  }
  return value;
}

// Reads the --job flags, records the job's updates into g_real. False
// (after saying why on stderr) on a bad flag, job or training failure.
bool SetUpRealUpdates(int* argc, char** argv, const std::string& job_path) {
  bench::RealUpdateOptions options;
  for (auto [flag, field] :
       {std::pair<const char*, uint64_t*>{"updates", &options.updates},
        {"warmup_steps", &options.warmup_steps},
        {"steps_per_update", &options.steps_per_update}}) {
    if (const auto text = bench::TakeFlag(argc, argv, flag)) {
      const std::optional<uint64_t> value = ParseCount(flag, *text);
      if (!value) return false;
      *field = *value;
    }
  }
  if (const auto text = bench::TakeFlag(argc, argv, "theta")) {
    char* end = nullptr;
    options.theta = std::strtod(text->c_str(), &end);
    if (text->empty() || *end != '\0' || !(options.theta >= 0)) {
      std::cerr << "--theta=" << *text << ": not a non-negative number\n";
      return false;
    }
  }
  Result<pb::JobConfig> job = LoadJobConfig(job_path);
  if (!job.ok()) {
    std::cerr << job.status().ToString() << "\n";
    return false;
  }
  std::cerr << "recording " << options.updates << " updates of " << job_path
            << " ...\n";
  Result<bench::RealUpdates> recorded = bench::RecordRealUpdates(*job, options);
  if (!recorded.ok()) {
    std::cerr << job_path << ": " << recorded.status().ToString() << "\n";
    return false;
  }
  g_real = new RealRun;
  g_real->recorded = *std::move(recorded);
  g_real->dense_bytes = static_cast<int64_t>(
      g_real->recorded.layout.num_elements() * sizeof(float));
  std::mt19937_64 rng(7);
  std::vector<RealUpdate> random;
  for (const RealUpdate& u : g_real->recorded.significant) {
    random.push_back(AtRandomPositions(u, rng));
  }
  g_real->kinds = {{"commit", g_real->recorded.commits},
                   {"significant", g_real->recorded.significant},
                   {"significant-random", std::move(random)}};
  return true;
}

}  // namespace
}  // namespace meridian

int main(int argc, char** argv) {
  const std::string format =
      meridian::bench::FlagValue(argc, argv, "benchmark_format")
          .value_or("console");
  const auto console_options = meridian::ConsoleOptions(argc, argv);
  const std::string job_path =
      meridian::bench::TakeFlag(&argc, argv, "job").value_or("");
  if (job_path.empty()) {
    meridian::RegisterAll();
  } else {
    if (!meridian::SetUpRealUpdates(&argc, argv, job_path)) return 2;
    meridian::RegisterReal();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // Machine-readable formats keep stdout clean; the table goes to stderr.
  if (format == "json") {
    meridian::RecordingReporter<benchmark::JSONReporter> reporter;
    return meridian::RunAll(reporter, job_path, std::cerr);
  }
  if (format != "console") {
    std::cerr << "--benchmark_format=" << format
              << " is not supported here (console or json); using console\n";
  }
  meridian::RecordingReporter<benchmark::ConsoleReporter> reporter(
      console_options);
  return meridian::RunAll(reporter, job_path, std::cout);
}
