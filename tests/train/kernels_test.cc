// The dense-product kernels against plain loops in double precision, on
// every kernel set the CPU has, over shapes that hit each tile's remainder
// paths, with operands that end at a guard page (a masked tail must not
// read past the end of a buffer).
#include "train/kernels.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "meridian/train/model.h"

namespace meridian::kernels {
namespace {

// `count` floats that end exactly where an inaccessible page begins: a read
// past the last one faults.
class GuardedFloats {
 public:
  explicit GuardedFloats(int64_t count) : count_(count) {
    const int64_t page = sysconf(_SC_PAGESIZE);
    const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
    data_pages_ = (bytes + page - 1) / page * page;
    mapping_bytes_ = data_pages_ + page;
    void* mapping = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) std::abort();
    mapping_ = static_cast<char*>(mapping);
    if (mprotect(mapping_ + data_pages_, page, PROT_NONE) != 0) std::abort();
    data_ = reinterpret_cast<float*>(mapping_ + data_pages_ - bytes);
  }
  ~GuardedFloats() { munmap(mapping_, mapping_bytes_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;

  float* data() { return data_; }
  float& operator[](int64_t i) { return data_[i]; }
  int64_t size() const { return count_; }

 private:
  int64_t count_;
  int64_t data_pages_ = 0;
  int64_t mapping_bytes_ = 0;
  char* mapping_ = nullptr;
  float* data_ = nullptr;
};

void Fill(GuardedFloats& values, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < values.size(); ++i) values[i] = uniform(rng);
}

// Sizes around every tile width (4, 6 and 8 rows; 3 and 4 columns; 8 and 16
// lanes, 2 and 3 vectors per block) and their remainders.
const std::vector<int64_t>& Sizes() {
  static const std::vector<int64_t> kSizes = {1,  2,  3,  5,  7,  8,  9,
                                              13, 16, 17, 24, 31, 49, 50};
  return kSizes;
}

class KernelsTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (GetParam() > CpuIsa()) {
      GTEST_SKIP() << "the CPU has no " << IsaName(GetParam());
    }
  }
  static double Tolerance(int64_t k) { return 1e-5 * (k + 1); }
};

TEST_P(KernelsTest, DotProductMatchesLoops) {
  for (int64_t m : Sizes()) {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{7}}) {
      for (int64_t k : Sizes()) {
        for (bool relu : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k "
                                          << k << " relu " << relu);
          // Rows of A end k floats apart plus one (lda > k); the last column
          // of X and the last row of A end at the guard page.
          const int64_t lda = k + 1;
          GuardedFloats a(m * lda - 1);
          GuardedFloats x(n * k);
          GuardedFloats bias(m);
          Fill(a, 1);
          Fill(x, 2);
          Fill(bias, 3);
          std::vector<float> out(m * n, 99.0f);
          DotProduct(GetParam(), m, n, k, a.data(), lda, x.data(), k,
                     bias.data(), relu, out.data(), m);
          for (int64_t b = 0; b < n; ++b) {
            for (int64_t o = 0; o < m; ++o) {
              double want = bias[o];
              for (int64_t j = 0; j < k; ++j) {
                want += double{a[o * lda + j]} * x[b * k + j];
              }
              if (relu) want = std::max(want, 0.0);
              ASSERT_NEAR(out[o + b * m], want, Tolerance(k))
                  << "out(" << o << ", " << b << ")";
            }
          }
        }
      }
    }
  }
}

TEST_P(KernelsTest, DotProductRowsAccumulateAddsToOut) {
  for (int64_t m : Sizes()) {
    for (int64_t n : {int64_t{1}, int64_t{4}, int64_t{5}}) {
      for (int64_t k : Sizes()) {
        SCOPED_TRACE(::testing::Message()
                     << "m " << m << " n " << n << " k " << k);
        // Overlapping rows, as a convolution's shifted input rows are: row
        // o starts o floats in.
        GuardedFloats base(m - 1 + k);
        GuardedFloats x(n * k);
        Fill(base, 4);
        Fill(x, 5);
        std::vector<const float*> rows;
        for (int64_t o = 0; o < m; ++o) rows.push_back(base.data() + o);
        std::vector<float> out(m * n);
        for (size_t i = 0; i < out.size(); ++i) out[i] = 0.5f * i;
        DotProductRowsAccumulate(GetParam(), m, n, k, rows.data(), x.data(), k,
                                 out.data(), m);
        for (int64_t b = 0; b < n; ++b) {
          for (int64_t o = 0; o < m; ++o) {
            double want = 0.5 * (o + b * m);
            for (int64_t j = 0; j < k; ++j) {
              want += double{base[o + j]} * x[b * k + j];
            }
            ASSERT_NEAR(out[o + b * m], want, Tolerance(k))
                << "out(" << o << ", " << b << ")";
          }
        }
      }
    }
  }
}

TEST_P(KernelsTest, OuterProductMatchesLoopsForBothLayoutsOfP) {
  for (int64_t r_count : Sizes()) {
    for (int64_t i_count : Sizes()) {
      for (int64_t s_count : {int64_t{1}, int64_t{2}, int64_t{9}}) {
        for (bool transposed : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "r " << r_count << " i " << i_count << " s "
                       << s_count << " p transposed " << transposed);
          GuardedFloats p(r_count * s_count);
          // Rows of q i_count + 2 apart; the last one ends at the guard.
          const int64_t ldq = i_count + 2;
          GuardedFloats q((s_count - 1) * ldq + i_count);
          Fill(p, 6);
          Fill(q, 7);
          const int64_t prs = transposed ? 1 : s_count;
          const int64_t pss = transposed ? r_count : 1;
          std::vector<float> pack(OuterPackSize(r_count, s_count));
          std::vector<float> g(r_count * i_count, 99.0f);
          OuterProduct(GetParam(), r_count, i_count, s_count, p.data(), prs,
                       pss, q.data(), ldq, g.data(), i_count, pack.data());
          for (int64_t r = 0; r < r_count; ++r) {
            for (int64_t i = 0; i < i_count; ++i) {
              double want = 0;
              for (int64_t s = 0; s < s_count; ++s) {
                want += double{p[r * prs + s * pss]} * q[s * ldq + i];
              }
              ASSERT_NEAR(g[r * i_count + i], want, Tolerance(s_count))
                  << "g(" << r << ", " << i << ")";
            }
          }
        }
      }
    }
  }
}

TEST_P(KernelsTest, OuterProductRowsReadsRowsThroughTheTable) {
  for (int64_t r_count : Sizes()) {
    for (int64_t i_count : Sizes()) {
      const int64_t s_count = 9;
      SCOPED_TRACE(::testing::Message() << "r " << r_count << " i " << i_count);
      // Shifted views of one buffer, in reverse order; the last row in
      // memory ends at the guard.
      GuardedFloats base(s_count - 1 + i_count);
      GuardedFloats p(r_count * s_count);
      Fill(base, 8);
      Fill(p, 9);
      std::vector<const float*> rows;
      for (int64_t s = 0; s < s_count; ++s) {
        rows.push_back(base.data() + (s_count - 1 - s));
      }
      std::vector<float> pack(OuterPackSize(r_count, s_count));
      std::vector<float> g(r_count * i_count, 99.0f);
      OuterProductRows(GetParam(), r_count, i_count, s_count, p.data(), s_count,
                       1, rows.data(), g.data(), i_count, pack.data());
      for (int64_t r = 0; r < r_count; ++r) {
        for (int64_t i = 0; i < i_count; ++i) {
          double want = 0;
          for (int64_t s = 0; s < s_count; ++s) {
            want += double{p[r * s_count + s]} * rows[s][i];
          }
          ASSERT_NEAR(g[r * i_count + i], want, Tolerance(s_count))
              << "g(" << r << ", " << i << ")";
        }
      }
    }
  }
}

TEST_P(KernelsTest, EmptySumsGiveZeroOrTheBias) {
  GuardedFloats a(6);
  GuardedFloats bias(3);
  Fill(a, 10);
  Fill(bias, 11);
  std::vector<float> out(6, 99.0f);
  DotProduct(GetParam(), 3, 2, 0, a.data(), 0, a.data(), 0, bias.data(), false,
             out.data(), 3);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t o = 0; o < 3; ++o) EXPECT_EQ(out[o + b * 3], bias[o]);
  }
  std::vector<float> g(6, 99.0f);
  OuterProduct(GetParam(), 2, 3, 0, a.data(), 1, 1, a.data(), 3, g.data(), 3,
               nullptr);
  for (float value : g) EXPECT_EQ(value, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Sets, KernelsTest,
                         ::testing::Values(Isa::kPortable, Isa::kAvx2,
                                           Isa::kAvx512),
                         [](const ::testing::TestParamInfo<Isa>& info) {
                           return std::string(IsaName(info.param));
                         });

TEST(KernelsIsaTest, TheEnvironmentLowersTheWantedSet) {
  EXPECT_EQ(WantedIsa(), CpuIsa());
  setenv("MERIDIAN_NO_AVX512", "1", 1);
  EXPECT_EQ(WantedIsa(), std::min(Isa::kAvx2, CpuIsa()));
  EXPECT_STREQ(ModelKernels(), IsaName(std::min(Isa::kAvx2, CpuIsa())));
  setenv("MERIDIAN_NO_SIMD", "1", 1);
  EXPECT_EQ(WantedIsa(), Isa::kPortable);
  EXPECT_STREQ(ModelKernels(), "portable");
  setenv("MERIDIAN_NO_SIMD", "0", 1);
  setenv("MERIDIAN_NO_AVX512", "", 1);
  EXPECT_EQ(WantedIsa(), CpuIsa());
  unsetenv("MERIDIAN_NO_SIMD");
  unsetenv("MERIDIAN_NO_AVX512");
}

TEST(KernelsIsaTest, AskingForMoreThanTheCpuHasRunsTheBestItHas) {
  // On any CPU: the widest set is requested, the result is still right.
  GuardedFloats a(4);
  GuardedFloats x(4);
  Fill(a, 12);
  Fill(x, 13);
  float out = 0;
  DotProduct(Isa::kAvx512, 1, 1, 4, a.data(), 4, x.data(), 4, nullptr, false,
             &out, 1);
  double want = 0;
  for (int j = 0; j < 4; ++j) want += double{a[j]} * x[j];
  EXPECT_NEAR(out, want, 1e-5);
}

}  // namespace
}  // namespace meridian::kernels
