// Measured inter-region latency and bandwidth, and the resolution of every
// link of a job (default link -> region preset -> per-link overrides).
#ifndef MERIDIAN_WAN_PRESETS_H_
#define MERIDIAN_WAN_PRESETS_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "meridian/core/status.h"
#include "meridian/job.pb.h"
#include "meridian/wan/link_model.h"

namespace meridian::wan {

// One measured pair of AWS regions. `rtt_ms` is a ROUND-TRIP time: the
// emulated link gets rtt_ms / 2 of one-way latency in each direction.
// `gbps` is the measured bandwidth, applied to each direction.
struct RegionPreset {
  std::string_view region_a;  // AWS region codes, e.g. "us-east-1"
  std::string_view region_b;
  double rtt_ms;
  double gbps;
};

// The whole table (72 pairs over 13 regions: every pair of DT-FM's 10,
// and every pair of Gaia's 11 that involves us-west-1, ap-south-1 or
// sa-east-1); see presets.cc for sources.
std::span<const RegionPreset> RegionPresets();

// Region codes the table knows, sorted.
std::vector<std::string> KnownRegions();
bool IsKnownRegion(std::string_view region);

// The preset of an unordered pair of regions; nullopt when the table has
// no entry (including a region paired with itself).
std::optional<RegionPreset> FindRegionPreset(std::string_view region_a,
                                             std::string_view region_b);

// Every link of a job: one per unordered pair of sites, in site order
// (a = the site listed first). Each direction starts from
// DefaultDirectionModel() overridden by wan.default_link, then takes the
// regions' preset (bandwidth and RTT/2 latency) when both sites have a
// region and the pair is in the table, then wan.link[i].both, then
// wan.link[i].a_to_b / b_to_a. Jitter seeds derive from job.seed() and the
// link name. Errors name the field: "wan.link[1].a_to_b.latency: ...",
// "site[2].region: unknown region ...", "wan.link[0].b: no site ...".
// wan.emulate is not looked at (the caller decides whether to shape).
Result<std::vector<LinkModel>> ResolveJobLinks(const pb::JobConfig& job);

// The name of the link between two sites of `job`, given in either order:
// "<site listed first>-<other site>". NotFound for an unknown site,
// InvalidArgument when both are the same site.
Result<std::string> JobLinkName(const pb::JobConfig& job,
                                std::string_view site_x,
                                std::string_view site_y);

// ---- workers' access links (workers.link) ----------------------------------

// A typical access network of an edge device (workers.link.preset).
// `one_way_ms` is ONE-WAY latency (half the measured round trip); down is
// server -> worker, up is worker -> server. Sources in presets.cc.
struct AccessLinkPreset {
  std::string_view name;  // "home-broadband", "4g", "5g", "campus"
  double down_mbps;
  double up_mbps;
  double one_way_ms;
  double jitter_ms;
};

std::span<const AccessLinkPreset> AccessLinkPresets();
std::optional<AccessLinkPreset> FindAccessLinkPreset(std::string_view name);
// Their names, ", "-separated, for error messages.
std::string AccessLinkPresetNames();

// The access link of worker `index` of `site`: a = "<site>/w<index>" (the
// worker's end; '/' never occurs in a site name), b = the site, so its name
// is "<site>/w<index>-<site>" and a_to_b is the uplink.
std::string WorkerLinkEnd(std::string_view site, uint32_t index);
// Whether `link` (a LinkModel name) is a worker's access link.
bool IsWorkerLink(std::string_view link);

// Every worker access link of a job, site by site, worker by worker, for
// the groups that have workers.link: each direction starts from
// DefaultDirectionModel(), takes the preset (bandwidth per direction,
// one-way latency, uniform jitter), then `both`, then up / down. Jitter
// seeds derive from job.seed() and the link name. Errors name the field:
// "site[0].workers[1].link.preset: unknown access network 'x'; ...".
Result<std::vector<LinkModel>> ResolveWorkerLinks(const pb::JobConfig& job);

}  // namespace meridian::wan

#endif  // MERIDIAN_WAN_PRESETS_H_
