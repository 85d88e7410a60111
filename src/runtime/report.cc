#include "runtime/report.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

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

pb::RunReport BuildRunReport(const pb::JobConfig& job,
                             const std::vector<pb::SiteSummary>& sites,
                             double wall_s, const std::string& outcome) {
  pb::RunReport report;
  report.set_job(job.name());
  report.set_target_accuracy(job.target_accuracy());
  report.set_wall_s(wall_s);
  report.set_outcome(outcome);
  report.set_policy(pb::PolicyKind_Name(job.policy().kind()));
  bool all_reached = !sites.empty() && job.target_accuracy() > 0;
  double last_target_time = 0;
  double accuracy = 0;
  double loss = 0;
  for (const pb::SiteSummary& site : sites) {
    *report.add_sites() = site;
    for (const pb::WorkerSummary& worker : site.workers()) {
      *report.add_workers() = worker;
    }
    all_reached = all_reached && site.reached_target();
    last_target_time = std::max(last_target_time, site.time_to_target_s());
    accuracy += site.final_accuracy();
    loss += site.final_loss();
  }
  report.set_reached_target(all_reached);
  report.set_time_to_target_s(all_reached ? last_target_time : -1);
  if (!sites.empty()) {
    report.set_final_accuracy(accuracy / sites.size());
    report.set_final_loss(loss / sites.size());
  }
  return report;
}

Status WriteTimelineCsv(const std::vector<pb::SiteSummary>& sites,
                        const std::string& path) {
  std::ostringstream out;
  out << "site,t_s,accuracy,loss,model_version,commits\n";
  char row[256];
  for (const pb::SiteSummary& site : sites) {
    for (const pb::EvalPoint& point : site.timeline()) {
      std::snprintf(row, sizeof(row), ",%.3f,%.6f,%.6f,%llu,%llu\n",
                    point.t_s(), point.accuracy(), point.loss(),
                    static_cast<unsigned long long>(point.model_version()),
                    static_cast<unsigned long long>(point.commits()));
      out << site.name() << row;
    }
  }
  return WriteFileAtomically(path, out.str());
}

}  // namespace meridian
