#include "meridian/wan/transfer_prices.h"

namespace meridian::wan {
namespace {

// kTransferPriceSource: a price per sending region, and the pair that
// differs (Virginia and Ohio, $0.01 each way). The table's regions are
// those of the link presets (presets.cc).
constexpr TransferPrice kPrices[] = {
    {"us-east-1", "us-east-2", 0.01},
    {"us-east-2", "us-east-1", 0.01},
    {"us-east-1", "", 0.02},
    {"us-east-2", "", 0.02},
    {"us-west-1", "", 0.02},
    {"us-west-2", "", 0.02},
    {"eu-west-1", "", 0.02},
    {"eu-west-2", "", 0.02},
    {"eu-central-1", "", 0.02},
    {"ap-northeast-1", "", 0.09},  // Tokyo
    {"ap-northeast-2", "", 0.08},  // Seoul
    {"ap-southeast-1", "", 0.09},  // Singapore
    {"ap-southeast-2", "", 0.098},  // Sydney
    {"ap-south-1", "", 0.086},      // Mumbai
    {"sa-east-1", "", 0.138},       // Sao Paulo
};

bool IsAny(std::string_view region) { return region.empty() || region == "*"; }

// How specifically an entry (from, to) matches a pair: 4 both named, 3 the
// source named, 2 the destination named, 1 neither; 0 no match.
int Specificity(std::string_view entry_from, std::string_view entry_to,
                std::string_view from, std::string_view to) {
  const bool from_any = IsAny(entry_from);
  const bool to_any = IsAny(entry_to);
  if (!from_any && entry_from != from) return 0;
  if (!to_any && entry_to != to) return 0;
  if (!from_any && !to_any) return 4;
  if (!from_any) return 3;
  if (!to_any) return 2;
  return 1;
}

}  // namespace

std::span<const TransferPrice> TransferPrices() { return kPrices; }

std::optional<double> TransferPriceUsdPerGb(const pb::JobConfig& job,
                                            std::string_view from_region,
                                            std::string_view to_region) {
  if (from_region.empty() || to_region.empty()) return std::nullopt;
  std::optional<double> price;
  int best = 0;
  for (const pb::TransferPriceConfig& entry : job.wan().price()) {
    const int specificity = Specificity(entry.from_region(), entry.to_region(),
                                        from_region, to_region);
    if (specificity > best) {
      best = specificity;
      price = entry.usd_per_gb();
    }
  }
  // The built-in table prices traffic between regions only.
  if (price || from_region == to_region) return price;
  for (const TransferPrice& entry : kPrices) {
    const int specificity = Specificity(entry.from_region, entry.to_region,
                                        from_region, to_region);
    if (specificity > best) {
      best = specificity;
      price = entry.usd_per_gb;
    }
  }
  return price;
}

}  // namespace meridian::wan
