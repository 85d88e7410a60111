// Seeded draws that give the same values on every platform (the standard
// library's distributions are implementation-defined): what the
// partitioners and the rating generator share.
#ifndef MERIDIAN_TRAIN_RANDOM_DRAWS_H_
#define MERIDIAN_TRAIN_RANDOM_DRAWS_H_

#include <cmath>
#include <cstdint>
#include <random>

namespace meridian::random_draws {

// Uniform integer in [0, bound), bound > 0, without modulo bias.
inline uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

// Uniform double in [0, 1) from 53 random bits.
inline double UniformUnit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// Standard normal draw (Marsaglia's polar method; the second value of each
// pair is dropped, so a draw depends only on the generator's state).
inline double StandardNormal(std::mt19937_64& rng) {
  for (;;) {
    const double u = 2 * UniformUnit(rng) - 1;
    const double v = 2 * UniformUnit(rng) - 1;
    const double s = u * u + v * v;
    if (s > 0 && s < 1) return u * std::sqrt(-2 * std::log(s) / s);
  }
}

}  // namespace meridian::random_draws

#endif  // MERIDIAN_TRAIN_RANDOM_DRAWS_H_
