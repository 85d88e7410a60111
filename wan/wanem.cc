#include "meridian/wan/wanem.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <thread>

#include "meridian/core/log.h"
#include "meridian/metrics/metrics.h"
#include "meridian/wan/control.h"
#include "meridian/wan/presets.h"
#include "meridian/wan/units.h"
#include "wan/connection_gate.h"
#include "wan/emulator.h"
#include "wan/host_port.h"

namespace meridian::wan {
namespace {

// How often the emulator's counters are copied into the metrics registry.
constexpr double kMetricsPeriodS = 0.25;

void PublishMetrics(const Emulator& emulator, double uptime_s,
                    MetricsRegistry* registry) {
  registry->Gauge("meridian_wan_uptime_seconds", "Seconds wanem has run")
      ->Set(uptime_s);
  for (const pb::WanLinkState& link : emulator.LinkStates()) {
    registry
        ->Gauge("meridian_wan_partitioned",
                "1 while a link is partitioned (its bytes are held)",
                {{"link", link.link()}})
        ->Set(link.partitioned());
    for (const pb::WanDirectionState* d : {&link.a_to_b(), &link.b_to_a()}) {
      const MetricLabels labels = {
          {"link", link.link()}, {"from", d->from_site()}, {"to", d->to_site()}};
      registry
          ->Counter("meridian_wan_bytes_total",
                    "Bytes delivered across a link direction", labels)
          ->Set(static_cast<double>(d->bytes()));
      registry
          ->Counter("meridian_wan_messages_total",
                    "ZeroMQ messages delivered across a link direction",
                    labels)
          ->Set(static_cast<double>(d->messages()));
      registry
          ->Gauge("meridian_wan_queued_bytes",
                  "Bytes accepted but not yet delivered (the link's queue)",
                  labels)
          ->Set(static_cast<double>(d->queued_bytes()));
      registry
          ->Gauge("meridian_wan_bandwidth_bits_per_second",
                  "Emulated bandwidth of a link direction (0: unlimited)",
                  labels)
          ->Set(d->bandwidth_bps());
      registry
          ->Gauge("meridian_wan_latency_seconds",
                  "Emulated one-way latency of a link direction", labels)
          ->Set(d->latency_s());
    }
    std::map<std::string, uint32_t> connections;
    for (const pb::WanRouteState& route : link.routes()) {
      connections[route.from_site()] += route.connections();
    }
    for (const auto& [from, count] : connections) {
      registry
          ->Gauge("meridian_wan_connections",
                  "Open connections through a link's routes, by connecting "
                  "site",
                  {{"link", link.link()}, {"from", from}})
          ->Set(count);
    }
  }
}

}  // namespace

Result<WanemOptions> OneLinkWanemOptions(std::string_view listen,
                                         std::string_view forward,
                                         std::string_view bandwidth,
                                         std::string_view latency,
                                         std::string_view jitter,
                                         std::string_view jitter_distribution,
                                         std::string_view queue_limit) {
  Result<HostPort> listen_address = ParseHostPort(listen, true);
  if (!listen_address.ok()) {
    return listen_address.status().WithContext("--listen");
  }
  Result<HostPort> forward_address = ParseHostPort(forward, false);
  if (!forward_address.ok()) {
    return forward_address.status().WithContext("--forward");
  }
  DirectionModel model = DefaultDirectionModel();
  model.bandwidth_bps = 0;  // unlimited unless --bandwidth says otherwise
  if (!bandwidth.empty()) {
    Result<double> bps = ParseBandwidth(bandwidth);
    if (!bps.ok()) return bps.status().WithContext("--bandwidth");
    model.bandwidth_bps = *bps;
  }
  if (!latency.empty()) {
    Result<Duration> value = ParseDuration(latency);
    if (!value.ok()) return value.status().WithContext("--latency");
    model.latency = *value;
  }
  if (!jitter.empty()) {
    Result<Duration> value = ParseDuration(jitter);
    if (!value.ok()) return value.status().WithContext("--jitter");
    model.jitter = *value;
  }
  if (!queue_limit.empty()) {
    Result<uint64_t> value = ParseByteSize(queue_limit);
    if (!value.ok()) return value.status().WithContext("--queue-limit");
    if (*value < 1024) {
      return InvalidArgumentError("--queue-limit: at least 1kb");
    }
    model.queue_limit_bytes = *value;
  }
  if (jitter_distribution == "normal") {
    model.jitter_distribution = pb::JITTER_NORMAL;
  } else if (!jitter_distribution.empty() && jitter_distribution != "uniform") {
    return InvalidArgumentError("--jitter-distribution '" +
                                std::string(jitter_distribution) +
                                "': use uniform or normal");
  }
  WanemOptions options;
  LinkModel link;
  link.a = "client";
  link.b = "server";
  link.a_to_b = model;
  link.b_to_a = model;
  link.b_to_a.seed = model.seed + 1;
  options.routes.push_back(RouteSpec{link.name(), "client", std::string(listen),
                                     std::string(forward)});
  options.links.push_back(std::move(link));
  return options;
}

Result<WanemOptions> JobWanemOptions(const pb::JobConfig& job,
                                     std::string_view control) {
  WanemOptions options;
  MERIDIAN_ASSIGN_OR_RETURN(options.links, ResolveJobLinks(job));
  if (!job.wan().emulate()) {
    for (LinkModel& link : options.links) {
      for (DirectionModel* d : {&link.a_to_b, &link.b_to_a}) {
        d->bandwidth_bps = 0;
        d->latency = Duration::zero();
        d->jitter = Duration::zero();
      }
    }
  }
  // Workers' access links are shaped whatever wan.emulate says: they model
  // the workers' own networks, not the WAN between sites.
  MERIDIAN_ASSIGN_OR_RETURN(std::vector<LinkModel> worker_links,
                            ResolveWorkerLinks(job));
  for (LinkModel& link : worker_links) {
    options.links.push_back(std::move(link));
  }
  options.control =
      control.empty() ? job.wan().control_address() : std::string(control);
  options.sample_period_s = job.wan().sample_period_s();
  options.metrics_address = job.wan().metrics_address();
  // Headroom of 64 connections above the job's own on a route (its
  // mirror connections, reconnects), and of 1024 in all.
  size_t largest_site = 0;
  size_t all_workers = 0;
  for (const pb::SiteConfig& site : job.site()) {
    size_t workers = 0;
    for (const pb::WorkerGroup& group : site.workers()) {
      workers += group.count();
    }
    largest_site = std::max(largest_site, workers);
    all_workers += workers;
  }
  options.max_connections_per_route += largest_site;
  options.max_connections += all_workers;
  return options;
}

Status RunWanem(const WanemOptions& options, const std::atomic<bool>* stop) {
  if (options.sample_period_s <= 0) {
    return InvalidArgumentError("sample period must be positive");
  }
  // Connections cost descriptors (wan/connection_gate.h): take what the
  // hard limit allows, and let the emulator size its budget from it.
  RaiseDescriptorLimit();
  EmulatorOptions emulator_options;
  emulator_options.links = options.links;
  emulator_options.clock = options.clock;
  emulator_options.max_connections_per_route =
      options.max_connections_per_route;
  emulator_options.max_connections = options.max_connections;
  MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<Emulator> emulator,
                            Emulator::Create(std::move(emulator_options)));
  for (const RouteSpec& route : options.routes) {
    Result<std::string> bound = emulator->AddRoute(route);
    if (!bound.ok()) {
      return bound.status().WithContext("route " + route.listen + " -> " +
                                        route.forward);
    }
  }
  std::unique_ptr<ControlServer> control;
  std::string endpoint = "none";
  if (!options.control.empty() && options.control != "none") {
    MERIDIAN_ASSIGN_OR_RETURN(
        control, ControlServer::Start(emulator.get(), options.control));
    endpoint = control->endpoint();
    MLOG(INFO) << "control endpoint " << endpoint;
  }
  std::ofstream csv;
  if (!options.traffic_csv.empty()) {
    csv.open(options.traffic_csv, std::ios::out | std::ios::trunc);
    if (!csv) {
      return InvalidArgumentError("cannot write '" + options.traffic_csv + "'");
    }
    csv << kTrafficCsvHeader << "\n";
  }
  MetricsRegistry metrics;
  std::unique_ptr<MetricsServer> metrics_server =
      StartMetricsServerOrWarn(&metrics, options.metrics_address, "wanem");
  if (options.ready_fd >= 0) {
    std::string line = "ready " + endpoint;
    if (metrics_server) line += " metrics=" + metrics_server->address();
    line += "\n";
    if (::write(options.ready_fd, line.data(), line.size()) !=
        static_cast<ssize_t>(line.size())) {
      MLOG(WARNING) << "cannot write the ready line to fd " << options.ready_fd;
    }
    ::close(options.ready_fd);
  }
  MLOG(INFO) << "wanem running: " << options.links.size() << " links, "
             << options.routes.size() << " routes";

  const Clock* clock = options.clock;
  const Duration start = clock->Now();
  const Duration period = FromSeconds(options.sample_period_s);
  Duration next_sample = start;
  Duration next_metrics = start;
  while (stop == nullptr || !stop->load()) {
    if (metrics_server && clock->Now() >= next_metrics) {
      PublishMetrics(*emulator, ToSeconds(clock->Now() - start), &metrics);
      next_metrics = clock->Now() + FromSeconds(kMetricsPeriodS);
    }
    if (csv.is_open() && clock->Now() >= next_sample) {
      pb::WanControlReply reply;
      for (pb::WanLinkState& state : emulator->LinkStates()) {
        *reply.add_links() = std::move(state);
      }
      csv << TrafficCsvRows(ToSeconds(clock->Now() - start), reply);
      csv.flush();
      next_sample += period;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  MLOG(INFO) << "wanem stopping";
  if (metrics_server) metrics_server->Stop();
  if (control) control->Stop();
  if (csv.is_open()) {
    pb::WanControlReply reply;
    for (pb::WanLinkState& state : emulator->LinkStates()) {
      *reply.add_links() = std::move(state);
    }
    csv << TrafficCsvRows(ToSeconds(clock->Now() - start), reply);
  }
  emulator->Stop();
  return Status::Ok();
}

int RunWanemCtl(const std::string& endpoint,
                const pb::WanControlRequest& request, std::string* output) {
  ControlClient client(endpoint);
  Result<pb::WanControlReply> reply = client.Call(request);
  if (!reply.ok()) {
    *output = reply.status().message() + "\n";
    return 1;
  }
  if (!reply->ok()) {
    *output = "wanem refused: " + reply->error() + "\n";
    return 1;
  }
  switch (request.command_case()) {
    case pb::WanControlRequest::kStatus:
      *output = FormatLinkStates(*reply);
      break;
    case pb::WanControlRequest::kAddRoute:
      *output = reply->listen() + "\n";
      break;
    default:
      *output = "ok\n" + FormatLinkStates(*reply);
      break;
  }
  return 0;
}

}  // namespace meridian::wan
