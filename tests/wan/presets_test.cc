// Region presets and the resolution of every link of a job.
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include "meridian/wan/presets.h"
#include "meridian/wan/wanem.h"
#include "testing/status_matchers.h"

namespace meridian::wan {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

pb::JobConfig Job(const std::string& text) {
  pb::JobConfig job;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &job))
      << text;
  return job;
}

TEST(PresetsTest, TableIsSymmetricAndCoversDtFmsAndGaiasRegions) {
  // DT-FM's 10 regions, every pair (45), and Gaia's 11 (3 more regions,
  // 27 more pairs).
  EXPECT_EQ(RegionPresets().size(), 72u);
  const std::vector<std::string> regions = KnownRegions();
  EXPECT_EQ(regions.size(), 13u);
  const std::vector<std::string> dt_fm = {
      "us-east-1",      "us-east-2",     "us-west-2",      "eu-west-1",
      "eu-west-2",      "eu-central-1",  "ap-northeast-1", "ap-northeast-2",
      "ap-southeast-1", "ap-southeast-2"};
  const std::vector<std::string> gaia = {
      "us-east-1",      "us-west-1",      "us-west-2",      "eu-west-1",
      "eu-central-1",   "ap-northeast-1", "ap-northeast-2", "ap-southeast-1",
      "ap-southeast-2", "ap-south-1",     "sa-east-1"};
  for (const auto* set : {&dt_fm, &gaia}) {
    for (const std::string& a : *set) {
      EXPECT_TRUE(IsKnownRegion(a)) << a;
      for (const std::string& b : *set) {
        if (a != b) {
          EXPECT_TRUE(FindRegionPreset(a, b)) << a << " " << b;
        }
      }
    }
  }
  EXPECT_FALSE(IsKnownRegion("mars-north-1"));
  for (const RegionPreset& preset : RegionPresets()) {
    auto forward = FindRegionPreset(preset.region_a, preset.region_b);
    auto backward = FindRegionPreset(preset.region_b, preset.region_a);
    ASSERT_TRUE(forward && backward);
    EXPECT_EQ(forward->rtt_ms, backward->rtt_ms);
    EXPECT_GT(preset.gbps, 0.3);
    EXPECT_LT(preset.gbps, 1.2);
  }
  auto virginia_ohio = FindRegionPreset("us-east-2", "us-east-1");
  ASSERT_TRUE(virginia_ohio);
  EXPECT_EQ(virginia_ohio->rtt_ms, 11);
  EXPECT_EQ(virginia_ohio->gbps, 1.12);
  EXPECT_FALSE(FindRegionPreset("us-east-1", "us-east-1"));
  // Ohio and London are DT-FM's, Sao Paulo is Gaia's: no pair.
  EXPECT_FALSE(FindRegionPreset("us-east-2", "sa-east-1"));
  // A pair of the estimated part: cloudping's RTT.
  auto mumbai_singapore = FindRegionPreset("ap-south-1", "ap-southeast-1");
  ASSERT_TRUE(mumbai_singapore);
  EXPECT_EQ(mumbai_singapore->rtt_ms, 56);
}

TEST(PresetsTest, OneLinkPerPairInSiteOrderWithTheDefault) {
  const auto links = ResolveJobLinks(
      Job("site { name: 'x' } site { name: 'y' } site { name: 'z' }"));
  ASSERT_OK(links);
  ASSERT_EQ(links->size(), 3u);
  EXPECT_EQ((*links)[0].name(), "x-y");
  EXPECT_EQ((*links)[1].name(), "x-z");
  EXPECT_EQ((*links)[2].name(), "y-z");
  // The documented default: 1 Gbit/s, 0 ms, no jitter, automatic queue.
  const DirectionModel& d = (*links)[0].a_to_b;
  EXPECT_DOUBLE_EQ(d.bandwidth_bps, 1e9);
  EXPECT_EQ(d.latency, Duration::zero());
  EXPECT_EQ(d.jitter, Duration::zero());
  EXPECT_EQ(d.queue_limit_bytes, 0u);
  // Seeds differ per direction and per link.
  EXPECT_NE((*links)[0].a_to_b.seed, (*links)[0].b_to_a.seed);
  EXPECT_NE((*links)[0].a_to_b.seed, (*links)[1].a_to_b.seed);
}

TEST(PresetsTest, RegionsGiveHalfTheRttEachWay) {
  const auto links =
      ResolveJobLinks(Job("site { name: 'va' region: 'us-east-1' } "
                          "site { name: 'tokyo' region: 'ap-northeast-1' } "
                          "site { name: 'lab' }"));
  ASSERT_OK(links);
  const LinkModel& va_tokyo = (*links)[0];
  EXPECT_EQ(va_tokyo.name(), "va-tokyo");
  for (const DirectionModel* d : {&va_tokyo.a_to_b, &va_tokyo.b_to_a}) {
    EXPECT_DOUBLE_EQ(d->bandwidth_bps, 0.524e9);
    EXPECT_EQ(d->latency, microseconds(71'500));  // 143 ms RTT / 2
  }
  // A site without a region gets the default link.
  EXPECT_EQ((*links)[1].a_to_b.latency, Duration::zero());
  EXPECT_DOUBLE_EQ((*links)[1].a_to_b.bandwidth_bps, 1e9);
}

TEST(PresetsTest, OverridesApplyDefaultThenPresetThenBothThenDirection) {
  const auto links = ResolveJobLinks(Job(R"(
    site { name: 'a' region: 'eu-west-2' }
    site { name: 'b' region: 'eu-central-1' }
    wan {
      default_link { bandwidth: '100mbit' jitter: '1ms' queue_limit: '8mb' }
      link {
        a: 'b' b: 'a'   # written in the other order
        both { latency: '30ms' }
        a_to_b { bandwidth: '5mbit' }   # b -> a in link order
      }
    })"));
  ASSERT_OK(links);
  const LinkModel& link = (*links)[0];
  EXPECT_EQ(link.name(), "a-b");
  // a -> b: preset bandwidth (1.14 Gbit/s), both's latency, default jitter.
  EXPECT_DOUBLE_EQ(link.a_to_b.bandwidth_bps, 1.14e9);
  EXPECT_EQ(link.a_to_b.latency, milliseconds(30));
  EXPECT_EQ(link.a_to_b.jitter, milliseconds(1));
  EXPECT_EQ(link.a_to_b.queue_limit_bytes, 8u << 20);
  // b -> a: the config's a_to_b, because its a is our b.
  EXPECT_DOUBLE_EQ(link.b_to_a.bandwidth_bps, 5e6);
  EXPECT_EQ(link.b_to_a.latency, milliseconds(30));
}

TEST(PresetsTest, PresetLatencyWithoutOverrideIsHalfTheRtt) {
  const auto links =
      ResolveJobLinks(Job("site { name: 'a' region: 'eu-west-2' } "
                          "site { name: 'b' region: 'eu-central-1' }"));
  ASSERT_OK(links);
  EXPECT_EQ((*links)[0].a_to_b.latency, milliseconds(7));
}

TEST(PresetsTest, LinkNamesFollowSiteOrder) {
  const pb::JobConfig job =
      Job("site { name: 'x' } site { name: 'y' } site { name: 'z' }");
  EXPECT_EQ(*JobLinkName(job, "z", "x"), "x-z");
  EXPECT_EQ(*JobLinkName(job, "y", "z"), "y-z");
  EXPECT_EQ(JobLinkName(job, "x", "w").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(JobLinkName(job, "x", "x").ok());
}

std::string ResolveError(const std::string& text) {
  const auto links = ResolveJobLinks(Job(text));
  EXPECT_FALSE(links.ok()) << text;
  return links.ok() ? "" : links.status().message();
}

TEST(PresetsTest, ErrorsNameTheField) {
  const std::string two = "site { name: 'a' } site { name: 'b' } ";
  EXPECT_NE(ResolveError(two + "wan { link { a: 'a' b: 'b' a_to_b { "
                               "latency: '40' } } }")
                .find("wan.link[0].a_to_b.latency"),
            std::string::npos);
  EXPECT_NE(ResolveError(two + "wan { link { a: 'a' b: 'b' both { "
                               "bandwidth: '10 mbit' } } }")
                .find("wan.link[0].both.bandwidth"),
            std::string::npos);
  EXPECT_NE(ResolveError(two + "wan { default_link { bandwidth: '0mbit' } }")
                .find("wan.default_link.bandwidth"),
            std::string::npos);
  EXPECT_NE(ResolveError(two + "wan { link { a: 'a' b: 'c' } }")
                .find("wan.link[0].b: no site named 'c'"),
            std::string::npos);
  EXPECT_NE(
      ResolveError(two + "wan { link { a: 'a' b: 'a' } }").find("wan.link[0]"),
      std::string::npos);
  EXPECT_NE(ResolveError(two + "wan { link { a: 'a' b: 'b' } "
                               "link { a: 'b' b: 'a' } }")
                .find("wan.link[1]: duplicate of wan.link[0]"),
            std::string::npos);
  EXPECT_NE(ResolveError("site { name: 'a' region: 'us-east-9' } "
                         "site { name: 'b' }")
                .find("site[0].region: unknown region 'us-east-9'"),
            std::string::npos);
  EXPECT_NE(ResolveError("site { name: 'a' } site { name: 'a' }")
                .find("site[1].name"),
            std::string::npos);
}

// ---- workers' access links
// ---------------------------------------------------

TEST(AccessLinkPresetsTest, EveryPresetIsFoundByNameAndPlausible) {
  ASSERT_EQ(AccessLinkPresets().size(), 4u);
  for (const AccessLinkPreset& preset : AccessLinkPresets()) {
    const auto found = FindAccessLinkPreset(preset.name);
    ASSERT_TRUE(found) << preset.name;
    EXPECT_GT(preset.up_mbps, 0) << preset.name;
    EXPECT_GE(preset.down_mbps, preset.up_mbps) << preset.name;
    EXPECT_GT(preset.one_way_ms, 0) << preset.name;
    EXPECT_LT(preset.one_way_ms, 100) << preset.name;
  }
  EXPECT_FALSE(FindAccessLinkPreset("dial-up"));
}

TEST(AccessLinkPresetsTest, WorkerLinksFollowTheWorkerNumberingOfTheSite) {
  // Site a: worker 0 on loopback, workers 1 and 2 behind 4G with a slower
  // uplink; site b: worker 0 behind its own link.
  const auto links = ResolveWorkerLinks(Job(R"(
    seed: 5
    site { name: 'a'
      workers { count: 1 }
      workers { count: 2 link { preset: '4g' up { bandwidth: '1mbit' } } } }
    site { name: 'b'
      workers { count: 1 link { both { bandwidth: '20mbit' latency: '30ms' }
                                down { latency: '10ms' } } } }
  )"));
  ASSERT_OK(links);
  ASSERT_EQ(links->size(), 3u);
  EXPECT_EQ((*links)[0].name(), "a/w1-a");
  EXPECT_EQ((*links)[1].name(), "a/w2-a");
  EXPECT_EQ((*links)[2].name(), "b/w0-b");
  for (const LinkModel& link : *links) EXPECT_TRUE(IsWorkerLink(link.name()));
  EXPECT_FALSE(IsWorkerLink("a-b"));
  // a -> b is the uplink (the worker's end is a).
  const LinkModel& four_g = (*links)[0];
  EXPECT_EQ(four_g.a, "a/w1");
  EXPECT_DOUBLE_EQ(four_g.a_to_b.bandwidth_bps, 1e6);     // up, overridden
  EXPECT_DOUBLE_EQ(four_g.b_to_a.bandwidth_bps, 21.3e6);  // down, preset
  EXPECT_EQ(four_g.a_to_b.latency, microseconds(27'625));
  EXPECT_EQ(four_g.b_to_a.latency, microseconds(27'625));
  EXPECT_NE(four_g.a_to_b.seed, (*links)[1].a_to_b.seed);
  const LinkModel& custom = (*links)[2];
  EXPECT_DOUBLE_EQ(custom.a_to_b.bandwidth_bps, 20e6);
  EXPECT_EQ(custom.a_to_b.latency, milliseconds(30));
  EXPECT_EQ(custom.b_to_a.latency, milliseconds(10));
  // No worker links, none resolved; and a bad preset names its field.
  EXPECT_TRUE(ResolveWorkerLinks(Job("site { name: 'a' }"))->empty());
  const auto bad = ResolveWorkerLinks(
      Job("site { name: 'a' workers { link { preset: 'dial-up' } } }"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(
                "site[0].workers[0].link.preset: unknown access network"),
            std::string::npos)
      << bad.status();
}

// A job's wanem admits every connection the job itself may open on a route
// (all of the largest site's workers training against another site's
// server) above the flood cap.
TEST(PresetsTest, AJobsWanemAdmitsEveryOneOfItsWorkersOnARoute) {
  const pb::JobConfig job = Job(
      "site { name: 'a' region: 'us-east-1' workers { count: 100 } "
      "       workers { count: 20 } }"
      "site { name: 'b' region: 'eu-central-1' server_site: 'a' "
      "       workers { count: 3 } }");
  Result<WanemOptions> options = JobWanemOptions(job, "none");
  ASSERT_OK(options);
  EXPECT_EQ(options->max_connections_per_route, 64u + 120u);
  EXPECT_EQ(options->max_connections, 1024u + 123u);
}

}  // namespace
}  // namespace meridian::wan
