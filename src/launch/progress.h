// The live progress of `meridian run`: what each site server's status
// says, as text, and its display (a block of lines redrawn in place on a
// terminal, a line now and then elsewhere).
#ifndef MERIDIAN_LAUNCH_PROGRESS_H_
#define MERIDIAN_LAUNCH_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "meridian/report.pb.h"

namespace meridian {

// One site on the live progress line.
struct SiteProgressView {
  const pb::SiteStatus* status = nullptr;  // its last status reply, if any
  int64_t clock = 0;                       // that reply's header clock
  // The launcher is restarting it: attempt number `attempt`.
  bool restarting = false;
  uint32_t attempt = 0;
  // Seconds since its status last answered, when the last request went
  // unanswered; < 0 while it answers.
  double silent_s = -1;
  bool finished = false;  // its process ended after finishing the job
  // The model's metric, shown instead of accuracy when it is not accuracy
  // ("rmse 0.8123").
  std::string metric = "accuracy";
};

// "train 12.0 s  acc 0.9012 ..." (with "  workers dead 1", "  peers
// unreachable 1" when non-zero, "  final flush: 0.42 MB to deliver, 1
// peer(s) to hear from" while it flushes), "restarting (attempt 2)", "down
// (no answer for 7 s)", "starting" or "1/4 workers joined".
std::string FormatSiteProgress(const SiteProgressView& site);

// (site name, FormatSiteProgress) per site.
using SiteLines = std::vector<std::pair<std::string, std::string>>;

// Every site on one line (logs, pipes): "[ t s] a: ...  | b: ...".
std::string FormatProgress(const SiteLines& sites, double wall_s);

// One line per site (a terminal), names aligned, the time on the first.
std::vector<std::string> FormatProgressLines(const SiteLines& sites,
                                             double wall_s);

// Where the progress goes: on a terminal, a block of one line per site
// redrawn in place at every Draw; elsewhere (logs, pipes) one line per
// kPlainProgressPeriodS. Owned by the launcher's JobRun, used by its
// monitor thread alone; holds no more than the size of the block drawn.
class ProgressDisplay {
 public:
  // `out` null: nowhere. Not owned.
  explicit ProgressDisplay(std::FILE* out);

  // Whether Draw at `now` (run seconds) would show anything.
  bool Due(double now) const;
  // Shows `sites` at `now`. Precondition: Due(now).
  void Draw(const SiteLines& sites, double now);
  // Lines were logged below the block: the next Draw starts a new block
  // below them instead of drawing over them.
  void Detach() { lines_ = 0; }

 private:
  bool Terminal() const;

  std::FILE* out_;
  double next_plain_s_;  // the next line elsewhere than on a terminal
  int lines_ = 0;        // lines of the block drawn on a terminal
};

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_PROGRESS_H_
