// FetchMetricsText: the scraping client of `meridian top` and the tests
// (cpp-httplib).
#include <httplib.h>

#include <chrono>
#include <exception>
#include <string>

#include "meridian/metrics/metrics.h"

namespace meridian {

Result<std::string> FetchMetricsText(std::string_view address,
                                     double timeout_s) {
  MERIDIAN_ASSIGN_OR_RETURN(MetricsAddress parsed,
                            ParseMetricsAddress(address));
  if (parsed.port == 0) {
    return InvalidArgumentError("metrics address '" + std::string(address) +
                                "': port 0 cannot be scraped");
  }
  const std::string host = parsed.host == "0.0.0.0" ? "127.0.0.1" : parsed.host;
  try {
    httplib::Client client(host, parsed.port);
    const auto timeout = std::chrono::duration<double>(timeout_s);
    client.set_connection_timeout(
        std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    client.set_read_timeout(
        std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    client.set_write_timeout(
        std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    httplib::Result result = client.Get("/metrics");
    if (!result) {
      std::string why;
      switch (result.error()) {
        case httplib::Error::Connection:
          why = "connection refused or host unreachable";
          break;
        case httplib::Error::ConnectionTimeout:
          why = "no answer within the timeout";
          break;
        default:
          why = httplib::to_string(result.error());
      }
      return UnavailableError("cannot reach http://" + host + ":" +
                              std::to_string(parsed.port) + "/metrics: " + why);
    }
    if (result->status != 200) {
      return DataLossError("http://" + host + ":" +
                           std::to_string(parsed.port) + "/metrics answered " +
                           std::to_string(result->status));
    }
    return std::move(result->body);
  } catch (const std::exception& error) {
    return UnavailableError("scraping " + parsed.ToString() + ": " +
                            error.what());
  }
}

}  // namespace meridian
