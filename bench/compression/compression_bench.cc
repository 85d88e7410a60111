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

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
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

#include "meridian/compression.h"
#include "meridian/job.pb.h"
#include "meridian/status.h"
#include "bench_util.h"

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

// ---- reporting -------------------------------------------------------------

using bench::Measurement;
using bench::RecordingReporter;

std::string Format(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return buffer;
}

// Decimal units: 1 GB/s = 1e9 bytes/s.
std::string HumanBytesPerSecond(double bytes) {
  if (bytes >= 1e9) return Format("%.2f GB/s", bytes / 1e9);
  if (bytes >= 1e6) return Format("%.1f MB/s", bytes / 1e6);
  return Format("%.1f kB/s", bytes / 1e3);
}

std::string HumanBytes(double bytes) {
  if (bytes >= 1e6) return Format("%.2f MB", bytes / 1e6);
  if (bytes >= 1e3) return Format("%.1f kB", bytes / 1e3);
  return Format("%.0f B", bytes);
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
    if (missed_ > 0) {
      out << "\n"
          << missed_
          << " goal(s) missed (informational: the exit status ignores "
             "goals).\n";
    }
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
    const auto it = results_.find(name);
    return it == results_.end() ? nullptr : &it->second;
  }

  static bool Usable(const Measurement* m) { return m != nullptr && !m->error; }

  static std::string Throughput(const Measurement* m) {
    if (m == nullptr) return "not run";
    if (m->error) return "failed: " + m->error_message;
    return HumanBytesPerSecond(m->bytes_per_second);
  }

  static std::string Ratio(const Measurement* m, double ceiling) {
    if (!Usable(m) || ceiling <= 0) return "n/a";
    return Format("%.2f×", m->bytes_per_second / ceiling);
  }

  const std::map<std::string, Measurement>& results_;
  int missed_ = 0;
};

using bench::AnyError;
using bench::ConsoleOptions;

template <typename Reporter>
int RunAll(Reporter& reporter, std::ostream& summary_out) {
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  if (!reporter.results().empty()) {  // empty e.g. with --benchmark_list_tests
    SummaryTable(reporter.results()).Print(summary_out);
  }
  return AnyError(reporter) ? 1 : 0;
}

}  // namespace
}  // namespace meridian

int main(int argc, char** argv) {
  const std::string format =
      meridian::bench::FlagValue(argc, argv, "benchmark_format").value_or("console");
  const auto console_options = meridian::ConsoleOptions(argc, argv);
  meridian::RegisterAll();
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
