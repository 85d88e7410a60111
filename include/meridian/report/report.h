// Run reports: JSON files written with Protobuf's JSON printer (field names
// as written in the .proto) and the CSV timeline.
#ifndef MERIDIAN_REPORT_REPORT_H_
#define MERIDIAN_REPORT_REPORT_H_

#include <google/protobuf/message.h>

#include <string>
#include <vector>

#include "meridian/core/status.h"
#include "meridian/job.pb.h"
#include "meridian/report.pb.h"

namespace meridian {

// Writes `message` as indented JSON, every field printed (defaults too),
// atomically (temp file + rename) so readers never see half a report.
Status WriteJsonFile(const google::protobuf::Message& message,
                     const std::string& path);
// Parses a JSON file written by WriteJsonFile; unknown fields are errors.
Status ReadJsonFile(const std::string& path,
                    google::protobuf::Message* message);

// The job-level report from the sites' summaries:
//   reached_target: every site reached the target;
//   time_to_target_s: when the last site reached it (-1 if one did not);
//   final_accuracy / final_loss: mean over sites;
//   workers: every site's workers, site by site;
//   lost_commits: the sites' recovery.lost_commits, summed;
//   flush_complete: every site's sync.flushed (true without sync), and
//   unflushed the sites whose final flush did not complete, with the
//   peers (sync.unflushed_peers); a site of the job without a summary
//   counts as unflushed (no peers named) when the others synced.
pb::RunReport BuildRunReport(const pb::JobConfig& job,
                             const std::vector<pb::SiteSummary>& sites,
                             double wall_s, const std::string& outcome);

// The sites whose final flush did not complete, with their peers: "us
// with ap; ap with us" (empty when it completed).
std::string DescribeUnflushed(const pb::RunReport& report);

// Sets report->events: every site summary's events (report->sites) and
// `launcher_events`, ordered by unix_s (ties keep that order), each with
// t_s = unix_s - run_start_unix_s (seconds since the run started).
void AddFaultEvents(const std::vector<pb::FaultEvent>& launcher_events,
                    double run_start_unix_s, pb::RunReport* report);

// Sets the WAN fields of `report` from every process the emulator ran as
// (restarts, resumes): links sums each process's last counters per link
// direction (bandwidth and latency: the last process's), wan_bytes_total
// their bytes, wan_reduction dense_equivalent_bytes / wan_bytes_total,
// wan_uncounted_s the incarnations' uncounted_s, wanem_processes their
// number. Call after BuildRunReport.
void AddWanTraffic(const std::vector<pb::WanIncarnation>& incarnations,
                   pb::RunReport* report);

// Sets the WAN bill of `report` (after AddWanTraffic): each link
// direction's usd_per_gb and cost_usd at the price from its from_site's
// region to its to_site's (wan::TransferPriceUsdPerGb: the job's wan.price,
// then the built-in list prices), wan_cost_usd their sum,
// unpriced_wan_bytes the bytes of links without a price,
// dense_equivalent_cost_usd what BSP over the WAN would have paid (unset
// when a pair it needs has no price) and wan_price_source.
void AddWanCost(const pb::JobConfig& job, pb::RunReport* report);

// One traffic.csv from the files several emulator processes wrote (in the
// order they ran; each timed from its own start, counting from 0): rows of
// file i get offsets_s[i] added to t_s, and the bytes and messages each
// earlier file ended with on the same link direction added to theirs, so
// the counters keep growing across restarts. Written atomically to
// `path` (which may be one of the inputs). Missing inputs are skipped.
Status MergeTrafficCsv(const std::vector<std::string>& inputs,
                       const std::vector<double>& offsets_s,
                       const std::string& path);

// A markdown table comparing the runs in `dirs` (each holding a
// report.json): time to target, final accuracy, WAN bytes, wall time, each
// ratio against the first run, compute utilisation and what an exchange
// carries. Errors name the directory that has no readable report.
Result<std::string> CompareRuns(const std::vector<std::string>& dirs);

// Two markdown cells: "83% | 1.5%, 4.2 bits/entry" (compute utilisation;
// the share of the model an exchange carries to one peer and wire bits per
// entry), "—" where the run has no workers, sent nothing, or its topology
// has no single density.
std::string DescribeCostTerms(const pb::RunReport& report);

// Dollars for tables and logs: "$1.23", "$0.042", "$0.0013".
std::string FormatUsd(double usd);

// The WAN bill of a run for tables: "$0.042 (BSP $1.47)", "$0.042 +
// 1.20 MB unpriced", "unpriced" (no link has a price), "—" (no WAN traffic,
// or a report from before prices).
std::string DescribeWanCost(const pb::RunReport& report);

// "site,t_s,accuracy,loss,model_version,commits" and one row per
// evaluation of every site.
Status WriteTimelineCsv(const std::vector<pb::SiteSummary>& sites,
                        const std::string& path);

}  // namespace meridian

#endif  // MERIDIAN_REPORT_REPORT_H_
