#include "train/kernels.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MERIDIAN_HAVE_AVX2_KERNELS 1
#else
#define MERIDIAN_HAVE_AVX2_KERNELS 0
#endif

namespace meridian::kernels {
namespace {

// Where row i of a row-major operand starts: base + i * ld.
struct StridedRows {
  const float* base;
  int64_t ld;
  const float* Row(int64_t i) const { return base + i * ld; }
  StridedRows Skip(int64_t rows) const { return {base + rows * ld, ld}; }
  StridedRows Offset(int64_t columns) const { return {base + columns, ld}; }
};

// Row i through a table of row pointers: rows[i] + offset.
struct IndirectRows {
  const float* const* rows;
  int64_t offset;
  const float* Row(int64_t i) const { return rows[i] + offset; }
  IndirectRows Skip(int64_t n) const { return {rows + n, offset}; }
  IndirectRows Offset(int64_t columns) const {
    return {rows, offset + columns};
  }
};

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
//   out[o + b * ldo] = act(bias[o] + sum_k a.Row(o)[k] * x[b * ldx + k]),
// added to what out holds when `accumulate`.
template <int MR, int NR, typename Rows>
MERIDIAN_AVX2_FN void DotTile(Rows a, const float* x, int64_t ldx, int64_t k,
                              const float* bias, bool relu, bool accumulate,
                              float* out, int64_t ldo) {
  __m256 acc[MR][NR];
  const float* a_row[MR];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    a_row[i] = a.Row(i);
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
      const __m256 av = _mm256_loadu_ps(a_row[i] + kk);
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
      const __m256 av = _mm256_maskload_ps(a_row[i] + kk, mask);
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
      float value = HorizontalSum(acc[i][j]);
      if (bias != nullptr) value += bias[i];
      if (relu) value = std::max(value, 0.0f);
      if (accumulate) value += out[i + j * ldo];
      out[i + j * ldo] = value;
    }
  }
}

template <int MR, typename Rows>
MERIDIAN_AVX2_FN void DotRowTile(Rows a, const float* x, int64_t ldx, int64_t n,
                                 int64_t k, const float* bias, bool relu,
                                 bool accumulate, float* out, int64_t ldo) {
  constexpr int kNr = 3;
  int64_t b = 0;
  for (; b + kNr <= n; b += kNr) {
    DotTile<MR, kNr>(a, x + b * ldx, ldx, k, bias, relu, accumulate,
                     out + b * ldo, ldo);
  }
  switch (n - b) {
    case 2:
      DotTile<MR, 2>(a, x + b * ldx, ldx, k, bias, relu, accumulate,
                     out + b * ldo, ldo);
      break;
    case 1:
      DotTile<MR, 1>(a, x + b * ldx, ldx, k, bias, relu, accumulate,
                     out + b * ldo, ldo);
      break;
    default:
      break;
  }
}

// out (m x n, column stride ldo) = act(A * X + bias) (+ out when
// `accumulate`) with the rows of A (m x k) from `a` and X column-major
// k x n (column stride ldx).
template <typename Rows>
MERIDIAN_AVX2_FN void DotProduct(int64_t m, int64_t n, int64_t k, Rows a,
                                 const float* x, int64_t ldx, const float* bias,
                                 bool relu, bool accumulate, float* out,
                                 int64_t ldo) {
  constexpr int kMr = 4;
  int64_t o = 0;
  const auto bias_at = [&](int64_t row) {
    return bias == nullptr ? nullptr : bias + row;
  };
  for (; o + kMr <= m; o += kMr) {
    DotRowTile<kMr>(a.Skip(o), x, ldx, n, k, bias_at(o), relu, accumulate,
                    out + o, ldo);
  }
  switch (m - o) {
    case 3:
      DotRowTile<3>(a.Skip(o), x, ldx, n, k, bias_at(o), relu, accumulate,
                    out + o, ldo);
      break;
    case 2:
      DotRowTile<2>(a.Skip(o), x, ldx, n, k, bias_at(o), relu, accumulate,
                    out + o, ldo);
      break;
    case 1:
      DotRowTile<1>(a.Skip(o), x, ldx, n, k, bias_at(o), relu, accumulate,
                    out + o, ldo);
      break;
    default:
      break;
  }
}

// Rows of p per outer-product tile.
constexpr int kOuterRows = 6;

// One RR x (8 * IW lanes) tile of the outer-product form:
//   g[r * ldg + i] = sum_s packed[s * kOuterRows + r] * q.Row(s)[i].
// kMasked: IW == 1 and only the lanes of `mask` exist.
template <int RR, int IW, bool kMasked, typename Rows>
MERIDIAN_AVX2_FN void OuterTile(const float* packed, Rows q, int64_t s_count,
                                __m256i mask, float* g, int64_t ldg) {
  __m256 acc[RR][IW];
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r) {
#pragma GCC unroll 2
    for (int w = 0; w < IW; ++w) acc[r][w] = _mm256_setzero_ps();
  }
  for (int64_t s = 0; s < s_count; ++s) {
    const float* row = q.Row(s);
    __m256 qv[IW];
#pragma GCC unroll 2
    for (int w = 0; w < IW; ++w) {
      qv[w] = kMasked ? _mm256_maskload_ps(row + 8 * w, mask)
                      : _mm256_loadu_ps(row + 8 * w);
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

template <int IW, bool kMasked, typename Rows>
MERIDIAN_AVX2_FN void OuterColumnBlock(int64_t r_count, int64_t s_count,
                                       const float* packed, Rows q,
                                       __m256i mask, float* g, int64_t ldg) {
  int64_t r = 0;
  for (; r + kOuterRows <= r_count; r += kOuterRows) {
    OuterTile<kOuterRows, IW, kMasked>(packed, q, s_count, mask, g + r * ldg,
                                       ldg);
    packed += s_count * kOuterRows;
  }
  float* gr = g + r * ldg;
  switch (r_count - r) {
    case 5:
      OuterTile<5, IW, kMasked>(packed, q, s_count, mask, gr, ldg);
      break;
    case 4:
      OuterTile<4, IW, kMasked>(packed, q, s_count, mask, gr, ldg);
      break;
    case 3:
      OuterTile<3, IW, kMasked>(packed, q, s_count, mask, gr, ldg);
      break;
    case 2:
      OuterTile<2, IW, kMasked>(packed, q, s_count, mask, gr, ldg);
      break;
    case 1:
      OuterTile<1, IW, kMasked>(packed, q, s_count, mask, gr, ldg);
      break;
    default:
      break;
  }
}

// g[r * ldg + i] = sum_{s < s_count} p[r * prs + s * pss] * q.Row(s)[i]
// for r < r_count, i < i_count (overwrites g). `pack` holds
// OuterPackSize(r_count, s_count) floats of scratch.
template <typename Rows>
MERIDIAN_AVX2_FN void OuterProduct(int64_t r_count, int64_t i_count,
                                   int64_t s_count, const float* p, int64_t prs,
                                   int64_t pss, Rows q, float* g, int64_t ldg,
                                   float* pack) {
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
    OuterColumnBlock<2, false>(r_count, s_count, pack, q.Offset(i), all, g + i,
                               ldg);
  }
  if (i + 8 <= i_count) {
    OuterColumnBlock<1, false>(r_count, s_count, pack, q.Offset(i), all, g + i,
                               ldg);
    i += 8;
  }
  if (i < i_count) {
    OuterColumnBlock<1, true>(r_count, s_count, pack, q.Offset(i),
                              TailMask(i_count - i), g + i, ldg);
  }
}

#undef MERIDIAN_AVX2_FN

}  // namespace avx2
#endif  // MERIDIAN_HAVE_AVX2_KERNELS

using RowMajorMatrixXf =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using DynamicStride = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;

}  // namespace

bool CpuHasAvx2Fma() {
#if MERIDIAN_HAVE_AVX2_KERNELS
  static const bool kHas =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return kHas;
#else
  return false;
#endif
}

bool SimdWanted() {
  const char* no_simd = std::getenv("MERIDIAN_NO_SIMD");
  return CpuHasAvx2Fma() && (no_simd == nullptr || no_simd[0] == '\0' ||
                             std::strcmp(no_simd, "0") == 0);
}

void DotProduct(bool simd, int64_t m, int64_t n, int64_t k, const float* a,
                int64_t lda, const float* x, int64_t ldx, const float* bias,
                bool relu, float* out, int64_t ldo) {
  if (m <= 0 || n <= 0) return;
#if MERIDIAN_HAVE_AVX2_KERNELS
  if (simd) {
    avx2::DotProduct(m, n, k, StridedRows{a, lda}, x, ldx, bias, relu,
                     /*accumulate=*/false, out, ldo);
    return;
  }
#endif
  // Row-major A (m x k), column-major X (k x n), column-major out.
  const Eigen::Map<const RowMajorMatrixXf, 0, DynamicStride> a_map(
      a, m, k, DynamicStride(lda, 1));
  const Eigen::Map<const Eigen::MatrixXf, 0, DynamicStride> x_map(
      x, k, n, DynamicStride(ldx, 1));
  Eigen::Map<Eigen::MatrixXf, 0, DynamicStride> out_map(out, m, n,
                                                        DynamicStride(ldo, 1));
  if (k <= 0) {
    out_map.setZero();
  } else {
    out_map.noalias() = a_map * x_map;
  }
  if (bias != nullptr) {
    out_map.colwise() += Eigen::Map<const Eigen::VectorXf>(bias, m);
  }
  if (relu) out_map = out_map.cwiseMax(0.0f);
}

void DotProductRowsAccumulate(bool simd, int64_t m, int64_t n, int64_t k,
                              const float* const* a_rows, const float* x,
                              int64_t ldx, float* out, int64_t ldo) {
  if (m <= 0 || n <= 0 || k <= 0) return;
#if MERIDIAN_HAVE_AVX2_KERNELS
  if (simd) {
    avx2::DotProduct(m, n, k, IndirectRows{a_rows, 0}, x, ldx, nullptr, false,
                     /*accumulate=*/true, out, ldo);
    return;
  }
#endif
  for (int64_t b = 0; b < n; ++b) {
    const Eigen::Map<const Eigen::VectorXf> column(x + b * ldx, k);
    for (int64_t o = 0; o < m; ++o) {
      out[o + b * ldo] +=
          Eigen::Map<const Eigen::VectorXf>(a_rows[o], k).dot(column);
    }
  }
}

int64_t OuterPackSize(int64_t r_count, int64_t s_count) {
  // The AVX2 kernel packs rows in tiles of 6 (kOuterRows).
  constexpr int64_t kTile = 6;
#if MERIDIAN_HAVE_AVX2_KERNELS
  static_assert(avx2::kOuterRows == kTile);
#endif
  return (r_count + kTile - 1) / kTile * kTile * s_count;
}

void OuterProduct(bool simd, int64_t r_count, int64_t i_count, int64_t s_count,
                  const float* p, int64_t prs, int64_t pss, const float* q,
                  int64_t ldq, float* g, int64_t ldg, float* pack) {
  if (r_count <= 0 || i_count <= 0) return;
#if MERIDIAN_HAVE_AVX2_KERNELS
  if (simd && s_count > 0) {
    avx2::OuterProduct(r_count, i_count, s_count, p, prs, pss,
                       StridedRows{q, ldq}, g, ldg, pack);
    return;
  }
#endif
  Eigen::Map<RowMajorMatrixXf, 0, DynamicStride> g_map(g, r_count, i_count,
                                                       DynamicStride(ldg, 1));
  if (s_count <= 0) {
    g_map.setZero();
    return;
  }
  const Eigen::Map<const RowMajorMatrixXf, 0, DynamicStride> p_map(
      p, r_count, s_count, DynamicStride(prs, pss));
  const Eigen::Map<const RowMajorMatrixXf, 0, DynamicStride> q_map(
      q, s_count, i_count, DynamicStride(ldq, 1));
  g_map.noalias() = p_map * q_map;
}

void OuterProductRows(bool simd, int64_t r_count, int64_t i_count,
                      int64_t s_count, const float* p, int64_t prs, int64_t pss,
                      const float* const* rows, float* g, int64_t ldg,
                      float* pack) {
  if (r_count <= 0 || i_count <= 0) return;
#if MERIDIAN_HAVE_AVX2_KERNELS
  if (simd && s_count > 0) {
    avx2::OuterProduct(r_count, i_count, s_count, p, prs, pss,
                       IndirectRows{rows, 0}, g, ldg, pack);
    return;
  }
#endif
  for (int64_t r = 0; r < r_count; ++r) {
    Eigen::Map<Eigen::VectorXf> out(g + r * ldg, i_count);
    out.setZero();
    for (int64_t s = 0; s < s_count; ++s) {
      out += p[r * prs + s * pss] *
             Eigen::Map<const Eigen::VectorXf>(rows[s], i_count);
    }
  }
}

}  // namespace meridian::kernels
