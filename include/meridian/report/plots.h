// `meridian report`: plots and a markdown summary of one or more run
// directories (report.json, timeline.csv, traffic.csv as `meridian run`
// writes them), rendered with gnuplot (Debian package gnuplot-nox).
//
// Written to the output directory:
//   accuracy_vs_time.png      test accuracy per site over training time
//   wan_bytes_vs_time.png     cumulative WAN MB per link direction (a panel
//                             per run)
//   accuracy_vs_wan_bytes.png mean accuracy over sites against cumulative
//                             WAN bytes, runs overlaid, log x: the
//                             traffic-reduction picture
//   commit_rate.png           commits per second of training, per worker
//   summary.md                the `meridian compare` table and the plots
//   *.dat, plots.gp           the data and the gnuplot script; re-render
//                             with `cd OUT && gnuplot plots.gp`
// The WAN plots need traffic.csv; runs without WAN traffic are left out of
// them (summary.md says so). traffic.csv's clock starts with wanem, not with
// training: it is aligned to training time by the first sample that shows
// bytes (within one sample period).
#ifndef MERIDIAN_REPORT_PLOTS_H_
#define MERIDIAN_REPORT_PLOTS_H_

#include <string>
#include <vector>

#include "meridian/core/status.h"

namespace meridian {

struct PlotOptions {
  std::vector<std::string> run_dirs;  // each holds a report.json
  // Where everything goes; empty: <first run dir>/plots.
  std::string out_dir;
  // The gnuplot executable: a path, or a name looked up in $PATH.
  std::string gnuplot = "gnuplot";
};

struct PlotResult {
  std::string out_dir;
  std::vector<std::string> pngs;  // paths of the images written
  std::string summary_path;       // summary.md
};

// Reads every run, writes the data files, the script and summary.md, and
// runs gnuplot. Errors:
//   InvalidArgument / NotFound / DataLoss: bad input (no run directory, a
//     missing or unreadable report.json, a malformed CSV line: the message
//     names the file and line), or an output directory that cannot be
//     written;
//   FailedPrecondition: gnuplot is not installed (the message names the
//     Debian package; data files, script and summary are written anyway);
//   Internal: gnuplot failed (the message has the end of its output).
Result<PlotResult> RenderReport(const PlotOptions& options);

}  // namespace meridian

#endif  // MERIDIAN_REPORT_PLOTS_H_
