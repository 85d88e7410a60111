// The dense products every model's forward and backward passes are built
// from, on AVX-512 or AVX2/FMA kernels where the CPU has them (checked at
// run time) and on Eigen otherwise. Stateless; thread-safe.
#ifndef MERIDIAN_TRAIN_KERNELS_H_
#define MERIDIAN_TRAIN_KERNELS_H_

#include <cstdint>

namespace meridian::kernels {

// The instruction sets the kernels come in, in order of speed. Every
// function below takes one; asking for more than the CPU has runs the best
// it has (never an illegal instruction).
enum class Isa { kPortable, kAvx2, kAvx512 };

// The best set this CPU (and OS) runs: AVX-512F, else AVX2 with FMA, else
// portable.
Isa CpuIsa();

// The set models built now should use: CpuIsa(), lowered to portable (the
// Eigen path) when MERIDIAN_NO_SIMD is set and not "0", e.g. to rule the
// kernels out when chasing a numerical problem, and to at most AVX2 when
// MERIDIAN_NO_AVX512 is (to compare the two).
Isa WantedIsa();

// "portable", "avx2", "avx512".
const char* IsaName(Isa isa);

// Dot-product form, for products whose summed dimension is contiguous in
// both operands:
//   out[o + b * ldo] = act(bias[o] + sum_{j<k} a[o * lda + j] * x[b * ldx + j])
// for o < m, b < n (overwrites out). `bias` may be null (no bias); act is
// ReLU when `relu`, else the identity.
void DotProduct(Isa isa, int64_t m, int64_t n, int64_t k, const float* a,
                int64_t lda, const float* x, int64_t ldx, const float* bias,
                bool relu, float* out, int64_t ldo);

// The dot-product form with the rows of A through a table (row o starts at
// a_rows[o]), added to out:
//   out[o + b * ldo] += sum_{j<k} a_rows[o][j] * x[b * ldx + j].
void DotProductRowsAccumulate(Isa isa, int64_t m, int64_t n, int64_t k,
                              const float* const* a_rows, const float* x,
                              int64_t ldx, float* out, int64_t ldo);

// Outer-product form, for products whose output rows are contiguous in the
// right operand:
//   g[r * ldg + i] = sum_{s < s_count} p[r * prs + s * pss] * q[i + s * ldq]
// for r < r_count, i < i_count (overwrites g). `pack` holds
// OuterPackSize(r_count, s_count) floats of scratch, enough for every set
// (unused on the portable path; may then be null).
int64_t OuterPackSize(int64_t r_count, int64_t s_count);
void OuterProduct(Isa isa, int64_t r_count, int64_t i_count, int64_t s_count,
                  const float* p, int64_t prs, int64_t pss, const float* q,
                  int64_t ldq, float* g, int64_t ldg, float* pack);

// The outer-product form with row s of the right operand at rows[s] (an
// implicit im2col: a convolution reads its shifted input rows in place):
//   g[r * ldg + i] = sum_{s < s_count} p[r * prs + s * pss] * rows[s][i].
void OuterProductRows(Isa isa, int64_t r_count, int64_t i_count,
                      int64_t s_count, const float* p, int64_t prs, int64_t pss,
                      const float* const* rows, float* g, int64_t ldg,
                      float* pack);

}  // namespace meridian::kernels

#endif  // MERIDIAN_TRAIN_KERNELS_H_
