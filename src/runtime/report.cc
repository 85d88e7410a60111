#include "meridian/report.h"

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
  report.set_reached_target(all_reached);
  report.set_time_to_target_s(all_reached ? last_target_time : -1);
  if (!sites.empty()) {
    report.set_final_accuracy(accuracy / sites.size());
    report.set_final_loss(loss / sites.size());
  }
  return report;
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

Result<std::string> CompareRuns(const std::vector<std::string>& dirs) {
  if (dirs.empty()) return InvalidArgumentError("no run directories given");
  std::vector<pb::RunReport> reports;
  for (const std::string& dir : dirs) {
    pb::RunReport report;
    MERIDIAN_RETURN_IF_ERROR(ReadJsonFile(dir + "/report.json", &report));
    reports.push_back(std::move(report));
  }
  std::ostringstream out;
  out << "| run | job | time to target (s) | final accuracy | WAN bytes | "
         "wall (s) | time vs first | WAN bytes vs first |\n"
      << "|---|---|---|---|---|---|---|---|\n";
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
    std::snprintf(buf, sizeof(buf), "%.4f", r.final_accuracy());
    out << " | " << buf << " | " << FormatBytes(r.wan_bytes_total()) << " | ";
    std::snprintf(buf, sizeof(buf), "%.1f", r.wall_s());
    out << buf << " | "
        << Ratio(r.reached_target() ? r.time_to_target_s() : 0,
                 first.reached_target() ? first.time_to_target_s() : 0)
        << " | " << Ratio(r.wan_bytes_total(), first.wan_bytes_total())
        << " |\n";
  }
  out << "\nRatios are each run's value divided by the first run's (target "
         "accuracy "
      << first.target_accuracy() << ").\n";
  return out.str();
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
