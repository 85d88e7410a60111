// What sending data between cloud regions costs: a built-in table of AWS
// list prices for inter-region data transfer, and the job's overrides
// (wan.price), for the WAN bill of a run's report.
#ifndef MERIDIAN_WAN_TRANSFER_PRICES_H_
#define MERIDIAN_WAN_TRANSFER_PRICES_H_

#include <optional>
#include <span>
#include <string_view>

#include "meridian/job.pb.h"

namespace meridian::wan {

// US dollars per GB (10^9 bytes) of data sent from `from_region` to
// `to_region`; an empty to_region: to any other region. AWS bills
// inter-region transfer to the SOURCE region only (receiving is free), so
// one price per sending region, with the few pairs that differ listed
// beside it.
struct TransferPrice {
  std::string_view from_region;
  std::string_view to_region;
  double usd_per_gb;
};

// Where the built-in table comes from and when it was recorded.
inline constexpr std::string_view kTransferPriceSource =
    "AWS list prices for data transfer out to another AWS region, billed to "
    "the source region (AWS EC2 on-demand pricing, data transfer section; "
    "AWS Global Network FAQ), as tabulated in skyplane-project/skyplane "
    "skyplane/data/aws_transfer_costs.csv (commit 3b82dcc1); recorded "
    "2026-12-07";

// The built-in table: every region of RegionPresets().
std::span<const TransferPrice> TransferPrices();

// The price of a GB sent from a site in `from_region` to a site in
// `to_region`: the most specific matching job.wan().price entry (see
// job.proto), else the built-in table; nullopt when neither has one (an
// empty region, a region the table does not know; two sites in the same
// region, which the table does not price: AWS bills traffic between its
// availability zones separately).
std::optional<double> TransferPriceUsdPerGb(const pb::JobConfig& job,
                                            std::string_view from_region,
                                            std::string_view to_region);

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_TRANSFER_PRICES_H_
