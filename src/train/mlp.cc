// Fully connected classifiers (softmax regression and ReLU MLPs) over a flat
// parameter vector, with forward/backward passes in Eigen (the three dense
// products on AVX2/FMA kernels where the CPU has them).
//
// Layer l computes Z_l = W_l * A_{l-1} + b_l (A_{-1} = the features, one
// column per sample) and A_l = ReLU(Z_l) for hidden layers; the last layer's
// Z is the logits. W_l is stored row-major [out, in] followed by b_l [out],
// layer after layer ("fc0.weight", "fc0.bias", "fc1.weight", ...).

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "meridian/dataset.h"
#include "meridian/model.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MERIDIAN_HAVE_AVX2_KERNELS 1
#else
#define MERIDIAN_HAVE_AVX2_KERNELS 0
#endif

namespace meridian {
namespace {

#if MERIDIAN_HAVE_AVX2_KERNELS
// AVX2/FMA kernels for the three dense products of a step. The project
// builds for baseline x86-64 (SSE2), where Eigen's GEMM runs at a third of
// what the CPU can do; these functions are compiled for AVX2+FMA and only
// called when the CPU has both (checked at run time), so the binary still
// runs everywhere. They use raw pointers and intrinsics only: no Eigen code
// is instantiated with a different instruction set.
namespace avx2 {

#define MERIDIAN_AVX2_FN __attribute__((target("avx2,fma")))

// Lanes [0, n) set, n in [0, 8].
MERIDIAN_AVX2_FN inline __m256i TailMask(int64_t n) {
  alignas(32) static const int32_t kBits[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kBits + 8 - n));
}

MERIDIAN_AVX2_FN inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// One MR x NR tile of the dot-product form:
//   out[o + b * ldo] = act(bias[o] + sum_k a[o * lda + k] * x[b * ldx + k]).
template <int MR, int NR>
MERIDIAN_AVX2_FN void DotTile(const float* a, int64_t lda, const float* x,
                              int64_t ldx, int64_t k, const float* bias,
                              bool relu, float* out, int64_t ldo) {
  __m256 acc[MR][NR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  int64_t kk = 0;
  for (; kk + 8 <= k; kk += 8) {
    __m256 xv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) xv[j] = _mm256_loadu_ps(x + j * ldx + kk);
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_loadu_ps(a + i * lda + kk);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm256_fmadd_ps(av, xv[j], acc[i][j]);
      }
    }
  }
  if (kk < k) {
    const __m256i mask = TailMask(k - kk);
    __m256 xv[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      xv[j] = _mm256_maskload_ps(x + j * ldx + kk, mask);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_maskload_ps(a + i * lda + kk, mask);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm256_fmadd_ps(av, xv[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NR; ++j) {
      float value = HorizontalSum(acc[i][j]) + bias[i];
      if (relu) value = std::max(value, 0.0f);
      out[i + j * ldo] = value;
    }
  }
}

template <int MR>
MERIDIAN_AVX2_FN void DotRowTile(const float* a, int64_t lda, const float* x,
                                 int64_t ldx, int64_t n, int64_t k,
                                 const float* bias, bool relu, float* out,
                                 int64_t ldo) {
  constexpr int kNr = 3;
  int64_t b = 0;
  for (; b + kNr <= n; b += kNr) {
    DotTile<MR, kNr>(a, lda, x + b * ldx, ldx, k, bias, relu, out + b * ldo,
                     ldo);
  }
  switch (n - b) {
    case 2:
      DotTile<MR, 2>(a, lda, x + b * ldx, ldx, k, bias, relu, out + b * ldo,
                     ldo);
      break;
    case 1:
      DotTile<MR, 1>(a, lda, x + b * ldx, ldx, k, bias, relu, out + b * ldo,
                     ldo);
      break;
    default:
      break;
  }
}

// out (m x n, column stride ldo) = act(A * X + bias) with A row-major m x k
// (row stride lda) and X column-major k x n (column stride ldx).
MERIDIAN_AVX2_FN void DotProduct(int64_t m, int64_t n, int64_t k,
                                 const float* a, int64_t lda, const float* x,
                                 int64_t ldx, const float* bias, bool relu,
                                 float* out, int64_t ldo) {
  constexpr int kMr = 4;
  int64_t o = 0;
  for (; o + kMr <= m; o += kMr) {
    DotRowTile<kMr>(a + o * lda, lda, x, ldx, n, k, bias + o, relu, out + o,
                    ldo);
  }
  switch (m - o) {
    case 3:
      DotRowTile<3>(a + o * lda, lda, x, ldx, n, k, bias + o, relu, out + o,
                    ldo);
      break;
    case 2:
      DotRowTile<2>(a + o * lda, lda, x, ldx, n, k, bias + o, relu, out + o,
                    ldo);
      break;
    case 1:
      DotRowTile<1>(a + o * lda, lda, x, ldx, n, k, bias + o, relu, out + o,
                    ldo);
      break;
    default:
      break;
  }
}

// Rows of p per outer-product tile.
constexpr int kOuterRows = 6;

// One RR x (8 * IW lanes) tile of the outer-product form:
//   g[r * ldg + i] = sum_s packed[s * kOuterRows + r] * q[i + s * ldq].
// kMasked: IW == 1 and only the lanes of `mask` exist.
template <int RR, int IW, bool kMasked>
MERIDIAN_AVX2_FN void OuterTile(const float* packed, const float* q,
                                int64_t ldq, int64_t s_count, __m256i mask,
                                float* g, int64_t ldg) {
  __m256 acc[RR][IW];
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r) {
#pragma GCC unroll 2
    for (int w = 0; w < IW; ++w) acc[r][w] = _mm256_setzero_ps();
  }
  for (int64_t s = 0; s < s_count; ++s) {
    __m256 qv[IW];
#pragma GCC unroll 2
    for (int w = 0; w < IW; ++w) {
      qv[w] = kMasked ? _mm256_maskload_ps(q + s * ldq + 8 * w, mask)
                      : _mm256_loadu_ps(q + s * ldq + 8 * w);
    }
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) {
      const __m256 pv = _mm256_broadcast_ss(packed + s * kOuterRows + r);
#pragma GCC unroll 2
      for (int w = 0; w < IW; ++w) {
        acc[r][w] = _mm256_fmadd_ps(pv, qv[w], acc[r][w]);
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r) {
#pragma GCC unroll 2
    for (int w = 0; w < IW; ++w) {
      if (kMasked) {
        _mm256_maskstore_ps(g + r * ldg + 8 * w, mask, acc[r][w]);
      } else {
        _mm256_storeu_ps(g + r * ldg + 8 * w, acc[r][w]);
      }
    }
  }
}

template <int IW, bool kMasked>
MERIDIAN_AVX2_FN void OuterColumnBlock(int64_t r_count, int64_t s_count,
                                       const float* packed, const float* q,
                                       int64_t ldq, __m256i mask, float* g,
                                       int64_t ldg) {
  int64_t r = 0;
  for (; r + kOuterRows <= r_count; r += kOuterRows) {
    OuterTile<kOuterRows, IW, kMasked>(packed, q, ldq, s_count, mask,
                                       g + r * ldg, ldg);
    packed += s_count * kOuterRows;
  }
  float* gr = g + r * ldg;
  switch (r_count - r) {
    case 5:
      OuterTile<5, IW, kMasked>(packed, q, ldq, s_count, mask, gr, ldg);
      break;
    case 4:
      OuterTile<4, IW, kMasked>(packed, q, ldq, s_count, mask, gr, ldg);
      break;
    case 3:
      OuterTile<3, IW, kMasked>(packed, q, ldq, s_count, mask, gr, ldg);
      break;
    case 2:
      OuterTile<2, IW, kMasked>(packed, q, ldq, s_count, mask, gr, ldg);
      break;
    case 1:
      OuterTile<1, IW, kMasked>(packed, q, ldq, s_count, mask, gr, ldg);
      break;
    default:
      break;
  }
}

// Floats of the `pack` buffer OuterProduct needs.
int64_t OuterPackSize(int64_t r_count, int64_t s_count) {
  return (r_count + kOuterRows - 1) / kOuterRows * kOuterRows * s_count;
}

// g[r * ldg + i] = sum_{s < s_count} p[r * prs + s * pss] * q[i + s * ldq]
// for r < r_count, i < i_count (overwrites g). `pack` holds
// OuterPackSize(r_count, s_count) floats of scratch.
MERIDIAN_AVX2_FN void OuterProduct(int64_t r_count, int64_t i_count,
                                   int64_t s_count, const float* p, int64_t prs,
                                   int64_t pss, const float* q, int64_t ldq,
                                   float* g, int64_t ldg, float* pack) {
  // Pack p tile by tile ([tile][s][row]): the broadcasts of one step are
  // then adjacent, and a tile's s_count steps read s_count * 24 contiguous
  // bytes instead of touching s_count cache lines.
  for (int64_t r0 = 0; r0 < r_count; r0 += kOuterRows) {
    const int64_t rows = std::min<int64_t>(kOuterRows, r_count - r0);
    float* tile = pack + r0 * s_count;
    for (int64_t s = 0; s < s_count; ++s) {
      for (int64_t r = 0; r < rows; ++r) {
        tile[s * kOuterRows + r] = p[(r0 + r) * prs + s * pss];
      }
    }
  }
  const __m256i all = TailMask(8);
  // Column blocks outermost: a block of q (16 x s_count) stays in L1 while
  // every row of g is computed from it.
  int64_t i = 0;
  for (; i + 16 <= i_count; i += 16) {
    OuterColumnBlock<2, false>(r_count, s_count, pack, q + i, ldq, all, g + i,
                               ldg);
  }
  if (i + 8 <= i_count) {
    OuterColumnBlock<1, false>(r_count, s_count, pack, q + i, ldq, all, g + i,
                               ldg);
    i += 8;
  }
  if (i < i_count) {
    OuterColumnBlock<1, true>(r_count, s_count, pack, q + i, ldq,
                              TailMask(i_count - i), g + i, ldg);
  }
}

#undef MERIDIAN_AVX2_FN

}  // namespace avx2
#endif  // MERIDIAN_HAVE_AVX2_KERNELS

bool CpuHasAvx2Fma() {
#if MERIDIAN_HAVE_AVX2_KERNELS
  static const bool kHas =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return kHas;
#else
  return false;
#endif
}

using RowMajorMatrixXf =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstWeightMap = Eigen::Map<const RowMajorMatrixXf>;
using WeightMap = Eigen::Map<RowMajorMatrixXf>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;
using ConstMatrixRef = Eigen::Ref<const Eigen::MatrixXf>;

// Samples per forward pass in Evaluate (bounds scratch memory).
constexpr Eigen::Index kEvalChunk = 1000;
// Largest layer width and model size MakeModel accepts.
constexpr uint64_t kMaxWidth = uint64_t{1} << 24;
constexpr uint64_t kMaxParams = uint64_t{1} << 30;

struct Layer {
  Eigen::Index in = 0;
  Eigen::Index out = 0;
  uint64_t weight_offset = 0;
  uint64_t bias_offset = 0;
  bool relu = false;
};

// Per-layer activations and deltas for up to `capacity` samples. Only grows,
// so repeated calls with batches no larger than before never allocate.
struct Scratch {
  std::vector<Eigen::MatrixXf> acts;    // acts[l]: A_l (logits for the last)
  std::vector<Eigen::MatrixXf> deltas;  // deltas[l]: dLoss / dZ_l
  std::vector<float> pack;              // operand packing (AVX2 backward)
  Eigen::Index capacity = 0;
};

// Uniform float in [-limit, limit) from 24 random bits: the same values on
// every platform for a given seed (std::uniform_real_distribution is not).
float UniformSymmetric(std::mt19937_64& rng, float limit) {
  const float unit = static_cast<float>(rng() >> 40) * 0x1.0p-24f;  // [0,1)
  return (2.0f * unit - 1.0f) * limit;
}

class Mlp final : public Model {
 public:
  Mlp(ModelLayout layout, std::vector<Layer> layers, int input_dim,
      int num_classes, bool use_avx2)
      : layout_(std::move(layout)),
        layers_(std::move(layers)),
        input_dim_(input_dim),
        num_classes_(num_classes),
        use_avx2_(use_avx2) {}

  const ModelLayout& layout() const override { return layout_; }
  int input_dim() const override { return input_dim_; }
  int num_classes() const override { return num_classes_; }

  void Initialize(uint64_t seed, std::span<float> params) const override {
    if (params.size() != layout_.num_elements()) {
      // Precondition violated: make the misuse loud rather than silent.
      std::fill(params.begin(), params.end(),
                std::numeric_limits<float>::quiet_NaN());
      return;
    }
    std::mt19937_64 rng(seed);
    for (const Layer& layer : layers_) {
      const double fan_in = static_cast<double>(layer.in);
      const double fan_out = static_cast<double>(layer.out);
      // He-uniform keeps ReLU activations' variance; Glorot-uniform for the
      // linear output layer.
      const float limit =
          static_cast<float>(layer.relu ? std::sqrt(6.0 / fan_in)
                                        : std::sqrt(6.0 / (fan_in + fan_out)));
      float* weight = params.data() + layer.weight_offset;
      const Eigen::Index count = layer.in * layer.out;
      for (Eigen::Index i = 0; i < count; ++i) {
        weight[i] = UniformSymmetric(rng, limit);
      }
      std::fill_n(params.data() + layer.bias_offset, layer.out, 0.0f);
    }
  }

  float LossAndGradient(std::span<const float> params,
                        const ConstMatrixRef& features,
                        std::span<const uint8_t> labels,
                        std::span<float> grad) override {
    const Eigen::Index n = features.cols();
    if (!InputsValid(params, features, labels) ||
        grad.size() != params.size()) {
      std::fill(grad.begin(), grad.end(), 0.0f);
      return std::numeric_limits<float>::quiet_NaN();
    }
    if (n == 0) {
      std::fill(grad.begin(), grad.end(), 0.0f);
      return 0.0f;
    }
    Reserve(train_, n);
    Forward(params, features, n, train_);

    // Softmax cross-entropy, stable: subtract each column's max logit.
    // dLoss/dlogits = (softmax - onehot) / n.
    const auto logits = train_.acts.back().leftCols(n);
    auto delta = train_.deltas.back().leftCols(n);
    const float inv_n = 1.0f / static_cast<float>(n);
    double loss = 0;
    for (Eigen::Index j = 0; j < n; ++j) {
      const auto z = logits.col(j);
      auto d = delta.col(j);
      const float max_logit = z.maxCoeff();
      d = (z.array() - max_logit).exp();
      const float sum = d.sum();
      const int label = labels[j];
      loss += std::log(static_cast<double>(sum)) + max_logit - z(label);
      d *= inv_n / sum;
      d(label) -= inv_n;
    }

    // Backward, last layer first.
    for (size_t l = layers_.size(); l-- > 0;) {
      const Layer& layer = layers_[l];
      const auto d = train_.deltas[l].leftCols(n);
      const ConstMatrixRef input =
          l == 0 ? features : ConstMatrixRef(train_.acts[l - 1].leftCols(n));
      float* grad_w_data = grad.data() + layer.weight_offset;
      const float* weight_data = params.data() + layer.weight_offset;
      VectorMap grad_b(grad.data() + layer.bias_offset, layer.out);
      grad_b.noalias() = d.rowwise().sum();
      auto d_prev = train_.deltas[l == 0 ? 0 : l - 1].leftCols(n);
#if MERIDIAN_HAVE_AVX2_KERNELS
      if (use_avx2_) {
        // grad_w[o, i] = sum_b d(o, b) * input(i, b).
        avx2::OuterProduct(layer.out, layer.in, n, d.data(), 1, d.outerStride(),
                           input.data(), input.outerStride(), grad_w_data,
                           layer.in, train_.pack.data());
        if (l > 0) {
          // d_prev(i, b) = sum_o d(o, b) * weight[o, i].
          avx2::OuterProduct(n, layer.in, layer.out, d.data(), d.outerStride(),
                             1, weight_data, layer.in, d_prev.data(),
                             d_prev.outerStride(), train_.pack.data());
        }
      } else  // NOLINT(readability/braces)
#endif
      {
        WeightMap grad_w(grad_w_data, layer.out, layer.in);
        grad_w.noalias() = d * input.transpose();
        if (l > 0) {
          const ConstWeightMap weight(weight_data, layer.out, layer.in);
          d_prev.noalias() = weight.transpose() * d;
        }
      }
      if (l > 0) {
        // ReLU: the gradient passes where the activation was positive.
        d_prev.array() *= (input.array() > 0.0f).cast<float>();
      }
    }
    return static_cast<float>(loss / static_cast<double>(n));
  }

  EvalResult Evaluate(std::span<const float> params, const Dataset& data,
                      uint64_t max_samples) override {
    return EvaluateInto(params, data, max_samples, nullptr);
  }

  EvalResult EvaluateSamples(std::span<const float> params,
                             const Dataset& data,
                             std::vector<uint8_t>* correct) override {
    return EvaluateInto(params, data, 0, correct);
  }

 private:
  // Evaluate; per-sample correctness into `correct` when not null.
  EvalResult EvaluateInto(std::span<const float> params, const Dataset& data,
                          uint64_t max_samples,
                          std::vector<uint8_t>* correct) {
    if (correct != nullptr) correct->clear();
    EvalResult result;
    uint64_t total = std::min<uint64_t>(
        data.labels.size(), static_cast<uint64_t>(data.features.cols()));
    if (max_samples > 0) total = std::min(total, max_samples);
    if (params.size() != layout_.num_elements() ||
        data.features.rows() != input_dim_) {
      result.loss = std::numeric_limits<double>::quiet_NaN();
      return result;
    }
    if (total == 0) return result;
    Reserve(eval_, std::min<Eigen::Index>(kEvalChunk,
                                          static_cast<Eigen::Index>(total)));
    if (correct != nullptr) correct->reserve(total);
    double loss = 0;
    uint64_t right = 0;
    for (uint64_t start = 0; start < total; start += kEvalChunk) {
      const Eigen::Index n = static_cast<Eigen::Index>(
          std::min<uint64_t>(kEvalChunk, total - start));
      Forward(params,
              data.features.middleCols(static_cast<Eigen::Index>(start), n), n,
              eval_);
      const auto logits = eval_.acts.back().leftCols(n);
      for (Eigen::Index j = 0; j < n; ++j) {
        const auto z = logits.col(j);
        Eigen::Index predicted = 0;
        const float max_logit = z.maxCoeff(&predicted);
        const int label = data.labels[start + j];
        if (label >= num_classes_) {
          if (correct != nullptr) correct->clear();
          result.loss = std::numeric_limits<double>::quiet_NaN();
          return result;
        }
        const double sum = (z.array() - max_logit).exp().sum();
        loss += std::log(sum) + max_logit - z(label);
        if (predicted == label) ++right;
        if (correct != nullptr) correct->push_back(predicted == label);
      }
    }
    result.samples = total;
    result.loss = loss / static_cast<double>(total);
    result.accuracy = static_cast<double>(right) / static_cast<double>(total);
    return result;
  }

  bool InputsValid(std::span<const float> params,
                   const ConstMatrixRef& features,
                   std::span<const uint8_t> labels) const {
    if (params.size() != layout_.num_elements()) return false;
    if (features.rows() != input_dim_) return false;
    if (static_cast<uint64_t>(features.cols()) != labels.size()) return false;
    for (uint8_t label : labels) {
      if (label >= num_classes_) return false;
    }
    return true;
  }

  void Reserve(Scratch& scratch, Eigen::Index n) const {
    if (n <= scratch.capacity && !scratch.acts.empty()) return;
    const Eigen::Index capacity = std::max(n, scratch.capacity);
    scratch.acts.resize(layers_.size());
    scratch.deltas.resize(layers_.size());
    int64_t pack = 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
      scratch.acts[l].resize(layers_[l].out, capacity);
      scratch.deltas[l].resize(layers_[l].out, capacity);
#if MERIDIAN_HAVE_AVX2_KERNELS
      // Weight gradient (rows = out, steps = samples) and delta propagation
      // (rows = samples, steps = out).
      pack = std::max({pack, avx2::OuterPackSize(layers_[l].out, capacity),
                       avx2::OuterPackSize(capacity, layers_[l].out)});
#endif
    }
    if (use_avx2_) scratch.pack.resize(static_cast<size_t>(pack));
    scratch.capacity = capacity;
  }

  // Fills scratch.acts[l].leftCols(n) for every layer.
  void Forward(std::span<const float> params, const ConstMatrixRef& features,
               Eigen::Index n, Scratch& scratch) const {
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      const float* weight_data = params.data() + layer.weight_offset;
      const float* bias_data = params.data() + layer.bias_offset;
      const ConstMatrixRef input =
          l == 0 ? features : ConstMatrixRef(scratch.acts[l - 1].leftCols(n));
      auto out = scratch.acts[l].leftCols(n);
#if MERIDIAN_HAVE_AVX2_KERNELS
      if (use_avx2_) {
        avx2::DotProduct(layer.out, n, layer.in, weight_data, layer.in,
                         input.data(), input.outerStride(), bias_data,
                         layer.relu, out.data(), out.outerStride());
        continue;
      }
#endif
      const ConstWeightMap weight(weight_data, layer.out, layer.in);
      const ConstVectorMap bias(bias_data, layer.out);
      out.noalias() = weight * input;
      out.colwise() += bias;
      if (layer.relu) out = out.cwiseMax(0.0f);
    }
  }

  ModelLayout layout_;
  std::vector<Layer> layers_;
  int input_dim_;
  int num_classes_;
  bool use_avx2_;
  Scratch train_;  // LossAndGradient
  Scratch eval_;   // Evaluate (kept apart so the two never resize each other)
};

}  // namespace

Result<std::unique_ptr<Model>> MakeModel(const pb::ModelConfig& config,
                                         int input_dim, int num_classes) {
  if (input_dim <= 0) {
    return InvalidArgumentError("model input dimension must be positive, got " +
                                std::to_string(input_dim));
  }
  if (num_classes <= 0 || num_classes > 256) {
    // Labels are bytes.
    return InvalidArgumentError("model needs between 1 and 256 classes, got " +
                                std::to_string(num_classes));
  }
  std::vector<uint64_t> widths = {static_cast<uint64_t>(input_dim)};
  switch (config.kind()) {
    case pb::SOFTMAX:
      if (config.hidden_size() > 0) {
        return InvalidArgumentError(
            "model.kind SOFTMAX has no hidden layers, but model.hidden lists " +
            std::to_string(config.hidden_size()) + " (use kind: MLP)");
      }
      break;
    case pb::MLP:
      if (config.hidden_size() == 0) {
        return InvalidArgumentError(
            "model.kind MLP needs at least one model.hidden layer size "
            "(use kind: SOFTMAX for no hidden layer)");
      }
      for (int i = 0; i < config.hidden_size(); ++i) {
        const uint64_t width = config.hidden(i);
        if (width == 0 || width > kMaxWidth) {
          return InvalidArgumentError(
              "model.hidden[" + std::to_string(i) + "] must be in [1, " +
              std::to_string(kMaxWidth) + "], got " + std::to_string(width));
        }
        widths.push_back(width);
      }
      break;
    default:
      return InvalidArgumentError("model.kind must be SOFTMAX or MLP, got " +
                                  pb::ModelKind_Name(config.kind()));
  }
  widths.push_back(static_cast<uint64_t>(num_classes));

  ModelLayout layout;
  std::vector<Layer> layers;
  uint64_t total = 0;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    const uint64_t in = widths[l];
    const uint64_t out = widths[l + 1];
    total += out * in + out;  // widths <= 2^24: no overflow
    if (total > kMaxParams) {
      return InvalidArgumentError("model has more than " +
                                  std::to_string(kMaxParams) + " parameters");
    }
    const std::string prefix = "fc" + std::to_string(l);
    Layer layer;
    layer.in = static_cast<Eigen::Index>(in);
    layer.out = static_cast<Eigen::Index>(out);
    layer.weight_offset = layout.num_elements();
    MERIDIAN_RETURN_IF_ERROR(layout.Add(prefix + ".weight", {out, in}));
    layer.bias_offset = layout.num_elements();
    MERIDIAN_RETURN_IF_ERROR(layout.Add(prefix + ".bias", {out}));
    layer.relu = l + 2 < widths.size();
    layers.push_back(layer);
  }
  // MERIDIAN_NO_SIMD (set, not "0") forces the portable Eigen kernels, e.g.
  // to rule the AVX2 ones out when chasing a numerical problem.
  const char* no_simd = std::getenv("MERIDIAN_NO_SIMD");
  const bool use_avx2 =
      CpuHasAvx2Fma() && (no_simd == nullptr || no_simd[0] == '\0' ||
                          std::strcmp(no_simd, "0") == 0);
  return std::unique_ptr<Model>(new Mlp(std::move(layout), std::move(layers),
                                        input_dim, num_classes, use_avx2));
}

}  // namespace meridian
