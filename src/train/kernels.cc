#include "train/kernels.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns about the AVX-512 intrinsics' own "undefined register"
// idiom once they are inlined (GCC bug 105593); the warning points into the
// header, so it is silenced there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define MERIDIAN_HAVE_SIMD_KERNELS 1
#else
#define MERIDIAN_HAVE_SIMD_KERNELS 0
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

#if MERIDIAN_HAVE_SIMD_KERNELS
// The project builds for baseline x86-64 (SSE2), where Eigen's GEMM runs
// at a third of what the CPU can do. The kernels below are compiled for
// AVX2+FMA and for AVX-512 through function attributes and only called when
// the CPU has the set (checked at run time), so the binary still runs
// everywhere.

#define MERIDIAN_SIMD_FN __attribute__((target("avx2,fma")))
namespace avx2 {

struct Simd {
  using V = __m256;
  using Mask = __m256i;
  static constexpr int64_t kLanes = 8;
  // 16 vector registers: a 4 x 3 dot tile (12 accumulators, 3 columns of
  // x, 1 row of a) and a 6 x 2 outer tile (12 + 2 + 1 broadcast).
  static constexpr int kDotRows = 4;
  static constexpr int kDotColumns = 3;
  static constexpr int kOuterRows = 6;
  static constexpr int kOuterWidth = 2;

  MERIDIAN_SIMD_FN static V Zero() { return _mm256_setzero_ps(); }
  MERIDIAN_SIMD_FN static V Load(const float* p) { return _mm256_loadu_ps(p); }
  MERIDIAN_SIMD_FN static V LoadMasked(const float* p, Mask mask) {
    return _mm256_maskload_ps(p, mask);
  }
  MERIDIAN_SIMD_FN static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  MERIDIAN_SIMD_FN static void StoreMasked(float* p, Mask mask, V v) {
    _mm256_maskstore_ps(p, mask, v);
  }
  MERIDIAN_SIMD_FN static V Broadcast(const float* p) {
    return _mm256_broadcast_ss(p);
  }
  MERIDIAN_SIMD_FN static V Fma(V a, V b, V c) {
    return _mm256_fmadd_ps(a, b, c);
  }
  MERIDIAN_SIMD_FN static float Sum(V v) {
    __m128 s =
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // Lanes [0, n) set, n in [0, 8].
  MERIDIAN_SIMD_FN static Mask TailMask(int64_t n) {
    alignas(32) static const int32_t kBits[16] = {
        -1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kBits + 8 - n));
  }
};

#include "train/kernels_simd.inc"

}  // namespace avx2
#undef MERIDIAN_SIMD_FN

#define MERIDIAN_SIMD_FN __attribute__((target("avx512f,avx2,fma")))
namespace avx512 {

struct Simd {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int64_t kLanes = 16;
  // 32 vector registers: a 6 x 4 dot tile (24 accumulators, 4 columns of
  // x, 1 row of a) and an 8 x 3 outer tile (24 + 3, the broadcasts folded
  // into the FMAs). Eight rows also divide the 16 and 32 channels of the
  // convolution presets.
  static constexpr int kDotRows = 6;
  static constexpr int kDotColumns = 4;
  static constexpr int kOuterRows = 8;
  static constexpr int kOuterWidth = 3;

  MERIDIAN_SIMD_FN static V Zero() { return _mm512_setzero_ps(); }
  MERIDIAN_SIMD_FN static V Load(const float* p) { return _mm512_loadu_ps(p); }
  // Masked-off lanes are not read (no fault past the end of a buffer).
  MERIDIAN_SIMD_FN static V LoadMasked(const float* p, Mask mask) {
    return _mm512_maskz_loadu_ps(mask, p);
  }
  MERIDIAN_SIMD_FN static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  MERIDIAN_SIMD_FN static void StoreMasked(float* p, Mask mask, V v) {
    _mm512_mask_storeu_ps(p, mask, v);
  }
  MERIDIAN_SIMD_FN static V Broadcast(const float* p) {
    return _mm512_set1_ps(*p);
  }
  MERIDIAN_SIMD_FN static V Fma(V a, V b, V c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  // Not _mm512_reduce_add_ps: GCC 12 warns on its undefined-register idiom.
  MERIDIAN_SIMD_FN static float Sum(V v) {
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2)));
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
    __m128 s = _mm512_castps512_ps128(v);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // Lanes [0, n) set, n in [0, 16].
  MERIDIAN_SIMD_FN static Mask TailMask(int64_t n) {
    return static_cast<Mask>((uint32_t{1} << n) - 1);
  }
};

#include "train/kernels_simd.inc"

}  // namespace avx512
#undef MERIDIAN_SIMD_FN

#endif  // MERIDIAN_HAVE_SIMD_KERNELS

using RowMajorMatrixXf =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using DynamicStride = Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>;

// `isa` lowered to what this CPU runs: a caller asking for more gets the
// best there is rather than an illegal instruction.
Isa Usable(Isa isa) { return std::min(isa, CpuIsa()); }

// Calls run(kernels) with the Kernels of the widest set `isa` allows on this
// CPU and returns true; false (run not called) on the portable path.
template <typename Run>
bool OnSimd(Isa isa, const Run& run) {
#if MERIDIAN_HAVE_SIMD_KERNELS
  switch (Usable(isa)) {
    case Isa::kAvx512:
      run(avx512::Kernels{});
      return true;
    case Isa::kAvx2:
      run(avx2::Kernels{});
      return true;
    case Isa::kPortable:
      break;
  }
#endif
  return false;
}

// Set and not "0".
bool EnvFlag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

}  // namespace

Isa CpuIsa() {
#if MERIDIAN_HAVE_SIMD_KERNELS
  static const Isa kIsa = [] {
    // libgcc also checks that the OS saves the vector registers (XCR0).
    if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      return Isa::kAvx2;
    }
    return Isa::kPortable;
  }();
  return kIsa;
#else
  return Isa::kPortable;
#endif
}

Isa WantedIsa() {
  if (EnvFlag("MERIDIAN_NO_SIMD")) return Isa::kPortable;
  if (EnvFlag("MERIDIAN_NO_AVX512")) return std::min(Isa::kAvx2, CpuIsa());
  return CpuIsa();
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

void DotProduct(Isa isa, int64_t m, int64_t n, int64_t k, const float* a,
                int64_t lda, const float* x, int64_t ldx, const float* bias,
                bool relu, float* out, int64_t ldo) {
  if (m <= 0 || n <= 0) return;
  if (OnSimd(isa, [&](auto kernels) {
        kernels.Dot(m, n, k, StridedRows{a, lda}, x, ldx, bias, relu,
                    /*accumulate=*/false, out, ldo);
      })) {
    return;
  }
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

void DotProductRowsAccumulate(Isa isa, int64_t m, int64_t n, int64_t k,
                              const float* const* a_rows, const float* x,
                              int64_t ldx, float* out, int64_t ldo) {
  if (m <= 0 || n <= 0 || k <= 0) return;
  if (OnSimd(isa, [&](auto kernels) {
        kernels.Dot(m, n, k, IndirectRows{a_rows, 0}, x, ldx, nullptr, false,
                    /*accumulate=*/true, out, ldo);
      })) {
    return;
  }
  for (int64_t b = 0; b < n; ++b) {
    const Eigen::Map<const Eigen::VectorXf> column(x + b * ldx, k);
    for (int64_t o = 0; o < m; ++o) {
      out[o + b * ldo] +=
          Eigen::Map<const Eigen::VectorXf>(a_rows[o], k).dot(column);
    }
  }
}

int64_t OuterPackSize(int64_t r_count, int64_t s_count) {
#if MERIDIAN_HAVE_SIMD_KERNELS
  // The sets pack in tiles of different heights; the model sizes its
  // scratch once, before knowing which set a pass runs on.
  return std::max(avx2::PackSize(r_count, s_count),
                  avx512::PackSize(r_count, s_count));
#else
  return 0;
#endif
}

void OuterProduct(Isa isa, int64_t r_count, int64_t i_count, int64_t s_count,
                  const float* p, int64_t prs, int64_t pss, const float* q,
                  int64_t ldq, float* g, int64_t ldg, float* pack) {
  if (r_count <= 0 || i_count <= 0) return;
  if (s_count > 0 && OnSimd(isa, [&](auto kernels) {
        kernels.Outer(r_count, i_count, s_count, p, prs, pss,
                      StridedRows{q, ldq}, g, ldg, pack);
      })) {
    return;
  }
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

void OuterProductRows(Isa isa, int64_t r_count, int64_t i_count,
                      int64_t s_count, const float* p, int64_t prs, int64_t pss,
                      const float* const* rows, float* g, int64_t ldg,
                      float* pack) {
  if (r_count <= 0 || i_count <= 0) return;
  if (s_count > 0 && OnSimd(isa, [&](auto kernels) {
        kernels.Outer(r_count, i_count, s_count, p, prs, pss,
                      IndirectRows{rows, 0}, g, ldg, pack);
      })) {
    return;
  }
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
