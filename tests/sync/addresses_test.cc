#include "meridian/sync/addresses.h"

#include <gtest/gtest.h>

#include <map>

#include "meridian/config/config.h"
#include "testing/status_matchers.h"

namespace meridian {
namespace {

// Three sites; `extra` is appended to the job text.
pb::JobConfig ThreeSites(const std::string& extra = "") {
  const std::string text = R"pb(
    site { name: "us-east" address: "tcp://meridian-us:7100"
           mirror_address: "tcp://meridian-us:7200" workers { count: 1 } }
    site { name: "eu" address: "tcp://10.0.2.2:7100"
           mirror_address: "tcp://10.0.2.2:7200" workers { count: 1 } }
    site { name: "ap" address: "tcp://127.0.0.1:7103"
           mirror_address: "tcp://127.0.0.1:7203" workers { count: 1 } }
    model { kind: SOFTMAX }
    data { dir: "/nonexistent" }
  )pb" + extra;
  Result<pb::JobConfig> job = ParseJobConfig(text, "test");
  EXPECT_OK(job);
  return job.ok() ? *job : pb::JobConfig();
}

EnvLookup FakeEnvironment(std::map<std::string, std::string> values) {
  return [values = std::move(values)](
             std::string_view name) -> std::optional<std::string> {
    auto it = values.find(std::string(name));
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

TEST(AddressesTest, BindsNamesOnEveryInterfaceAndAddressesAsGiven) {
  EXPECT_EQ(BindEndpointFor("tcp://meridian-us:7100"), "tcp://*:7100");
  EXPECT_EQ(BindEndpointFor("tcp://us.example.com:7200"), "tcp://*:7200");
  EXPECT_EQ(BindEndpointFor("tcp://127.0.0.1:7100"), "tcp://127.0.0.1:7100");
  EXPECT_EQ(BindEndpointFor("tcp://10.0.2.2:7100"), "tcp://10.0.2.2:7100");
  EXPECT_EQ(BindEndpointFor("tcp://[::1]:7100"), "tcp://[::1]:7100");
  EXPECT_EQ(BindEndpointFor("tcp://localhost:7100"), "tcp://localhost:7100");
  EXPECT_EQ(BindEndpointFor("tcp://*:7100"), "tcp://*:7100");
  EXPECT_EQ(BindEndpointFor("ipc:///tmp/x"), "ipc:///tmp/x");
  EXPECT_EQ(BindEndpointFor("tcp://nohostport"), "tcp://nohostport");
}

TEST(AddressesTest, EnvironmentVariableNamesAreUpperCasedAndSanitised) {
  EXPECT_EQ(SiteEnvVariable("us-east", "ADDRESS"),
            "MERIDIAN_SITE_US_EAST_ADDRESS");
  EXPECT_EQ(SiteEnvVariable("eu.1", "MIRROR_ADDRESS"),
            "MERIDIAN_SITE_EU_1_MIRROR_ADDRESS");
}

TEST(AddressesTest, EnvironmentOverridesAddressesAndWanemHost) {
  pb::JobConfig job = ThreeSites();
  ASSERT_OK(ApplyAddressOverrides(
                  &job, FakeEnvironment(
                            {{"MERIDIAN_SITE_US_EAST_ADDRESS",
                              "tcp://10.9.0.1:9100"},
                             {"MERIDIAN_SITE_AP_MIRROR_ADDRESS",
                              "tcp://10.9.0.3:9200"},
                             {"MERIDIAN_WANEM_HOST", "wanem"}})));
  EXPECT_EQ(job.site(0).address(), "tcp://10.9.0.1:9100");
  EXPECT_EQ(job.site(0).mirror_address(), "tcp://meridian-us:7200");
  EXPECT_EQ(job.site(2).mirror_address(), "tcp://10.9.0.3:9200");
  EXPECT_EQ(job.wan().wanem_host(), "wanem");
  EXPECT_TRUE(ValidateJobConfig(job).empty());
}

TEST(AddressesTest, MalformedOverridesAreRefusedNamingTheVariable) {
  pb::JobConfig job = ThreeSites();
  Status status = ApplyAddressOverrides(
      &job, FakeEnvironment({{"MERIDIAN_SITE_EU_ADDRESS", "10.0.0.1:7100"}}));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("MERIDIAN_SITE_EU_ADDRESS"),
            std::string::npos);
  EXPECT_EQ(job.site(1).address(), "tcp://10.0.2.2:7100");  // untouched

  status = ApplyAddressOverrides(
      &job, FakeEnvironment({{"MERIDIAN_WANEM_HOST", "tcp://wanem:7400"}}));
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find("MERIDIAN_WANEM_HOST"), std::string::npos);
}

TEST(AddressesTest, WithoutWanemSitesConnectDirectly) {
  const pb::JobConfig job = ThreeSites();
  EXPECT_TRUE(StaticRoutes(job).empty());
  EXPECT_EQ(PeerMirrorEndpoint(job, 0, 1), "tcp://10.0.2.2:7200");
  EXPECT_EQ(WorkerServerEndpoint(job, 2), "tcp://127.0.0.1:7103");
}

TEST(AddressesTest, WanemRoutesEveryOrderedPairOnItsOwnPort) {
  const pb::JobConfig job = ThreeSites(R"pb(
    wan { wanem_host: "meridian-wanem" route_base_port: 8000 })pb");
  const std::vector<StaticRoute> routes = StaticRoutes(job);
  ASSERT_EQ(routes.size(), 6u);  // 3 x 2 ordered pairs, sync only
  std::map<uint32_t, const StaticRoute*> by_port;
  for (const StaticRoute& route : routes) {
    EXPECT_TRUE(by_port.emplace(route.port, &route).second) << route.port;
    EXPECT_FALSE(route.workers);
  }
  // us-east (0) -> eu (1): 8000 + 0*3 + 1.
  ASSERT_TRUE(by_port.count(8001));
  EXPECT_EQ(by_port[8001]->link, "us-east-eu");
  EXPECT_EQ(by_port[8001]->from_site, "us-east");
  EXPECT_EQ(by_port[8001]->listen, "0.0.0.0:8001");
  EXPECT_EQ(by_port[8001]->forward, "10.0.2.2:7200");
  // ap (2) -> us-east (0): 8000 + 2*3 + 0; the link is named in file order.
  ASSERT_TRUE(by_port.count(8006));
  EXPECT_EQ(by_port[8006]->link, "us-east-ap");
  EXPECT_EQ(by_port[8006]->forward, "meridian-us:7200");
  EXPECT_EQ(PeerMirrorEndpoint(job, 0, 1), "tcp://meridian-wanem:8001");
  EXPECT_EQ(PeerMirrorEndpoint(job, 2, 0), "tcp://meridian-wanem:8006");
}

TEST(AddressesTest, WorkersOfASiteWithoutServerGetAWorkerRoute) {
  pb::JobConfig job = ThreeSites(R"pb(
    wan { wanem_host: "10.0.0.254" })pb");
  job.mutable_site(2)->set_server_site("us-east");
  ASSERT_TRUE(ValidateJobConfig(job).empty());
  const std::vector<StaticRoute> routes = StaticRoutes(job);
  // us-east <-> eu sync (2 routes) + ap's workers -> us-east (1 route).
  ASSERT_EQ(routes.size(), 3u);
  const StaticRoute& worker_route = routes.back();
  EXPECT_TRUE(worker_route.workers);
  EXPECT_EQ(worker_route.from_site, "ap");
  EXPECT_EQ(worker_route.port, 7400u + 9 + 2 * 3 + 0);
  EXPECT_EQ(worker_route.forward, "meridian-us:7100");
  EXPECT_EQ(WorkerServerEndpoint(job, 2), "tcp://10.0.0.254:7415");
  EXPECT_EQ(WorkerServerEndpoint(job, 0), "tcp://meridian-us:7100");
}

TEST(AddressesTest, ValidationNamesBadWanemSettings) {
  pb::JobConfig job = ThreeSites();
  job.mutable_wan()->set_wanem_host("wanem:7400");
  job.mutable_wan()->set_route_base_port(65530);
  job.mutable_site(1)->set_mirror_address("ipc:///tmp/eu");
  std::string all;
  for (const ConfigIssue& issue : ValidateJobConfig(job)) {
    all += issue.field + ": " + issue.message + "\n";
  }
  EXPECT_NE(all.find("wan.wanem_host"), std::string::npos) << all;
  EXPECT_NE(all.find("wan.route_base_port"), std::string::npos) << all;
  EXPECT_NE(all.find("site[1].mirror_address"), std::string::npos) << all;
}

}  // namespace
}  // namespace meridian
