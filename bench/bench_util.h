// Shared by the Google Benchmark binaries (meridian_bench,
// compression_bench): reading Google Benchmark's output flags for a custom
// display reporter, the reporter that records every result for the
// binaries' summary tables, its error check, and the tables' number
// formats. Header-only.
#ifndef MERIDIAN_BENCH_BENCH_UTIL_H_
#define MERIDIAN_BENCH_BENCH_UTIL_H_

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace meridian::bench {

// The value of --name=value (or "true" for a bare --name) in argv, read
// before benchmark::Initialize consumes the flags: with a custom display
// reporter, Google Benchmark no longer applies the output flags itself.
inline std::optional<std::string> FlagValue(int argc, char** argv,
                                            std::string_view name) {
  std::optional<std::string> value;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (!arg.starts_with("--") || arg.substr(2, name.size()) != name) continue;
    arg.remove_prefix(2 + name.size());
    if (arg.empty()) {
      value = "true";
    } else if (arg.front() == '=') {
      value = std::string(arg.substr(1));
    }
  }
  return value;
}

// Removes every --name=value of argv (argc shrinks) and returns the last
// value: for a binary's own flags, which benchmark::Initialize would report
// as unrecognised. A bare --name is "true".
inline std::optional<std::string> TakeFlag(int* argc, char** argv,
                                           std::string_view name) {
  std::optional<std::string> value;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.starts_with("--") && arg.substr(2, name.size()) == name &&
        (arg.size() == 2 + name.size() || arg[2 + name.size()] == '=')) {
      value = arg.size() == 2 + name.size()
                  ? std::string("true")
                  : std::string(arg.substr(3 + name.size()));
      continue;
    }
    argv[kept++] = argv[i];
  }
  *argc = kept;
  return value;
}

// Google Benchmark's spellings of a true flag value.
inline bool IsTrue(std::string_view value) {
  return value == "true" || value == "yes" || value == "1" || value == "t" ||
         value == "y" || value == "on";
}

// Console options as Google Benchmark derives them from its flags.
inline benchmark::ConsoleReporter::OutputOptions ConsoleOptions(int argc,
                                                                char** argv) {
  int options = benchmark::ConsoleReporter::OO_None;
  const std::string color =
      FlagValue(argc, argv, "benchmark_color").value_or("auto");
  bool use_color = false;
  if (color == "auto") {
    const char* term = std::getenv("TERM");
    use_color = ::isatty(STDOUT_FILENO) != 0 && term != nullptr &&
                std::string_view(term) != "dumb";
  } else {
    use_color = IsTrue(color) || color == "force";
  }
  if (use_color) options |= benchmark::ConsoleReporter::OO_Color;
  if (IsTrue(
          FlagValue(argc, argv, "benchmark_counters_tabular").value_or(""))) {
    options |= benchmark::ConsoleReporter::OO_Tabular;
  }
  return static_cast<benchmark::ConsoleReporter::OutputOptions>(options);
}

// One benchmark's result as RecordingReporter keeps it.
struct Measurement {
  bool error = false;
  std::string error_message;
  // The rates Google Benchmark derives from SetBytesProcessed and
  // SetItemsProcessed, per second (0 when the benchmark sets none).
  double bytes_per_second = 0;
  double items_per_second = 0;
  // Every counter of the run by name, the rates included.
  std::map<std::string, double> counters;

  // Counter `name`, or 0 when the run has none.
  double counter(const std::string& name) const {
    const auto it = counters.find(name);
    return it == counters.end() ? 0.0 : it->second;
  }
};

// Forwards to Google Benchmark's reporter `Base` (ConsoleReporter,
// JSONReporter) and records every benchmark's result, keyed by its name
// without the time type suffix ("BM_ApplyUpdate/plain"). With
// --benchmark_repetitions the median aggregate wins over single runs.
// Not thread-safe (Google Benchmark reports from its one running thread).
template <typename Base>
class RecordingReporter : public Base {
 public:
  using Run = benchmark::BenchmarkReporter::Run;
  using Base::Base;

  void ReportRuns(const std::vector<Run>& runs) override {
    Base::ReportRuns(runs);
    for (const Run& run : runs) Record(run);
  }

  const std::map<std::string, Measurement>& results() const { return results_; }

 private:
  void Record(const Run& run) {
    const bool median =
        run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
    if (run.run_type == Run::RT_Aggregate && !median) return;
    std::string key = run.run_name.function_name;
    if (!run.run_name.args.empty()) key += "/" + run.run_name.args;
    if (!median && medians_.contains(key)) return;
    if (median) medians_.insert(key);
    Measurement& m = results_[key];
    m.error = run.error_occurred;
    m.error_message = run.error_message;
    m.counters.clear();
    for (const auto& [name, counter] : run.counters) {
      m.counters[name] = counter.value;
    }
    m.bytes_per_second = m.counter("bytes_per_second");
    m.items_per_second = m.counter("items_per_second");
  }

  std::map<std::string, Measurement> results_;
  std::set<std::string> medians_;
};

// The result of benchmark `name` in `results` (a RecordingReporter's), or
// nullptr when it did not run.
inline const Measurement* FindMeasurement(
    const std::map<std::string, Measurement>& results,
    const std::string& name) {
  const auto it = results.find(name);
  return it == results.end() ? nullptr : &it->second;
}

// Whether `m` ran and did not fail.
inline bool Usable(const Measurement* m) { return m != nullptr && !m->error; }

// ---- the summary tables' text ----------------------------------------------

// `value` printed with the printf `format` (one double), then `unit`.
inline std::string Format(const char* format, double value,
                          const char* unit = "") {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, value);
  return std::string(buffer) + unit;
}

// Decimal units: 1 GB/s = 1e9 bytes/s.
inline std::string HumanBytesPerSecond(double bytes) {
  if (bytes >= 1e9) return Format("%.2f", bytes / 1e9, " GB/s");
  if (bytes >= 1e6) return Format("%.1f", bytes / 1e6, " MB/s");
  return Format("%.1f", bytes / 1e3, " kB/s");
}

// A table's closing line when `missed` goals were missed (none when 0).
inline void PrintMissedGoals(std::ostream& out, int missed) {
  if (missed == 0) return;
  out << "\n"
      << missed
      << " goal(s) missed (informational: the exit status ignores goals).\n";
}

// Whether any benchmark a reporter recorded (results(): name -> a
// measurement with an `error` flag) failed.
template <typename Reporter>
bool AnyError(const Reporter& reporter) {
  return std::any_of(reporter.results().begin(), reporter.results().end(),
                     [](const auto& entry) { return entry.second.error; });
}

}  // namespace meridian::bench

#endif  // MERIDIAN_BENCH_BENCH_UTIL_H_
