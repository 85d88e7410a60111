#include "config/issue_reporter.h"

#include <algorithm>
#include <iterator>

#include "meridian/metrics/metrics.h"

namespace meridian::config_internal {
namespace {

constexpr std::string_view kEndpointSchemes[] = {"tcp://", "ipc://",
                                                 "inproc://"};

}  // namespace

std::string Indexed(std::string_view field, int index) {
  return std::string(field) + "[" + std::to_string(index) + "]";
}

bool IsEndpoint(std::string_view address) {
  return std::any_of(std::begin(kEndpointSchemes), std::end(kEndpointSchemes),
                     [&](std::string_view scheme) {
                       return address.size() > scheme.size() &&
                              address.substr(0, scheme.size()) == scheme;
                     });
}

void IssueReporter::Endpoint(std::string_view field,
                             const std::string& value) const {
  Check(IsEndpoint(value), field,
        "must be a ZeroMQ endpoint starting with tcp://, ipc:// or "
        "inproc://, got '" +
            value + "'");
}

void IssueReporter::MetricsAddress(std::string_view field,
                                   const std::string& value) const {
  if (value.empty()) return;
  const Result<meridian::MetricsAddress> parsed = ParseMetricsAddress(value);
  if (!parsed.ok()) Report(field, parsed.status().message());
}

void ReportAtPath(const Status& status, const IssueReporter& root) {
  const std::string& text = status.message();
  const size_t colon = text.find(": ");
  if (colon == std::string::npos || text.find(' ') < colon) {
    root.Report("", text);
  } else {
    root.Report(text.substr(0, colon), text.substr(colon + 2));
  }
}

}  // namespace meridian::config_internal
