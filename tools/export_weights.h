// Initial weights files on the command line. `meridian export-weights JOB
// --out FILE`: the job's built-in model's initial weights as a safetensors
// file, so that a PyTorch copy of the model (model.kind EXTERNAL,
// model.weights) starts from exactly what the site servers of the built-in
// job start from. `meridian validate`: an EXTERNAL job's weights file read
// and summarised.
#ifndef MERIDIAN_TOOLS_EXPORT_WEIGHTS_H_
#define MERIDIAN_TOOLS_EXPORT_WEIGHTS_H_

#include <string>

#include "meridian/job.pb.h"

namespace meridian {

struct ExportWeightsFlags {
  std::string config;  // JOB
  std::string out;     // --out FILE
};

// Writes the file; prints what it wrote. Returns the exit code: 0, 1 when
// the model cannot be built or the file written, 2 for a job file that is
// not valid or whose model is EXTERNAL already.
int ExportWeights(const ExportWeightsFlags& flags);

// An EXTERNAL model's initial weights must be a safetensors file that
// parses, or be missing with a model.weights_command to write them. False
// after printing why to stderr (prefixed with the job file's `path`);
// `summary`: the tensors the sites serve, "name[d0,d1]" (":TYPE" when not
// F32), in data order, or what will write the missing file.
bool CheckWeightsFile(const std::string& path, const pb::JobConfig& job,
                      std::string* summary);

}  // namespace meridian

#endif  // MERIDIAN_TOOLS_EXPORT_WEIGHTS_H_
