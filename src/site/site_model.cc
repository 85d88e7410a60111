#include "site/site_model.h"

#include <Eigen/Core>
#include <cstring>

#include "meridian/core/log.h"
#include "meridian/train/dataset.h"
#include "meridian/train/safetensors.h"

namespace meridian {
namespace {

// One element of `type` at `bytes` as a float (little-endian).
float ToFloat(ElementType type, const std::byte* bytes) {
  switch (type) {
    case ElementType::kF32: {
      float value;
      std::memcpy(&value, bytes, sizeof(value));
      return value;
    }
    case ElementType::kF64: {
      double value;
      std::memcpy(&value, bytes, sizeof(value));
      return static_cast<float>(value);
    }
    case ElementType::kF16: {
      uint16_t bits;
      std::memcpy(&bits, bytes, sizeof(bits));
      return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
    }
    case ElementType::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, bytes, sizeof(bits));
      return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(bits));
    }
    default:
      return 0;  // not a layout type
  }
}

// `value` as one element of `type` at `out`.
void FromFloat(float value, ElementType type, std::byte* out) {
  switch (type) {
    case ElementType::kF32:
      std::memcpy(out, &value, sizeof(value));
      return;
    case ElementType::kF64: {
      const double wide = value;
      std::memcpy(out, &wide, sizeof(wide));
      return;
    }
    case ElementType::kF16: {
      const uint16_t bits =
          Eigen::numext::bit_cast<uint16_t>(Eigen::half(value));
      std::memcpy(out, &bits, sizeof(bits));
      return;
    }
    case ElementType::kBF16: {
      const uint16_t bits =
          Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(value));
      std::memcpy(out, &bits, sizeof(bits));
      return;
    }
    default:
      return;
  }
}

Result<SiteModel> LoadExternal(const pb::JobConfig& job) {
  const std::string& path = job.model().weights();
  Result<TensorFile> file = ReadSafetensors(path);
  if (!file.ok()) {
    return file.status().WithContext("model.weights (the initial weights)");
  }
  SiteModel model;
  model.metric = ModelMetric(job.model());
  for (const FileTensor& tensor : file->tensors) {
    if (!IsFloating(tensor.type)) continue;  // stays with the workers
    MERIDIAN_RETURN_IF_ERROR(
        model.layout.Add(tensor.name, tensor.shape, tensor.type)
            .WithContext("model.weights " + path));
  }
  if (model.layout.tensors().empty()) {
    return InvalidArgumentError("model.weights " + path +
                                ": no floating-point tensor to train");
  }
  // The labels of the data { } the job names for its programs
  // (meridian.data splits those files as the built-in workers do), for
  // the summary's label histogram: the skew of each site's share. Only a
  // description: a model whose programs read other data trains without it.
  if (job.has_data() && !job.data().has_ratings()) {
    Result<std::vector<uint8_t>> labels = LoadTrainLabels(job.data());
    if (labels.ok()) {
      model.train_labels = std::move(*labels);
    } else {
      MLOG(INFO) << "no label histogram of the site's data: "
                 << labels.status();
    }
  }
  model.initial.resize(model.layout.num_elements());
  for (const TensorInfo& info : model.layout.tensors()) {
    const FileTensor& tensor = *file->Find(info.name);
    const std::span<const std::byte> bytes = file->Bytes(tensor);
    const size_t element = ElementSize(tensor.type);
    for (uint64_t i = 0; i < info.size; ++i) {
      model.initial[info.offset + i] =
          ToFloat(tensor.type, bytes.data() + i * element);
    }
  }
  return model;
}

Result<SiteModel> LoadBuiltin(const pb::JobConfig& job, int site_index) {
  // The training images are read for their normalisation statistics, and
  // for the fixed minibatches of the policy's global loss evaluations.
  MERIDIAN_ASSIGN_OR_RETURN(RawData raw, LoadRawData(job.data(), true, true));
  SiteModel model;
  MERIDIAN_ASSIGN_OR_RETURN(model.eval_sets,
                            MakeEvaluationSets(job, site_index, raw));
  const int input_dim = raw.input_dim();
  MERIDIAN_ASSIGN_OR_RETURN(std::unique_ptr<Model> built,
                            MakeJobModel(job, input_dim, 10));
  MERIDIAN_ASSIGN_OR_RETURN(model.eval_model, MakeJobModel(job, input_dim, 10));
  model.layout = built->layout();
  model.metric = built->metric();
  model.initial.resize(model.layout.num_elements());
  built->Initialize(job.seed(), model.initial);
  model.train_labels = std::move(raw.train_labels);
  return model;
}

}  // namespace

Result<SiteModel> LoadSiteModel(const pb::JobConfig& job, int site_index) {
  if (job.model().kind() == pb::EXTERNAL) return LoadExternal(job);
  return LoadBuiltin(job, site_index);
}

Status WriteModelFile(const std::string& path, const ModelLayout& layout,
                      std::span<const float> values) {
  std::vector<std::vector<std::byte>> buffers;
  std::vector<TensorToWrite> tensors;
  buffers.reserve(layout.tensors().size());
  for (const TensorInfo& info : layout.tensors()) {
    const size_t element = ElementSize(info.type);
    std::vector<std::byte>& bytes = buffers.emplace_back(info.size * element);
    for (uint64_t i = 0; i < info.size; ++i) {
      FromFloat(values[info.offset + i], info.type, bytes.data() + i * element);
    }
    tensors.push_back({info.name, info.type, info.shape, bytes});
  }
  return WriteSafetensors(path, tensors, {{"written_by", "meridian"}});
}

}  // namespace meridian
