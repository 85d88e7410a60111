// The `meridian` command line: parses flags and calls the library. No logic
// a test needs lives here.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <google/protobuf/util/json_util.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meridian/sync/addresses.h"
#include "meridian/config/config.h"
#include "meridian/core/format.h"
#include "meridian/train/dataset.h"
#include "meridian/launch/launcher.h"
#include "meridian/launch/run_manifest.h"
#include "meridian/launch/site_workers.h"
#include "meridian/launch/stop_signals.h"
#include "meridian/train/local_training.h"
#include "meridian/core/log.h"
#include "meridian/train/model.h"
#include "meridian/train/safetensors.h"
#include "meridian/report/plots.h"
#include "meridian/report/report.h"
#include "meridian/net/security.h"
#include "meridian/site/site_server.h"
#include "meridian/report/top.h"
#include "meridian/wan/control.h"
#include "meridian/wan/presets.h"
#include "meridian/wan/wanem.h"
#include "meridian/worker/worker.h"
#include "export_weights.h"

namespace meridian {
namespace {

// Exit codes: 0 success, 1 the job or role failed, 2 bad input (flags or
// job file), 3 (`meridian run`) the final flush incomplete, 130
// interrupted.
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;
// `meridian run`: the job ran, but some site's final flush did not
// complete (report.json flush_complete false): the replicas differ until
// `meridian run --resume OUT` completes it.
constexpr int kExitFlushIncomplete = 3;
constexpr int kExitInterrupted = 130;

// Loads and validates the job file, printing every problem, then applies
// the environment's address overrides (addresses.h).
bool LoadJob(const std::string& path, pb::JobConfig* job) {
  Result<pb::JobConfig> loaded = LoadJobConfig(path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().message().c_str());
    return false;
  }
  if (Status status = ApplyAddressOverrides(&*loaded, ProcessEnvironment());
      !status.ok()) {
    std::fprintf(stderr, "%s\n", status.message().c_str());
    return false;
  }
  *job = std::move(*loaded);
  return true;
}

// A CNN's layers can only be checked against the images they will see
// (MakeModel's checks: windows larger than their input, groups that do not
// divide the channels, ...). Done by `validate` and `run` before any process
// starts, so a bad layer list is one clear error instead of every site
// server and worker failing to start.
bool CheckModelFitsData(const pb::JobConfig& job) {
  if (job.model().kind() == pb::MATRIX_FACTORIZATION) {
    // The matrix is generated: its settings are checked by generating it.
    Result<RawData> data = LoadRawData(job.data(), false, true);
    Result<std::unique_ptr<Model>> model =
        data.ok() ? MakeJobModel(job, 2, 10)
                  : Result<std::unique_ptr<Model>>(data.status());
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", model.status().message().c_str());
      return false;
    }
    return true;
  }
  if (job.model().kind() != pb::CNN) return true;
  Result<RawData> data = LoadRawData(job.data(), /*load_train=*/false,
                                     /*load_test=*/true);
  if (!data.ok()) {
    std::fprintf(stderr, "%s\n", data.status().message().c_str());
    return false;
  }
  const auto dim = static_cast<int>(data->test_images.dim());
  if (Result<std::unique_ptr<Model>> model = MakeModel(job.model(), dim, 10);
      !model.ok()) {
    std::fprintf(stderr, "model does not fit the data (%dx%d images): %s\n",
                 static_cast<int>(data->test_images.rows),
                 static_cast<int>(data->test_images.cols),
                 model.status().message().c_str());
    return false;
  }
  return true;
}

// A role's flag, else the environment variable `variable`, else empty (the
// job file's value).
std::string FlagOrEnvironment(const std::string& flag, const char* variable) {
  if (!flag.empty()) return flag;
  const char* value = std::getenv(variable);
  return value == nullptr ? std::string() : std::string(value);
}

std::string DefaultOutDir(const pb::JobConfig& job) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &local);
  return "runs/" + job.name() + "-" + stamp;
}

int Validate(const std::string& path) {
  pb::JobConfig job;
  std::string weights;
  if (!LoadJob(path, &job) || !CheckModelFitsData(job) ||
      !CheckWeightsFile(path, job, &weights)) {
    return kExitBadInput;
  }
  std::printf("%s: OK (%d sites, %u workers, %s)\n", path.c_str(),
              job.site_size(), TotalWorkerCount(job),
              pb::PolicyKind_Name(job.policy().kind()).c_str());
  if (!weights.empty()) {
    std::printf("model.weights %s: %s\n", job.model().weights().c_str(),
                weights.c_str());
  }
  return 0;
}

// `meridian local`.
struct LocalFlags {
  std::string config;
  uint64_t samples = 0;  // --samples
  int threads = 1;       // --threads
};

int Local(const LocalFlags& flags) {
  pb::JobConfig job;
  if (!LoadJob(flags.config, &job) || !CheckModelFitsData(job)) {
    return kExitBadInput;
  }
  Result<LocalTrainingResult> result =
      TrainLocally(job, flags.samples, flags.threads);
  if (!result.ok()) {
    std::fprintf(stderr, "meridian local: %s\n",
                 result.status().message().c_str());
    return kExitFailure;
  }
  const MetricSpec metric = ModelMetric(job.model());
  std::printf(
      "trained '%s' in one process: %llu steps, %llu samples in %.1f s "
      "(%.0f samples/s)\n",
      job.name().c_str(), static_cast<unsigned long long>(result->steps),
      static_cast<unsigned long long>(result->samples), result->seconds,
      result->seconds > 0 ? result->samples / result->seconds : 0.0);
  std::printf("test %s %.4f (accuracy %.4f, loss %.4f) on %llu samples\n",
              metric.name.c_str(), result->test.metric, result->test.accuracy,
              result->test.loss,
              static_cast<unsigned long long>(result->test.samples));
  return 0;
}

// `meridian run`.
struct RunFlags {
  std::string config;   // FILE
  std::string out_dir;  // --out
  std::string resume;   // --resume DIR
  bool fail_fast = false;
  int max_restarts = -1;  // -1: the job file's fault.max_restarts
};

// What `meridian run` prints once the job ended well: the target, the final
// metric, the WAN and edge bytes, the faults, and where the report is.
void PrintRunSummary(const pb::RunReport& report, const std::string& out_dir) {
  const char* metric = report.metric().c_str();
  if (report.reached_target()) {
    std::printf("reached target %s %.4f at %.1f s of training\n", metric,
                report.target_metric(), report.time_to_target_s());
  } else if (report.target_metric() > 0) {
    // A site that reached the target may have ended the job for the others
    // (stop_at_target): name who reached it, and when.
    std::string reached, not_reached;
    for (const pb::SiteSummary& site : report.sites()) {
      std::string& list = site.reached_target() ? reached : not_reached;
      if (!list.empty()) list += ", ";
      list += site.name();
      if (site.reached_target()) {
        list += " at " + FormatSeconds(site.time_to_target_s()) + " s";
      }
    }
    if (reached.empty()) {
      std::printf("did not reach target %s %.4f (%s)\n", metric,
                  report.target_metric(), report.outcome().c_str());
    } else {
      std::printf("target %s %.4f reached by %s of training; not by %s\n",
                  metric, report.target_metric(), reached.c_str(),
                  not_reached.c_str());
    }
  }
  if (report.metric() == "accuracy") {
    std::printf("final accuracy %.4f, loss %.4f, wall time %.1f s\n",
                report.final_accuracy(), report.final_loss(), report.wall_s());
  } else {
    std::printf("final %s %.4f (accuracy %.4f), loss %.4f, wall time %.1f s\n",
                metric, report.final_metric(), report.final_accuracy(),
                report.final_loss(), report.wall_s());
  }
  if (report.wan_bytes_total() > 0) {
    std::printf(
        "WAN: %.2f MB over %d link directions; BSP over the WAN would have "
        "sent %.2f MB for the same work (%.0fx less)\n",
        report.wan_bytes_total() / 1e6, report.links_size(),
        report.dense_equivalent_bytes() / 1e6, report.wan_reduction());
    if (!report.wan_price_source().empty()) {
      std::printf(
          "WAN bill at inter-region list prices: %s (report.json "
          "wan_cost_usd; the prices: wan_price_source)\n",
          DescribeWanCost(report).c_str());
    }
  }
  if (report.edge_links_size() > 0) {
    std::printf(
        "edge: %.2f MB over %d access-link directions (workers.link; not "
        "WAN)\n",
        report.edge_bytes_total() / 1e6, report.edge_links_size());
  }
  if (!report.events().empty()) {
    std::printf("faults: %d events (report.json \"events\")",
                report.events_size());
    if (report.wan_uncounted_s() > 0) {
      std::printf("; up to %.1f s of WAN traffic uncounted (wanem restarts)",
                  report.wan_uncounted_s());
    }
    std::printf("\n");
  }
  if (!report.flush_complete()) {
    std::printf(
        "FINAL FLUSH INCOMPLETE (%s): the replicas differ; run `meridian run "
        "--resume %s` once the sites can reach each other to complete it\n",
        DescribeUnflushed(report).c_str(), out_dir.c_str());
  }
  std::printf("report: %s/report.json\ntimeline: %s/timeline.csv\n",
              out_dir.c_str(), out_dir.c_str());
}

int Run(const RunFlags& flags) {
  std::string path = flags.config;
  std::string out_dir = flags.out_dir;
  if (!flags.resume.empty()) {
    if (!path.empty() || (!out_dir.empty() && out_dir != flags.resume)) {
      std::fprintf(stderr,
                   "meridian run: --resume DIR continues the run in DIR with "
                   "its own job file; give no FILE and no other --out\n");
      return kExitBadInput;
    }
    Result<std::string> config = ResumeConfigPath(flags.resume);
    if (!config.ok()) {
      std::fprintf(stderr, "meridian run: %s\n",
                   config.status().message().c_str());
      return kExitBadInput;
    }
    path = *config;
    out_dir = flags.resume;
  } else if (path.empty()) {
    std::fprintf(stderr,
                 "meridian run: give a job file, or --resume DIR (a directory "
                 "of an earlier `meridian run`)\n");
    return kExitBadInput;
  }
  if (flags.max_restarts < -1) {
    std::fprintf(stderr, "meridian run: --max-restarts must be 0 or more\n");
    return kExitBadInput;
  }
  pb::JobConfig job;
  if (!LoadJob(path, &job) || !CheckModelFitsData(job)) return kExitBadInput;
  if (Status found = FindJobPrograms(job, path); !found.ok()) {
    std::fprintf(stderr, "meridian run: %s\n", found.message().c_str());
    return kExitBadInput;
  }
  const std::atomic<bool>* stop = InstallStopSignalHandlers();
  if (out_dir.empty()) out_dir = DefaultOutDir(job);
  RunOptions options;
  options.config_path = path;
  options.out_dir = out_dir;
  options.stop_requested = stop;
  options.stop_signals = StopSignalCount();
  options.resume = !flags.resume.empty();
  options.fail_fast = flags.fail_fast;
  if (flags.max_restarts >= 0) {
    options.max_restarts = static_cast<uint32_t>(flags.max_restarts);
  }
  std::printf("%s job '%s' (%d sites, %u workers); output in %s\n",
              options.resume ? "resuming" : "running", job.name().c_str(),
              job.site_size(), TotalWorkerCount(job), out_dir.c_str());
  std::fflush(stdout);
  Result<pb::RunReport> report = RunJob(job, options);
  if (!report.ok()) {
    std::fprintf(stderr, "meridian run failed: %s\n",
                 report.status().message().c_str());
    if (::access((out_dir + "/report.json").c_str(), R_OK) == 0) {
      std::fprintf(stderr,
                   "report (with what the sites wrote): %s/report.json\n",
                   out_dir.c_str());
    }
    return stop->load() ? kExitInterrupted : kExitFailure;
  }
  PrintRunSummary(*report, out_dir);
  if (stop->load()) return kExitInterrupted;
  return report->flush_complete() ? 0 : kExitFlushIncomplete;
}

// `meridian top`.
struct TopFlags {
  std::string config;       // CONFIG
  std::string run_dir;      // --run
  double interval_s = 2.0;  // --interval
  bool once = false;        // --once
};

// `meridian top`: a live table of the job's sites from their metrics
// endpoints (the job file's addresses, or a run's endpoints.json).
int Top(const TopFlags& flags) {
  const std::string& config = flags.config;
  const std::string& run_dir = flags.run_dir;
  const double interval_s = flags.interval_s;
  TopOptions options;
  if (!run_dir.empty()) {
    Result<std::vector<TopTarget>> targets = TopTargetsFromRun(run_dir);
    if (!targets.ok()) {
      std::fprintf(stderr, "meridian top: %s\n",
                   targets.status().message().c_str());
      return kExitBadInput;
    }
    options.targets = std::move(*targets);
    options.run_dir = run_dir;
  } else if (!config.empty()) {
    pb::JobConfig job;
    if (!LoadJob(config, &job)) return kExitBadInput;
    options.targets = TopTargetsFromJob(job);
  } else {
    std::fprintf(stderr,
                 "meridian top: give a job file or --run DIR (a directory "
                 "of `meridian run`)\n");
    return kExitBadInput;
  }
  if (!(interval_s > 0)) {
    std::fprintf(stderr, "meridian top: --interval must be positive\n");
    return kExitBadInput;
  }
  options.interval_s = interval_s;
  options.once = flags.once;
  options.stop = InstallStopSignalHandlers();
  RunTop(options);
  return 0;
}

// `meridian report`.
struct ReportFlags {
  std::vector<std::string> dirs;  // DIR...
  std::string out_dir;            // --out
};

// `meridian report`: plots and summary.md of run directories.
int Report(const ReportFlags& flags) {
  PlotOptions options;
  options.run_dirs = flags.dirs;
  options.out_dir = flags.out_dir;
  Result<PlotResult> result = RenderReport(options);
  if (!result.ok()) {
    std::fprintf(stderr, "meridian report: %s\n",
                 result.status().message().c_str());
    const StatusCode code = result.status().code();
    // A missing or failing gnuplot is not the input's fault.
    return code == StatusCode::kFailedPrecondition ||
                   code == StatusCode::kInternal
               ? kExitFailure
               : kExitBadInput;
  }
  std::printf("report: %s\n", result->summary_path.c_str());
  for (const std::string& png : result->pngs) {
    std::printf("plot: %s\n", png.c_str());
  }
  return 0;
}

int Compare(const std::vector<std::string>& dirs) {
  Result<std::string> table = CompareRuns(dirs);
  if (!table.ok()) {
    std::fprintf(stderr, "meridian compare: %s\n",
                 table.status().message().c_str());
    return kExitBadInput;
  }
  std::fputs(table->c_str(), stdout);
  return 0;
}

// `meridian keygen`.
struct KeygenFlags {
  std::string site;     // --site
  std::string out_dir;  // --out
};

// Writes a site's CURVE key pair into --out and prints the job-file line
// with its public key.
int Keygen(const KeygenFlags& flags) {
  const std::string& site = flags.site;
  const std::string& out_dir = flags.out_dir;
  Result<CurveKeyPair> pair = GenerateCurveKeyPair();
  if (!pair.ok()) {
    std::fprintf(stderr, "meridian keygen: %s\n",
                 pair.status().message().c_str());
    return kExitFailure;
  }
  if (Status status = WriteCurveKeyFiles(out_dir, site, *pair); !status.ok()) {
    std::fprintf(stderr, "meridian keygen: %s\n", status.message().c_str());
    return status.code() == StatusCode::kFailedPrecondition ||
                   status.code() == StatusCode::kInvalidArgument
               ? kExitBadInput
               : kExitFailure;
  }
  std::printf(
      "wrote %s/%s.key (secret, mode 0600: give it to site '%s' only) and "
      "%s/%s.pub\nadd to site \"%s\" in the job file:\n  curve_public_key: "
      "\"%s\"\n",
      out_dir.c_str(), site.c_str(), site.c_str(), out_dir.c_str(),
      site.c_str(), site.c_str(), pair->public_key.c_str());
  return 0;
}

// The built-in link presets: every measured region pair and every access
// network, as a table or (--json) as JSON for scripts, so that none keeps
// a copy of wan/presets.cc.
int Presets(bool json) {
  if (!json) {
    std::printf("Region pairs (round trip; the bandwidth applies to each "
                "direction):\n");
    for (const wan::RegionPreset& pair : wan::RegionPresets()) {
      std::printf("  %-15s %-15s %7.1f ms RTT %6.3f Gbit/s\n",
                  std::string(pair.region_a).c_str(),
                  std::string(pair.region_b).c_str(), pair.rtt_ms, pair.gbps);
    }
    std::printf("Access networks (workers.link.preset; down = to the "
                "worker, up = to its site, one-way latency):\n");
    for (const wan::AccessLinkPreset& access : wan::AccessLinkPresets()) {
      std::printf("  %-15s down %8.2f Mbit/s  up %8.2f Mbit/s  %7.3f ms  "
                  "jitter %.1f ms\n",
                  std::string(access.name).c_str(), access.down_mbps,
                  access.up_mbps, access.one_way_ms, access.jitter_ms);
    }
    return 0;
  }
  pb::LinkPresets all;
  for (const wan::RegionPreset& pair : wan::RegionPresets()) {
    pb::RegionPairPreset* entry = all.add_region_pairs();
    entry->set_region_a(std::string(pair.region_a));
    entry->set_region_b(std::string(pair.region_b));
    entry->set_rtt_ms(pair.rtt_ms);
    entry->set_gbps(pair.gbps);
  }
  for (const wan::AccessLinkPreset& access : wan::AccessLinkPresets()) {
    pb::AccessNetworkPreset* entry = all.add_access_networks();
    entry->set_name(std::string(access.name));
    entry->set_down_mbps(access.down_mbps);
    entry->set_up_mbps(access.up_mbps);
    entry->set_one_way_ms(access.one_way_ms);
    entry->set_jitter_ms(access.jitter_ms);
  }
  std::string text;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(all, &text, options).ok()) {
    std::fprintf(stderr, "meridian presets: cannot print JSON\n");
    return kExitFailure;
  }
  std::fputs(text.c_str(), stdout);
  return 0;
}

// `meridian worker`.
struct WorkerFlags {
  std::string config;      // --config
  std::string site;        // --site
  std::optional<uint32_t> index;  // --index
  uint32_t threads = 0;    // --threads
  std::string connect;     // --connect
  std::string metrics;     // --metrics
  std::string secret_key;  // --secret-key
};

// A worker's place in the job: its flags, else the variables `meridian run`
// gives a worker program (MERIDIAN_JOB, MERIDIAN_SITE,
// MERIDIAN_WORKER_INDEX), so that `meridian worker` is itself such a
// program.
bool WorkerPlace(const WorkerFlags& flags, std::string* config,
                 std::string* site, uint32_t* index) {
  *config = FlagOrEnvironment(flags.config, "MERIDIAN_JOB");
  *site = FlagOrEnvironment(flags.site, "MERIDIAN_SITE");
  const std::string text = flags.index.has_value()
                               ? std::to_string(*flags.index)
                               : FlagOrEnvironment("", "MERIDIAN_WORKER_INDEX");
  if (config->empty() || site->empty() || text.empty()) {
    std::fprintf(stderr,
                 "meridian worker: give --config, --site and --index (or "
                 "MERIDIAN_JOB, MERIDIAN_SITE and MERIDIAN_WORKER_INDEX)\n");
    return false;
  }
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (*end != '\0' || text.front() == '-' || value > UINT32_MAX) {
    std::fprintf(stderr,
                 "meridian worker: MERIDIAN_WORKER_INDEX must be a whole "
                 "number >= 0, got '%s'\n",
                 text.c_str());
    return false;
  }
  *index = static_cast<uint32_t>(value);
  return true;
}

int WorkerRole(const WorkerFlags& flags) {
  WorkerOptions options;
  std::string config;
  if (!WorkerPlace(flags, &config, &options.site, &options.index) ||
      !LoadJob(config, &options.job)) {
    return kExitBadInput;
  }
  options.threads = flags.threads;
  options.connect = FlagOrEnvironment(flags.connect, "MERIDIAN_CONNECT");
  options.metrics_address = flags.metrics;
  options.secret_key_file = flags.secret_key;
  options.stop_requested = InstallStopSignalHandlers();
  Result<std::unique_ptr<Worker>> worker = Worker::Create(std::move(options));
  if (!worker.ok()) {
    MLOG(ERROR) << worker.status();
    return kExitFailure;
  }
  if (Status status = (*worker)->Run(); !status.ok()) {
    MLOG(ERROR) << status;
    return status.code() == StatusCode::kCancelled ? kExitInterrupted
                                                   : kExitFailure;
  }
  return 0;
}

// Flags of `meridian wanem` (the emulator) and `meridian wanem ctl`.
struct WanemFlags {
  std::string config, link, listen, forward, bandwidth, latency, jitter,
      jitter_distribution, queue_limit, control, traffic_csv, metrics;
  int ready_fd = -1;
  bool dynamic_routes = false;
};
struct WanemCtlFlags {
  std::string control = std::string(wan::kDefaultControlEndpoint);
  std::string link, direction, bandwidth, latency, jitter, jitter_distribution,
      queue_limit, from, listen, forward;
};

// The standalone form of `wanem --config`: when the job names a wanem_host,
// opens the routes its sites connect to (addresses.h). `link` non-empty:
// only that link ("a-b"), and only its model.
Status AddStaticRoutes(const pb::JobConfig& job, const std::string& link,
                       wan::WanemOptions* options) {
  if (!link.empty()) {
    std::string known;
    bool found = false;
    for (const wan::LinkModel& model : options->links) {
      known += (known.empty() ? "" : ", ") + model.name();
      found |= model.name() == link;
    }
    if (!found) {
      return InvalidArgumentError("--link '" + link +
                                  "' is not a link of the job; its links are " +
                                  known);
    }
    std::erase_if(options->links, [&](const wan::LinkModel& model) {
      return model.name() != link;
    });
  }
  if (job.wan().wanem_host().empty()) {
    if (!link.empty()) {
      return InvalidArgumentError(
          "--link needs the job's wan.wanem_host (the routes of a standalone "
          "wanem); without it routes are added over the control endpoint");
    }
    return Status::Ok();
  }
  for (const StaticRoute& route : StaticRoutes(job)) {
    if (!link.empty() && route.link != link) continue;
    options->routes.push_back(wan::RouteSpec{route.link, route.from_site,
                                             route.listen, route.forward,
                                             /*allow_unresolved=*/true});
  }
  return Status::Ok();
}

int Wanem(const WanemFlags& flags) {
  SetLogRole("wanem");
  Result<wan::WanemOptions> options = InvalidArgumentError("");
  if (!flags.config.empty()) {
    if (!flags.listen.empty() || !flags.forward.empty()) {
      std::fprintf(stderr,
                   "wanem: --config and --listen/--forward are two forms; "
                   "use one\n");
      return kExitBadInput;
    }
    pb::JobConfig job;
    if (!LoadJob(flags.config, &job)) return kExitBadInput;
    options = wan::JobWanemOptions(job, flags.control);
    if (options.ok()) {
      if (Status status = flags.dynamic_routes
                              ? Status::Ok()
                              : AddStaticRoutes(job, flags.link, &*options);
          !status.ok()) {
        std::fprintf(stderr, "wanem: %s\n", status.message().c_str());
        return kExitBadInput;
      }
    }
  } else if (!flags.link.empty()) {
    std::fprintf(stderr, "wanem: --link selects a link of --config JOB\n");
    return kExitBadInput;
  } else if (flags.listen.empty() || flags.forward.empty()) {
    std::fprintf(stderr,
                 "wanem: give --listen HOST:PORT and --forward HOST:PORT (one "
                 "link), or --config JOB\n");
    return kExitBadInput;
  } else {
    options = wan::OneLinkWanemOptions(
        flags.listen, flags.forward, flags.bandwidth, flags.latency,
        flags.jitter, flags.jitter_distribution, flags.queue_limit);
    if (options.ok() && !flags.control.empty()) {
      options->control = flags.control;
    }
  }
  if (!options.ok()) {
    std::fprintf(stderr, "wanem: %s\n", options.status().message().c_str());
    return kExitBadInput;
  }
  options->ready_fd = flags.ready_fd;
  options->traffic_csv = flags.traffic_csv;
  if (!flags.metrics.empty()) options->metrics_address = flags.metrics;
  if (Status status = wan::RunWanem(*options, InstallStopSignalHandlers());
      !status.ok()) {
    MLOG(ERROR) << status;
    return kExitFailure;
  }
  return 0;
}

int WanemCtl(const std::string& command, const WanemCtlFlags& flags) {
  pb::WanControlRequest request;
  if (command == "status") {
    request = wan::MakeStatusRequest();
  } else if (command == "partition") {
    request = wan::MakePartitionRequest(flags.link);
  } else if (command == "heal") {
    request = wan::MakeHealRequest(flags.link);
  } else if (command == "reset") {
    request = wan::MakeResetRequest(flags.link);
  } else if (command == "add-route") {
    request = wan::MakeAddRouteRequest(flags.link, flags.from, flags.listen,
                                       flags.forward);
  } else {
    Result<pb::WanControlRequest> set = wan::MakeSetRequest(
        flags.link, flags.direction, flags.bandwidth, flags.latency,
        flags.jitter, flags.jitter_distribution, flags.queue_limit);
    if (!set.ok()) {
      std::fprintf(stderr, "wanem ctl: %s\n", set.status().message().c_str());
      return kExitBadInput;
    }
    request = *set;
  }
  if (Status valid = wan::ValidateControlRequest(request); !valid.ok()) {
    std::fprintf(stderr, "wanem ctl: %s\n", valid.message().c_str());
    return kExitBadInput;
  }
  std::string output;
  const int code = wan::RunWanemCtl(flags.control, request, &output);
  std::fputs(output.c_str(), code == 0 ? stdout : stderr);
  return code;
}

// `meridian site`.
struct SiteFlags {
  std::string config;              // --config
  std::string site;                // --site
  std::string bind;                // --bind
  std::string mirror_bind;         // --mirror-bind
  std::string out_dir;             // --out
  int ready_fd = -1;               // --ready-fd
  std::string metrics;             // --metrics
  std::string secret_key;          // --secret-key
  std::string control_token_file;  // --control-token-file
  bool resume = false;             // --resume
  std::string checkpoint_dir;      // --checkpoint-dir
  bool await_peers = false;        // --await-peers
  bool with_workers = false;       // --with-workers
};

// Every flag of every subcommand, one struct per subcommand (CLI11 fills
// only those of the subcommand given).
struct Flags {
  std::string validate_config;  // validate FILE
  RunFlags run;
  LocalFlags local;
  ExportWeightsFlags export_weights;
  std::vector<std::string> compare_dirs;  // compare DIR...
  TopFlags top;
  ReportFlags report;
  bool presets_json = false;  // presets --json
  SiteFlags site;
  KeygenFlags keygen;
  WorkerFlags worker;
  WanemFlags wanem;
  WanemCtlFlags ctl;
};

int Site(const SiteFlags& flags) {
  const std::string& site = flags.site;
  const std::string& out_dir = flags.out_dir;
  const int ready_fd = flags.ready_fd;
  SiteServerOptions options;
  if (!LoadJob(flags.config, &options.job)) return kExitBadInput;
  const pb::JobConfig job = options.job;
  if (flags.with_workers) {
    // Its worker and evaluator programs must exist here before it serves.
    Result<int> s = FindSite(job, site);
    Status found = s.ok() ? FindJobPrograms(job, flags.config, *s) : s.status();
    if (!found.ok()) {
      std::fprintf(stderr, "meridian site: %s\n", found.message().c_str());
      return kExitBadInput;
    }
  }
  Result<std::string> token = ControlToken(flags.control_token_file);
  if (!token.ok()) {
    MLOG(ERROR) << token.status();
    return kExitBadInput;
  }
  options.control_token = std::move(*token);
  options.site = site;
  options.resume = flags.resume;
  options.await_peers = flags.await_peers;
  options.checkpoint_dir = flags.checkpoint_dir;
  options.secret_key_file = flags.secret_key;
  options.metrics_address = flags.metrics;
  options.bind = FlagOrEnvironment(flags.bind, "MERIDIAN_BIND");
  options.mirror_bind =
      FlagOrEnvironment(flags.mirror_bind, "MERIDIAN_MIRROR_BIND");
  options.out_dir = out_dir;
  options.stop_requested = InstallStopSignalHandlers();
  Result<std::unique_ptr<SiteServer>> server =
      SiteServer::Create(std::move(options));
  if (!server.ok()) {
    MLOG(ERROR) << server.status();
    return kExitFailure;
  }
  if (ready_fd >= 0) {
    // "ready <worker endpoint> [<mirror endpoint>]"
    std::string line = "ready " + (*server)->endpoint();
    if (!(*server)->mirror_endpoint().empty()) {
      line += " " + (*server)->mirror_endpoint();
    }
    if (!(*server)->metrics_address().empty()) {
      line += " metrics=" + (*server)->metrics_address();
    }
    line += "\n";
    if (::write(ready_fd, line.data(), line.size()) !=
        static_cast<ssize_t>(line.size())) {
      MLOG(WARNING) << "cannot write the ready line to fd " << ready_fd;
    }
    ::close(ready_fd);
  }
  auto serve = [&] { return (*server)->Run(); };
  SiteWorkersOptions children;
  children.config_path = flags.config;
  children.site = site;
  children.out_dir = out_dir.empty() ? "." : out_dir;
  children.stop_site = RequestStop;
  const Status status =
      flags.with_workers ? RunWithSiteWorkers(job, children, serve) : serve();
  if (!status.ok()) {
    MLOG(ERROR) << status;
    return kExitFailure;
  }
  return 0;
}

// The subcommands, to tell which one was given.
struct Commands {
  CLI::App* validate = nullptr;
  CLI::App* run = nullptr;
  CLI::App* compare = nullptr;
  CLI::App* local = nullptr;
  CLI::App* export_weights = nullptr;
  CLI::App* top = nullptr;
  CLI::App* report = nullptr;
  CLI::App* site = nullptr;
  CLI::App* keygen = nullptr;
  CLI::App* presets = nullptr;
  CLI::App* worker = nullptr;
  CLI::App* wanem = nullptr;
  CLI::App* wanem_ctl = nullptr;
};

// The commands that work on job files and run directories: validate, run,
// compare.
void AddJobCommands(CLI::App* app, Flags* flags, Commands* commands) {
  commands->validate = app->add_subcommand(
      "validate", "Check a job file; print every problem with line:column");
  commands->validate
      ->add_option("FILE", flags->validate_config,
                   "job file (text-format JobConfig)")
      ->required();

  commands->run = app->add_subcommand(
      "run", "Run a whole job on this machine: every role as a child process");
  commands->run->add_option("FILE", flags->run.config,
                            "job file (not with --resume)");
  commands->run->add_option("--out", flags->run.out_dir,
                            "output directory (default runs/<job>-<time>)");
  commands->run->add_option(
      "--resume", flags->run.resume,
      "continue the run in this directory (its run.json names the job "
      "file) after every process of it was killed: site servers from their "
      "checkpoints, workers fresh; after a run whose final flush was "
      "incomplete (exit 3), completes the flush");
  commands->run->add_flag(
      "--fail-fast", flags->run.fail_fast,
      "stop the job at the first failure of any child (no restarts)");
  commands->run->add_option(
      "--max-restarts", flags->run.max_restarts,
      "restarts of one child before the job fails (default: the job's "
      "fault.max_restarts; 0: fail fast)");

  commands->local = app->add_subcommand(
      "local",
      "Train the job's model in this process alone (all its training data, "
      "its optimizer and seed; no servers, network or sync): the "
      "single-process reference of the job");
  commands->local
      ->add_option("FILE", flags->local.config,
                   "job file (text-format JobConfig)")
      ->required();
  commands->local->add_option(
      "--samples", flags->local.samples,
      "training samples to process (default: train for the job's "
      "time_budget_s)");
  commands->local
      ->add_option("--threads", flags->local.threads,
                   "compute threads per step (default 1; as a worker's "
                   "workers.threads)")
      ->check(CLI::Range(1, kMaxWorkerThreads));

  commands->export_weights = app->add_subcommand(
      "export-weights",
      "Write the job's built-in model's initial weights (what every site "
      "server starts from) as a safetensors file with the model's tensor "
      "names: the weights of a PyTorch copy of it (model.kind EXTERNAL)");
  commands->export_weights
      ->add_option("FILE", flags->export_weights.config, "job file")
      ->required();
  commands->export_weights
      ->add_option("--out", flags->export_weights.out,
                   "the safetensors file to write")
      ->required();

  commands->compare = app->add_subcommand(
      "compare",
      "Markdown table of runs: time to target, final accuracy, WAN bytes, "
      "and each ratio against the first run");
  commands->compare
      ->add_option("DIR", flags->compare_dirs,
                   "run directories, each holding a report.json")
      ->required();
}

// The commands that observe runs: top (live) and report (afterwards).
void AddObserveCommands(CLI::App* app, Flags* flags, Commands* commands) {
  CLI::App* top = commands->top = app->add_subcommand(
      "top",
      "Live table of every site (state, training time, accuracy, clock, "
      "theta, commits/s, WAN MB, staleness, queue) from their metrics "
      "endpoints");
  top->add_option("CONFIG", flags->top.config,
                  "job file: scrape each site's metrics_address (and "
                  "wan.metrics_address)");
  top->add_option("--run", flags->top.run_dir,
                  "a directory of `meridian run`: scrape the processes in its "
                  "endpoints.json");
  top->add_option("--interval", flags->top.interval_s,
                  "seconds between refreshes (default 2)");
  top->add_flag("--once", flags->top.once, "print the table once and exit");

  CLI::App* report = commands->report = app->add_subcommand(
      "report",
      "Plots (PNG, gnuplot) and summary.md of run directories: accuracy vs "
      "time, WAN bytes vs time, accuracy vs WAN bytes, commit rate");
  report
      ->add_option("DIR", flags->report.dirs,
                   "run directories, each holding a report.json")
      ->required();
  report->add_option("--out", flags->report.out_dir,
                     "directory for the plots (default: DIR/plots of the "
                     "first DIR)");

  CLI::App* presets = commands->presets = app->add_subcommand(
      "presets",
      "The built-in link presets: measured region pairs (site.region) and "
      "access networks (workers.link.preset)");
  presets->add_flag("--json", flags->presets_json, "print them as JSON");
}

CLI::App* AddSiteCommand(CLI::App* app, SiteFlags* flags) {
  CLI::App* site = app->add_subcommand("site", "Run one site server of a job");
  site->add_option("--config", flags->config, "job file")->required();
  site->add_option("--site", flags->site, "site name in the job file")
      ->required();
  site->add_option("--bind", flags->bind,
                   "ZeroMQ endpoint to listen on (default: the site's "
                   "address)");
  site->add_option("--mirror-bind", flags->mirror_bind,
                   "ZeroMQ endpoint for peer sites' updates (default: "
                   "the site's mirror_address)");
  site->add_option("--out", flags->out_dir,
                   "directory for the site summary (site-<name>.json)");
  site->add_option("--ready-fd", flags->ready_fd,
                   "write 'ready <endpoint>' to this fd once listening");
  site->add_option("--metrics", flags->metrics,
                   "serve metrics (Prometheus text at /metrics) on "
                   "HOST:PORT; port 0 picks one (default: the site's "
                   "metrics_address; 'none': no endpoint)");
  site->add_option("--secret-key", flags->secret_key,
                   "the site's CURVE secret key file, mode 0600 "
                   "(default: $MERIDIAN_SECRET_KEY, else "
                   "<security.key_dir>/<site>.key)");
  site->add_option("--control-token-file", flags->control_token_file,
                   "the job's control token (mode 0600): SHUTDOWN and "
                   "SET_PEERS are obeyed only with it (default: "
                   "$MERIDIAN_CONTROL_TOKEN, else none is obeyed)");
  site->add_flag("--resume", flags->resume,
                 "continue from the newest checkpoint in the checkpoint "
                 "directory, if there is one (a restart after a crash)");
  site->add_option("--checkpoint-dir", flags->checkpoint_dir,
                   "where the site keeps its checkpoints (default: the "
                   "job's fault.checkpoint_dir, else "
                   "<out>/checkpoints/<site>)");
  site->add_flag("--await-peers", flags->await_peers,
                 "start training only after a SET_PEERS has said where the "
                 "peer sites listen (what `meridian run` does: its links go "
                 "through wanem)");
  site->add_flag("--with-workers", flags->with_workers,
                 "also run the site's workers (and its evaluator program) "
                 "as child processes, restarted when they fail (logs in "
                 "<out>/logs); one command per site");
  return site;
}

// keygen, which prepares a site, and worker, the other role.
void AddKeygenAndWorkerCommands(CLI::App* app, Flags* flags,
                                Commands* commands) {
  CLI::App* keygen = commands->keygen = app->add_subcommand(
      "keygen",
      "Write a site's CURVE key pair (DIR/NAME.key, mode 0600, and "
      "DIR/NAME.pub) and print the job-file line with its public key");
  keygen->add_option("--site", flags->keygen.site, "site name")->required();
  keygen
      ->add_option("--out", flags->keygen.out_dir,
                   "directory for the key files")
      ->required();

  CLI::App* worker = commands->worker =
      app->add_subcommand("worker", "Run one worker");
  worker->add_option("--config", flags->worker.config,
                     "job file (default: $MERIDIAN_JOB)");
  worker->add_option("--site", flags->worker.site,
                     "site name in the job file (default: $MERIDIAN_SITE)");
  worker->add_option("--index", flags->worker.index,
                     "worker index inside the site (default: "
                     "$MERIDIAN_WORKER_INDEX)");
  worker
      ->add_option("--threads", flags->worker.threads,
                   "compute threads (default: the worker group's "
                   "workers.threads, 1 unless set)")
      ->check(CLI::Range(1, kMaxWorkerThreads));
  worker->add_option("--connect", flags->worker.connect,
                     "site server endpoint (default: the site's "
                     "address)");
  worker->add_option("--metrics", flags->worker.metrics,
                     "serve this worker's metrics on HOST:PORT (default: "
                     "none; the site server exports every worker's "
                     "counts)");
  worker->add_option("--secret-key", flags->worker.secret_key,
                     "the workers' CURVE secret key file, mode 0600, when "
                     "the serving site lists worker_curve_public_key "
                     "(default: $MERIDIAN_SECRET_KEY, else "
                     "<security.key_dir>/workers/<site>.key)");
}

CLI::App* AddWanemCommand(CLI::App* app, WanemFlags* wanem) {
  CLI::App* cmd = app->add_subcommand(
      "wanem",
      "WAN link emulator: a TCP proxy that shapes bandwidth, latency, jitter "
      "and partitions and counts every byte and message");
  cmd->add_option("--listen", wanem->listen,
                  "one link: listen on HOST:PORT (port 0: any)");
  cmd->add_option("--forward", wanem->forward,
                  "one link: forward connections to HOST:PORT");
  cmd->add_option("--bandwidth", wanem->bandwidth,
                  "one link: rate per direction, e.g. 100mbit, 1gbit "
                  "(default unlimited)");
  cmd->add_option("--latency", wanem->latency,
                  "one link: one-way latency, e.g. 40ms (default 0)");
  cmd->add_option("--jitter", wanem->jitter,
                  "one link: jitter, e.g. 5ms (default 0)");
  cmd->add_option("--jitter-distribution", wanem->jitter_distribution,
                  "one link: uniform (default) or normal");
  cmd->add_option("--queue-limit", wanem->queue_limit,
                  "one link: bytes held per direction before reading "
                  "stops, e.g. 4mb (default 2 x bandwidth x delay, "
                  ">= 1mb)");
  cmd->add_option("--config", wanem->config,
                  "job file: every link between its sites; with the "
                  "job's wan.wanem_host it listens for every route its "
                  "sites use, otherwise routes are added over the "
                  "control endpoint");
  cmd->add_option("--link", wanem->link,
                  "with --config: only this link, e.g. us-eu");
  cmd->add_flag("--dynamic-routes", wanem->dynamic_routes,
                "with --config: open no routes of wan.wanem_host; "
                "they are added over the control endpoint (what "
                "`meridian run` does)");
  cmd->add_option("--control", wanem->control,
                  "control endpoint (default: the job's "
                  "wan.control_address, or tcp://127.0.0.1:7300; "
                  "port 0 picks one; 'none' disables it)");
  cmd->add_option("--ready-fd", wanem->ready_fd,
                  "write 'ready <control endpoint>' to this fd once "
                  "listening");
  cmd->add_option("--traffic-csv", wanem->traffic_csv,
                  "append per-link traffic samples to this file");
  cmd->add_option("--metrics", wanem->metrics,
                  "serve metrics (per link direction) on HOST:PORT; "
                  "port 0 picks one (default: the job's "
                  "wan.metrics_address; 'none': no endpoint)");
  return cmd;
}

// `wanem ctl` under `wanem`, with one subcommand per request; the request
// is the name of the subcommand given.
CLI::App* AddWanemCtlCommand(CLI::App* wanem, WanemCtlFlags* flags) {
  CLI::App* ctl = wanem->add_subcommand(
      "ctl",
      "Control a running wanem: status, set, partition, heal, reset, "
      "add-route");
  ctl->require_subcommand(1);
  ctl->add_option("--control", flags->control,
                  "wanem's control endpoint (default tcp://127.0.0.1:7300)");
  CLI::App* status = ctl->add_subcommand("status", "Links and counters");
  CLI::App* set =
      ctl->add_subcommand("set", "Change a link's model while it runs");
  set->add_option("LINK", flags->link, "link name, e.g. a-b")->required();
  set->add_option("--direction", flags->direction,
                  "a-to-b, b-to-a or both (default both)");
  set->add_option("--bandwidth", flags->bandwidth, "e.g. 100mbit");
  set->add_option("--latency", flags->latency, "one-way, e.g. 40ms");
  set->add_option("--jitter", flags->jitter, "e.g. 5ms");
  set->add_option("--jitter-distribution", flags->jitter_distribution,
                  "uniform or normal");
  set->add_option("--queue-limit", flags->queue_limit, "e.g. 4mb");
  CLI::App* partition = ctl->add_subcommand(
      "partition", "Hold a link's bytes (connections stay open)");
  partition->add_option("LINK", flags->link, "link name")->required();
  CLI::App* heal =
      ctl->add_subcommand("heal", "Resume a partitioned link, in order");
  heal->add_option("LINK", flags->link, "link name")->required();
  CLI::App* reset = ctl->add_subcommand(
      "reset", "Close a link's connections, dropping what they carried");
  reset->add_option("LINK", flags->link, "link name")->required();
  CLI::App* route = ctl->add_subcommand(
      "add-route", "Listen for connections from one site to the other");
  route->add_option("LINK", flags->link, "link name")->required();
  route->add_option("--from", flags->from, "the connecting site")->required();
  route
      ->add_option("--listen", flags->listen,
                   "HOST:PORT to listen on (port 0: any)")
      ->required();
  route->add_option("--forward", flags->forward, "HOST:PORT on the other site")
      ->required();
  for (CLI::App* leaf : {status, set, partition, heal, reset, route}) {
    leaf->fallthrough();  // `ctl status --control X` works too
  }
  return ctl;
}

// Adds every subcommand to `app`, in the order `--help` lists them.
Commands AddCommands(CLI::App* app, Flags* flags) {
  Commands commands;
  AddJobCommands(app, flags, &commands);
  AddObserveCommands(app, flags, &commands);
  commands.site = AddSiteCommand(app, &flags->site);
  AddKeygenAndWorkerCommands(app, flags, &commands);
  commands.wanem = AddWanemCommand(app, &flags->wanem);
  commands.wanem_ctl = AddWanemCtlCommand(commands.wanem, &flags->ctl);
  return commands;
}

// Runs the subcommand that was given; returns the exit code.
int Dispatch(const Commands& commands, const Flags& flags) {
  if (*commands.validate) return Validate(flags.validate_config);
  if (*commands.run) return Run(flags.run);
  if (*commands.compare) return Compare(flags.compare_dirs);
  if (*commands.local) return Local(flags.local);
  if (*commands.export_weights) return ExportWeights(flags.export_weights);
  if (*commands.site) return Site(flags.site);
  if (*commands.keygen) return Keygen(flags.keygen);
  if (*commands.worker) return WorkerRole(flags.worker);
  if (*commands.top) return Top(flags.top);
  if (*commands.report) return Report(flags.report);
  if (*commands.presets) return Presets(flags.presets_json);
  if (*commands.wanem) {
    if (*commands.wanem_ctl) {
      std::string command;
      for (CLI::App* leaf : commands.wanem_ctl->get_subcommands()) {
        command = leaf->get_name();
      }
      return WanemCtl(command, flags.ctl);
    }
    return Wanem(flags.wanem);
  }
  return kExitBadInput;
}

int Main(int argc, char** argv) {
  CLI::App app{
      "Meridian: geo-distributed training with site parameter servers"};
  app.require_subcommand(1);
  Flags flags;
  const Commands commands = AddCommands(&app, &flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : kExitBadInput;
  }
  return Dispatch(commands, flags);
}

}  // namespace
}  // namespace meridian

int main(int argc, char** argv) { return meridian::Main(argc, argv); }
