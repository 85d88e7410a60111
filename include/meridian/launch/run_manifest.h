// The manifest of a `meridian run` (OUT/run.json, pb::RunManifest): what
// lets `meridian run --resume DIR` continue a run after every process was
// killed. The launcher keeps it (src/launch/run_manifest.h).
#ifndef MERIDIAN_LAUNCH_RUN_MANIFEST_H_
#define MERIDIAN_LAUNCH_RUN_MANIFEST_H_

#include <string>

#include "meridian/core/status.h"

namespace meridian {

// `meridian run --resume DIR`: the job file the run in DIR ran, from its
// run.json. Errors name the file.
Result<std::string> ResumeConfigPath(const std::string& run_dir);

}  // namespace meridian

#endif  // MERIDIAN_LAUNCH_RUN_MANIFEST_H_
