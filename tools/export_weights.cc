#include "export_weights.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <vector>

#include "meridian/config/config.h"
#include "meridian/launch/launcher.h"
#include "meridian/train/dataset.h"
#include "meridian/train/model.h"
#include "meridian/train/safetensors.h"

namespace meridian {

// The values are those of LoadSiteModel for a built-in model
// (src/site/site_model.cc): MakeJobModel for the data's input size, then
// Initialize(job.seed()). Built-in models' tensors are all F32, so the
// file holds exactly the float32 values a site server's WELCOME carries.
int ExportWeights(const ExportWeightsFlags& flags) {
  Result<pb::JobConfig> job = LoadJobConfig(flags.config);
  if (!job.ok()) {
    std::fprintf(stderr, "%s\n", job.status().message().c_str());
    return 2;
  }
  if (job->model().kind() == pb::EXTERNAL) {
    std::fprintf(stderr,
                 "meridian export-weights: %s: model.kind is EXTERNAL: its "
                 "initial weights are model.weights already\n",
                 flags.config.c_str());
    return 2;
  }
  // The test images give the input size (the generated matrix of an MF
  // job: its (user, item) pairs).
  Result<RawData> data = LoadRawData(job->data(), /*load_train=*/false,
                                     /*load_test=*/true);
  Result<std::unique_ptr<Model>> model =
      data.ok() ? MakeJobModel(*job, data->input_dim(), 10)
                : Result<std::unique_ptr<Model>>(data.status());
  if (!model.ok()) {
    std::fprintf(stderr, "meridian export-weights: %s\n",
                 model.status().message().c_str());
    return 1;
  }
  const ModelLayout& layout = (*model)->layout();
  std::vector<float> values(layout.num_elements());
  (*model)->Initialize(job->seed(), values);
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo& info : layout.tensors()) {
    if (info.type != ElementType::kF32) {
      std::fprintf(
          stderr, "meridian export-weights: tensor %s is %s, not F32\n",
          info.name.c_str(), std::string(ElementTypeName(info.type)).c_str());
      return 1;
    }
    tensors.push_back({info.name, info.type, info.shape,
                       std::as_bytes(std::span<const float>(
                           values.data() + info.offset, info.size))});
  }
  const Status written =
      WriteSafetensors(flags.out, tensors,
                       {{"written_by", "meridian export-weights"},
                        {"job", job->name()},
                        {"seed", std::to_string(job->seed())}});
  if (!written.ok()) {
    std::fprintf(stderr, "meridian export-weights: %s\n",
                 written.message().c_str());
    return 1;
  }
  std::printf("%s: %zu tensors, %zu parameters of the %s model (seed %llu)\n",
              flags.out.c_str(), tensors.size(), values.size(),
              pb::ModelKind_Name(job->model().kind()).c_str(),
              static_cast<unsigned long long>(job->seed()));
  return 0;
}

// Here rather than in config, which sits below train (the safetensors
// reader) in the layer order; the site servers check the file again when
// they start.
bool CheckWeightsFile(const std::string& path, const pb::JobConfig& job,
                      std::string* summary) {
  if (job.model().kind() != pb::EXTERNAL || job.model().weights().empty()) {
    return true;
  }
  std::error_code missing;
  if (!job.model().weights_command().empty() &&
      !std::filesystem::exists(job.model().weights(), missing)) {
    *summary = "missing; `meridian run` writes it first with `" +
               DescribeCommand({job.model().weights_command().begin(),
                                job.model().weights_command().end()}) +
               "` (model.weights_command)";
    return true;
  }
  Result<TensorFile> weights = ReadSafetensors(job.model().weights());
  if (!weights.ok()) {
    std::fprintf(stderr, "%s: model.weights: %s\n", path.c_str(),
                 weights.status().message().c_str());
    return false;
  }
  for (const FileTensor& tensor : weights->tensors) {
    if (!IsFloating(tensor.type)) continue;  // stays with each worker
    *summary += (summary->empty() ? "" : " ") + tensor.name + "[";
    for (size_t d = 0; d < tensor.shape.size(); ++d) {
      *summary += (d > 0 ? "," : "") + std::to_string(tensor.shape[d]);
    }
    *summary += "]";
    if (tensor.type != ElementType::kF32) {
      *summary += ":" + std::string(ElementTypeName(tensor.type));
    }
  }
  if (summary->empty()) {
    std::fprintf(stderr,
                 "%s: model.weights: %s holds no floating-point tensor: "
                 "nothing for the sites to serve\n",
                 path.c_str(), job.model().weights().c_str());
    return false;
  }
  return true;
}

}  // namespace meridian
