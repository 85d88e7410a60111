// What a site server knows of its model, and where it comes from: the
// layout (named tensors, the key space of the store, the wire and the
// sync), the initial values every site starts from, and the metric the
// job judges it by. Two sources:
//   - a built-in model (model.kind SOFTMAX, MLP, CNN,
//     MATRIX_FACTORIZATION): built from the job file, initialised from the
//     job's seed, evaluated by the server itself on the job's data;
//   - the user's own model (model.kind EXTERNAL): the floating-point
//     tensors of the initial-weights file (model.weights, safetensors), in
//     the order of their data, converted to float32; integer tensors
//     (BatchNorm's step counter) stay with the workers. The server never
//     runs it: an evaluator process evaluates it (remote_evaluator.h).
// Every site reads the same job file and weights file, so every replica
// starts bit-identical.
#ifndef MERIDIAN_SITE_SITE_MODEL_H_
#define MERIDIAN_SITE_SITE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meridian/core/layout.h"
#include "meridian/core/status.h"
#include "meridian/job.pb.h"
#include "meridian/train/model.h"
#include "site/builtin_evaluator.h"

namespace meridian {

struct SiteModel {
  ModelLayout layout;
  std::vector<float> initial;  // layout.num_elements() values
  MetricSpec metric;           // the job's metric
  // Built-in models: the copy the server evaluates and the data sets it
  // evaluates on. Null / empty for an external model.
  std::unique_ptr<Model> eval_model;
  EvaluationSets eval_sets;
  // The training labels (for the summary's label histogram); for an
  // external model those of the job's data { } when it names one, else
  // empty.
  std::vector<uint8_t> train_labels;

  bool external() const { return eval_model == nullptr; }
};

// The model of site `site_index` of a validated job. Errors name what is
// wrong: the data files (built-in), the weights file — missing, truncated,
// corrupt, or without a floating-point tensor (external).
Result<SiteModel> LoadSiteModel(const pb::JobConfig& job, int site_index);

// Writes `values` (the layout's float32 key space) as a safetensors file,
// each tensor converted back to its element type. Atomic (rename).
Status WriteModelFile(const std::string& path, const ModelLayout& layout,
                      std::span<const float> values);

}  // namespace meridian

#endif  // MERIDIAN_SITE_SITE_MODEL_H_
