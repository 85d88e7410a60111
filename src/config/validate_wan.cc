// Validation of the emulated WAN (links, presets, wanem) and of what the
// job does when processes and links fail (restarts, heartbeats, the
// retention of updates for unreachable peers).

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "config/validate.h"
#include "meridian/wan/presets.h"
#include "meridian/wan/units.h"

namespace meridian::config_internal {

namespace {

// wan.price: a price for each entry, each pair of regions priced once.
void ValidatePrices(const pb::WanConfig& wan, const IssueReporter& r) {
  std::map<std::pair<std::string, std::string>, int> first_use;
  for (int i = 0; i < wan.price_size(); ++i) {
    const pb::TransferPriceConfig& price = wan.price(i);
    const IssueReporter p = r.Nested("price", i);
    p.Check(price.has_usd_per_gb(), "usd_per_gb",
            "must be set (US dollars per GB sent)");
    p.Real("usd_per_gb", price.usd_per_gb(), kNonNegative);
    p.Check(!price.from_region().empty(), "from_region",
            "must name a region, or be \"*\" for any");
    const std::string to =
        price.to_region().empty() ? "*" : price.to_region();
    const auto [it, inserted] =
        first_use.emplace(std::make_pair(price.from_region(), to), i);
    p.Check(inserted, "to_region",
            "the pair " + price.from_region() + " -> " + to +
                " is already priced by wan.price[" +
                std::to_string(it->second) + "]");
  }
}

}  // namespace

void ValidateWan(const pb::JobConfig& config, const IssueReporter& r,
                 const IssueReporter& root) {
  const pb::WanConfig& wan = config.wan();
  r.Real("sample_period_s", wan.sample_period_s(), kPositive);
  r.Endpoint("control_address", wan.control_address());
  r.MetricsAddress("metrics_address", wan.metrics_address());
  if (!wan.wanem_host().empty()) {
    r.Check(wan.wanem_host().find_first_of(":/ ") == std::string::npos,
            "wanem_host",
            "must be a host name or IPv4 address (no scheme, no port), got '" +
                wan.wanem_host() + "'");
    // Two ports per ordered pair of sites (sync and worker routes).
    const uint64_t sites = static_cast<uint64_t>(config.site_size());
    const uint64_t last = uint64_t{wan.route_base_port()} + 2 * sites * sites;
    r.Check(wan.route_base_port() > 0 && last <= 65536, "route_base_port",
            "routes need ports " + std::to_string(wan.route_base_port()) +
                ".." + std::to_string(last - 1) +
                " (2 x sites^2 of them), which must lie in 1..65535");
    for (int i = 0; i < config.site_size(); ++i) {
      const pb::SiteConfig& site = config.site(i);
      const IssueReporter s = root.Nested("site", i);
      for (const auto& [field, value] :
           {std::pair<const char*, const std::string&>{"address",
                                                       site.address()},
            {"mirror_address", site.mirror_address()}}) {
        s.Check(value.rfind("tcp://", 0) == 0, field,
                "must be a tcp:// endpoint when wan.wanem_host routes the "
                "sites through a standalone wanem, got '" +
                    value + "'");
      }
    }
  }
  std::map<std::pair<int, int>, int> first_use;
  for (int i = 0; i < wan.link_size(); ++i) {
    const pb::LinkConfig& link = wan.link(i);
    const IssueReporter l = r.Nested("link", i);
    Result<int> a = FindSite(config, link.a());
    Result<int> b = FindSite(config, link.b());
    if (!a.ok()) l.Report("a", a.status().message());
    if (!b.ok()) l.Report("b", b.status().message());
    if (!a.ok() || !b.ok()) continue;
    if (*a == *b) {
      l.Report("b", "a link joins two different sites; both ends are '" +
                        link.a() + "'");
      continue;
    }
    const auto [it, inserted] = first_use.emplace(std::minmax(*a, *b), i);
    l.Check(inserted, "b",
            "the link " + link.a() + "-" + link.b() +
                " is already configured by wan.link[" +
                std::to_string(it->second) + "]");
  }
  // Unit strings: each direction config applied to a default model.
  auto check_direction = [&](const pb::LinkDirectionConfig& direction,
                             const std::string& path) {
    wan::DirectionModel model = wan::DefaultDirectionModel();
    if (Status status = wan::ApplyDirectionConfig(direction, path, &model);
        !status.ok()) {
      ReportAtPath(status, root);
    }
  };
  if (wan.has_default_link()) {
    check_direction(wan.default_link(), "wan.default_link");
  }
  for (int i = 0; i < wan.link_size(); ++i) {
    const std::string path = "wan." + Indexed("link", i);
    if (wan.link(i).has_both()) {
      check_direction(wan.link(i).both(), path + ".both");
    }
    if (wan.link(i).has_a_to_b()) {
      check_direction(wan.link(i).a_to_b(), path + ".a_to_b");
    }
    if (wan.link(i).has_b_to_a()) {
      check_direction(wan.link(i).b_to_a(), path + ".b_to_a");
    }
  }
  ValidatePrices(wan, r);
}

void ValidateFault(const pb::FaultConfig& fault, const IssueReporter& r) {
  r.Real("heartbeat_interval_s", fault.heartbeat_interval_s(), kPositive);
  r.Real("worker_timeout_s", fault.worker_timeout_s(), kPositive);
  r.Real("server_timeout_s", fault.server_timeout_s(), kPositive);
  r.Real("worker_give_up_s", fault.worker_give_up_s(), kNonNegative);
  r.Real("peer_timeout_s", fault.peer_timeout_s(), kPositive);
  r.Specified("partition_policy", fault.partition_policy());
  r.Real("checkpoint_period_s", fault.checkpoint_period_s(), kNonNegative);
  r.Real("restart_backoff_s", fault.restart_backoff_s(), kNonNegative);
  // A peer is declared silent only after several heartbeats it missed.
  for (const auto& [field, timeout] :
       {std::pair<std::string_view, double>{"worker_timeout_s",
                                            fault.worker_timeout_s()},
        {"server_timeout_s", fault.server_timeout_s()},
        {"peer_timeout_s", fault.peer_timeout_s()}}) {
    if (std::isfinite(timeout) && std::isfinite(fault.heartbeat_interval_s()) &&
        timeout < 2 * fault.heartbeat_interval_s()) {
      r.Report(field, "must be at least twice heartbeat_interval_s (" +
                          FormatReal(fault.heartbeat_interval_s()) + "), got " +
                          FormatReal(timeout) +
                          ": one late heartbeat would declare a live "
                          "process dead");
    }
  }
  if (fault.has_retention_limit()) {
    Result<uint64_t> limit = wan::ParseByteSize(fault.retention_limit());
    if (!limit.ok()) {
      r.Report("retention_limit", limit.status().message());
    } else if (*limit < (uint64_t{64} << 10)) {
      r.Report("retention_limit",
               "must be at least 64kb, got '" + fault.retention_limit() + "'");
    }
  }
}

}  // namespace meridian::config_internal
