#include "config/issue_reporter.h"

#include <algorithm>
#include <iterator>

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
