#include "meridian/report/plots.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

#include "meridian/report/report.h"
#include "meridian/report.pb.h"
#include "meridian/wan/presets.h"
#include "meridian/core/process.h"

namespace meridian {
namespace {

namespace fs = std::filesystem;

constexpr auto kGnuplotTimeout = std::chrono::seconds(120);
constexpr const char* kGnuplotPackage = "gnuplot-nox";

struct EvalRow {
  std::string site;
  double t_s = 0;
  double accuracy = 0;
};

struct TrafficRow {
  double t_s = 0;
  std::string from;
  std::string to;
  double bytes = 0;  // delivered so far (a cumulative counter)
};

struct Run {
  std::string dir;
  std::string label;
  pb::RunReport report;
  std::vector<EvalRow> timeline;
  std::vector<TrafficRow> traffic;
  // traffic.csv time of the start of training (see plots.h).
  double traffic_offset_s = 0;
  double first_bytes_t_s = 0;  // traffic.csv time of the first bytes
  bool has_traffic = false;
};

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> fields;
  std::string field;
  std::istringstream in(line);
  while (std::getline(in, field, ',')) fields.push_back(field);
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  return fields;
}

bool ParseNumber(const std::string& text, double* value) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  const auto [ptr, error] = std::from_chars(begin, end, *value);
  return !text.empty() && error == std::errc() && ptr == end &&
         std::isfinite(*value);
}

// Reads a CSV file whose header starts with `columns`; calls `row` with
// each line's fields (at least columns.size() of them). Errors name the
// file and line.
Status ReadCsv(
    const std::string& path, const std::vector<std::string>& columns,
    const std::function<Status(const std::vector<std::string>&)>& row) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read '" + path + "'");
  std::string expected;
  for (const std::string& column : columns) {
    expected += (expected.empty() ? "" : ",") + column;
  }
  std::string line;
  int number = 0;
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("'" + path + "' line " +
                                std::to_string(number) + ": " + why);
  };
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (number == 1) {
      if (line.rfind(expected, 0) != 0) {
        return bad("expected a header starting with '" + expected + "', got '" +
                   line.substr(0, 80) + "'");
      }
      continue;
    }
    if (line.empty()) continue;
    const std::vector<std::string> fields = SplitCsv(line);
    if (fields.size() < columns.size()) {
      return bad("expected " + std::to_string(columns.size()) +
                 " or more fields (" + expected + "), got '" +
                 line.substr(0, 80) + "'");
    }
    if (Status status = row(fields); !status.ok()) {
      return bad(status.message() + " in '" + line.substr(0, 80) + "'");
    }
  }
  if (number == 0) {
    return InvalidArgumentError("'" + path + "' is empty (expected a header '" +
                                expected + "')");
  }
  return Status::Ok();
}

Status ReadTimeline(const std::string& path, std::vector<EvalRow>* rows) {
  return ReadCsv(path, {"site", "t_s", "accuracy"},
                 [&](const std::vector<std::string>& f) {
                   EvalRow row;
                   row.site = f[0];
                   if (row.site.empty()) return InvalidArgumentError("no site");
                   if (!ParseNumber(f[1], &row.t_s)) {
                     return InvalidArgumentError("t_s is not a number");
                   }
                   if (!ParseNumber(f[2], &row.accuracy)) {
                     return InvalidArgumentError("accuracy is not a number");
                   }
                   rows->push_back(std::move(row));
                   return Status::Ok();
                 });
}

Status ReadTraffic(const std::string& path, std::vector<TrafficRow>* rows) {
  return ReadCsv(path, {"t_s", "link", "from_site", "to_site", "bytes"},
                 [&](const std::vector<std::string>& f) {
                   TrafficRow row;
                   if (!ParseNumber(f[0], &row.t_s)) {
                     return InvalidArgumentError("t_s is not a number");
                   }
                   // Workers' access links are edge traffic, not WAN.
                   if (wan::IsWorkerLink(f[1])) return Status::Ok();
                   row.from = f[2];
                   row.to = f[3];
                   if (!ParseNumber(f[4], &row.bytes)) {
                     return InvalidArgumentError("bytes is not a number");
                   }
                   rows->push_back(std::move(row));
                   return Status::Ok();
                 });
}

// Total bytes per sample time, in time order.
std::vector<std::pair<double, double>> TotalBytes(const Run& run) {
  std::map<double, double> total;
  for (const TrafficRow& row : run.traffic) total[row.t_s] += row.bytes;
  return {total.begin(), total.end()};
}

// Cumulative WAN bytes at `t_s` of training (linear between samples).
double BytesAt(const std::vector<std::pair<double, double>>& total,
               double offset_s, double t_s) {
  if (total.empty()) return 0;
  const double t = t_s + offset_s;
  if (t <= total.front().first) return total.front().second;
  for (size_t i = 1; i < total.size(); ++i) {
    if (t <= total[i].first) {
      const auto& [t0, b0] = total[i - 1];
      const auto& [t1, b1] = total[i];
      return t1 > t0 ? b0 + (b1 - b0) * (t - t0) / (t1 - t0) : b1;
    }
  }
  return total.back().second;
}

Result<Run> LoadRun(const std::string& dir) {
  Run run;
  run.dir = dir;
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return NotFoundError("'" + dir + "' is not a run directory");
  }
  MERIDIAN_RETURN_IF_ERROR(ReadJsonFile(dir + "/report.json", &run.report));
  const std::string timeline = dir + "/timeline.csv";
  // EvalRow.accuracy holds the model's metric: accuracy from timeline.csv,
  // any other (rmse) from the report's timelines.
  const bool accuracy =
      run.report.metric().empty() || run.report.metric() == "accuracy";
  if (!accuracy) {
    for (const pb::SiteSummary& site : run.report.sites()) {
      for (const pb::EvalPoint& point : site.timeline()) {
        run.timeline.push_back({site.name(), point.t_s(), point.metric()});
      }
    }
  } else if (fs::exists(timeline, error)) {
    MERIDIAN_RETURN_IF_ERROR(ReadTimeline(timeline, &run.timeline));
  } else {
    // The same evaluations are in the report.
    for (const pb::SiteSummary& site : run.report.sites()) {
      for (const pb::EvalPoint& point : site.timeline()) {
        run.timeline.push_back({site.name(), point.t_s(), point.accuracy()});
      }
    }
  }
  const std::string traffic = dir + "/traffic.csv";
  if (fs::exists(traffic, error)) {
    MERIDIAN_RETURN_IF_ERROR(ReadTraffic(traffic, &run.traffic));
  }
  const auto total = TotalBytes(run);
  for (size_t i = 0; i < total.size(); ++i) {
    if (total[i].second > 0) {
      run.has_traffic = true;
      run.first_bytes_t_s = total[i].first;
      run.traffic_offset_s =
          i == 0 ? total[i].first : (total[i - 1].first + total[i].first) / 2;
      break;
    }
  }
  return run;
}

// A double-quoted gnuplot string.
std::string Quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string Fmt(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", value);
  return buf;
}

// A data file of blocks (gnuplot's `index`) and the plot clauses that
// draw them.
class Blocks {
 public:
  explicit Blocks(std::string file) : file_(std::move(file)) {}
  // Starts a block drawn `style` with legend `title`.
  void Begin(const std::string& title, const std::string& style,
             const std::string& columns = "1:2") {
    if (count_ > 0) data_ += "\n\n";
    data_ += "# " + title + "\n";
    clauses_.push_back(Quote(file_) + " index " + std::to_string(count_) +
                       " using " + columns + " " + style + " title " +
                       Quote(title));
    ++count_;
  }
  void Row(const std::string& row) { data_ += row + "\n"; }
  int count() const { return count_; }
  const std::string& file() const { return file_; }
  const std::string& data() const { return data_; }
  // "plot a, b, ..." for the blocks [first, last) (last < 0: to the end).
  std::string Plot(int first = 0, int last = -1) const {
    if (last < 0 || last > count_) last = count_;
    std::string out = "plot ";
    for (int i = first; i < last; ++i) {
      out += (i > first ? ", \\\n     " : "") + clauses_[i];
    }
    return out + "\n";
  }

 private:
  std::string file_;
  std::string data_;
  std::vector<std::string> clauses_;
  int count_ = 0;
};

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.flush();
  if (!out) return InvalidArgumentError("cannot write '" + path + "'");
  return Status::Ok();
}

std::string Terminal(int width, int height) {
  return "set terminal pngcairo noenhanced size " + std::to_string(width) +
         "," + std::to_string(height) + " font \",11\"\n";
}

// Resolves the gnuplot executable; "" when there is none.
std::string FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    return ::access(name.c_str(), X_OK) == 0 ? name : "";
  }
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// Line colour `colour` (gnuplot's first eight linetypes, cycling) and dash
// type `dash`.
std::string LineStyle(size_t colour, size_t dash) {
  return "lc " + std::to_string(colour % 8 + 1) + " dt " +
         std::to_string(dash % 5 + 1);
}

struct Plot {
  std::string png;
  std::string description;
};

// What the plot sections add up to: the gnuplot script, the images it
// draws (summary.md lists them) and notes on what was left out.
struct Figures {
  std::string script;
  std::vector<Plot> plots;
  std::vector<std::string> notes;
};

constexpr char kScriptHeader[] =
    "# Meridian report plots: run `gnuplot plots.gp` in this directory.\n"
    "set encoding utf8\nset grid\nset key outside right top\n"
    "# Eight well-separated colours (matplotlib's tab10).\n"
    "set linetype 1 lc rgb \"#1f77b4\"\nset linetype 2 lc rgb \"#ff7f0e\"\n"
    "set linetype 3 lc rgb \"#2ca02c\"\nset linetype 4 lc rgb \"#d62728\"\n"
    "set linetype 5 lc rgb \"#9467bd\"\nset linetype 6 lc rgb \"#8c564b\"\n"
    "set linetype 7 lc rgb \"#e377c2\"\nset linetype 8 lc rgb \"#7f7f7f\"\n"
    "set linetype cycle 8\n";

// Legends: the directory's name, or the path as given when two agree.
void LabelRuns(std::vector<Run>* runs) {
  std::map<std::string, int> seen;
  for (Run& run : *runs) {
    run.label = fs::path(run.dir).lexically_normal().filename().string();
    if (run.label.empty()) {
      run.label = fs::path(run.dir)
                      .lexically_normal()
                      .parent_path()
                      .filename()
                      .string();
    }
    if (run.label.empty()) run.label = run.dir;
    ++seen[run.label];
  }
  for (Run& run : *runs) {
    if (seen[run.label] > 1) run.label = run.dir;
  }
}

// Every run of `dirs`, labelled; the first error stops it.
Result<std::vector<Run>> LoadRuns(const std::vector<std::string>& dirs) {
  std::vector<Run> runs;
  for (const std::string& dir : dirs) {
    MERIDIAN_ASSIGN_OR_RETURN(Run run, LoadRun(dir));
    runs.push_back(std::move(run));
  }
  LabelRuns(&runs);
  return runs;
}

// Creates the output directory (options.out_dir, else <first run>/plots)
// and returns its path.
Result<std::string> MakeOutDir(const PlotOptions& options, const Run& first) {
  const std::string out_dir =
      options.out_dir.empty() ? first.dir + "/plots" : options.out_dir;
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error || !fs::is_directory(out_dir)) {
    return InvalidArgumentError("cannot create output directory '" + out_dir +
                                "'");
  }
  return out_dir;
}

// A block per site of every run, accuracy over training time. Several
// runs: a colour per run, a dash type per site.
Blocks AccuracyBlocks(const std::vector<Run>& runs) {
  const bool many = runs.size() > 1;
  Blocks blocks("accuracy_vs_time.dat");
  for (size_t r = 0; r < runs.size(); ++r) {
    const Run& run = runs[r];
    std::map<std::string, std::vector<const EvalRow*>> by_site;
    std::vector<std::string> order;
    for (const EvalRow& row : run.timeline) {
      if (by_site[row.site].empty()) order.push_back(row.site);
      by_site[row.site].push_back(&row);
    }
    for (size_t i = 0; i < order.size(); ++i) {
      const std::string& site = order[i];
      blocks.Begin(many ? run.label + ": " + site : site,
                   "with linespoints pt 7 ps 0.5 lw 2 " +
                       (many ? LineStyle(r, i) : LineStyle(i, 0)));
      for (const EvalRow* row : by_site[site]) {
        blocks.Row(Fmt(row->t_s) + " " + Fmt(row->accuracy));
      }
    }
  }
  return blocks;
}

// How the plots name the runs' metric (the first run's; the runs of one
// report train one kind of model): "accuracy", or e.g. "rmse" with its
// axis label "test rmse (lower is better)".
struct MetricWords {
  std::string name = "accuracy";
  std::string axis = "test accuracy (fraction correct)";
  std::string title = "Accuracy";
};

MetricWords WordsFor(const pb::RunReport& report) {
  MetricWords words;
  if (report.metric().empty() || report.metric() == "accuracy") return words;
  words.name = report.metric();
  words.title = "Test " + report.metric();
  words.axis = "test " + report.metric() +
               (report.metric_higher_is_better() ? " (higher is better)"
                                                 : " (lower is better)");
  return words;
}

// Accuracy over training time, per site. `out` ends with '/'.
Status AddAccuracyPlot(const std::vector<Run>& runs, const std::string& out,
                       Figures* figures) {
  const Blocks blocks = AccuracyBlocks(runs);
  if (blocks.count() == 0) {
    figures->notes.push_back("No evaluations in the runs: no accuracy plots.");
    return Status::Ok();
  }
  MERIDIAN_RETURN_IF_ERROR(WriteText(out + blocks.file(), blocks.data()));
  // The file keeps its name whatever the metric (scripts look for it).
  const MetricWords words = WordsFor(runs.front().report);
  const std::string& what = words.name;
  const std::string& axis = words.axis;
  figures->script += "\n# Test " + what + " per site over training time\n" +
                     Terminal(1100, 650) +
                     "set output \"accuracy_vs_time.png\"\n"
                     "set title \"Test " +
                     what +
                     " per site\"\n"
                     "set xlabel \"training time (s)\"\n"
                     "set ylabel \"" +
                     axis +
                     "\"\n"
                     "unset logscale x\nset xrange [0:*]\nset autoscale "
                     "xfixmax\n"
                     "set yrange [*:*]\nset format x \"%g\"\n" +
                     blocks.Plot();
  figures->plots.push_back(
      {"accuracy_vs_time.png",

       "test " + what + " of every site over training time"});
  return Status::Ok();
}

// The runs that have WAN traffic; a note for each one that has none.
std::vector<const Run*> RunsWithTraffic(const std::vector<Run>& runs,
                                        std::vector<std::string>* notes) {
  std::vector<const Run*> with_traffic;
  for (const Run& run : runs) {
    if (run.has_traffic) {
      with_traffic.push_back(&run);
    } else {
      notes->push_back("Run " + run.label +
                       " has no WAN traffic (no traffic.csv, or no bytes in "
                       "it): it is left out of the WAN plots.");
    }
  }
  return with_traffic;
}

// A block per link direction that carried bytes, cumulative MB over
// training time. first_block[p] is the first block of runs[p]'s panel;
// one more entry, the block count, closes the last panel.
Blocks WanBytesBlocks(const std::vector<const Run*>& runs,
                      std::vector<int>* first_block) {
  Blocks blocks("wan_bytes_vs_time.dat");
  for (const Run* run : runs) {
    first_block->push_back(blocks.count());
    std::map<std::pair<std::string, std::string>, std::vector<TrafficRow>>
        directions;
    for (const TrafficRow& row : run->traffic) {
      directions[{row.from, row.to}].push_back(row);
    }
    size_t shown = 0;
    for (const auto& [direction, rows] : directions) {
      if (rows.empty() || rows.back().bytes <= 0) continue;  // idle
      blocks.Begin(direction.first + " -> " + direction.second,
                   "with lines lw 2 " + LineStyle(shown % 8, shown / 8));
      ++shown;
      for (const TrafficRow& row : rows) {
        blocks.Row(Fmt(row.t_s - run->traffic_offset_s) + " " +
                   Fmt(row.bytes / 1e6));
      }
    }
  }
  first_block->push_back(blocks.count());
  return blocks;
}

// Cumulative WAN bytes per link direction, a panel per run with traffic.
// `many`: the report has several runs (one panel then names its run).
Status AddWanBytesPlot(const std::vector<const Run*>& with_traffic, bool many,
                       const std::string& out, Figures* figures) {
  std::vector<int> first_block;
  const Blocks blocks = WanBytesBlocks(with_traffic, &first_block);
  MERIDIAN_RETURN_IF_ERROR(WriteText(out + blocks.file(), blocks.data()));
  const int panels = static_cast<int>(with_traffic.size());
  std::string& script = figures->script;
  script += "\n# Cumulative WAN bytes per link direction (a panel per run)\n" +
            Terminal(1100, std::max(650, 420 * panels)) +
            "set output \"wan_bytes_vs_time.png\"\n"
            "set xlabel \"training time (s)\"\n"
            "set ylabel \"cumulative WAN bytes (MB)\"\n"
            "unset logscale x\nset xrange [0:*]\nset autoscale xfixmax\n"
            "set yrange [0:*]\nset format x \"%g\"\n";
  if (panels > 1) {
    script += "set multiplot layout " + std::to_string(panels) +
              ",1 title \"Cumulative WAN bytes per link direction\"\n";
  }
  for (int p = 0; p < panels; ++p) {
    std::string title = with_traffic[p]->label;
    if (panels == 1) {
      title = "Cumulative WAN bytes per link direction" +
              (many ? " (" + title + ")" : std::string());
    }
    script += "set title " + Quote(title) + "\n";
    script += blocks.Plot(first_block[p], first_block[p + 1]);
  }
  if (panels > 1) script += "unset multiplot\n";
  figures->plots.push_back({"wan_bytes_vs_time.png",
                            "cumulative WAN megabytes per link direction over "
                            "training time"});
  return Status::Ok();
}

// "MB accuracy" rows of one run: for each evaluation round that every site
// completed, the mean accuracy over sites against the cumulative WAN bytes
// at the mean time of the round.
std::vector<std::string> AccuracyVsBytesRows(const Run& run) {
  const auto total = TotalBytes(run);
  std::map<std::string, std::vector<const EvalRow*>> by_site;
  for (const EvalRow& row : run.timeline) by_site[row.site].push_back(&row);
  size_t evals = SIZE_MAX;
  for (const auto& [site, rows] : by_site) evals = std::min(evals, rows.size());
  std::vector<std::string> rows;
  if (by_site.empty() || evals == 0) return rows;
  for (size_t k = 0; k < evals; ++k) {
    double t = 0;
    double accuracy = 0;
    for (const auto& [site, site_rows] : by_site) {
      t += site_rows[k]->t_s;
      accuracy += site_rows[k]->accuracy;
    }
    t /= by_site.size();
    accuracy /= by_site.size();
    const double bytes = BytesAt(total, run.traffic_offset_s, t);
    // Evaluations before the first sample with bytes fall in an interval
    // the samples do not resolve: left out.
    if (t + run.traffic_offset_s < run.first_bytes_t_s) continue;
    if (bytes > 0) rows.push_back(Fmt(bytes / 1e6) + " " + Fmt(accuracy));
  }
  return rows;
}

// Accuracy against cumulative WAN bytes, runs overlaid; no plot when no
// run has a point.
Status AddAccuracyVsBytesPlot(const std::vector<const Run*>& with_traffic,
                              const std::string& out, Figures* figures) {
  Blocks curve("accuracy_vs_wan_bytes.dat");
  const MetricWords words = WordsFor(with_traffic.front()->report);
  for (const Run* run : with_traffic) {
    const std::vector<std::string> rows = AccuracyVsBytesRows(*run);
    if (rows.empty()) continue;
    curve.Begin(run->label, "with linespoints pt 7 ps 0.6 lw 2");
    for (const std::string& row : rows) curve.Row(row);
  }
  if (curve.count() == 0) return Status::Ok();
  MERIDIAN_RETURN_IF_ERROR(WriteText(out + curve.file(), curve.data()));
  figures->script +=
      "\n# Mean test accuracy over sites against cumulative WAN "
      "bytes (runs overlaid)\n" +
      Terminal(1100, 650) +
      "set output \"accuracy_vs_wan_bytes.png\"\n"
      "set title \"" +
      words.title +
      " against WAN traffic\"\n"
      "set xlabel \"cumulative WAN bytes (MB, log scale)\"\n"
      "set ylabel \"mean " +
      words.axis +
      " over sites\"\n"
      "set xrange [*:*]\nset logscale x 10\nset format x \"%g\"\n"
      "set yrange [*:*]\n" +
      curve.Plot() + "unset logscale x\n";
  figures->plots.push_back({"accuracy_vs_wan_bytes.png",
                            "mean test " + words.name +
                                " over sites against the WAN "
                                "megabytes sent so far, runs overlaid (log x): "
                                "the traffic-reduction picture"});
  return Status::Ok();
}

// The WAN plots; they leave out runs without traffic (with a note).
Status AddWanPlots(const std::vector<Run>& runs, const std::string& out,
                   Figures* figures) {
  const std::vector<const Run*> with_traffic =
      RunsWithTraffic(runs, &figures->notes);
  if (with_traffic.empty()) return Status::Ok();
  MERIDIAN_RETURN_IF_ERROR(
      AddWanBytesPlot(with_traffic, runs.size() > 1, out, figures));
  return AddAccuracyVsBytesPlot(with_traffic, out, figures);
}

// "x rate label" rows of one run's workers that trained: commits per second
// of their site's training time, at x positions counted on from *x.
std::vector<std::string> CommitRateRows(const Run& run, int* x) {
  std::map<std::pair<std::string, uint32_t>, double> training_s;
  for (const pb::SiteSummary& site : run.report.sites()) {
    for (const pb::WorkerSummary& worker : site.workers()) {
      training_s[{worker.site(), worker.index()}] = site.training_s();
    }
  }
  std::vector<std::string> rows;
  for (const pb::WorkerSummary& worker : run.report.workers()) {
    const double seconds = training_s[{worker.site(), worker.index()}];
    if (!(seconds > 0)) continue;
    rows.push_back(std::to_string((*x)++) + " " +
                   Fmt(worker.commits() / seconds) + " " +
                   Quote(worker.site() + "/" + std::to_string(worker.index())));
  }
  return rows;
}

// Commit rate per worker, a group of bars per run.
Status AddCommitRatePlot(const std::vector<Run>& runs, const std::string& out,
                         Figures* figures) {
  Blocks bars("commit_rate.dat");
  int x = 0;
  int workers = 0;
  for (const Run& run : runs) {
    const std::vector<std::string> rows = CommitRateRows(run, &x);
    if (rows.empty()) continue;
    bars.Begin(run.label, "with boxes", "1:2:xtic(3)");
    for (const std::string& row : rows) bars.Row(row);
    workers += static_cast<int>(rows.size());
    ++x;  // a gap between runs
  }
  if (bars.count() == 0) {
    figures->notes.push_back(
        "No worker statistics in the reports: no commit rate "
        "plot.");
    return Status::Ok();
  }
  MERIDIAN_RETURN_IF_ERROR(WriteText(out + bars.file(), bars.data()));
  figures->script += "\n# Commits per second of training, per worker\n" +
                     Terminal(std::max(1100, 28 * workers + 300), 650) +
                     "set output \"commit_rate.png\"\n"
                     "set title \"Commit rate per worker\"\n"
                     "set xlabel \"worker (site/index)\"\n"
                     "set ylabel \"commits per second of training\"\n"
                     "unset logscale x\nset yrange [0:*]\nset format x "
                     "\"%g\"\n"
                     "set style fill solid 0.7 border -1\nset boxwidth 0.8\n"
                     "set xrange [-1:" +
                     std::to_string(x - 1) + "]\n" +
                     (workers > 12 ? "set xtics rotate by 90 right\n" : "") +
                     bars.Plot() + "set xtics norotate\nset xrange [*:*]\n";
  figures->plots.push_back({"commit_rate.png",
                            "commits per second of training of every worker "
                            "(its commits over its site's training time)"});
  return Status::Ok();
}

// A line per run: job, policy, outcome and, when known, the WAN reduction.
std::string RunLines(const std::vector<Run>& runs) {
  std::string lines;
  for (const Run& run : runs) {
    lines += "- " + run.label + ": job '" + run.report.job() + "', " +
             run.report.policy() + ", outcome: " + run.report.outcome();
    if (run.report.wan_reduction() > 0) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.0f", run.report.wan_reduction());
      lines += std::string(", WAN reduction ") + buf +
               "× (BSP over the WAN would have sent " + buf +
               " times its WAN bytes)";
    }
    if (run.report.wan_cost_usd() > 0) {
      lines += ", WAN bill " + DescribeWanCost(run.report) +
               " at inter-region list prices";
    }
    lines += "\n";
  }
  return lines;
}

// The section of WAN traffic per link direction; "" when no report has
// links.
std::string LinkSection(const std::vector<Run>& runs) {
  bool links = false;
  for (const Run& run : runs) links = links || run.report.links_size() > 0;
  if (!links) return "";
  std::string section =
      "\n## WAN traffic per link direction\n\n"
      "| run | from | to | MB | messages | $/GB | bill |\n"
      "|---|---|---|---|---|---|---|\n";
  bool priced = false;
  for (const Run& run : runs) {
    for (const pb::LinkTraffic& link : run.report.links()) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.2f | %.0f", link.bytes() / 1e6,
                    link.messages());
      std::string price = "— | —";
      if (link.has_usd_per_gb()) {
        char usd[32];
        std::snprintf(usd, sizeof(usd), "%.3g", link.usd_per_gb());
        price = std::string(usd) + " | " + FormatUsd(link.cost_usd());
        priced = true;
      }
      section += "| " + run.label + " | " + link.from_site() + " | " +
                 link.to_site() + " | " + buf + " | " + price + " |\n";
    }
  }
  if (priced) {
    section += "\nPrices per GB (10^9 bytes) sent: " +
               runs.front().report.wan_price_source() + ".\n";
  }
  return section;
}

// The section of each site's training data: its partition, samples and the
// classes holding at least 1% of them; "" when no report has label
// histograms (reports of earlier versions).
std::string DataSection(const std::vector<Run>& runs) {
  bool histograms = false;
  for (const Run& run : runs) {
    for (const pb::SiteSummary& site : run.report.sites()) {
      histograms = histograms || site.label_histogram_size() > 0;
    }
  }
  if (!histograms) return "";
  std::string section =
      "\n## Training data per site\n\n"
      "| run | site | partition | samples | classes held (>= 1% of the "
      "site's samples) |\n|---|---|---|---|---|\n";
  for (const Run& run : runs) {
    for (const pb::SiteSummary& site : run.report.sites()) {
      uint64_t total = 0;
      for (uint32_t count : site.label_histogram()) total += count;
      std::string held;
      for (int c = 0; c < site.label_histogram_size(); ++c) {
        const uint64_t count = site.label_histogram(c);
        if (count == 0 || count * 100 < total) continue;
        if (!held.empty()) held += ", ";
        held += std::to_string(c);
      }
      section += "| " + run.label + " | " + site.name() + " | " +
                 site.partition() + " | " + std::to_string(total) + " | " +
                 held + " |\n";
    }
  }
  return section;
}

// How old each peer's changes were when a site applied them (medians and
// p90 to the histogram bucket), and how much change that peer held back for
// the site (its ||acc|| / ||w||); "" when no report has them.
std::string AgeSection(const std::vector<Run>& runs) {
  std::string rows;
  for (const Run& run : runs) {
    // (sender, receiver) -> the sender's unsent change for the receiver.
    std::map<std::pair<std::string, std::string>, const pb::UnsentChange*>
        unsent;
    for (const pb::SiteSummary& site : run.report.sites()) {
      for (const pb::UnsentChange& change : site.sync().unsent_change()) {
        unsent[{site.name(), change.peer()}] = &change;
      }
    }
    for (const pb::SiteSummary& site : run.report.sites()) {
      for (const pb::RemoteUpdateAge& age : site.sync().remote_update_age()) {
        char buf[200];
        std::snprintf(buf, sizeof(buf),
                      "%.0f | %.3f | %.3f | %.3f | %.3f | %.1f | %.0f",
                      static_cast<double>(age.updates()), age.median_s(),
                      age.p90_s(), age.max_s(), age.median_transit_s(),
                      age.mean_clocks_behind(), age.max_clocks_behind());
        std::string held = "-";
        if (auto it = unsent.find({age.peer(), site.name()});
            it != unsent.end()) {
          char held_buf[64];
          std::snprintf(held_buf, sizeof(held_buf), "%.4f / %.4f",
                        it->second->mean_relative_norm(),
                        it->second->max_relative_norm());
          held = held_buf;
        }
        rows += "| " + run.label + " | " + site.name() + " | " + age.peer() +
                " | " + buf + " | " + held + " |\n";
      }
    }
  }
  if (rows.empty()) return "";
  return "\n## Age of remote changes when applied\n\n"
         "From the moment the sender began collecting an update's changes "
         "to the moment this site applied it (seconds); clocks behind: this "
         "site's clock minus the update's; held back: the sender's unsent "
         "change for this site, ||acc|| / ||w||, mean / max of samples "
         "taken about once a second.\n\n"
         "| run | site | from | updates | median s | p90 s | max s | median "
         "transit s | mean clocks behind | max clocks behind | held back |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|\n" +
         rows;
}

// summary.md: the comparison table, the plots, per-link traffic, the
// training data per site, the age of remote changes.
Result<std::string> Summary(const std::vector<std::string>& run_dirs,
                            const std::vector<Run>& runs,
                            const Figures& figures) {
  std::string summary = "# Meridian report\n\n";
  MERIDIAN_ASSIGN_OR_RETURN(const std::string table, CompareRuns(run_dirs));
  summary += "## Runs\n\n" + table + "\n" + RunLines(runs);
  summary += "\n## Plots\n\n";
  for (const Plot& plot : figures.plots) {
    summary +=
        "- [`" + plot.png + "`](" + plot.png + "): " + plot.description + "\n";
  }
  for (const std::string& note : figures.notes) summary += "\n" + note + "\n";
  summary += LinkSection(runs);
  summary += DataSection(runs);
  summary += AgeSection(runs);
  summary +=
      "\nData and script beside the images: `*.dat`, `plots.gp` "
      "(re-render with `gnuplot plots.gp` in this directory). WAN "
      "samples are aligned to training time by the first sample "
      "with bytes (within one sample period).\n";
  return summary;
}

// The gnuplot executable named `name`; FailedPrecondition naming the Debian
// package when there is none.
Result<std::string> FindGnuplot(const std::string& name,
                                const std::string& out_dir) {
  std::string gnuplot = FindExecutable(name);
  if (gnuplot.empty()) {
    return FailedPreconditionError(
        "gnuplot not found ('" + name +
        "' is not in $PATH): install the Debian package " + kGnuplotPackage +
        " (apt-get install " + kGnuplotPackage +
        "), then run `gnuplot "
        "plots.gp` in " +
        out_dir +
        "; the data files, plots.gp and summary.md are written there");
  }
  return gnuplot;
}

// Waits for gnuplot, killing it after kGnuplotTimeout. `out` is the output
// directory with its '/', where gnuplot.log is.
Status WaitForGnuplot(ChildProcess* child, const std::string& out) {
  const auto deadline = std::chrono::steady_clock::now() + kGnuplotTimeout;
  while (!child->Poll()) {
    if (std::chrono::steady_clock::now() > deadline) {
      child->Signal(SIGKILL);
      return InternalError("gnuplot did not finish within 120 s; see " + out +
                           "gnuplot.log");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!child->succeeded()) {
    return InternalError("gnuplot " + child->DescribeExit() + " on " + out +
                         "plots.gp; its output ends with:\n" +
                         child->LogTail(10));
  }
  return Status::Ok();
}

// Runs <out_dir>/plots.gp with gnuplot and returns the paths of `plots`'
// images, each checked to be there and not empty. Images of an earlier
// report are removed first, so a stale one never passes for new.
Result<std::vector<std::string>> RunGnuplot(const std::string& name,
                                            const std::string& out_dir,
                                            const std::vector<Plot>& plots) {
  MERIDIAN_ASSIGN_OR_RETURN(const std::string gnuplot,
                            FindGnuplot(name, out_dir));
  const std::string out = out_dir + "/";
  const std::string absolute = fs::absolute(out_dir).string();
  std::error_code error;
  for (const Plot& plot : plots) fs::remove(out + plot.png, error);
  MERIDIAN_ASSIGN_OR_RETURN(
      ChildProcess child,
      ChildProcess::Spawn(
          "gnuplot",
          {gnuplot, "-e", "cd " + Quote(absolute), absolute + "/plots.gp"},
          out + "gnuplot.log"));
  MERIDIAN_RETURN_IF_ERROR(WaitForGnuplot(&child, out));
  std::vector<std::string> pngs;
  for (const Plot& plot : plots) {
    const std::string path = out + plot.png;
    if (!fs::exists(path, error) || fs::file_size(path, error) == 0) {
      return InternalError("gnuplot wrote no " + path + "; see " + out +
                           "gnuplot.log");
    }
    pngs.push_back(path);
  }
  return pngs;
}

}  // namespace

Result<PlotResult> RenderReport(const PlotOptions& options) {
  if (options.run_dirs.empty()) {
    return InvalidArgumentError("no run directories given");
  }
  MERIDIAN_ASSIGN_OR_RETURN(const std::vector<Run> runs,
                            LoadRuns(options.run_dirs));
  PlotResult result;
  MERIDIAN_ASSIGN_OR_RETURN(result.out_dir, MakeOutDir(options, runs.front()));
  const std::string out = result.out_dir + "/";

  Figures figures;
  figures.script = kScriptHeader;
  MERIDIAN_RETURN_IF_ERROR(AddAccuracyPlot(runs, out, &figures));
  MERIDIAN_RETURN_IF_ERROR(AddWanPlots(runs, out, &figures));
  MERIDIAN_RETURN_IF_ERROR(AddCommitRatePlot(runs, out, &figures));
  figures.script += "unset output\n";
  MERIDIAN_RETURN_IF_ERROR(WriteText(out + "plots.gp", figures.script));

  MERIDIAN_ASSIGN_OR_RETURN(const std::string summary,
                            Summary(options.run_dirs, runs, figures));
  result.summary_path = out + "summary.md";
  MERIDIAN_RETURN_IF_ERROR(WriteText(result.summary_path, summary));

  MERIDIAN_ASSIGN_OR_RETURN(
      result.pngs, RunGnuplot(options.gnuplot, result.out_dir, figures.plots));
  return result;
}

}  // namespace meridian
