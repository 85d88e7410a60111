#include "meridian/report/top.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <future>
#include <map>
#include <thread>

#include "meridian/report/report.h"

namespace meridian {
namespace {

constexpr double kScrapeTimeoutS = 1.0;

bool IsWildcardHost(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "*" || host == "::";
}

// The host of a ZeroMQ tcp endpoint "tcp://HOST:PORT"; "" otherwise.
std::string EndpointHost(const std::string& endpoint) {
  const std::string prefix = "tcp://";
  if (endpoint.rfind(prefix, 0) != 0) return "";
  const std::string rest = endpoint.substr(prefix.size());
  const size_t colon = rest.rfind(':');
  return colon == std::string::npos ? rest : rest.substr(0, colon);
}

// `address` with a wildcard host replaced by `host` (or 127.0.0.1).
std::string Reachable(const std::string& address, const std::string& host) {
  Result<MetricsAddress> parsed = ParseMetricsAddress(address);
  if (!parsed.ok()) return address;  // shown as down, with the reason
  if (IsWildcardHost(parsed->host)) {
    parsed->host = IsWildcardHost(host) ? "127.0.0.1" : host;
  }
  return parsed->ToString();
}

// Sum of every sample named `name` (a site's endpoint has only its own
// site's series); nullopt-like NaN when there is none.
double Sum(const TopScrape& scrape, const std::string& name) {
  double total = 0;
  bool found = false;
  for (const MetricSample& sample : scrape.samples) {
    if (sample.name == name) {
      total += sample.value;
      found = true;
    }
  }
  return found ? total : std::nan("");
}

std::string Number(double value, const char* format) {
  if (std::isnan(value)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

std::string Pad(std::string text, size_t width, bool right) {
  if (text.size() >= width) return text;
  const std::string fill(width - text.size(), ' ');
  return right ? fill + text : text + fill;
}

struct Column {
  const char* title;
  bool right;  // right-aligned (numbers)
};

constexpr Column kColumns[] = {
    {"SITE", false},          {"STATE", false},     {"TRAIN s", true},
    {"ACCURACY", true},       {"CLOCK", true},      {"THETA", true},
    {"COMMITS/s", true},      {"WAN OUT MB", true}, {"WAN IN MB", true},
    {"STALE mean/max", true}, {"LAG", true},        {"QUEUE", true},
};
constexpr size_t kNumColumns = sizeof(kColumns) / sizeof(kColumns[0]);

std::vector<std::string> SiteRow(const TopTarget& target,
                                 const TopScrape& scrape) {
  std::vector<std::string> row(kNumColumns, "");
  row[0] = target.name;
  if (target.address.empty()) {
    row[1] = "no metrics endpoint";
    return row;
  }
  if (!scrape.up) {
    if (target.state.rfind("restarting", 0) == 0) {
      row[1] = target.state;
    } else if (scrape.silent_s >= 0) {
      row[1] = "down (no answer for " + Number(scrape.silent_s, "%.0f") + " s)";
    } else {
      row[1] = "down";
    }
    return row;
  }
  const double joined = Sum(scrape, "meridian_site_workers_joined");
  const double expected = Sum(scrape, "meridian_site_workers_expected");
  if (Sum(scrape, "meridian_site_finished") > 0) {
    row[1] = "finished";
  } else if (Sum(scrape, "meridian_site_training") > 0) {
    row[1] = "training";
  } else if (!std::isnan(joined) && !std::isnan(expected)) {
    row[1] =
        "waiting " + Number(joined, "%.0f") + "/" + Number(expected, "%.0f");
  } else {
    row[1] = "up";
  }
  // Faults right now: workers declared dead, peers declared unreachable.
  const double dead = Sum(scrape, "meridian_site_workers_dead");
  const double unreachable = Sum(scrape, "meridian_sync_peers_unreachable");
  std::string faults;
  if (dead > 0) faults = Number(dead, "%.0f") + " workers dead";
  if (unreachable > 0) {
    faults += (faults.empty() ? "" : ", ") + Number(unreachable, "%.0f") +
              " peers unreachable";
  }
  if (!faults.empty()) row[1] += " (" + faults + ")";
  row[2] = Number(Sum(scrape, "meridian_site_training_seconds"), "%.1f");
  row[3] = Number(Sum(scrape, "meridian_site_accuracy"), "%.4f");
  row[4] = Number(Sum(scrape, "meridian_site_clock"), "%.0f");
  row[5] = Number(Sum(scrape, "meridian_sync_theta"), "%.3g");
  row[6] = Number(Sum(scrape, "meridian_site_commits_per_second"), "%.1f");
  row[7] = Number(Sum(scrape, "meridian_sync_bytes_sent_total") / 1e6, "%.2f");
  row[8] =
      Number(Sum(scrape, "meridian_sync_bytes_received_total") / 1e6, "%.2f");
  const double mean =
      Sum(scrape, "meridian_site_commit_staleness_mean_versions");
  const double max = Sum(scrape, "meridian_site_commit_staleness_max_versions");
  row[9] =
      std::isnan(mean) ? "-" : Number(mean, "%.1f") + "/" + Number(max, "%.0f");
  row[10] = Number(Sum(scrape, "meridian_sync_clock_lag"), "%.0f");
  row[11] = Number(Sum(scrape, "meridian_site_waiting_workers"), "%.0f");
  return row;
}

std::string WanemLine(const TopTarget& target, const TopScrape& scrape) {
  std::string line = target.name + ": ";
  if (target.address.empty()) return line + "no metrics endpoint";
  if (!scrape.up) {
    if (target.state.rfind("restarting", 0) == 0) return line + target.state;
    if (scrape.silent_s >= 0) {
      return line + "down (no answer for " + Number(scrape.silent_s, "%.0f") +
             " s)";
    }
    return line + "down";
  }
  int directions = 0;
  for (const MetricSample& sample : scrape.samples) {
    directions += sample.name == "meridian_wan_bytes_total";
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "%.2f MB delivered over %d link directions, %.0f messages, "
                "%.3f MB queued",
                Sum(scrape, "meridian_wan_bytes_total") / 1e6, directions,
                Sum(scrape, "meridian_wan_messages_total"),
                Sum(scrape, "meridian_wan_queued_bytes") / 1e6);
  return line + buf;
}

}  // namespace

std::vector<TopTarget> TopTargetsFromJob(const pb::JobConfig& job) {
  std::vector<TopTarget> targets;
  for (const pb::SiteConfig& site : job.site()) {
    if (!site.server_site().empty()) continue;  // runs no server
    TopTarget target{site.name(), "site", "", ""};
    if (!site.metrics_address().empty()) {
      target.address =
          Reachable(site.metrics_address(), EndpointHost(site.address()));
    }
    targets.push_back(std::move(target));
  }
  if (!job.wan().metrics_address().empty()) {
    targets.push_back(
        {"wanem", "wanem",
         Reachable(job.wan().metrics_address(), job.wan().wanem_host()), ""});
  }
  return targets;
}

Result<std::vector<TopTarget>> TopTargetsFromRun(const std::string& run_dir) {
  pb::RunEndpoints endpoints;
  MERIDIAN_RETURN_IF_ERROR(
      ReadJsonFile(run_dir + "/endpoints.json", &endpoints));
  std::vector<TopTarget> targets;
  for (const pb::ProcessEndpoint& process : endpoints.process()) {
    const bool site = process.role() == "site";
    targets.push_back({site ? process.site() : process.name(),
                       site ? "site" : process.role(),
                       process.metrics_address(), process.state()});
  }
  return targets;
}

std::vector<TopScrape> ScrapeTargets(const std::vector<TopTarget>& targets,
                                     double timeout_s) {
  // One thread per target, scraping in parallel: each reads only its own
  // (const) target and hands its result back through its future, so
  // nothing is shared and nothing is locked.
  std::vector<std::future<TopScrape>> pending;
  for (const TopTarget& target : targets) {
    pending.push_back(std::async(std::launch::async, [&target, timeout_s] {
      TopScrape scrape;
      if (target.address.empty()) return scrape;
      Result<std::string> text = FetchMetricsText(target.address, timeout_s);
      if (!text.ok()) {
        scrape.error = text.status().message();
        return scrape;
      }
      Result<std::vector<MetricSample>> samples = ParseMetricsText(*text);
      if (!samples.ok()) {
        scrape.error = samples.status().message();
        return scrape;
      }
      scrape.up = true;
      scrape.samples = std::move(*samples);
      return scrape;
    }));
  }
  std::vector<TopScrape> scrapes;
  for (auto& future : pending) scrapes.push_back(future.get());
  return scrapes;
}

std::string FormatTopTable(const std::vector<TopTarget>& targets,
                           const std::vector<TopScrape>& scrapes) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> extra;
  for (size_t i = 0; i < targets.size() && i < scrapes.size(); ++i) {
    if (targets[i].role == "site") {
      rows.push_back(SiteRow(targets[i], scrapes[i]));
    } else {
      extra.push_back(WanemLine(targets[i], scrapes[i]));
    }
  }
  std::vector<size_t> width(kNumColumns);
  for (size_t c = 0; c < kNumColumns; ++c) {
    width[c] = std::string(kColumns[c].title).size();
    for (const auto& row : rows) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  auto emit = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < kNumColumns; ++c) {
      if (c > 0) line += "  ";
      line += Pad(cells[c], width[c], kColumns[c].right);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  std::vector<std::string> header;
  for (const Column& column : kColumns) header.push_back(column.title);
  emit(header);
  for (const auto& row : rows) emit(row);
  if (rows.empty()) out += "(no site servers in the job)\n";
  for (const std::string& line : extra) out += line + "\n";
  // Why each down process could not be read, once.
  for (size_t i = 0; i < targets.size() && i < scrapes.size(); ++i) {
    if (!targets[i].address.empty() && !scrapes[i].up) {
      out += "  " + targets[i].name + " (" + targets[i].address +
             "): " + scrapes[i].error + "\n";
    }
  }
  return out;
}

void RunTop(const TopOptions& options) {
  const bool tty = ::isatty(::fileno(options.out));
  const double interval_s = options.interval_s > 0 ? options.interval_s : 2.0;
  std::vector<TopTarget> targets = options.targets;
  // When each target (by role and name) last answered; bounded by the
  // targets of the job.
  std::map<std::string, std::chrono::steady_clock::time_point> last_up;
  const auto started = std::chrono::steady_clock::now();
  while (true) {
    if (!options.run_dir.empty()) {
      // A restarted process serves on a new port: follow endpoints.json.
      Result<std::vector<TopTarget>> reread =
          TopTargetsFromRun(options.run_dir);
      if (reread.ok()) targets = std::move(*reread);
    }
    std::vector<TopScrape> scrapes =
        ScrapeTargets(targets, std::min(kScrapeTimeoutS, interval_s));
    const auto scraped = std::chrono::steady_clock::now();
    for (size_t i = 0; i < targets.size() && i < scrapes.size(); ++i) {
      const std::string key = targets[i].role + "/" + targets[i].name;
      if (scrapes[i].up) {
        last_up[key] = scraped;
        continue;
      }
      auto it = last_up.find(key);
      const auto since = it == last_up.end() ? started : it->second;
      scrapes[i].silent_s =
          std::chrono::duration<double>(scraped - since).count();
    }
    const std::string table = FormatTopTable(targets, scrapes);
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::strftime(stamp, sizeof(stamp), "%H:%M:%S", &local);
    if (tty && !options.once) {
      // Home, clear, redraw.
      std::fprintf(options.out,
                   "\033[H\033[2J%s  every %.3g s, Ctrl-C quits\n%s", stamp,
                   interval_s, table.c_str());
    } else {
      std::fprintf(options.out, "%s%s", options.once ? "" : stamp,
                   options.once ? table.c_str() : ("\n" + table).c_str());
    }
    std::fflush(options.out);
    if (options.once) return;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration<double>(interval_s);
    while (std::chrono::steady_clock::now() < deadline) {
      if (options.stop != nullptr && options.stop->load()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (options.stop != nullptr && options.stop->load()) return;
  }
}

}  // namespace meridian
