#include "meridian/report/report.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "meridian/config/config.h"
#include "meridian/train/model.h"
#include "meridian/wan/presets.h"
#include "meridian/wan/transfer_prices.h"

namespace meridian {
namespace {

Status WriteFileAtomically(const std::string& path, const std::string& text) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return InvalidArgumentError("cannot write '" + temp + "'");
    out << text;
    out.flush();
    if (!out) return DataLossError("short write to '" + temp + "'");
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return InvalidArgumentError("cannot rename '" + temp + "' to '" + path +
                                "'");
  }
  return Status::Ok();
}

}  // namespace

Status WriteJsonFile(const google::protobuf::Message& message,
                     const std::string& path) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status =
      google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return InternalError("cannot print JSON: " + status.ToString());
  }
  return WriteFileAtomically(path, json);
}

Status ReadJsonFile(const std::string& path,
                    google::protobuf::Message* message) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("cannot read '" + path + "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const auto status =
      google::protobuf::util::JsonStringToMessage(buffer.str(), message);
  if (!status.ok()) {
    return DataLossError("'" + path + "' is not a valid " +
                         message->GetTypeName() + ": " + status.ToString());
  }
  return Status::Ok();
}

namespace {

// report->flush_complete and unflushed (see BuildRunReport).
void SetFlushVerdict(const pb::JobConfig& job,
                     const std::vector<pb::SiteSummary>& sites,
                     pb::RunReport* report) {
  report->set_flush_complete(true);
  for (const pb::SiteSummary& site : sites) {
    if (!site.has_sync() || site.sync().flushed()) continue;
    report->set_flush_complete(false);
    pb::UnflushedSite* unflushed = report->add_unflushed();
    unflushed->set_site(site.name());
    *unflushed->mutable_peers() = site.sync().unflushed_peers();
  }
  // A site of a syncing job that wrote no summary (killed) cannot say
  // whether its flush completed: it counts as not.
  const bool syncs =
      std::any_of(sites.begin(), sites.end(),
                  [](const pb::SiteSummary& site) { return site.has_sync(); });
  for (const pb::SiteConfig& config : job.site()) {
    if (!syncs || std::any_of(sites.begin(), sites.end(),
                              [&](const pb::SiteSummary& site) {
                                return site.name() == config.name();
                              })) {
      continue;
    }
    report->set_flush_complete(false);
    report->add_unflushed()->set_site(config.name());
  }
}

// Clocks per round of the job's sync: 1 for GAIA and DENSE, the averaging
// period for the outer methods.
double ClocksPerRound(const pb::SyncConfig& sync) {
  const bool outer =
      sync.kind() == pb::DILOCO || sync.kind() == pb::MODEL_AVERAGING;
  return outer ? std::max<uint32_t>(sync.averaging_period(), 1) : 1.0;
}

// report->compute_utilization, round_density and bits_per_entry, and each
// site's sync round_density and bits_per_entry (see report.proto).
void SetCostTerms(const pb::JobConfig& job, pb::RunReport* report) {
  double busy_s = 0;
  double waiting_s = 0;
  for (const pb::WorkerSummary& worker : report->workers()) {
    busy_s += worker.compute_s() + worker.device_wait_s();
    waiting_s += worker.blocked_s();
  }
  report->set_compute_utilization(
      busy_s + waiting_s > 0 ? busy_s / (busy_s + waiting_s) : 0.0);
  const bool mesh = job.sync().topology() == pb::FULL_MESH;
  const double peers = job.site_size() > 1 ? job.site_size() - 1 : 0;
  double density_sum = 0;
  int densities = 0;
  double bytes = 0;
  double entries = 0;
  for (pb::SiteSummary& site : *report->mutable_sites()) {
    if (!site.has_sync()) continue;
    pb::SyncSummary& sync = *site.mutable_sync();
    const double rounds = sync.clock() / ClocksPerRound(job.sync());
    const double exchanged =
        rounds * peers * static_cast<double>(site.model_parameters());
    if (mesh && exchanged > 0) {
      sync.set_round_density(sync.entries_sent() / exchanged);
      density_sum += sync.round_density();
      ++densities;
    }
    if (sync.entries_sent() > 0) {
      sync.set_bits_per_entry(sync.bytes_sent() * 8 / sync.entries_sent());
    }
    bytes += sync.bytes_sent();
    entries += sync.entries_sent();
  }
  report->set_round_density(densities > 0 ? density_sum / densities : 0.0);
  report->set_bits_per_entry(entries > 0 ? bytes * 8 / entries : 0.0);
}

}  // namespace

pb::RunReport BuildRunReport(const pb::JobConfig& job,
                             const std::vector<pb::SiteSummary>& sites,
                             double wall_s, const std::string& outcome) {
  pb::RunReport report;
  report.set_job(job.name());
  report.set_target_accuracy(job.target_accuracy());
  const MetricSpec metric = ModelMetric(job.model());
  report.set_metric(metric.name);
  report.set_metric_higher_is_better(metric.higher_is_better);
  report.set_target_metric(JobTarget(job));
  report.set_wall_s(wall_s);
  report.set_outcome(outcome);
  report.set_policy(pb::PolicyKind_Name(job.policy().kind()));
  bool all_reached = !sites.empty() && JobTarget(job) > 0;
  double last_target_time = 0;
  double accuracy = 0;
  double metric_sum = 0;
  double loss = 0;
  for (const pb::SiteSummary& site : sites) {
    *report.add_sites() = site;
    for (const pb::WorkerSummary& worker : site.workers()) {
      *report.add_workers() = worker;
    }
    all_reached = all_reached && site.reached_target();
    last_target_time = std::max(last_target_time, site.time_to_target_s());
    accuracy += site.final_accuracy();
    metric_sum += site.final_metric();
    loss += site.final_loss();
  }
  // Dense per-step equivalent: workers outside the first site, whose steps
  // would each cross the WAN twice with the whole model.
  double dense_equivalent = 0;
  const std::string first_site = job.site_size() > 0 ? job.site(0).name() : "";
  for (const pb::SiteSummary& site : sites) {
    const double model_bytes =
        static_cast<double>(site.model_parameters()) * sizeof(float);
    for (const pb::WorkerSummary& worker : site.workers()) {
      if (worker.site() != first_site) {
        dense_equivalent += 2.0 * model_bytes * worker.steps();
      }
    }
  }
  report.set_dense_equivalent_bytes(dense_equivalent);
  // H = mean(v) / min(v) over the workers' device speeds: steps per second
  // of computing (and emulated device time), not counting waits for the
  // server, so a barrier that slows everyone to the slowest does not hide
  // the heterogeneity.
  double speed_sum = 0;
  double speed_min = 0;
  int speeds = 0;
  for (const pb::WorkerSummary& worker : report.workers()) {
    const double busy_s = worker.compute_s() + worker.device_wait_s();
    const double v = busy_s > 0 ? worker.steps() / busy_s : 0;
    if (!(v > 0)) continue;
    speed_sum += v;
    speed_min = speeds == 0 ? v : std::min(speed_min, v);
    ++speeds;
  }
  report.set_heterogeneity(speeds > 0 ? speed_sum / speeds / speed_min : 0);
  for (const pb::SiteSummary& site : sites) {
    report.set_search_time_s(
        std::max(report.search_time_s(), site.search_time_s()));
  }
  uint32_t lost_commits = 0;
  for (const pb::SiteSummary& site : sites) {
    lost_commits += site.recovery().lost_commits();
  }
  report.set_lost_commits(lost_commits);
  SetFlushVerdict(job, sites, &report);
  SetCostTerms(job, &report);
  report.set_reached_target(all_reached);
  report.set_time_to_target_s(all_reached ? last_target_time : -1);
  if (!sites.empty()) {
    report.set_final_accuracy(accuracy / sites.size());
    report.set_final_metric(metric_sum / sites.size());
    report.set_final_loss(loss / sites.size());
  }
  return report;
}

std::string DescribeUnflushed(const pb::RunReport& report) {
  std::string text;
  for (const pb::UnflushedSite& site : report.unflushed()) {
    if (!text.empty()) text += "; ";
    text += site.site() + " with ";
    for (int i = 0; i < site.peers_size(); ++i) {
      text += (i == 0 ? "" : ", ") + site.peers(i);
    }
    if (site.peers_size() == 0) text += "its peers";
  }
  return text;
}

void AddFaultEvents(const std::vector<pb::FaultEvent>& launcher_events,
                    double run_start_unix_s, pb::RunReport* report) {
  std::vector<pb::FaultEvent> events;
  for (const pb::SiteSummary& site : report->sites()) {
    events.insert(events.end(), site.events().begin(), site.events().end());
  }
  events.insert(events.end(), launcher_events.begin(), launcher_events.end());
  std::stable_sort(events.begin(), events.end(),
                   [](const pb::FaultEvent& a, const pb::FaultEvent& b) {
                     return a.unix_s() < b.unix_s();
                   });
  report->clear_events();
  for (pb::FaultEvent& event : events) {
    event.set_t_s(event.unix_s() - run_start_unix_s);
    *report->add_events() = std::move(event);
  }
}

void AddWanTraffic(const std::vector<pb::WanIncarnation>& incarnations,
                   pb::RunReport* report) {
  // Link directions in the order the first process that had them listed
  // them; later processes add to their counters.
  std::vector<pb::LinkTraffic> links;
  std::map<std::pair<std::string, std::string>, size_t> index;
  double uncounted_s = 0;
  for (const pb::WanIncarnation& incarnation : incarnations) {
    uncounted_s += incarnation.uncounted_s();
    for (const pb::LinkTraffic& link : incarnation.links()) {
      const auto key = std::make_pair(link.link(), link.from_site());
      auto [it, added] = index.emplace(key, links.size());
      if (added) {
        links.push_back(link);
        continue;
      }
      pb::LinkTraffic& sum = links[it->second];
      sum.set_bytes(sum.bytes() + link.bytes());
      sum.set_messages(sum.messages() + link.messages());
      sum.set_bandwidth_bps(link.bandwidth_bps());
      sum.set_latency_s(link.latency_s());
    }
  }
  report->clear_links();
  report->clear_edge_links();
  double total = 0;
  double edge_total = 0;
  for (pb::LinkTraffic& link : links) {
    if (wan::IsWorkerLink(link.link())) {
      edge_total += link.bytes();
      *report->add_edge_links() = std::move(link);
    } else {
      total += link.bytes();
      *report->add_links() = std::move(link);
    }
  }
  report->set_wan_bytes_total(total);
  if (edge_total > 0 || report->edge_links_size() > 0) {
    report->set_edge_bytes_total(edge_total);
  }
  report->set_wan_reduction(total > 0 ? report->dense_equivalent_bytes() / total
                                      : 0);
  report->set_wan_uncounted_s(uncounted_s);
  report->set_wanem_processes(static_cast<uint32_t>(incarnations.size()));
}

namespace {

// The region of site `name` of `job`; "" for an unknown site or a site
// without one.
std::string SiteRegion(const pb::JobConfig& job, const std::string& name) {
  for (const pb::SiteConfig& site : job.site()) {
    if (site.name() == name) return site.region();
  }
  return "";
}

// What BSP over the WAN would have paid for dense_equivalent_bytes: each
// step of a worker outside the first site pushes the model's bytes from
// its site's region to the first site's and pulls them back; nullopt when
// one of those directions has no price.
std::optional<double> DenseEquivalentCost(const pb::JobConfig& job,
                                          const pb::RunReport& report) {
  if (job.site_size() == 0) return std::nullopt;
  const pb::SiteConfig& first = job.site(0);
  double cost = 0;
  for (const pb::SiteSummary& site : report.sites()) {
    const double gb_per_step =
        static_cast<double>(site.model_parameters()) * sizeof(float) / 1e9;
    for (const pb::WorkerSummary& worker : site.workers()) {
      if (worker.site() == first.name()) continue;
      const std::string region = SiteRegion(job, worker.site());
      const std::optional<double> push =
          wan::TransferPriceUsdPerGb(job, region, first.region());
      const std::optional<double> pull =
          wan::TransferPriceUsdPerGb(job, first.region(), region);
      if (!push || !pull) return std::nullopt;
      cost += gb_per_step * worker.steps() * (*push + *pull);
    }
  }
  return cost;
}

}  // namespace

void AddWanCost(const pb::JobConfig& job, pb::RunReport* report) {
  double cost = 0;
  double unpriced = 0;
  for (pb::LinkTraffic& link : *report->mutable_links()) {
    const std::optional<double> price = wan::TransferPriceUsdPerGb(
        job, SiteRegion(job, link.from_site()),
        SiteRegion(job, link.to_site()));
    if (!price) {
      unpriced += link.bytes();
      continue;
    }
    link.set_usd_per_gb(*price);
    link.set_cost_usd(link.bytes() / 1e9 * *price);
    cost += link.cost_usd();
  }
  report->set_wan_cost_usd(cost);
  report->set_unpriced_wan_bytes(unpriced);
  if (const std::optional<double> dense = DenseEquivalentCost(job, *report)) {
    report->set_dense_equivalent_cost_usd(*dense);
  }
  const std::string source(wan::kTransferPriceSource);
  report->set_wan_price_source(job.wan().price_size() > 0
                                   ? "the job's wan.price, then " + source
                                   : source);
}

namespace {

// Splits a CSV row (no quoting: traffic.csv has none).
std::vector<std::string> SplitRow(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream row(line);
  for (std::string cell; std::getline(row, cell, ',');) cells.push_back(cell);
  return cells;
}

std::string FormatCount(double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.0f", value);
  return buf;
}

}  // namespace

Status MergeTrafficCsv(const std::vector<std::string>& inputs,
                       const std::vector<double>& offsets_s,
                       const std::string& path) {
  if (offsets_s.size() != inputs.size()) {
    return InvalidArgumentError("MergeTrafficCsv: one offset per input");
  }
  // Per link direction ("link,from_site"): bytes and messages every earlier
  // file ended with.
  std::map<std::string, std::pair<double, double>> carried;
  std::string header;
  std::ostringstream out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::ifstream in(inputs[i]);
    if (!in) continue;
    std::string line;
    if (!std::getline(in, line)) continue;
    if (header.empty()) {
      header = line;
      out << header << "\n";
    }
    std::map<std::string, std::pair<double, double>> last;
    while (std::getline(in, line)) {
      std::vector<std::string> cells = SplitRow(line);
      // t_s,link,from_site,to_site,bytes,messages,...
      if (cells.size() < 6) continue;
      const double t = std::strtod(cells[0].c_str(), nullptr);
      const double bytes = std::strtod(cells[4].c_str(), nullptr);
      const double messages = std::strtod(cells[5].c_str(), nullptr);
      const std::string key = cells[1] + "," + cells[2];
      last[key] = {bytes, messages};
      const auto& [base_bytes, base_messages] = carried[key];
      char stamp[32];
      std::snprintf(stamp, sizeof(stamp), "%.3f", t + offsets_s[i]);
      cells[0] = stamp;
      cells[4] = FormatCount(bytes + base_bytes);
      cells[5] = FormatCount(messages + base_messages);
      for (size_t c = 0; c < cells.size(); ++c) {
        out << (c == 0 ? "" : ",") << cells[c];
      }
      out << "\n";
    }
    for (const auto& [key, counts] : last) {
      carried[key].first += counts.first;
      carried[key].second += counts.second;
    }
  }
  if (header.empty()) return NotFoundError("no traffic samples to merge");
  return WriteFileAtomically(path, out.str());
}

namespace {

std::string FormatBytes(double bytes) {
  char buf[32];
  if (bytes >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2f GB", bytes / 1e9);
  } else if (bytes >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.2f MB", bytes / 1e6);
  } else if (bytes >= 1e3) {
    std::snprintf(buf, sizeof(buf), "%.1f kB", bytes / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  }
  return buf;
}

// "x.xx×" of value against base; "—" when either is missing.
std::string Ratio(double value, double base) {
  if (value <= 0 || base <= 0) return "—";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f×", value / base);
  return buf;
}

}  // namespace

std::string FormatUsd(double usd) {
  char buf[32];
  std::snprintf(buf, sizeof(buf),
                usd >= 1 ? "$%.2f" : (usd >= 0.01 ? "$%.3f" : "$%.2g"), usd);
  return buf;
}

std::string DescribeWanCost(const pb::RunReport& report) {
  if (report.wan_price_source().empty() || report.wan_bytes_total() <= 0) {
    return "—";
  }
  if (report.unpriced_wan_bytes() >= report.wan_bytes_total()) {
    return "unpriced";
  }
  std::string text = FormatUsd(report.wan_cost_usd());
  if (report.unpriced_wan_bytes() > 0) {
    text += " + " + FormatBytes(report.unpriced_wan_bytes()) + " unpriced";
  } else if (report.dense_equivalent_cost_usd() > 0) {
    text += " (BSP " + FormatUsd(report.dense_equivalent_cost_usd()) + ")";
  }
  return text;
}

Result<std::string> CompareRuns(const std::vector<std::string>& dirs) {
  if (dirs.empty()) return InvalidArgumentError("no run directories given");
  std::vector<pb::RunReport> reports;
  for (const std::string& dir : dirs) {
    pb::RunReport report;
    MERIDIAN_RETURN_IF_ERROR(ReadJsonFile(dir + "/report.json", &report));
    reports.push_back(std::move(report));
  }
  std::ostringstream out;
  const std::string metric =
      reports.front().metric().empty() ? "accuracy" : reports.front().metric();
  out << "| run | job | time to target (s) | final " << metric
      << " | WAN bytes | WAN bill | wall (s) | time vs first | WAN bytes vs "
         "first | compute utilization | an exchange |\n"
      << "|---|---|---|---|---|---|---|---|---|---|---|\n";
  const pb::RunReport& first = reports.front();
  char buf[64];
  for (size_t i = 0; i < reports.size(); ++i) {
    const pb::RunReport& r = reports[i];
    out << "| " << dirs[i] << " | " << r.job() << " | ";
    if (r.reached_target()) {
      std::snprintf(buf, sizeof(buf), "%.1f", r.time_to_target_s());
      out << buf;
    } else {
      out << "not reached";
    }
    std::snprintf(buf, sizeof(buf), "%.4f",
                  r.metric().empty() ? r.final_accuracy() : r.final_metric());
    out << " | " << buf << " | " << FormatBytes(r.wan_bytes_total()) << " | "
        << DescribeWanCost(r) << " | ";
    std::snprintf(buf, sizeof(buf), "%.1f", r.wall_s());
    out << buf << " | "
        << Ratio(r.reached_target() ? r.time_to_target_s() : 0,
                 first.reached_target() ? first.time_to_target_s() : 0)
        << " | " << Ratio(r.wan_bytes_total(), first.wan_bytes_total()) << " | "
        << DescribeCostTerms(r) << " |\n";
  }
  out << "\nRatios are each run's value divided by the first run's (target "
      << metric << " "
      << (first.metric().empty() ? first.target_accuracy()
                                 : first.target_metric())
      << "). Compute utilization: the share of the workers' time spent "
         "computing rather than waiting for the server and the sync; an "
         "exchange: the share of the model one exchange carries to one "
         "peer, and wire bits per entry sent (report.json: "
         "compute_utilization, round_density, bits_per_entry). WAN bill: "
         "the WAN bytes at the inter-region list prices of "
         "report.json's wan_price_source (wan_cost_usd), against what BSP "
         "over the WAN would have paid (dense_equivalent_cost_usd).\n";
  return out.str();
}

std::string DescribeCostTerms(const pb::RunReport& report) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.0f%% | ",
                report.compute_utilization() * 100);
  std::string text = report.workers_size() > 0 ? buf : "— | ";
  if (report.bits_per_entry() <= 0) return text + "—";
  if (report.round_density() > 0) {
    std::snprintf(buf, sizeof(buf), "%.3g%%, ", report.round_density() * 100);
    text += buf;
  }
  std::snprintf(buf, sizeof(buf), "%.1f bits/entry", report.bits_per_entry());
  return text + buf;
}

Status WriteTimelineCsv(const std::vector<pb::SiteSummary>& sites,
                        const std::string& path) {
  // Named metrics beyond the fixed columns (an external model's evaluator
  // reports the job's; a built-in one "rmse"), one column each, in the
  // order they first appear.
  std::vector<std::string> named;
  for (const pb::SiteSummary& site : sites) {
    for (const pb::EvalPoint& point : site.timeline()) {
      for (const pb::MetricValue& metric : point.metrics()) {
        const std::string& name = metric.name();
        if (name == "accuracy" || name == "loss" || name == "metric" ||
            std::find(named.begin(), named.end(), name) != named.end()) {
          continue;
        }
        named.push_back(name);
      }
    }
  }
  std::ostringstream out;
  out << "site,t_s,accuracy,loss,model_version,commits,theta,metric,"
         "skew_knob";
  for (const std::string& name : named) out << ',' << name;
  out << '\n';
  char row[256];
  for (const pb::SiteSummary& site : sites) {
    for (const pb::EvalPoint& point : site.timeline()) {
      std::snprintf(row, sizeof(row), ",%.3f,%.6f,%.6f,%llu,%llu,%.6g,%.6f,",
                    point.t_s(), point.accuracy(), point.loss(),
                    static_cast<unsigned long long>(point.model_version()),
                    static_cast<unsigned long long>(point.commits()),
                    point.theta(), point.metric());
      out << site.name() << row;
      // Empty without SkewScout.
      if (point.has_skew_knob()) {
        std::snprintf(row, sizeof(row), "%.6g", point.skew_knob());
        out << row;
      }
      for (const std::string& name : named) {
        out << ',';
        for (const pb::MetricValue& metric : point.metrics()) {
          if (metric.name() != name) continue;
          std::snprintf(row, sizeof(row), "%.6g", metric.value());
          out << row;
          break;
        }
      }
      out << "\n";
    }
  }
  return WriteFileAtomically(path, out.str());
}

}  // namespace meridian
