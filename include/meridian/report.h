// Run reports: JSON files written with Protobuf's JSON printer (field names
// as written in the .proto) and the CSV timeline.
#ifndef MERIDIAN_REPORT_H_
#define MERIDIAN_REPORT_H_

#include <google/protobuf/message.h>

#include <string>
#include <vector>

#include "meridian/job.pb.h"
#include "meridian/report.pb.h"
#include "meridian/status.h"

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
//   workers: every site's workers, site by site.
pb::RunReport BuildRunReport(const pb::JobConfig& job,
                             const std::vector<pb::SiteSummary>& sites,
                             double wall_s, const std::string& outcome);

// A markdown table comparing the runs in `dirs` (each holding a
// report.json): time to target, final accuracy, WAN bytes, wall time, and
// each ratio against the first run. Errors name the directory that has no
// readable report.
Result<std::string> CompareRuns(const std::vector<std::string>& dirs);

// "site,t_s,accuracy,loss,model_version,commits" and one row per
// evaluation of every site.
Status WriteTimelineCsv(const std::vector<pb::SiteSummary>& sites,
                        const std::string& path);

}  // namespace meridian

#endif  // MERIDIAN_REPORT_H_
