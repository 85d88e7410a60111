// Shared by the Google Benchmark binaries (meridian_bench,
// compression_bench): reading Google Benchmark's output flags for a custom
// display reporter, and the reporters' error check. Header-only.
#ifndef MERIDIAN_BENCH_BENCH_UTIL_H_
#define MERIDIAN_BENCH_BENCH_UTIL_H_

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

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

// Whether any benchmark a reporter recorded (results(): name -> a
// measurement with an `error` flag) failed.
template <typename Reporter>
bool AnyError(const Reporter& reporter) {
  return std::any_of(reporter.results().begin(), reporter.results().end(),
                     [](const auto& entry) { return entry.second.error; });
}

}  // namespace meridian::bench

#endif  // MERIDIAN_BENCH_BENCH_UTIL_H_
