// What every part of a site server reads and none changes: the job, this
// site, the model's layout, time, and the bounds of the worker endpoint.
//
// Ownership and threads: built once by SiteServer::Impl before its parts,
// which keep a reference to it; immutable afterwards, so any thread may
// read it. Size: fixed.
#ifndef MERIDIAN_SITE_SITE_CONTEXT_H_
#define MERIDIAN_SITE_SITE_CONTEXT_H_

#include <string>

#include "meridian/core/clock.h"
#include "meridian/core/layout.h"
#include "meridian/job.pb.h"
#include "meridian/site/site_server.h"
#include "meridian/wire.pb.h"

namespace meridian {

struct SiteContext {
  const pb::JobConfig& job;  // validated
  int site_index = 0;
  const pb::SiteConfig& config;  // job.site(site_index)
  pb::Endpoint self;             // this server, as its messages name it
  Clock* clock = nullptr;        // the event loop's
  const WallClock* wall_clock = nullptr;  // of fault events
  SiteServerTimeouts timeouts;
  const ModelLayout& layout;
  EndpointBounds bounds;  // what one worker connection may cost

  const std::string& name() const { return config.name(); }
  // Seconds on the event loop's clock.
  double Now() const { return clock->NowSeconds(); }
};

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_CONTEXT_H_
