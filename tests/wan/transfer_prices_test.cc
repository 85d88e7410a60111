// The built-in inter-region transfer prices and the job's overrides
// (wan.price): the most specific entry applies, the job's before the table.
#include "meridian/wan/transfer_prices.h"

#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <string>

#include "meridian/wan/presets.h"

namespace meridian::wan {
namespace {

pb::JobConfig Job(const std::string& text) {
  pb::JobConfig job;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &job))
      << text;
  return job;
}

TEST(TransferPricesTest, EveryPairOfPresetRegionsHasAPriceBilledToTheSource) {
  const pb::JobConfig job;
  for (const std::string& from : KnownRegions()) {
    for (const std::string& to : KnownRegions()) {
      if (from == to) continue;
      const std::optional<double> price = TransferPriceUsdPerGb(job, from, to);
      ASSERT_TRUE(price.has_value()) << from << " -> " << to;
      EXPECT_GT(*price, 0) << from << " -> " << to;
    }
  }
  // Billed to the sender: Singapore's sending costs more than Virginia's.
  EXPECT_EQ(TransferPriceUsdPerGb(job, "ap-southeast-1", "us-east-1"), 0.09);
  EXPECT_EQ(TransferPriceUsdPerGb(job, "us-east-1", "ap-southeast-1"), 0.02);
  // The pair that differs from its source's price.
  EXPECT_EQ(TransferPriceUsdPerGb(job, "us-east-1", "us-east-2"), 0.01);
  EXPECT_EQ(TransferPriceUsdPerGb(job, "us-east-1", "us-west-2"), 0.02);
}

TEST(TransferPricesTest, UnknownEmptyOrSameRegionHasNoBuiltInPrice) {
  const pb::JobConfig job;
  EXPECT_EQ(TransferPriceUsdPerGb(job, "mars-1", "us-east-1"), std::nullopt);
  EXPECT_EQ(TransferPriceUsdPerGb(job, "", "us-east-1"), std::nullopt);
  EXPECT_EQ(TransferPriceUsdPerGb(job, "us-east-1", ""), std::nullopt);
  EXPECT_EQ(TransferPriceUsdPerGb(job, "us-east-1", "us-east-1"),
            std::nullopt);
}

TEST(TransferPricesTest, TheJobsMostSpecificEntryWinsOverTheTable) {
  const pb::JobConfig job = Job(R"pb(
    wan {
      price { from_region: "*" usd_per_gb: 0.05 }
      price { from_region: "*" to_region: "eu-central-1" usd_per_gb: 0.04 }
      price { from_region: "us-east-1" usd_per_gb: 0.03 }
      price {
        from_region: "us-east-1"
        to_region: "eu-central-1"
        usd_per_gb: 0.001
      }
      price { from_region: "dc-a" to_region: "dc-a" usd_per_gb: 0 }
    }
  )pb");
  EXPECT_EQ(TransferPriceUsdPerGb(job, "us-east-1", "eu-central-1"), 0.001);
  EXPECT_EQ(TransferPriceUsdPerGb(job, "us-east-1", "ap-southeast-1"), 0.03);
  EXPECT_EQ(TransferPriceUsdPerGb(job, "ap-southeast-1", "eu-central-1"),
            0.04);
  // "*" catches every pair, regions the table does not know included.
  EXPECT_EQ(TransferPriceUsdPerGb(job, "ap-southeast-1", "us-east-1"), 0.05);
  EXPECT_EQ(TransferPriceUsdPerGb(job, "dc-b", "dc-c"), 0.05);
  // The job may price traffic inside one region; a zero price is a price.
  EXPECT_EQ(TransferPriceUsdPerGb(job, "dc-a", "dc-a"), 0.0);
  // A job that prices only some pairs keeps the table for the rest.
  const pb::JobConfig partial = Job(R"pb(
    wan { price { from_region: "ap-southeast-1" usd_per_gb: 0.12 } }
  )pb");
  EXPECT_EQ(TransferPriceUsdPerGb(partial, "ap-southeast-1", "us-east-1"),
            0.12);
  EXPECT_EQ(TransferPriceUsdPerGb(partial, "eu-central-1", "us-east-1"),
            0.02);
}

}  // namespace
}  // namespace meridian::wan
