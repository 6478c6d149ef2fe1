#pragma once
// bf16: brain floating point storage type (1 sign, 8 exponent, 7 mantissa bits).
// Kokkos 3.4 has no bhalf_t (docs/stack-notes.md §2.5), so fsdpp carries its own. It is a storage format only:
// arithmetic converts to float, which is exact, and back with round-to-nearest-even.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>

namespace fsdpp {

struct bf16 {
  std::uint16_t bits = 0;

  KOKKOS_INLINE_FUNCTION static bf16 from_bits(std::uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }

  // Round to nearest, ties to even. NaN stays NaN (quieted, sign and top payload bits kept): plain rounding
  // could carry a NaN's payload into the exponent and turn it into Inf. Inf stays Inf; floats above the
  // largest bf16 round to Inf as IEEE rounding requires; subnormals round like any other value.
  KOKKOS_INLINE_FUNCTION static bf16 from_float(float f) {
    std::uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return from_bits(static_cast<std::uint16_t>((u >> 16) | 0x0040u));
    const std::uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return from_bits(static_cast<std::uint16_t>(u >> 16));
  }

  KOKKOS_INLINE_FUNCTION float to_float() const {
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
  }

  KOKKOS_INLINE_FUNCTION explicit operator float() const { return to_float(); }
};

static_assert(sizeof(bf16) == 2, "bf16 must be 2 bytes: it is sent over the wire and stored in checkpoints");

KOKKOS_INLINE_FUNCTION bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
KOKKOS_INLINE_FUNCTION bool operator!=(bf16 a, bf16 b) { return a.bits != b.bits; }

// `f` rounded to the nearest bf16 value (ties to even), kept as a float.
KOKKOS_INLINE_FUNCTION float round_to_bf16(float f) { return bf16::from_float(f).to_float(); }

// `f` rounded to the nearest TF32 value (8 exponent, 10 mantissa bits; ties to even), kept as a float: what
// tensor cores read of an f32 input in TF32 mode. NaN and Inf pass through; values past the largest TF32
// round to Inf, as for bf16.
KOKKOS_INLINE_FUNCTION float round_to_tf32(float f) {
  std::uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) {  // finite: add half an ulp of TF32 (ties to even), drop 13 bits
    u += 0x0fffu + ((u >> 13) & 1u);
    u &= 0xffffe000u;
  }
  memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace fsdpp
