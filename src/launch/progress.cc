#include "launch/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace meridian {
namespace {

// Elsewhere than on a terminal, a progress line this often.
constexpr double kPlainProgressPeriodS = 5.0;

}  // namespace

std::string FormatSiteProgress(const SiteProgressView& site) {
  char buf[256];
  if (site.restarting) {
    return "restarting (attempt " + std::to_string(site.attempt) + ")";
  }
  if (site.silent_s >= 0) {
    std::snprintf(buf, sizeof(buf), "down (no answer for %.0f s)",
                  site.silent_s);
    return buf;
  }
  if (site.status == nullptr) return "starting";
  const pb::SiteStatus& status = *site.status;
  std::string line;
  if (status.workers_joined() < status.workers_expected() &&
      status.elapsed_s() <= 0) {
    std::snprintf(buf, sizeof(buf), "%u/%u workers joined",
                  status.workers_joined(), status.workers_expected());
    line = buf;
  } else {
    const pb::EvalPoint& eval = status.last_eval();
    const bool accuracy = site.metric == "accuracy";
    std::snprintf(buf, sizeof(buf),
                  "train %.1f s  %s %.4f  loss %.4f  %.0f commits/s",
                  status.elapsed_s(), accuracy ? "acc" : site.metric.c_str(),
                  accuracy ? eval.accuracy() : eval.metric(), eval.loss(),
                  status.commits_per_s());
    line = buf;
    if (status.has_theta()) {
      std::snprintf(buf, sizeof(buf), "  clock %lld  theta %.3g  WAN %.1f MB",
                    static_cast<long long>(site.clock), status.theta(),
                    status.wan_bytes_sent() / 1e6);
      line += buf;
    }
  }
  if (status.workers_dead() > 0) {
    line += "  workers dead " + std::to_string(status.workers_dead());
  }
  if (status.peers_unreachable() > 0) {
    line += "  peers unreachable " + std::to_string(status.peers_unreachable());
  }
  // A finished site's last status may still show its flush under way.
  if (status.flushing() && !site.finished) {
    std::snprintf(buf, sizeof(buf),
                  "  final flush: %.2f MB to deliver, %u peer(s) to hear from",
                  static_cast<double>(status.flush_bytes_left()) / 1e6,
                  status.flush_peers_left());
    line += buf;
  }
  if (site.finished) line += "  finished";
  return line;
}

std::string FormatProgress(const SiteLines& sites, double wall_s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "[%6.1f s]", wall_s);
  std::string line = buf;
  for (size_t i = 0; i < sites.size(); ++i) {
    line += (i == 0 ? " " : "  | ") + sites[i].first + ": " + sites[i].second;
  }
  return line;
}

std::vector<std::string> FormatProgressLines(const SiteLines& sites,
                                             double wall_s) {
  size_t width = 0;
  for (const auto& site : sites) width = std::max(width, site.first.size());
  char stamp[32];
  std::snprintf(stamp, sizeof(stamp), "[%6.1f s]", wall_s);
  std::vector<std::string> lines;
  for (size_t i = 0; i < sites.size(); ++i) {
    std::string name = sites[i].first;
    name.resize(width, ' ');
    lines.push_back(
        (i == 0 ? std::string(stamp) : std::string(std::strlen(stamp), ' ')) +
        " " + name + "  " + sites[i].second);
  }
  return lines;
}

ProgressDisplay::ProgressDisplay(std::FILE* out)
    : out_(out), next_plain_s_(kPlainProgressPeriodS) {}

bool ProgressDisplay::Terminal() const {
  return out_ != nullptr && ::isatty(::fileno(out_));
}

bool ProgressDisplay::Due(double now) const {
  return Terminal() || (out_ != nullptr && now >= next_plain_s_);
}

void ProgressDisplay::Draw(const SiteLines& sites, double now) {
  if (Terminal()) {
    // Redraw the block of site lines in place: up to its first line,
    // then each line cleared and rewritten.
    const std::vector<std::string> lines = FormatProgressLines(sites, now);
    std::string block;
    if (lines_ > 0) block += "\033[" + std::to_string(lines_) + "A";
    for (const std::string& line : lines) block += "\r\033[K" + line + "\n";
    std::fputs(block.c_str(), out_);
    lines_ = static_cast<int>(lines.size());
  } else {
    next_plain_s_ = now + kPlainProgressPeriodS;
    std::fprintf(out_, "%s\n", FormatProgress(sites, now).c_str());
  }
  std::fflush(out_);
}

}  // namespace meridian
