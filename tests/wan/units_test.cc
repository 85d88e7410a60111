// Units as tc writes them, and clear errors for anything else.
#include <gtest/gtest.h>

#include "meridian/wan/link_model.h"
#include "wan/host_port.h"
#include "meridian/wan/units.h"
#include "testing/status_matchers.h"

namespace meridian::wan {
namespace {

double Rate(const char* text) {
  Result<double> r = ParseBandwidth(text);
  EXPECT_OK(r) << text << ": " << r.status();
  return r.ok() ? *r : -1;
}

Duration Time(const char* text) {
  Result<Duration> r = ParseDuration(text);
  EXPECT_OK(r) << text << ": " << r.status();
  return r.ok() ? *r : Duration(-1);
}

std::string RateError(const char* text) {
  Result<double> r = ParseBandwidth(text);
  EXPECT_FALSE(r.ok()) << text << " parsed as " << (r.ok() ? *r : 0);
  return r.ok() ? "" : r.status().message();
}

std::string TimeError(const char* text) {
  Result<Duration> r = ParseDuration(text);
  EXPECT_FALSE(r.ok()) << text;
  return r.ok() ? "" : r.status().message();
}

TEST(UnitsTest, RatesAsTcWritesThem) {
  EXPECT_DOUBLE_EQ(Rate("100mbit"), 100e6);
  EXPECT_DOUBLE_EQ(Rate("1gbit"), 1e9);
  EXPECT_DOUBLE_EQ(Rate("1.5Gbit"), 1.5e9);
  EXPECT_DOUBLE_EQ(Rate("500kbit"), 500e3);
  EXPECT_DOUBLE_EQ(Rate("64kibit"), 65536);
  EXPECT_DOUBLE_EQ(Rate("10mbps"), 80e6);  // bps = bytes per second in tc
  EXPECT_DOUBLE_EQ(Rate("2000000"), 2e6);  // bare: bit/s
  EXPECT_DOUBLE_EQ(Rate("1tbit"), 1e12);
  EXPECT_DOUBLE_EQ(Rate("unlimited"), 0);
}

TEST(UnitsTest, BadRatesSayWhatIsWrong) {
  EXPECT_NE(RateError("100mbits").find("unknown unit 'mbits'"),
            std::string::npos);
  EXPECT_NE(RateError("100mbits").find("mbit"), std::string::npos);
  EXPECT_NE(RateError("0mbit").find("positive"), std::string::npos);
  EXPECT_NE(RateError("-5mbit").find("positive"), std::string::npos);
  EXPECT_NE(RateError("mbit").find("number"), std::string::npos);
  EXPECT_NE(RateError("").find("empty"), std::string::npos);
  EXPECT_NE(RateError("10 mbit").find("unknown unit"), std::string::npos);
  EXPECT_NE(RateError("2tbit").find("out of range"), std::string::npos);
  EXPECT_NE(RateError("100bit").find("out of range"), std::string::npos);
  RateError("1e9bit");
  RateError("nan");
  RateError("inf");
  RateError("0x10mbit");
  RateError("1..2mbit");
}

TEST(UnitsTest, TimesAsTcWritesThem) {
  EXPECT_EQ(Time("50ms"), std::chrono::milliseconds(50));
  EXPECT_EQ(Time("500us"), std::chrono::microseconds(500));
  EXPECT_EQ(Time("1.5s"), std::chrono::milliseconds(1500));
  EXPECT_EQ(Time("2secs"), std::chrono::seconds(2));
  EXPECT_EQ(Time("20msec"), std::chrono::milliseconds(20));
  EXPECT_EQ(Time("0.25ms"), std::chrono::microseconds(250));
  EXPECT_EQ(Time("0"), Duration::zero());
  EXPECT_EQ(Time("0ms"), Duration::zero());
}

TEST(UnitsTest, BadTimesSayWhatIsWrong) {
  // tc would read a bare 40 as 40 us: refuse the ambiguity.
  EXPECT_NE(TimeError("40").find("needs a unit"), std::string::npos);
  EXPECT_NE(TimeError("-5ms").find("negative"), std::string::npos);
  EXPECT_NE(TimeError("5minutes").find("unknown unit"), std::string::npos);
  EXPECT_NE(TimeError("61s").find("at most 60s"), std::string::npos);
  EXPECT_NE(TimeError("ms").find("number"), std::string::npos);
}

TEST(UnitsTest, SizesAreBinaryAsInTc) {
  EXPECT_EQ(*ParseByteSize("64kb"), 65536u);
  EXPECT_EQ(*ParseByteSize("4mb"), 4u << 20);
  EXPECT_EQ(*ParseByteSize("1g"), 1u << 30);
  EXPECT_EQ(*ParseByteSize("1500"), 1500u);
  EXPECT_EQ(*ParseByteSize("1500b"), 1500u);
  EXPECT_FALSE(ParseByteSize("0").ok());
  EXPECT_FALSE(ParseByteSize("-1kb").ok());
  EXPECT_FALSE(ParseByteSize("1tb").ok());
  EXPECT_FALSE(ParseByteSize("100gb").ok());
}

TEST(UnitsTest, FormatsRoundTrip) {
  EXPECT_EQ(FormatBandwidth(100e6), "100mbit");
  EXPECT_EQ(FormatBandwidth(1.5e9), "1.5gbit");
  EXPECT_EQ(FormatBandwidth(0), "unlimited");
  EXPECT_EQ(FormatDuration(std::chrono::milliseconds(40)), "40ms");
  EXPECT_EQ(FormatDuration(std::chrono::microseconds(500)), "500us");
  EXPECT_EQ(FormatDuration(Duration::zero()), "0ms");
  EXPECT_EQ(FormatBytes(1 << 20), "1MiB");
  for (const char* text : {"100mbit", "1gbit", "2.5mbit", "640kbit"}) {
    EXPECT_DOUBLE_EQ(Rate(FormatBandwidth(Rate(text)).c_str()), Rate(text));
  }
}

TEST(UnitsTest, HostPortParsing) {
  Result<HostPort> a = ParseHostPort("127.0.0.1:8080", false);
  ASSERT_OK(a);
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8080);
  Result<HostPort> b = ParseHostPort("tcp://localhost:7100", false);
  ASSERT_OK(b);
  EXPECT_EQ(b->host, "localhost");
  Result<HostPort> c = ParseHostPort("[::1]:9", false);
  ASSERT_OK(c);
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->ToString(), "[::1]:9");
  EXPECT_OK(ParseHostPort("127.0.0.1:0", true));
  EXPECT_FALSE(ParseHostPort("127.0.0.1:0", false).ok());
  EXPECT_FALSE(ParseHostPort("127.0.0.1", true).ok());
  EXPECT_FALSE(ParseHostPort("127.0.0.1:70000", true).ok());
  EXPECT_FALSE(ParseHostPort(":80", true).ok());
  EXPECT_FALSE(ParseHostPort("host:port", true).ok());
  EXPECT_FALSE(ParseHostPort("::1:80", true).ok());
}

TEST(UnitsTest, DirectionConfigNamesTheField) {
  DirectionModel model;
  pb::LinkDirectionConfig change;
  change.set_bandwidth("10mbit");
  change.set_latency("40");  // no unit
  const Status status =
      ApplyDirectionConfig(change, "wan.link[2].a_to_b", &model);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("wan.link[2].a_to_b.latency"),
            std::string::npos)
      << status;
  EXPECT_EQ(model, DirectionModel{}) << "unchanged on error";

  change.set_latency("40ms");
  change.set_queue_limit("100");  // below 1 KiB
  EXPECT_FALSE(ApplyDirectionConfig(change, "x", &model).ok());
  change.set_queue_limit("4mb");
  change.set_jitter("5ms");
  change.set_jitter_distribution(pb::JITTER_NORMAL);
  ASSERT_OK(ApplyDirectionConfig(change, "x", &model));
  EXPECT_DOUBLE_EQ(model.bandwidth_bps, 10e6);
  EXPECT_EQ(model.latency, std::chrono::milliseconds(40));
  EXPECT_EQ(model.jitter, std::chrono::milliseconds(5));
  EXPECT_EQ(model.jitter_distribution, pb::JITTER_NORMAL);
  EXPECT_EQ(model.queue_limit_bytes, 4u << 20);
}

TEST(UnitsTest, DefaultQueueLimitCoversTheBandwidthDelayProduct) {
  DirectionModel model;
  model.bandwidth_bps = 1e9;
  model.latency = std::chrono::milliseconds(150);
  // 1 Gbit/s x 150 ms = 18.75 MB in flight; the default holds twice that.
  EXPECT_EQ(DefaultQueueLimit(model), 37'500'000u);
  model.bandwidth_bps = 1e6;
  model.latency = std::chrono::milliseconds(10);
  EXPECT_EQ(DefaultQueueLimit(model), 1u << 20);  // at least 1 MiB
  model.bandwidth_bps = 0;
  EXPECT_EQ(DefaultQueueLimit(model), 16u << 20);
  model.queue_limit_bytes = 5000;
  EXPECT_EQ(EffectiveQueueLimit(model), 5000u);
}

TEST(UnitsTest, ChunksAreAboutOneMillisecondOfLinkTime) {
  DirectionModel model;
  model.bandwidth_bps = 1e9;
  EXPECT_EQ(ChunkBytes(model, 256 * 1024), 125000u);
  model.bandwidth_bps = 1e6;
  EXPECT_EQ(ChunkBytes(model, 256 * 1024), 125u);
  model.bandwidth_bps = 1e4;
  EXPECT_EQ(ChunkBytes(model, 256 * 1024), 64u);
  model.bandwidth_bps = 1e11;
  EXPECT_EQ(ChunkBytes(model, 256 * 1024), 256u * 1024);
  model.bandwidth_bps = 0;
  EXPECT_EQ(ChunkBytes(model, 256 * 1024), 256u * 1024);
}

}  // namespace
}  // namespace meridian::wan
