// bf16 conversions against an independent reference: the nearest of the two bf16 neighbours, chosen in double
// arithmetic, ties to the even one.
#include "mpi_test.hpp"

#include "fsdpp/tensor/bf16.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

using fsdpp::bf16;

namespace {
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Reference for finite floats: truncate to the lower neighbour, compare distances in double.
std::uint16_t reference_round(float f) {
  const std::uint32_t u = to_bits(f);
  const std::uint16_t lo = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t hi = static_cast<std::uint16_t>(lo + 1);
  const double dlo = std::fabs(double(f) - double(bf16::from_bits(lo).to_float()));
  const double dhi = std::fabs(double(bf16::from_bits(hi).to_float()) - double(f));
  if (std::isnan(bf16::from_bits(hi).to_float())) return lo;  // not reachable for finite inputs below max
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}
}  // namespace

TEST_CASE("bf16: exact values convert exactly") {
  CHECK(bf16::from_float(1.0f).bits == 0x3F80);
  CHECK(bf16::from_float(-2.5f).bits == 0xC020);
  CHECK(bf16::from_float(0.0f).bits == 0x0000);
  CHECK(bf16::from_float(-0.0f).bits == 0x8000);
  CHECK(bf16::from_bits(0x3F80).to_float() == 1.0f);
  CHECK(bf16::from_bits(0x4049).to_float() == 3.140625f);
}

TEST_CASE("bf16: ties round to even") {
  // 1 + 2^-8 lies halfway between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): goes down.
  CHECK(bf16::from_float(1.0f + std::ldexp(1.0f, -8)).bits == 0x3F80);
  // 1 + 3*2^-8 lies halfway between 0x3F81 and 0x3F82 (even): goes up.
  CHECK(bf16::from_float(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3F82);
  // Just above a tie goes up, just below goes down.
  CHECK(bf16::from_float(from_bits(0x3F808001)).bits == 0x3F81);
  CHECK(bf16::from_float(from_bits(0x3F817FFF)).bits == 0x3F81);
  CHECK(bf16::from_float(-(1.0f + 3 * std::ldexp(1.0f, -8))).bits == 0xBF82);
}

TEST_CASE("bf16: NaN stays NaN, Inf stays Inf, overflow rounds to Inf") {
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(bf16::from_float(inf).bits == 0x7F80);
  CHECK(bf16::from_float(-inf).bits == 0xFF80);
  CHECK(std::isinf(bf16::from_bits(0x7F80).to_float()));
  // NaNs whose payload sits only in the low bits would round into Inf, or wrap the sign, without the NaN check.
  for (std::uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0x7F80FFFFu, 0x7FFFFFFFu, 0xFFFFFFFFu, 0xFF800001u}) {
    const bf16 h = bf16::from_float(from_bits(nan_bits));
    CHECK_MESSAGE(std::isnan(h.to_float()), "NaN bits ", nan_bits);
    CHECK((h.bits & 0x8000) == ((nan_bits >> 16) & 0x8000));  // sign kept
  }
  CHECK(bf16::from_float(std::numeric_limits<float>::max()).bits == 0x7F80);
  CHECK(bf16::from_float(from_bits(0x7F7F7FFF)).bits == 0x7F7F);  // largest value that stays finite
}

TEST_CASE("bf16: subnormals round like any other value") {
  CHECK(bf16::from_float(from_bits(0x00000001)).bits == 0x0000);
  CHECK(bf16::from_float(from_bits(0x00008000)).bits == 0x0000);  // tie, even below
  CHECK(bf16::from_float(from_bits(0x00018000)).bits == 0x0002);  // tie, even above
  CHECK(bf16::from_float(from_bits(0x00018001)).bits == 0x0002);
  CHECK(bf16::from_bits(0x0001).to_float() == std::ldexp(1.0f, -133));
  CHECK(bf16::from_float(from_bits(0x807F8000)).bits == 0x8080);  // negative subnormal rounds up into a normal
}

TEST_CASE("bf16: every bf16 value round-trips through float") {
  for (std::uint32_t b = 0; b <= 0xFFFF; ++b) {
    const bf16 h = bf16::from_bits(static_cast<std::uint16_t>(b));
    const bf16 back = bf16::from_float(h.to_float());
    if (std::isnan(h.to_float())) CHECK(std::isnan(back.to_float()));
    else if (back.bits != h.bits) FAIL("bf16 0x" << std::hex << b << " did not round-trip");
  }
}

TEST_CASE("bf16: random floats match the reference rounding") {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::uint32_t> bits;
  int mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    const float f = from_bits(bits(rng));
    if (!std::isfinite(f) || std::fabs(f) >= from_bits(0x7F7F8000)) continue;
    mismatches += bf16::from_float(f).bits != reference_round(f);
  }
  CHECK(mismatches == 0);
}

// TF32 (8 exponent, 10 mantissa bits) against the same kind of reference: the nearer of the two TF32
// neighbours in double arithmetic, ties to the one with an even last mantissa bit.
TEST_CASE("tf32: random floats round to the nearest TF32 value, ties to even") {
  std::mt19937 gen(20261130);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x7f7fffffu);  // finite, positive; sign is symmetric
  int mismatches = 0;
  for (int i = 0; i < 200000; ++i) {
    const float f = from_bits(bits(gen));
    if (to_bits(f) >= 0x7f7ff000u) continue;  // rounds past the largest TF32 to Inf: checked below
    const std::uint32_t lo = to_bits(f) & 0xffffe000u, hi = lo + 0x2000u;
    const double dlo = double(f) - double(from_bits(lo)), dhi = double(from_bits(hi)) - double(f);
    const std::uint32_t want = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 0x2000u) ? hi : lo);
    mismatches += to_bits(fsdpp::round_to_tf32(f)) != want;
    mismatches += to_bits(fsdpp::round_to_tf32(-f)) != (want | 0x80000000u);
  }
  CHECK(mismatches == 0);
  CHECK(fsdpp::round_to_tf32(1.0f + std::ldexp(1.0f, -11)) == 1.0f);  // a tie goes to the even neighbour
  CHECK(fsdpp::round_to_tf32(1.0f + 3 * std::ldexp(1.0f, -11)) == 1.0f + std::ldexp(1.0f, -9));
  CHECK(std::isinf(fsdpp::round_to_tf32(std::numeric_limits<float>::infinity())));
  CHECK(std::isnan(fsdpp::round_to_tf32(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isinf(fsdpp::round_to_tf32(std::numeric_limits<float>::max())));  // past the largest TF32
  CHECK(fsdpp::round_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
}
