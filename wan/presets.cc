#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "meridian/wan/presets.h"

namespace meridian::wan {
namespace {

// Region pairs, every one a ROUND-TRIP time (rtt_ms) and a bandwidth
// applied to each direction (gbps).
//
// 1. DT-FM's table: all 45 pairs of its 10 regions, the AWS (delay ms,
// Gbps) pairs hard-coded in DS3Lab/DT-FM
// scheduler/generate_sim_com_matrices.py (`delay_bandwidth_dict`, commit
// 69f05e50, the NeurIPS'22 "Decentralized Training of Foundation Models"
// testbed; Table A of ../shared/reference/wan-emulation.md section 8 holds
// 19 of them). RTT OR ONE-WAY: DT-FM calls the first column "delay", but
// its values match measured ROUND-TRIP times (the median ping of
// doitintl/intercloud-throughput, Feb 2022, agrees within a few ms on every
// pair both measured, e.g. Virginia-Ohio 11 vs 11.2, Tokyo-Frankfurt 223 vs
// 223.1). So each direction of an emulated link gets rtt_ms / 2 of one-way
// latency (DT-FM's own tc script applies the full value on each sender's
// egress, which doubles the RTT).
//
// 2. Gaia's other three regions (California us-west-1, Mumbai ap-south-1,
// Sao Paulo sa-east-1; Gaia, NSDI'17, ran on 11 regions): 27 pairs with
// the others of Gaia's 11. RTT: cloudping.co's AWS inter-region matrix as
// hard-coded in libp2p/jvm-libp2p tools/simulator/.../aws/AwsLatencies.kt
// (commit 267a4d46, "thanks https://www.cloudping.co for the sample"),
// the mean of the two directions (they differ by at most 5 ms); cloudping
// times a TCP handshake from a Lambda in one region to a service endpoint
// in the other (one round trip), and agrees with DT-FM within about 4 ms on
// most pairs both have. Bandwidth: no source measured these pairs' capacity
// (iperf2 single-stream results, e.g. doitintl/intercloud-throughput 2022,
// are limited by the TCP window, not the link), so gbps is an ESTIMATE:
// the median Gbps of DT-FM's pairs whose RTT is within 30 ms of the pair's
// (at least the 3 nearest).
constexpr RegionPreset kPresets[] = {
    {"us-west-2", "us-east-1", 67, 0.79},              // Oregon-Virginia
    {"us-west-2", "us-east-2", 49, 1.1},               // Oregon-Ohio
    {"us-west-2", "ap-northeast-1", 96, 0.523},        // Oregon-Tokyo
    {"us-west-2", "ap-northeast-2", 124, 0.46},        // Oregon-Seoul
    {"us-west-2", "ap-southeast-1", 163, 0.341},       // Oregon-Singapore
    {"us-west-2", "ap-southeast-2", 139, 0.36},        // Oregon-Sydney
    {"us-west-2", "eu-west-2", 136, 0.42},             // Oregon-London
    {"us-west-2", "eu-central-1", 143, 0.404},         // Oregon-Frankfurt
    {"us-west-2", "eu-west-1", 124, 0.482},            // Oregon-Ireland
    {"us-east-1", "us-east-2", 11, 1.12},              // Virginia-Ohio
    {"us-east-1", "ap-northeast-1", 143, 0.524},       // Virginia-Tokyo
    {"us-east-1", "ap-northeast-2", 172, 0.5},         // Virginia-Seoul
    {"us-east-1", "ap-southeast-1", 230, 0.364},       // Virginia-Singapore
    {"us-east-1", "ap-southeast-2", 197, 0.383},       // Virginia-Sydney
    {"us-east-1", "eu-west-2", 76, 1.16},              // Virginia-London
    {"us-east-1", "eu-central-1", 90, 1.02},           // Virginia-Frankfurt
    {"us-east-1", "eu-west-1", 67, 1.05},              // Virginia-Ireland
    {"us-east-2", "ap-northeast-1", 130, 0.694},       // Ohio-Tokyo
    {"us-east-2", "ap-northeast-2", 159, 0.529},       // Ohio-Seoul
    {"us-east-2", "ap-southeast-1", 197, 0.452},       // Ohio-Singapore
    {"us-east-2", "ap-southeast-2", 185, 0.484},       // Ohio-Sydney
    {"us-east-2", "eu-west-2", 86, 1.05},              // Ohio-London
    {"us-east-2", "eu-central-1", 99, 0.799},          // Ohio-Frankfurt
    {"us-east-2", "eu-west-1", 77, 1.14},              // Ohio-Ireland
    {"ap-northeast-1", "ap-northeast-2", 34, 1.1},     // Tokyo-Seoul
    {"ap-northeast-1", "ap-southeast-1", 73, 1.01},    // Tokyo-Singapore
    {"ap-northeast-1", "ap-southeast-2", 100, 0.761},  // Tokyo-Sydney
    {"ap-northeast-1", "eu-west-2", 210, 0.366},       // Tokyo-London
    {"ap-northeast-1", "eu-central-1", 223, 0.36},     // Tokyo-Frankfurt
    {"ap-northeast-1", "eu-west-1", 199, 0.465},       // Tokyo-Ireland
    {"ap-northeast-2", "ap-southeast-1", 74, 1.14},    // Seoul-Singapore
    {"ap-northeast-2", "ap-southeast-2", 148, 0.58},   // Seoul-Sydney
    {"ap-northeast-2", "eu-west-2", 238, 0.342},       // Seoul-London
    {"ap-northeast-2", "eu-central-1", 235, 0.358},    // Seoul-Frankfurt
    {"ap-northeast-2", "eu-west-1", 228, 0.335},       // Seoul-Ireland
    {"ap-southeast-1", "ap-southeast-2", 92, 0.816},   // Singapore-Sydney
    {"ap-southeast-1", "eu-west-2", 169, 0.5},         // Singapore-London
    {"ap-southeast-1", "eu-central-1", 155, 0.535},    // Singapore-Frankfurt
    {"ap-southeast-1", "eu-west-1", 179, 0.492},       // Singapore-Ireland
    {"ap-southeast-2", "eu-west-2", 262, 0.326},       // Sydney-London
    {"ap-southeast-2", "eu-central-1", 265, 0.328},    // Sydney-Frankfurt
    {"ap-southeast-2", "eu-west-1", 254, 0.344},       // Sydney-Ireland
    {"eu-west-2", "eu-central-1", 14, 1.14},           // London-Frankfurt
    {"eu-west-2", "eu-west-1", 12, 1.09},              // London-Ireland
    {"eu-central-1", "eu-west-1", 24, 1.08},           // Frankfurt-Ireland
    // Gaia's other regions: cloudping RTT, estimated bandwidth.
    {"us-east-1", "us-west-1", 62, 1.05},            // Virginia-California
    {"us-west-1", "us-west-2", 22, 1.1},             // California-Oregon
    {"us-west-1", "eu-west-1", 128, 0.524},          // California-Ireland
    {"us-west-1", "eu-central-1", 151, 0.496},       // California-Frankfurt
    {"us-west-1", "ap-northeast-1", 108, 0.728},     // California-Tokyo
    {"us-west-1", "ap-northeast-2", 128, 0.524},     // California-Seoul
    {"us-west-1", "ap-southeast-1", 171.5, 0.492},   // California-Singapore
    {"us-west-1", "ap-southeast-2", 138.5, 0.482},   // California-Sydney
    {"us-west-1", "ap-south-1", 227.5, 0.359},       // California-Mumbai
    {"us-west-1", "sa-east-1", 172, 0.492},          // California-SaoPaulo
    {"us-east-1", "ap-south-1", 185.5, 0.475},       // Virginia-Mumbai
    {"us-east-1", "sa-east-1", 113.5, 0.524},        // Virginia-SaoPaulo
    {"us-west-2", "ap-south-1", 217.5, 0.364},       // Oregon-Mumbai
    {"us-west-2", "sa-east-1", 174, 0.492},          // Oregon-SaoPaulo
    {"eu-west-1", "ap-south-1", 120, 0.524},         // Ireland-Mumbai
    {"eu-west-1", "sa-east-1", 176.5, 0.492},        // Ireland-SaoPaulo
    {"eu-central-1", "ap-south-1", 110, 0.694},      // Frankfurt-Mumbai
    {"eu-central-1", "sa-east-1", 204, 0.383},       // Frankfurt-SaoPaulo
    {"ap-northeast-1", "ap-south-1", 124.5, 0.523},  // Tokyo-Mumbai
    {"ap-northeast-1", "sa-east-1", 256.5, 0.342},   // Tokyo-SaoPaulo
    {"ap-northeast-2", "ap-south-1", 125, 0.524},    // Seoul-Mumbai
    {"ap-northeast-2", "sa-east-1", 285, 0.328},     // Seoul-SaoPaulo
    {"ap-southeast-1", "ap-south-1", 56, 1.1},       // Singapore-Mumbai
    {"ap-southeast-1", "sa-east-1", 322, 0.328},     // Singapore-SaoPaulo
    {"ap-southeast-2", "ap-south-1", 145.5, 0.5},    // Sydney-Mumbai
    {"ap-southeast-2", "sa-east-1", 311.5, 0.328},   // Sydney-SaoPaulo
    {"ap-south-1", "sa-east-1", 297.5, 0.328},       // Mumbai-SaoPaulo
};

// Access networks of edge workers (workers.link.preset): medians or means
// of published measurements; one_way_ms is half the reported latency, which
// the sources measure as a round trip (ping) to a nearby test server, so it
// is a lower bound for reaching a server in a cloud region. None of the
// sources reports jitter: the presets have none (add workers.link.both
// .jitter to model it).
//  home-broadband  Ookla Speedtest Global Index, Q1 2023, global median
//                  fixed broadband: 79 Mbit/s down, 34.92 up, 9 ms latency.
//  4g              Opensignal, "State of Mobile: USA", Q1 2019 (LTE 93% of
//                  the time): 21.3 Mbit/s down, 6.3 up, latency 44.1-66.4 ms
//                  across operators (midpoint 55.25 ms).
//  5g              Ookla, "The State of Worldwide Connectivity in 2023" (Q3
//                  2023): median 5G 203.04 Mbit/s down, 18.93 up, 44 ms
//                  multi-server latency.
//  campus          an ESTIMATE, not a measurement: 1 GbE line rate both
//                  ways and 1 ms round trip inside a campus network.
constexpr AccessLinkPreset kAccessPresets[] = {
    {"home-broadband", 79.0, 34.92, 4.5, 0},
    {"4g", 21.3, 6.3, 27.625, 0},
    {"5g", 203.04, 18.93, 22.0, 0},
    {"campus", 1000, 1000, 0.5, 0},
};

// FNV-1a, for per-direction jitter seeds that do not depend on the STL.
uint64_t Hash(std::string_view text, uint64_t seed) {
  uint64_t h = 14695981039346656037ull ^ (seed * 0x9E3779B97F4A7C15ull);
  for (char c : text) {
    h ^= static_cast<uint8_t>(c);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::span<const RegionPreset> RegionPresets() { return kPresets; }

std::vector<std::string> KnownRegions() {
  std::set<std::string> regions;
  for (const RegionPreset& preset : kPresets) {
    regions.emplace(preset.region_a);
    regions.emplace(preset.region_b);
  }
  return {regions.begin(), regions.end()};
}

bool IsKnownRegion(std::string_view region) {
  return std::any_of(std::begin(kPresets), std::end(kPresets),
                     [&](const RegionPreset& p) {
                       return p.region_a == region || p.region_b == region;
                     });
}

std::optional<RegionPreset> FindRegionPreset(std::string_view region_a,
                                             std::string_view region_b) {
  for (const RegionPreset& preset : kPresets) {
    if ((preset.region_a == region_a && preset.region_b == region_b) ||
        (preset.region_a == region_b && preset.region_b == region_a)) {
      return preset;
    }
  }
  return std::nullopt;
}

namespace {

// A wan.link[] entry, keyed by the pair of site indices it joins.
struct LinkOverride {
  int index;      // in wan.link
  bool reversed;  // link.a is the site listed later
};
using LinkOverrides = std::map<std::pair<int, int>, LinkOverride>;
// Site index by name.
using SiteIndex = std::map<std::string, int>;

// Refuses empty or repeated site names and unknown regions.
Result<SiteIndex> IndexSites(const pb::JobConfig& job) {
  const auto& sites = job.site();
  SiteIndex index_of;
  for (int i = 0; i < sites.size(); ++i) {
    const std::string field = "site[" + std::to_string(i) + "]";
    if (sites[i].name().empty()) {
      return InvalidArgumentError(field + ".name: a site needs a name");
    }
    if (!index_of.emplace(sites[i].name(), i).second) {
      return InvalidArgumentError(field + ".name: duplicate site name '" +
                                  sites[i].name() + "'");
    }
    if (sites[i].has_region() && !IsKnownRegion(sites[i].region())) {
      std::string known;
      for (const std::string& region : KnownRegions()) {
        known += (known.empty() ? "" : ", ") + region;
      }
      return InvalidArgumentError(field + ".region: unknown region '" +
                                  sites[i].region() + "'; known: " + known);
    }
  }
  return index_of;
}

// Every link override, checked and keyed by the pair of site indices.
Result<LinkOverrides> IndexLinkOverrides(const pb::JobConfig& job,
                                         const SiteIndex& index_of) {
  LinkOverrides overrides;
  for (int k = 0; k < job.wan().link_size(); ++k) {
    const pb::LinkConfig& link = job.wan().link(k);
    const std::string field = "wan.link[" + std::to_string(k) + "]";
    auto a = index_of.find(link.a());
    if (link.a().empty() || a == index_of.end()) {
      return InvalidArgumentError(field + ".a: no site named '" + link.a() +
                                  "'");
    }
    auto b = index_of.find(link.b());
    if (link.b().empty() || b == index_of.end()) {
      return InvalidArgumentError(field + ".b: no site named '" + link.b() +
                                  "'");
    }
    if (a->second == b->second) {
      return InvalidArgumentError(field + ": a link joins two different sites");
    }
    const std::pair<int, int> key(std::min(a->second, b->second),
                                  std::max(a->second, b->second));
    const bool reversed = a->second > b->second;
    auto [it, inserted] = overrides.emplace(key, LinkOverride{k, reversed});
    if (!inserted) {
      return InvalidArgumentError(field + ": duplicate of wan.link[" +
                                  std::to_string(it->second.index) +
                                  "] (same pair of sites)");
    }
  }
  return overrides;
}

// Applies wan.link[override.index] to `link`: both, then a_to_b / b_to_a.
Status ApplyLinkOverride(const pb::JobConfig& job,
                         const LinkOverride& override, LinkModel* link) {
  const pb::LinkConfig& config = job.wan().link(override.index);
  const std::string field = "wan.link[" + std::to_string(override.index) + "]";
  if (config.has_both()) {
    MERIDIAN_RETURN_IF_ERROR(
        ApplyDirectionConfig(config.both(), field + ".both", &link->a_to_b));
    MERIDIAN_RETURN_IF_ERROR(
        ApplyDirectionConfig(config.both(), field + ".both", &link->b_to_a));
  }
  // The config's a_to_b is from ITS a, which may be our b.
  DirectionModel* config_a_to_b =
      override.reversed ? &link->b_to_a : &link->a_to_b;
  DirectionModel* config_b_to_a =
      override.reversed ? &link->a_to_b : &link->b_to_a;
  if (config.has_a_to_b()) {
    MERIDIAN_RETURN_IF_ERROR(ApplyDirectionConfig(
        config.a_to_b(), field + ".a_to_b", config_a_to_b));
  }
  if (config.has_b_to_a()) {
    MERIDIAN_RETURN_IF_ERROR(ApplyDirectionConfig(
        config.b_to_a(), field + ".b_to_a", config_b_to_a));
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<LinkModel>> ResolveJobLinks(const pb::JobConfig& job) {
  const auto& sites = job.site();
  MERIDIAN_ASSIGN_OR_RETURN(const SiteIndex index_of, IndexSites(job));
  DirectionModel base = DefaultDirectionModel();
  if (job.wan().has_default_link()) {
    MERIDIAN_RETURN_IF_ERROR(ApplyDirectionConfig(job.wan().default_link(),
                                                  "wan.default_link", &base));
  }
  MERIDIAN_ASSIGN_OR_RETURN(const LinkOverrides overrides,
                            IndexLinkOverrides(job, index_of));

  std::vector<LinkModel> links;
  for (int i = 0; i < sites.size(); ++i) {
    for (int j = i + 1; j < sites.size(); ++j) {
      LinkModel link;
      link.a = sites[i].name();
      link.b = sites[j].name();
      DirectionModel model = base;
      if (sites[i].has_region() && sites[j].has_region()) {
        if (std::optional<RegionPreset> preset =
                FindRegionPreset(sites[i].region(), sites[j].region())) {
          model.bandwidth_bps = preset->gbps * 1e9;
          model.latency = FromSeconds(preset->rtt_ms / 2.0 / 1000.0);
        }
      }
      link.a_to_b = model;
      link.b_to_a = model;
      if (auto it = overrides.find({i, j}); it != overrides.end()) {
        MERIDIAN_RETURN_IF_ERROR(ApplyLinkOverride(job, it->second, &link));
      }
      link.a_to_b.seed = Hash(link.name() + ">", job.seed());
      link.b_to_a.seed = Hash(link.name() + "<", job.seed());
      links.push_back(std::move(link));
    }
  }
  return links;
}

Result<std::string> JobLinkName(const pb::JobConfig& job,
                                std::string_view site_x,
                                std::string_view site_y) {
  int x = -1, y = -1;
  for (int i = 0; i < job.site_size(); ++i) {
    if (job.site(i).name() == site_x && x < 0) x = i;
    if (job.site(i).name() == site_y && y < 0) y = i;
  }
  if (x < 0 || y < 0) {
    return NotFoundError("no site named '" +
                         std::string(x < 0 ? site_x : site_y) + "'");
  }
  if (x == y) {
    return InvalidArgumentError("a link joins two different sites, got '" +
                                std::string(site_x) + "' twice");
  }
  return job.site(std::min(x, y)).name() + "-" +
         job.site(std::max(x, y)).name();
}

std::span<const AccessLinkPreset> AccessLinkPresets() { return kAccessPresets; }

std::optional<AccessLinkPreset> FindAccessLinkPreset(std::string_view name) {
  for (const AccessLinkPreset& preset : kAccessPresets) {
    if (preset.name == name) return preset;
  }
  return std::nullopt;
}

std::string AccessLinkPresetNames() {
  std::string names;
  for (const AccessLinkPreset& preset : kAccessPresets) {
    names += (names.empty() ? "" : ", ") + std::string(preset.name);
  }
  return names;
}

std::string WorkerLinkEnd(std::string_view site, uint32_t index) {
  return std::string(site) + "/w" + std::to_string(index);
}

bool IsWorkerLink(std::string_view link) {
  return link.find('/') != std::string_view::npos;
}

Result<std::vector<LinkModel>> ResolveWorkerLinks(const pb::JobConfig& job) {
  std::vector<LinkModel> links;
  for (int s = 0; s < job.site_size(); ++s) {
    const pb::SiteConfig& site = job.site(s);
    uint32_t index = 0;
    for (int g = 0; g < site.workers_size(); ++g) {
      const pb::WorkerGroup& group = site.workers(g);
      const std::string field = "site[" + std::to_string(s) + "].workers[" +
                                std::to_string(g) + "].link";
      if (!group.has_link()) {
        index += group.count();
        continue;
      }
      const pb::WorkerLinkConfig& config = group.link();
      DirectionModel up = DefaultDirectionModel();
      DirectionModel down = up;
      if (!config.preset().empty()) {
        const std::optional<AccessLinkPreset> preset =
            FindAccessLinkPreset(config.preset());
        if (!preset) {
          return InvalidArgumentError(field +
                                      ".preset: unknown access "
                                      "network '" +
                                      config.preset() +
                                      "'; known: " + AccessLinkPresetNames());
        }
        up.latency = FromSeconds(preset->one_way_ms / 1000.0);
        up.jitter = FromSeconds(preset->jitter_ms / 1000.0);
        down = up;
        up.bandwidth_bps = preset->up_mbps * 1e6;
        down.bandwidth_bps = preset->down_mbps * 1e6;
      }
      if (config.has_both()) {
        MERIDIAN_RETURN_IF_ERROR(
            ApplyDirectionConfig(config.both(), field + ".both", &up));
        MERIDIAN_RETURN_IF_ERROR(
            ApplyDirectionConfig(config.both(), field + ".both", &down));
      }
      if (config.has_up()) {
        MERIDIAN_RETURN_IF_ERROR(
            ApplyDirectionConfig(config.up(), field + ".up", &up));
      }
      if (config.has_down()) {
        MERIDIAN_RETURN_IF_ERROR(
            ApplyDirectionConfig(config.down(), field + ".down", &down));
      }
      for (uint32_t w = 0; w < group.count(); ++w, ++index) {
        LinkModel link;
        link.a = WorkerLinkEnd(site.name(), index);
        link.b = site.name();
        link.a_to_b = up;
        link.b_to_a = down;
        link.a_to_b.seed = Hash(link.name() + ">", job.seed());
        link.b_to_a.seed = Hash(link.name() + "<", job.seed());
        links.push_back(std::move(link));
      }
    }
  }
  return links;
}

}  // namespace meridian::wan
