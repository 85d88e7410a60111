// `meridian export-weights JOB --out FILE`: the job's built-in model's
// initial weights as a safetensors file, so that a PyTorch copy of the
// model (model.kind EXTERNAL, model.weights) starts from exactly what the
// site servers of the built-in job start from.
#ifndef MERIDIAN_TOOLS_EXPORT_WEIGHTS_H_
#define MERIDIAN_TOOLS_EXPORT_WEIGHTS_H_

#include <string>

namespace meridian {

struct ExportWeightsFlags {
  std::string config;  // JOB
  std::string out;     // --out FILE
};

// Writes the file; prints what it wrote. Returns the exit code: 0, 1 when
// the model cannot be built or the file written, 2 for a job file that is
// not valid or whose model is EXTERNAL already.
int ExportWeights(const ExportWeightsFlags& flags);

}  // namespace meridian

#endif  // MERIDIAN_TOOLS_EXPORT_WEIGHTS_H_
