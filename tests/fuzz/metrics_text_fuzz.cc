// libFuzzer target for the Prometheus text parser `meridian top` applies to
// every scrape it reads from the network (ParseMetricsText in
// src/metrics/metrics.cc), and for the label escaping the endpoints write.
//
// Besides "no crash, no leak", it checks:
//  - every accepted sample has a non-empty name;
//  - a label value escaped by EscapeLabelValue reads back unchanged;
//  - a value written by FormatMetricValue reads back (NaN stays NaN).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "meridian/metrics/metrics.h"

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "metrics_text_fuzz: invariant violated: %s\n", what);
  std::abort();
}

void Require(bool condition, const char* what) {
  if (!condition) Fail(what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  auto samples = meridian::ParseMetricsText(text);
  if (samples.ok()) {
    for (const meridian::MetricSample& sample : *samples) {
      Require(!sample.name.empty(), "accepted a sample without a name");
    }
  }

  // The input as a label value: escaping then parsing is the identity.
  const std::string line = "meridian_fuzz{value=\"" +
                           meridian::EscapeLabelValue(text) + "\"} 1\n";
  auto escaped = meridian::ParseMetricsText(line);
  if (text.find('\0') == std::string_view::npos) {
    Require(escaped.ok(), "an escaped label value did not parse");
    Require(escaped->size() == 1, "one line, not one sample");
    Require((*escaped)[0].Label("value") == text,
            "a label value changed through escaping");
  }

  // The first 8 bytes as a double: formatting then parsing keeps it.
  if (size >= sizeof(double)) {
    double value;
    std::memcpy(&value, data, sizeof(value));
    auto formatted = meridian::ParseMetricsText(
        "meridian_fuzz " + meridian::FormatMetricValue(value) + "\n");
    Require(formatted.ok() && formatted->size() == 1,
            "a formatted value did not parse");
    const double back = (*formatted)[0].value;
    Require(std::isnan(value) ? std::isnan(back) : back == value,
            "a value changed through formatting");
  }
  return 0;
}
