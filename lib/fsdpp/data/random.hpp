#pragma once
// Random-number helpers shared by the data layer. Everything here is defined bit for bit (no std::*_distribution,
// whose algorithms differ between standard libraries), so a seed gives the same corpus and the same sample order
// with any compiler: the same deck then trains on the same data everywhere.
#include <cstdint>

namespace fsdpp::data_random {

// SplitMix64's finalizer: a bijective 64-bit mix with full avalanche. Used as a counter-based generator
// (value i = mix64(key ^ mix64(i))), which lets any rank jump straight to any sequence index.
constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Keys for independent streams from one user seed, so that e.g. the corpus and the sampler never share draws.
constexpr std::uint64_t stream_key(std::uint64_t seed, std::uint64_t stream) { return mix64(mix64(seed) ^ stream); }

// Uniform double in [0, 1) from the top 53 bits.
constexpr double unit_double(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace fsdpp::data_random
