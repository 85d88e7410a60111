// The layers of a convolutional classifier (cnn.cc builds the model from
// them) and what they share: shapes, activation layouts, per-pass scratch,
// the Layer interface, and one builder per kind of layer, which parses the
// layer's config into a layer and adds its tensors to the model's layout.
// Each kind lives in its own file: cnn_conv.cc, cnn_pool.cc, cnn_norm.cc
// (BatchNorm, GroupNorm), cnn_dense.cc, cnn_pointwise.cc (ReLU, dropout).
//
// Activation layouts. A batch of n samples of shape C x H x W (P = H * W
// positions) is held in one of two layouts, both with a position's
// neighbours contiguous:
//   channel-major  (c * n + b) * P + p   spatial layers (conv, pools): one
//                                        channel of the whole batch is one
//                                        row, so a convolution of the batch
//                                        is one product per chunk
//   sample-major   b * C * P + c * P + p dense layers and the features as
//                                        they arrive (one column a sample)
// Elementwise and normalisation layers work on either (through strides).
// Convolutions run as im2col + the outer-product kernel over chunks of
// samples small enough to stay in cache (the columns are recomputed in the
// backward pass instead of being kept); the weight gradient is a dot
// product over the chunk's positions.
//
// Threads: a layer is used by one model, which one thread drives at a time.
#ifndef MERIDIAN_TRAIN_CNN_LAYER_H_
#define MERIDIAN_TRAIN_CNN_LAYER_H_

#include <Eigen/Core>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "meridian/core/layout.h"
#include "meridian/core/status.h"
#include "meridian/job.pb.h"
#include "train/kernels.h"

namespace meridian::cnn_internal {

// Bounds on what a job file may ask for (a model is built by every process
// of a job; these keep a typo from exhausting memory).
inline constexpr uint64_t kMaxChannels = 65536;
inline constexpr uint64_t kMaxDenseWidth = uint64_t{1} << 24;
inline constexpr uint64_t kMaxKernel = 64;

struct Shape {
  int64_t c = 0;
  int64_t h = 0;
  int64_t w = 0;
  int64_t plane() const { return h * w; }
  int64_t size() const { return c * h * w; }
};

// Where element (channel c, sample b, position p) of an activation lives:
// c * channel_stride + b * sample_stride + p.
struct Strides {
  int64_t channel = 0;
  int64_t sample = 0;
};

inline Strides StridesOf(const Shape& shape, int64_t n, bool channel_major) {
  if (channel_major) return {n * shape.plane(), shape.plane()};
  return {shape.plane(), shape.size()};
}

// One layer's scratch for one mode (training or evaluation); grows only.
struct LayerWork {
  std::vector<float> a;            // conv: columns / padded input; norms: xhat;
                                   // dense: flat x; dropout: mask
  std::vector<float> b;            // conv: column gradients / wide output;
                                   // norms: 1 / std; dense: flat dx
  std::vector<float> c;            // conv (stride 1): wide output gradient
  std::vector<float> d;            // conv (stride 1): padded output gradient
  std::vector<float> e;            // conv (stride 1): wide input gradient,
                                   // flipped weights
  std::vector<const float*> rows;  // conv (stride 1): input rows
  std::vector<const float*> grad_rows;  // conv (stride 1): gradient rows
  std::vector<int32_t> index;           // max pool: the winner of each window
};

// What one pass needs besides the layer's own data.
struct Pass {
  int64_t n = 0;  // samples
  bool train = false;
  kernels::Isa isa = kernels::Isa::kPortable;
  float* pack = nullptr;  // kernels::OuterProduct scratch
  std::mt19937_64* rng = nullptr;
};

// A contiguous run of floats (e.g. one (channel, sample)'s P positions) as
// an Eigen array, so reductions and elementwise updates vectorise.
using ConstSegment = Eigen::Map<const Eigen::ArrayXf>;
using Segment = Eigen::Map<Eigen::ArrayXf>;

inline void Grow(std::vector<float>& buffer, int64_t size) {
  if (static_cast<int64_t>(buffer.size()) < size) {
    buffer.resize(static_cast<size_t>(size));
  }
}

// sample-major (n x C*P) <- channel-major, and back.
void ChannelToSampleMajor(const float* in, const Shape& shape, int64_t n,
                          float* out);
void SampleToChannelMajor(const float* in, const Shape& shape, int64_t n,
                          float* out);

class Layer {
 public:
  Layer(Shape in, Shape out) : in_(in), out_(out) {}
  virtual ~Layer() = default;

  const Shape& input_shape() const { return in_; }
  const Shape& output_shape() const { return out_; }
  // The layout of the output, given whether the input is channel-major.
  virtual bool OutputChannelMajor(bool input_channel_major) const {
    return input_channel_major;
  }
  // Writes the initial values of this layer's tensors.
  virtual void Initialize(std::mt19937_64& /*rng*/, float* /*params*/,
                          bool /*last*/) const {}
  // OuterProduct scratch for a pass over n samples.
  virtual int64_t PackSize(int64_t /*n*/) const { return 0; }

  // out = layer(in) for pass.n samples; `channel_major` is the input's
  // layout.
  virtual void Forward(const float* params, const float* in, float* out,
                       bool channel_major, LayerWork& work,
                       const Pass& pass) = 0;
  // Gradients of this layer's tensors into `grad` (the model's, zeroed
  // before the pass) and, when d_in is not null, dLoss/din (overwritten).
  virtual void Backward(const float* params, const float* in, const float* out,
                        const float* d_out, float* d_in, float* grad,
                        bool channel_major, LayerWork& work,
                        const Pass& pass) = 0;
  // Writes state computed by the last training Forward (running
  // statistics) into params.
  virtual void ApplyState(float* /*params*/) {}

 private:
  Shape in_;
  Shape out_;
};

// --- building from the config ------------------------------------------------

// What building one layer reads: its config, where it is in the job file
// ("model.layers[3]", for errors), its index as its tensors' names carry
// it ("3"), and its input's shape.
struct LayerSpec {
  const pb::LayerConfig& config;
  std::string where;
  std::string id;
  Shape in;
};

// One builder per kind: checks the fields the kind uses (the caller has
// checked that the others are unset), adds the layer's tensors to
// `layout`, and returns the layer; InvalidArgument naming the field
// otherwise.
Result<std::unique_ptr<Layer>> BuildConv(const LayerSpec& spec,
                                         ModelLayout& layout);
// MAX_POOL and AVG_POOL.
Result<std::unique_ptr<Layer>> BuildPool(const LayerSpec& spec);
Result<std::unique_ptr<Layer>> BuildRelu(const LayerSpec& spec);
Result<std::unique_ptr<Layer>> BuildDropout(const LayerSpec& spec);
// BATCH_NORM and GROUP_NORM.
Result<std::unique_ptr<Layer>> BuildNorm(const LayerSpec& spec,
                                         ModelLayout& layout);
// FULLY_CONNECTED.
Result<std::unique_ptr<Layer>> BuildDense(const LayerSpec& spec,
                                          ModelLayout& layout);

// InvalidArgument "<where> must be in [low, high], got value" outside.
Status CheckRange(uint64_t value, uint64_t low, uint64_t high,
                  const std::string& where);

// "CxHxW".
std::string ShapeText(const Shape& shape);

}  // namespace meridian::cnn_internal

#endif  // MERIDIAN_TRAIN_CNN_LAYER_H_
